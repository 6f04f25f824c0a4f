"""The oracle engine: the paper's matrix recursion (eq. extRec) on whole-network arrays.

It shares no code with the agent state machine, only the public inputs every engine uses
(the Instance's risks, privnet.agent.rng's streams, the per-agent keys of experiment.seeds, the
data), so when the net and memory engines agree with it, the agent core computes the
paper's algorithm. Per round, phi = C1(w); psi = C0(phi) - mu grad(phi); w = C2(psi), with
C_j the privatized combine of A_j (see `_Combine`). Repeats and schemes run side by side in
one (P, R, S, M) array, so a combine is one matmul for all of them, and the noise tables are
drawn once per repeat, in chunks of rounds, each sender's rows from its own key.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np

from privnet.agent import lattice, rng
from privnet.agent import schedule as expand
from privnet.agent.schemes.base import Draws
from privnet.agent.spec import STRATEGY_STEP, ConfigError, Scheme, Strategy, WireDtype
from privnet.orchestrator.curves import Curve
from privnet.orchestrator.engines import oracle_byzantine as byzantine
from privnet.orchestrator.experiment import data, seeds, topology
from privnet.orchestrator.experiment.config import parse_choices
from privnet.orchestrator.experiment.instance import Instance

CHUNK = 100  # rounds of noise and minibatch indices drawn at once; bounds memory


def run_oracle(
    problem: Instance,
    strategies: Iterable[Strategy | str] | None = None,
    schemes: Iterable[Scheme | str] | None = None,
    progress: Callable[[int], None] | None = None,
    models: dict[str, np.ndarray] | None = None,
) -> list[Curve]:
    """One Curve per (strategy, scheme), in the order strategies x schemes.

    Defaults come from problem.config. `progress(n)` reports n more units done (one unit
    per strategy, so n = 1 as each finishes; the memory engine reports the same way).
    rounds_per_s is iters * repeats over the wall time of the strategy; all its schemes ran
    in that time, so they share the figure. `models` gets every session's models, (iters,
    P, M), by its label (`atc/none/0`), as the memory engine gives them.
    """
    config = problem.config
    strategies = parse_choices(config.strategies if strategies is None else strategies, Strategy)
    schemes = parse_choices(config.schemes if schemes is None else schemes, Scheme)
    unmodelled = [str(s) for s in schemes if not s.part.oracle]
    if unmodelled:
        raise ConfigError(
            f"the oracle's recursion does not model scheme {', '.join(unmodelled)} (a scheme "
            "registered outside privnet): run it on the agents' own cores, --engine memory "
            "(engine='memory')"
        )
    lanes = tuple(schemes)
    grads = _Gradients(problem, byzantine.flipped_agents(problem))
    curves: list[Curve] = []
    for strategy in strategies:
        start = perf_counter()
        kept: list[np.ndarray] | None = None if models is None else []
        centroid, avg, errors, extras = _run_strategy(problem, strategy, lanes, grads, kept)
        rate = config.iters * config.repeats / (perf_counter() - start)
        for scheme in schemes:
            s = lanes.index(scheme)
            if models is not None and kept is not None:
                history = np.concatenate(kept)  # (T, P, R, S, M)
                for r in range(config.repeats):
                    models[f"{strategy}/{scheme}/{r}"] = history[:, :, r, s]
            series = {name: e[s] for name, e in errors.items()}
            curves.append(
                Curve(strategy.value, scheme.value, centroid[s], avg[s], rate, extras[s], series)
            )
        if progress is not None:
            progress(1)
    return curves


# The privatized combine C(x)_p per scheme, with G the noise table of the step and round
# (row m: what sender m draws from its own key, (P, M) per row) and g_m = G[m, m]:
#   none:       sum_m a_mp x_m
#   random:     sum_m a_mp x_m + sum_{m != p} a_mp G[m, p]
#   ghp:        sum_m a_mp x_m + sum_{m != p} a_mp g_m - (1 - a_pp) g_p
#               (random and ghp: x rounded to the noise grid first, privnet.agent.rng.snap)
#   local-ghp:  sum_m [a_mp x_m], [y] being y rounded to the noise grid (the lattice)
#   masked-ghp: sum_{m != p} [a_mp (x_m + g_m)] + [a_pp x_p - (1 - a_pp) g_p] (x on the grid
#               first): the pair masks of both cancel exactly on the lattice, so none is drawn.
# With the u4 wire (privnet.agent.lattice) the lattice is lattice.grid (the noise grid, or
# 2^-24 without noise) and none releases x on it too: on the wire every release is a
# lattice point, so the rest is the same sums (the modular sum of words is the integer sum
# wherever the sender's range check lets a release out).
# An identity step adds no noise.
@dataclass(frozen=True)
class _Combine:
    """A combine step whose matrix is not I, with the maps from a noise table to the noise
    each receiver ends up adding (receiver-major, so each map is one array operation)."""

    a_t: np.ndarray  # (P, P): A^T, so x -> A^T x
    senders: np.ndarray  # (E,): m of every edge m -> p with m != p and a_mp > 0 ...
    receivers: np.ndarray  # (E,): ... and its p; edges sorted by receiver
    weights: np.ndarray  # (E,): a_mp of each edge
    heard: np.ndarray  # receivers with at least one such edge ...
    starts: np.ndarray  # ... and where their edges start
    spread_ghp: np.ndarray  # (P, P): A^T with diagonal -(1 - a_pp), the self-term factor
    every: _Edges  # every edge m -> p with a_mp > 0, self-terms included (lattice lanes)
    alone: np.ndarray  # agents with no edge in or out (a schedule's round): they keep x

    @classmethod
    def of(cls, a: np.ndarray) -> _Combine:
        agents = a.shape[0]
        receivers, senders = np.nonzero(((a > 0) & ~np.eye(agents, dtype=bool)).T)
        heard = np.unique(receivers)
        spread_ghp = a.T.copy()
        np.fill_diagonal(spread_ghp, -(1.0 - np.diag(a)))
        return cls(
            np.ascontiguousarray(a.T),
            senders,
            receivers,
            a[senders, receivers],
            heard,
            np.searchsorted(receivers, heard),
            spread_ghp,
            _Edges.of(a),
            np.flatnonzero(((a > 0).sum(axis=0) == 1) & ((a > 0).sum(axis=1) == 1)),
        )

    def noise(
        self, lane: Scheme, table: np.ndarray, draw: Callable[[np.ndarray], np.ndarray]
    ) -> np.ndarray:
        """What each receiver adds under random or ghp, receiver-major (P, ..., M); under
        masked-ghp, sender-major, each sender's own draw g_m (the lattice adds it per edge).

        `table` is (..., P, P, M); `draw` turns just the entries the scheme reads (edges
        m -> p, or the diagonal) into Laplace noise, so nothing else is transformed.
        """
        agents = len(self.a_t)
        by_pair = np.moveaxis(table, (-3, -2), (0, 1))
        if lane.part.draws is Draws.PER_LINK:
            edge = draw(by_pair[self.senders, self.receivers])  # (E, ..., M)
            weighted = edge * self.weights.reshape(-1, *[1] * (edge.ndim - 1))
            out = np.zeros((agents, *edge.shape[1:]))
            out[self.heard] = np.add.reduceat(weighted, self.starts, axis=0)
            return out
        own = np.arange(agents)
        g = draw(by_pair[own, own])  # (P, ..., M): g_m = G[m, m]
        if lane.masked:
            return g
        return (self.spread_ghp @ g.reshape(agents, -1)).reshape(g.shape)

    def __call__(self, x: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        mixed = (self.a_t @ x.reshape(x.shape[0], -1)).reshape(x.shape)
        return mixed if noise is None else mixed + noise


@dataclass(frozen=True)
class _Edges:
    """Every edge m -> p of A (a_mp > 0, m = p included), sorted by receiver: a combine
    whose every term is rounded to the noise grid, as the masked schemes' hubs add."""

    senders: np.ndarray  # (E,)
    weights: np.ndarray  # (E,): a_mp
    ghp: np.ndarray  # (E,): what g_m is multiplied by: 1, or -(1 - a_pp)/a_pp on p's own
    starts: np.ndarray  # (P,): where each receiver's edges start

    @classmethod
    def of(cls, a: np.ndarray) -> _Edges:
        receivers, senders = np.nonzero((a > 0).T)
        weights = a[senders, receivers]
        own = senders == receivers
        ghp = np.where(own, -((1 - weights) / weights), 1.0)
        return cls(senders, weights, ghp, np.searchsorted(receivers, np.arange(a.shape[0])))

    def lattice(self, x: np.ndarray, g: np.ndarray | None, step: float) -> np.ndarray:
        """sum_m [a_mp (x_m + c_mp g_m)] per receiver p, [.] rounded to the noise grid;
        x and g are (P, ..., M), sender-major; g is None for local-ghp."""
        shape = (-1, *[1] * (x.ndim - 1))
        v = x[self.senders]
        if g is not None:
            v = v + self.ghp.reshape(shape) * g[self.senders]
        terms = self.weights.reshape(shape) * v
        if step:
            terms = step * np.rint(terms / step)
        return np.add.reduceat(terms, self.starts, axis=0)


class _Gradients:
    """Every agent's gradient in every repeat, from the problem plug-in's own risks (the code
    each agent runs): one risk over all agents and repeats at once when the plug-in
    `stacks` and every agent holds as many samples, else one risk per agent and repeat.
    Minibatch rows come from each agent's BATCH stream, a block of rounds at a time (agent
    p's in round i: problems.minibatch of its share). The `flipped` agents (Byzantine,
    issue 34) train on their labels flipped."""

    def __init__(self, problem: Instance, flipped: frozenset[int] = frozenset()) -> None:
        c = problem.config
        shares = [problem.specs(r) for r in range(c.repeats)]
        parts = [data.parts(s) for s in shares]  # [r][p]: (x, y)
        for row in parts:
            for p in flipped:
                row[p] = (row[p][0], byzantine.flip(row[p][1], problem.classes))
        self.sizes = np.array([[len(y) for _, y in row] for row in parts]).T  # (P, R)
        batch = c.batch or 0
        self.batched = self.sizes > batch if batch else np.zeros(self.sizes.shape, dtype=bool)
        self.local_steps = c.local_steps
        self.rows = [
            [[rng.Rows(s.batch_key, rng.Domain.BATCH, e, batch) for s in row] for row in shares]
            for e in range(c.local_steps)
        ]  # [e][r][p]: local step e's minibatch stream (problems.minibatch)
        self.stacked = (
            bool(getattr(problem.plugin, "stacks", False))
            and len(np.unique(self.sizes)) == 1
            and len(np.unique(self.batched)) == 1
        )
        plugin, classes = problem.plugin, problem.classes
        if self.stacked:
            x = np.array([[row[p][0] for row in parts] for p in range(c.agents)])  # (P, R, N, F)
            y = np.array([[row[p][1] for row in parts] for p in range(c.agents)])  # (P, R, N)
            self.risk = plugin.risk(x, y, classes)
        else:
            self.risks = [[plugin.risk(*row[p], classes) for row in parts] for p in range(c.agents)]
        self.idx: dict[tuple[int, int, int], np.ndarray] = {}  # (p, r, e) -> (rounds, batch)

    def load(self, first_round: int, rounds: int) -> None:
        """This chunk's minibatch rows of every agent that draws them, every local step."""
        self.idx = {
            (p, r, e): rng.indices(
                self.rows[e][r][p].block(first_round, rounds), int(self.sizes[p, r])
            )
            for p, r in zip(*np.nonzero(self.batched), strict=True)
            for e in range(self.local_steps)
        }

    def descent(self, phi: np.ndarray, t: int, mu: float) -> np.ndarray:
        """sum_e g_e of E local steps from phi in round t of the chunk (g_e at x_e,
        x_{e+1} = x_e - mu g_e): the agent core's `_descent`, in its order."""
        g = self(phi, t)
        if self.local_steps == 1:
            return g
        total, x = g.copy(), phi
        for e in range(1, self.local_steps):
            x = x - mu * g
            g = self(x, t, e)
            total += g
        return total

    def __call__(self, phi: np.ndarray, t: int, e: int = 0) -> np.ndarray:
        """The gradients at phi (P, R, S, M) in round t of the chunk, local step e."""
        if self.stacked:
            rows = None
            if self.idx:
                agents, repeats = self.sizes.shape
                rows = np.array(
                    [[self.idx[(p, r, e)][t] for r in range(repeats)] for p in range(agents)]
                )
            return self.risk.gradient(phi, rows)
        out = np.empty_like(phi)
        for (p, r), _ in np.ndenumerate(self.sizes):
            rows = self.idx[(p, r, e)][t] if (p, r, e) in self.idx else None
            out[p, r] = self.risks[p][r].gradient(phi[p, r], rows)
        return out


def _run_strategy(
    problem: Instance,
    strategy: Strategy,
    lanes: tuple[Scheme, ...],
    grads: _Gradients,
    kept: list[np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], list[dict[str, Any]]]:
    """Centroid and average MSD, each (S, R, T), of every lane and repeat of one strategy,
    the problem's test metric of the centroid and on average, each (S, R, T), and each
    lane's Curve.extra (the attackers, apart); `kept` gets every chunk's models, (rounds,
    P, R, S, M). With attackers or a defense each combine runs per edge
    (oracle_byzantine.Hostile), drawing its own noise."""
    config = problem.config
    agents, repeats, dim, iters = config.agents, config.repeats, config.dim, config.iters
    combines_at = _Rounds(problem, strategy)
    combines = combines_at(1)
    hostile = byzantine.Hostile(problem, lanes) if byzantine.hostile(problem) else None
    noisy = hostile is None and config.sigma_g > 0 and any(lane.part.perturbs for lane in lanes)
    keys = [seeds.keys(config.seed, seeds.Purpose.NOISE, r, agents) for r in range(repeats)]
    streams = {  # streams[j][r][m]: sender m's noise rows of step j in repeat r
        j: [[rng.Rows(key, rng.Domain.NOISE, j, agents * dim) for key in ks] for ks in keys]
        for j in combines
    }
    record = _Record(problem, len(lanes))
    w = np.broadcast_to(problem.w0, (agents, repeats, len(lanes), dim)).copy()
    side_by_side = hostile or _Lanes(lanes, config.sigma_g, problem.wire)

    with np.errstate(over="ignore", invalid="ignore"):  # divergence is reported once, below
        for first in range(1, iters + 1, CHUNK):
            rounds = min(CHUNK, iters + 1 - first)
            grads.load(first, rounds)
            noise = {
                j: _noise(c, streams[j], first, rounds, lanes, dim, config.sigma_g)
                if noisy and problem.schedule is None
                else None
                for j, c in combines.items()
            }
            history = np.empty((rounds, *w.shape))
            for at in range(rounds):
                t, i = at, first + at
                if problem.schedule is not None:  # this round's A, and its noise alone
                    combines, t = combines_at(i), 0
                    noise = {
                        j: _noise(c, streams[j], i, 1, lanes, dim, config.sigma_g)
                        if noisy
                        else None
                        for j, c in combines.items()
                    }
                phi = _apply(combines, noise, 1, w, t, side_by_side, i)
                step = config.mu * grads.descent(phi, t, config.mu)
                psi = _apply(combines, noise, 0, phi, t, side_by_side, i) - step
                w = _apply(combines, noise, 2, psi, t, side_by_side, i)
                history[at] = w
            if kept is not None:
                kept.append(history)
            record(history, first)
    if np.isfinite(problem.w_opt).all() and not np.all(np.isfinite(record.avg)):
        warnings.warn(  # NaN w^o: no MSD, nothing to warn of
            f"{strategy}: the models diverged (MSD overflowed) with mu = {config.mu}; "
            "lower mu until the recursion is stable",
            RuntimeWarning,
            stacklevel=3,
        )
    return record.centroid, record.avg, record.errors, record.extras()


class _Record:
    """One strategy's curves, (S, R, T) each, of the honest agents alone: the attackers'
    models left out and q renormalized over the rest (as the memory engine's curves), and
    the attackers' own average MSD kept apart for Curve.extra."""

    def __init__(self, problem: Instance, lanes: int) -> None:
        c = problem.config
        self.problem = problem
        self.attackers = sorted(c.attackers())
        self.honest = np.setdiff1d(np.arange(c.agents), self.attackers)
        self.q = problem.q[self.honest] / problem.q[self.honest].sum()
        shape = (lanes, c.repeats, c.iters)
        self.centroid, self.avg, self.attacked = np.empty(shape), np.empty(shape), np.empty(shape)
        self.errors = {name: np.empty(shape) for name in problem.metric_series}

    def __call__(self, history: np.ndarray, first: int) -> None:
        """Record the chunk of models (rounds, P, R, S, M) from round `first` on."""
        problem, rounds = self.problem, len(history)
        window = slice(first - 1, first - 1 + rounds)
        if not self.attackers:
            self.centroid[..., window], self.avg[..., window] = _msd(
                history, problem.q, problem.w_opt
            )
        else:
            honest = history[:, self.honest]
            self.centroid[..., window], self.avg[..., window] = _msd(honest, self.q, problem.w_opt)
            apart = history[:, self.attackers]
            _, self.attacked[..., window] = _msd(
                apart, np.full(len(self.attackers), 0.0), problem.w_opt
            )
        if self.errors:
            repeats, agents, dim = history.shape[2], history.shape[1], history.shape[-1]
            by_model = np.array(history.transpose(0, 2, 3, 1, 4).reshape(-1, agents, dim))
            by_model[:, self.attackers] = np.nan  # left out, as absent agents are
            tested = problem.scores(by_model) or ()
            for name, values in zip(self.errors, tested, strict=True):
                per = values.reshape(rounds, repeats, -1).transpose(2, 1, 0)
                self.errors[name][..., window] = per

    def extras(self) -> list[dict[str, Any]]:
        """Each lane's Curve.extra: the attackers and their average MSD over the last
        tenth of the rounds, in dB (the memory engine's `byzantine_msd_avg_db`)."""
        if not self.attackers:
            return [{} for _ in self.avg]
        tail = max(1, self.problem.config.iters // 10)
        return [
            {
                "byzantine": self.attackers,
                "byzantine_msd_avg_db": float(10 * np.log10(lane[:, -tail:].mean(axis=1).mean())),
            }
            for lane in self.attacked
        ]


class _Rounds:
    """Round i's combines (the steps whose matrix is not I): fixed, or a schedule's,
    made once per distinct graph (privnet.agent.schedule.index)."""

    def __init__(self, problem: Instance, strategy: Strategy) -> None:
        self.problem, self.strategy = problem, strategy
        self.made: dict[int, dict[int, _Combine]] = {}

    def __call__(self, round_: int) -> dict[int, _Combine]:
        made = self.problem.schedule
        at = 0 if made is None else expand.index(made, round_)
        if at not in self.made:
            a = self.problem.round_matrix(round_)
            carrier = STRATEGY_STEP[self.strategy]
            matrices = topology.strategy_matrices(self.strategy, a)
            eye = np.eye(len(a))
            self.made[at] = {
                j: _Combine.of(m)
                for j, m in enumerate(matrices)
                if not np.array_equal(m, eye) or (made is not None and j == carrier)
            }
        return self.made[at]


def _msd(history: np.ndarray, q: np.ndarray, w_opt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Models (rounds, P, R, S, M) -> centroid and average MSD, each (S, R, rounds)."""
    w_c = np.tensordot(q, history, axes=(0, 1))  # (rounds, R, S, M)
    centroid = np.sum((w_c - w_opt[:, None, :]) ** 2, axis=-1)
    avg = np.mean(np.sum((history - w_opt[:, None, :]) ** 2, axis=-1), axis=1)
    return centroid.transpose(2, 1, 0), avg.transpose(2, 1, 0)


@dataclass(frozen=True)
class _Lanes:
    """The schemes side by side on axis 2 of the state (P, R, S, M): how a combine treats
    each of them."""

    schemes: tuple[Scheme, ...]
    sigma_g: float
    wire: WireDtype = WireDtype.F8

    def combine(self, c: _Combine, x: np.ndarray, table: np.ndarray | None) -> np.ndarray:
        """One combine of every lane; `table` is the round's noise (None without noise).
        An agent alone this round sends nothing: it keeps its value, not snapped."""
        given = x
        step = lattice.grid(self.sigma_g, self.wire)
        if step:  # the lanes whose value is released on the lattice (u4: none's too)
            u4 = self.wire is WireDtype.U4
            on = [lane.part.perturbs or (u4 and not lane.masked) for lane in self.schemes]
            snaps = np.array(on)[:, None]
            x = np.where(snaps, rng.on_lattice(x, 1.0, step), x)
        out = c(x, table)
        for s, lane in enumerate(self.schemes):
            if lane.masked:
                g = table[:, :, s] if table is not None and lane.part.perturbs else None
                out[:, :, s] = c.every.lattice(x[:, :, s], g, step)
        out[c.alone] = given[c.alone]
        return out


def _apply(
    combines: dict[int, _Combine],
    noise: dict[int, np.ndarray | None],
    step: int,
    x: np.ndarray,
    t: int,
    lanes: _Lanes | byzantine.Hostile,
    round_: int,
) -> np.ndarray:
    """Combine step `step` of round `round_` (t of the chunk); an identity step returns x
    itself. With attackers or a defense, the per-edge combine (it draws its own noise)."""
    if step not in combines:
        return x
    c = combines[step]
    if isinstance(lanes, byzantine.Hostile):
        return lanes.combine(c.a_t.T, x, step, round_)
    table = noise[step]
    return lanes.combine(c, x, None if table is None else table[t])


def _noise(
    combine: _Combine,
    streams: list[list[rng.Rows]],
    first_round: int,
    rounds: int,
    lanes: tuple[Scheme, ...],
    dim: int,
    sigma_g: float,
) -> np.ndarray:
    """The noise each receiver adds in the combine step whose rows `streams` reads
    (streams[r][m]: sender m's in repeat r), shape (rounds, P, R, S, M); for masked-ghp,
    each sender's draw g_m."""
    agents = len(combine.a_t)

    def draw(raw: np.ndarray) -> np.ndarray:
        return rng.laplace(rng.uniforms(raw), sigma_g)

    out = np.zeros((rounds, agents, len(streams), len(lanes), dim))
    for r, senders in enumerate(streams):
        table = np.stack([rows.block(first_round, rounds) for rows in senders], axis=1)
        by_sender = table.reshape(rounds, agents, agents, dim)
        for s, lane in enumerate(lanes):
            if lane.part.perturbs:
                out[:, :, r, s] = combine.noise(lane, by_sender, draw).swapaxes(0, 1)
    return out

"""The oracle engine: the paper's matrix recursion (eq. extRec) on whole-network arrays.

It shares no code with the agent state machine, only the public inputs every engine uses
(the Problem, the counter-based streams of agent.rng, the per-agent keys of
orchestrator.experiment.seeds and the data generator), so when the net and memory
engines agree with it, the agent core computes the paper's algorithm.

Per round i = 1..T, from w_0 = 0 (eqs. preComb, update, postComb):
    phi = C1(w);  psi = C0(phi) - mu grad(phi);  w = C2(psi),
where C_j is the privatized combine with A_j (an identity step adds no noise). With the
noise table G of step j and round i (row m: what sender m draws from its own key, laid
out (P, M) per row):
    none:      C(x)_p = sum_m a_mp x_m
    random:    C(x)_p = sum_m a_mp x_m + sum_{m != p} a_mp G[m, p]
    ghp:       C(x)_p = sum_m a_mp x_m + sum_{m != p} a_mp g_m - (1 - a_pp) g_p,  g_m = G[m, m]
               (random and ghp: x rounded to the noise grid first, agent.rng.snap)
    local-ghp: C(x)_p = sum_m [a_mp x_m],  [y] = y rounded to the noise grid (the lattice)
    masked-ghp: C(x)_p = sum_{m != p} [a_mp (x_m + g_m)] + [a_pp x_p - (1 - a_pp) g_p]
               (x rounded to the grid first): the pairwise masks of both cancel exactly on
               the lattice, at every hub, so they are not drawn here.
Repeats and schemes run side by side in one state array of shape (P, R, S, M), so each
combine of a round is one (P, P) x (P, R*S*M) matmul for all of them (the lattice lanes one
sum over the edges); `random`, `ghp` and `masked-ghp` read the same table (off-diagonal
and diagonal), drawn once per repeat in chunks of rounds, each sender's rows from its own
key.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from time import perf_counter

import numpy as np
from scipy.special import expit

from agent import rng
from agent.losses import classification_data, regression_data
from agent.spec import ConfigError, Scheme, Strategy
from orchestrator.experiment import seeds
from orchestrator.experiment.config import parse_choices
from orchestrator.experiment.problem import Problem
from orchestrator.results import TEST_ERRORS, Curve

CHUNK = 100  # rounds of noise and minibatch indices drawn at once; bounds memory


def run_oracle(
    problem: Problem,
    strategies: Iterable[Strategy | str] | None = None,
    schemes: Iterable[Scheme | str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Curve]:
    """One Curve per (strategy, scheme), in the order strategies x schemes.

    Defaults come from problem.config. `progress(n)` reports n more units done (one unit
    per strategy, so n = 1 as each finishes; the memory engine reports the same way).
    rounds_per_s is iters * repeats over the wall time of the strategy; all its schemes ran
    in that time, so they share the figure.
    """
    config = problem.config
    strategies = parse_choices(config.strategies if strategies is None else strategies, Strategy)
    schemes = parse_choices(config.schemes if schemes is None else schemes, Scheme)
    lanes = tuple(schemes)
    grads = _gradients(problem)
    curves: list[Curve] = []
    for strategy in strategies:
        start = perf_counter()
        centroid, avg, errors = _run_strategy(problem, strategy, lanes, grads)
        rate = config.iters * config.repeats / (perf_counter() - start)
        for scheme in schemes:
            s = lanes.index(scheme)
            series = {name: e[s] for name, e in errors.items()}
            curves.append(
                Curve(strategy.value, scheme.value, centroid[s], avg[s], rate, {}, series)
            )
        if progress is not None:
            progress(1)
    return curves


def scheme_noise(a: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What each receiver p adds to sum_m a_mp x_m under random and under ghp.

    `table` holds noise G of shape (..., P, P, M), G[m, p] drawn by sender m; returns
    (random, ghp), each (..., P, M), so that C_scheme(x) = A^T x + this.
    """
    combine = _Combine.of(np.asarray(a, dtype=float))
    by_receiver = (combine.noise(lane, table, _same) for lane in (Scheme.RANDOM, Scheme.GHP))
    random, ghp = (np.moveaxis(x, 0, -2) for x in by_receiver)
    return random, ghp


def _same(x: np.ndarray) -> np.ndarray:
    return x


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
        if lane is Scheme.RANDOM:
            edge = draw(by_pair[self.senders, self.receivers])  # (E, ..., M)
            weighted = edge * self.weights.reshape(-1, *[1] * (edge.ndim - 1))
            out = np.zeros((agents, *edge.shape[1:]))
            out[self.heard] = np.add.reduceat(weighted, self.starts, axis=0)
            return out
        own = np.arange(agents)
        g = draw(by_pair[own, own])  # (P, ..., M): g_m = G[m, m]
        if lane is Scheme.MASKED_GHP:
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

    def lattice(self, x: np.ndarray, g: np.ndarray | None, sigma_g: float) -> np.ndarray:
        """sum_m [a_mp (x_m + c_mp g_m)] per receiver p, [.] rounded to the noise grid;
        x and g are (P, ..., M), sender-major; g is None for local-ghp."""
        shape = (-1, *[1] * (x.ndim - 1))
        v = x[self.senders]
        if g is not None:
            v = v + self.ghp.reshape(shape) * g[self.senders]
        terms = self.weights.reshape(shape) * v
        step = rng.grid(sigma_g)
        if step:
            terms = step * np.rint(terms / step)
        return np.add.reduceat(terms, self.starts, axis=0)


class _FullBatch:
    """Exact local gradients grad_p(w) = H_p w - r_p, H_p = 2 (R_p + rho I), r_p = 2 r_ud_p,
    as LeastSquares computes them, for every agent and repeat at once."""

    def __init__(self, hessian_t: np.ndarray, r: np.ndarray) -> None:
        self.hessian_t = hessian_t  # (P, R, M, M), H_p^T of each repeat
        self.r = r  # (P, R, 1, M)

    def load(self, first_round: int, rounds: int) -> None:
        """Nothing is drawn per round with exact gradients."""

    def __call__(self, phi: np.ndarray, t: int) -> np.ndarray:
        return phi @ self.hessian_t - self.r


class _Minibatch:
    """LeastSquares' minibatch gradients; indices come from each agent's BATCH stream, a
    block of rounds at a time (agent p's in round i is batch_indices(key_p, i, batch, N))."""

    def __init__(self, problem: Problem, u: np.ndarray, d: np.ndarray, batch: int) -> None:
        config = problem.config
        self.rows = [
            [rng.Rows(spec.batch_key, rng.Domain.BATCH, 0, batch) for spec in specs]
            for specs in map(problem.regression_specs, range(config.repeats))
        ]
        self.u, self.d, self.batch, self.rho = u, d, batch, config.rho  # (P, R, N, M), (P, R, N)
        self.agent = np.arange(config.agents)[:, None, None]
        self.repeat = np.arange(config.repeats)[None, :, None]
        self.idx = np.empty((0, config.agents, config.repeats, batch), dtype=np.int64)

    def load(self, first_round: int, rounds: int) -> None:
        samples = self.u.shape[2]
        raw = np.array(
            [[rows.block(first_round, rounds) for rows in agents] for agents in self.rows]
        )  # (R, P, rounds, batch)
        self.idx = rng.indices(raw, samples).transpose(2, 1, 0, 3)  # (rounds, P, R, batch)

    def __call__(self, phi: np.ndarray, t: int) -> np.ndarray:
        idx = self.idx[t]
        u = self.u[self.agent, self.repeat, idx]  # (P, R, batch, M)
        d = self.d[self.agent, self.repeat, idx]  # (P, R, batch)
        w = phi.swapaxes(-1, -2)  # (P, R, M, S)
        grad = 2.0 * (u.swapaxes(-1, -2) @ (u @ w - d[..., None]) / self.batch + self.rho * w)
        return grad.swapaxes(-1, -2)


class _Logistic:
    """Full-batch gradients of 1/N sum_n ln(1 + exp(-y_n h_n^T w)) + rho ||w||^2 for every
    agent and repeat at once, written here from the formula, not taken from agent.losses."""

    def __init__(self, problem: Problem) -> None:
        config = problem.config
        if _batch(problem):
            raise ConfigError("the oracle runs classification with full batches only; drop --batch")
        data = [
            [classification_data(spec) for spec in problem.classification_specs(r)]
            for r in range(config.repeats)
        ]
        self.x = np.array([[xy[0] for xy in row] for row in data]).swapaxes(0, 1)  # (P, R, N, M)
        self.y = np.array([[xy[1] for xy in row] for row in data]).swapaxes(0, 1)[..., None]
        self.rho = config.rho

    def load(self, first_round: int, rounds: int) -> None:
        """Nothing is drawn per round with exact gradients."""

    def __call__(self, phi: np.ndarray, t: int) -> np.ndarray:
        margins = self.y * (self.x @ phi.swapaxes(-1, -2))  # (P, R, N, S)
        coeff = -self.y * expit(-margins) / self.x.shape[2]
        return (self.x.swapaxes(-1, -2) @ coeff).swapaxes(-1, -2) + 2.0 * self.rho * phi


_Gradients = _FullBatch | _Minibatch | _Logistic


def _gradients(problem: Problem) -> _Gradients:
    if problem.classifies:
        return _Logistic(problem)
    batch = _batch(problem)
    return _minibatch(problem, batch) if batch else _full_batch(problem)


def _batch(problem: Problem) -> int | None:
    """The minibatch size LeastSquares uses: None (full batch) unless batch < samples."""
    batch = problem.config.batch
    return batch if batch and batch < problem.config.samples else None


def _full_batch(problem: Problem) -> _FullBatch:
    config = problem.config
    eye = np.eye(config.dim)
    moments = [problem.moments(r) for r in range(config.repeats)]
    hessian = np.stack([2.0 * (r_hat + config.rho * eye) for r_hat, _ in moments], axis=1)
    r = np.stack([2.0 * r_ud for _, r_ud in moments], axis=1)
    return _FullBatch(np.ascontiguousarray(hessian.swapaxes(-1, -2)), r[:, :, None, :])


def _minibatch(problem: Problem, batch: int) -> _Minibatch:
    config = problem.config
    data = [
        [regression_data(spec) for spec in problem.regression_specs(r)]
        for r in range(config.repeats)
    ]
    u = np.array([[ud[0] for ud in row] for row in data]).swapaxes(0, 1)  # (P, R, N, M)
    d = np.array([[ud[1] for ud in row] for row in data]).swapaxes(0, 1)  # (P, R, N)
    return _Minibatch(problem, u, d, batch)


def _run_strategy(
    problem: Problem, strategy: Strategy, lanes: tuple[Scheme, ...], grads: _Gradients
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Centroid and average MSD, each (S, R, T), of every lane and repeat of one strategy,
    and for classification the two testing errors, each (S, R, T)."""
    config = problem.config
    agents, repeats, dim, iters = config.agents, config.repeats, config.dim, config.iters
    matrices = problem.matrices(strategy)
    eye = np.eye(agents)
    combines = {j: _Combine.of(a) for j, a in enumerate(matrices) if not np.array_equal(a, eye)}
    noisy = config.sigma_g > 0 and any(lane in _DRAWS for lane in lanes)
    keys = [seeds.keys(config.seed, seeds.Purpose.NOISE, r, agents) for r in range(repeats)]
    streams = {  # streams[j][r][m]: sender m's noise rows of step j in repeat r
        j: [[rng.Rows(key, rng.Domain.NOISE, j, agents * dim) for key in ks] for ks in keys]
        for j in combines
    }
    centroid = np.empty((len(lanes), repeats, iters))
    avg = np.empty_like(centroid)
    errors = {name: np.empty_like(centroid) for name in TEST_ERRORS} if problem.classifies else {}
    w = np.zeros((agents, repeats, len(lanes), dim))
    side_by_side = _Lanes(lanes, config.sigma_g)

    with np.errstate(over="ignore", invalid="ignore"):  # divergence is reported once, below
        for first in range(1, iters + 1, CHUNK):
            rounds = min(CHUNK, iters + 1 - first)
            grads.load(first, rounds)
            noise = {
                j: _noise(c, streams[j], first, rounds, lanes, dim, config.sigma_g)
                if noisy
                else None
                for j, c in combines.items()
            }
            history = np.empty((rounds, *w.shape))
            for t in range(rounds):
                phi = _apply(combines, noise, 1, w, t, side_by_side)
                psi = _apply(combines, noise, 0, phi, t, side_by_side) - config.mu * grads(phi, t)
                w = _apply(combines, noise, 2, psi, t, side_by_side)
                history[t] = w
            window = slice(first - 1, first - 1 + rounds)
            centroid[..., window], avg[..., window] = _msd(history, problem.q, problem.w_opt)
            tested = problem.test_errors(history)  # each (rounds, R, S)
            for name, values in zip(errors, tested or (), strict=True):
                errors[name][..., window] = values.transpose(2, 1, 0)
    if not np.all(np.isfinite(avg)):
        warnings.warn(
            f"{strategy}: the models diverged (MSD overflowed) with mu = {config.mu}; "
            "lower mu until the recursion is stable",
            RuntimeWarning,
            stacklevel=3,
        )
    return centroid, avg, errors


def _msd(history: np.ndarray, q: np.ndarray, w_opt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Models (rounds, P, R, S, M) -> centroid and average MSD, each (S, R, rounds)."""
    w_c = np.tensordot(q, history, axes=(0, 1))  # (rounds, R, S, M)
    centroid = np.sum((w_c - w_opt[:, None, :]) ** 2, axis=-1)
    avg = np.mean(np.sum((history - w_opt[:, None, :]) ** 2, axis=-1), axis=1)
    return centroid.transpose(2, 1, 0), avg.transpose(2, 1, 0)


_DRAWS = (Scheme.RANDOM, Scheme.GHP, Scheme.MASKED_GHP)  # the lanes that draw noise ...
_SNAPS = _DRAWS  # ... and release their value rounded to the noise grid (rng.snap)


@dataclass(frozen=True)
class _Lanes:
    """The schemes side by side on axis 2 of the state (P, R, S, M): how a combine treats
    each of them."""

    schemes: tuple[Scheme, ...]
    sigma_g: float

    def combine(self, c: _Combine, x: np.ndarray, table: np.ndarray | None) -> np.ndarray:
        """One combine of every lane; `table` is the round's noise (None without noise)."""
        if table is not None:
            snaps = np.array([lane in _SNAPS for lane in self.schemes])[:, None]
            x = np.where(snaps, rng.snap(x, self.sigma_g), x)
        out = c(x, table)
        for s, lane in enumerate(self.schemes):
            if lane.masked:
                g = table[:, :, s] if table is not None and lane is Scheme.MASKED_GHP else None
                out[:, :, s] = c.every.lattice(x[:, :, s], g, self.sigma_g)
        return out


def _apply(
    combines: dict[int, _Combine],
    noise: dict[int, np.ndarray | None],
    step: int,
    x: np.ndarray,
    t: int,
    lanes: _Lanes,
) -> np.ndarray:
    """Combine step `step` of round t of the chunk; an identity step returns x itself."""
    if step not in combines:
        return x
    table = noise[step]
    return lanes.combine(combines[step], x, None if table is None else table[t])


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
            if lane in _DRAWS:
                out[:, :, r, s] = combine.noise(lane, by_sender, draw).swapaxes(0, 1)
    return out

"""The oracle's replay of Byzantine agents and defenses (issue 34), stated afresh.

The oracle's matrix recursion is linear; a defense is not (it rescales or ranks each
message) and an attacker sends each neighbour a model of its own making. So when a run
has either, each combine is written out per edge: what every sender releases to every
receiver (its scheme's noise from the oracle's own tables, the masked schemes' terms on
the lattice), the attacks (from Blanchard et al. 2017, Baruch et al. 2019, Xie et al.
2020, He, Karimireddy and Jaggi 2022) and each hub's defense (ClippedGossip, the
coordinate-wise trimmed mean, the clipped step), vectorized over edges and repeats,
with only the rank-based parts hub by hub. Nothing here calls privnet.agent's attacks,
defenses or core: it is a second statement that can disagree with them. Shared are the
public inputs only: the parsed `--byzantine`/`--defense` specs and their defaults, the
cap on a crafted norm, the Gaussian attack's normals (a seeded stream, like the noise
tables), the noise streams and the lattice rounding (privnet.agent.rng).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from privnet.agent import attacks, defenses, lattice, rng
from privnet.agent.schemes.base import Draws
from privnet.agent.spec import Scheme, WireDtype
from privnet.orchestrator.experiment import seeds
from privnet.orchestrator.experiment.instance import Instance

Kind = attacks.Kind
Defend = defenses.Kind


def flipped_agents(problem: Instance) -> frozenset[int]:
    """The agents whose labels are flipped (they train on them, and send honestly)."""
    return frozenset(p for p, a in problem.config.attackers().items() if a.flips_labels)


def flip(y: np.ndarray, classes: int) -> np.ndarray:
    """Label flipping: class c -> C - 1 - c of C classes; a regression target d -> -d."""
    out: np.ndarray = classes - 1 - y if classes else -y
    return out


def hostile(problem: Instance) -> bool:
    """Whether the run has a defense or an attacker (the per-edge combine, `Hostile`)."""
    config = problem.config
    return bool(config.byzantine.strip()) or defenses.parse(config.defense).kind is not Defend.NONE


@dataclass(frozen=True)
class _Net:
    """One combine matrix A as edges m -> p (m != p, a_mp > 0), sorted by receiver."""

    a: np.ndarray  # (P, P): a_mp, column p what hub p weighs
    senders: np.ndarray  # (E,)
    receivers: np.ndarray  # (E,)
    weights: np.ndarray  # (E,): a_mp
    own: np.ndarray  # (P,): a_pp
    bounds: np.ndarray  # (P + 1,): hub p's edges are bounds[p]:bounds[p + 1]
    alone: np.ndarray  # (P,) bool: no edge in or out, the agent keeps its value

    @classmethod
    def of(cls, a: np.ndarray) -> _Net:
        agents = len(a)
        linked = (a > 0) & ~np.eye(agents, dtype=bool)
        receivers, senders = np.nonzero(linked.T)
        bounds = np.searchsorted(receivers, np.arange(agents + 1))
        alone = np.asarray(~linked.any(axis=0) & ~linked.any(axis=1))
        return cls(a, senders, receivers, a[senders, receivers], np.diag(a).copy(), bounds, alone)

    def hub(self, p: int) -> slice:
        return slice(int(self.bounds[p]), int(self.bounds[p + 1]))

    def into(self, values: np.ndarray) -> np.ndarray:
        """sum over each receiver's edges of values (E, ...) -> (P, ...)."""
        out = np.zeros((len(self.a), *values.shape[1:]))
        np.add.at(out, self.receivers, values)
        return out


@dataclass
class _View:
    """What an attacker saw as a hub at one step, the last time it combined there."""

    mean: np.ndarray  # (R, M): its neighbours' weighted mean, as its scheme shows it
    spread: np.ndarray  # (R, M): the messages' spread (masked: its own distance to the mean)
    messages: dict[int, np.ndarray]  # sender -> (R, M) as received (masked: none)


@dataclass
class _Window:
    """clip-step's past step lengths of every hub (its last `size`), at one step and lane."""

    size: int
    agents: int
    repeats: int
    taken: np.ndarray = field(init=False)  # (size, P, R), a ring per hub
    count: np.ndarray = field(init=False)  # (P,)

    def __post_init__(self) -> None:
        self.taken = np.zeros((self.size, self.agents, self.repeats))
        self.count = np.zeros(self.agents, dtype=int)


class Hostile:
    """Attackers and the defense over one strategy's run, every lane and repeat side by
    side; kept per lane, step and agent: what each attacker last saw as a hub, and
    clip-step's window of past steps."""

    def __init__(self, problem: Instance, lanes: tuple[Scheme, ...]) -> None:
        c = problem.config
        self.defense = defenses.parse(c.defense)
        for lane in lanes:  # clip and trim judge each message: refused where masked
            defenses.check(self.defense, lane)
        self.attackers = {p: a for p, a in c.attackers().items() if a.crafts}
        self.lanes = lanes
        self.agents, self.dim, self.repeats = c.agents, c.dim, c.repeats
        self.sigma_g = c.sigma_g
        self.grid = lattice.grid(c.sigma_g, problem.wire)
        self.u4 = problem.wire is WireDtype.U4
        self.noisy = c.sigma_g > 0 and any(lane.part.perturbs for lane in lanes)
        self.keys = [seeds.keys(c.seed, seeds.Purpose.NOISE, r, c.agents) for r in range(c.repeats)]
        self.streams: dict[int, list[list[rng.Rows]]] = {}  # step -> [r][m]
        self.nets: dict[bytes, _Net] = {}
        self.views: dict[tuple[int, int, int], _View] = {}  # (lane, step, attacker)
        self.windows: dict[tuple[int, int], _Window] = {}  # (lane, step)

    def combine(self, a: np.ndarray, x: np.ndarray, step: int, round_: int) -> np.ndarray:
        """Combine step `step` of round `round_` with matrix `a` of every lane of x
        (P, R, S, M): releases, attacks, the hubs' sums and defenses."""
        net = self.nets.get(a.tobytes())
        if net is None:
            net = self.nets[a.tobytes()] = _Net.of(a)
        tables = self._tables(step, round_) if self.noisy else None
        out = np.empty_like(x)
        for s, lane in enumerate(self.lanes):
            out[:, :, s] = self._lane(net, s, lane, x[:, :, s], tables, step, round_)
        return out

    def _tables(self, step: int, round_: int) -> np.ndarray:
        """(R, P, P, M): row k of sender m's Laplace table (what receiver k gets under
        random; its own row, g_m, under ghp), from m's own noise stream."""
        streams = self.streams.get(step)
        if streams is None:
            width = self.agents * self.dim
            streams = self.streams[step] = [
                [rng.Rows(key, rng.Domain.NOISE, step, width) for key in keys] for keys in self.keys
            ]
        raw = np.array([[rows.block(round_, 1)[0] for rows in by_m] for by_m in streams])
        table: np.ndarray = rng.laplace(rng.uniforms(raw), self.sigma_g)
        return table.reshape(self.repeats, self.agents, self.agents, self.dim)

    def _lane(
        self,
        net: _Net,
        s: int,
        lane: Scheme,
        x: np.ndarray,
        tables: np.ndarray | None,
        step: int,
        round_: int,
    ) -> np.ndarray:
        """One lane's combine: x (P, R, M) -> every hub's defended sum (P, R, M)."""
        sent = x[net.senders]  # (E, R, M): the value on each edge, before the scheme
        for m, attack in self.attackers.items():
            on = net.senders == m
            if on.any():
                crafted = self._craft(net, s, step, round_, m, attack, x[m])
                sent[on] = crafted[net.receivers[on]]
        g = None
        if tables is not None and lane.part.perturbs:  # sender m's own row: ghp's g_m
            own_rows = np.arange(self.agents)
            g = tables[:, own_rows, own_rows].transpose(1, 0, 2)  # (P, R, M)
        if lane.masked:
            total, mine = self._masked(net, lane, x, sent, g)
            received = None
        else:
            received, mine = self._messages(net, lane, x, sent, tables, g)
            total = self._defended(net, received, mine, x)
        for m in self.attackers:
            self._observe(net, s, step, m, received, mine, total)
        total = self._bounded(net, s, step, total, x)
        total[net.alone] = x[net.alone]
        return total

    # ---- what each sender releases -------------------------------------------------------

    def _craft(
        self,
        net: _Net,
        s: int,
        step: int,
        round_: int,
        m: int,
        attack: attacks.Attack,
        x: np.ndarray,
    ) -> np.ndarray:
        """Attacker m's value for each out-neighbour, (P, R, M) (rows of non-targets 0),
        each within norm CAP; x (R, M) is its own value."""
        targets = np.flatnonzero(net.a[m] > 0)
        targets = targets[targets != m]
        out = np.zeros((self.agents, *x.shape))
        view = self.views.get((s, step, m))
        kind = attack.kind
        if kind is Kind.SIGN_FLIP:  # Blanchard et al. 2017
            out[targets] = -attack["scale"] * x
        elif kind is Kind.LARGE_NORM:
            norm = np.sqrt(np.sum(x * x, axis=-1, keepdims=True))
            unit = np.where(norm > 0, x / np.where(norm > 0, norm, 1.0), 1 / np.sqrt(x.shape[-1]))
            out[targets] = attack["norm"] * unit
        elif kind is Kind.GAUSSIAN:  # a fresh draw per round, step and receiver
            z = [attacks.normals(ks[m], step, round_, self.agents, self.dim) for ks in self.keys]
            out[targets] = x + attack["sigma"] * np.stack(z, axis=1)[targets]
        elif view is None:  # nothing seen yet (its first round): its own value
            out[targets] = x
        elif kind is Kind.ALIE:  # Baruch et al. 2019: z spreads below the mean
            out[targets] = view.mean - attack["z"] * view.spread
        elif kind is Kind.IPM:  # Xie et al. 2020: against the mean
            out[targets] = -attack["eps"] * view.mean
        else:  # dissensus (He et al. 2022): undo eps times k's pull towards its neighbours
            for k in targets:
                a = net.a[m, k]
                x_k = view.messages.get(int(k), view.mean)
                out[k] = x_k + attack["eps"] * (1 - a) / a * (x_k - view.mean)
        return _capped(out)

    def _messages(
        self,
        net: _Net,
        lane: Scheme,
        x: np.ndarray,
        sent: np.ndarray,
        tables: np.ndarray | None,
        g: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """What each hub receives on each edge (E, R, M) and its own term (P, R, M), under
        none, random and ghp: the value on the noise grid (u4: on the lattice, none's too),
        plus the sender's row for that receiver (random) or its one draw g_m (ghp), whose
        -(1 - a_pp)/a_pp g_p the hub's own term carries."""
        if lane.part.perturbs or self.u4:
            sent, mine = rng.on_lattice(sent, 1.0, self.grid), rng.on_lattice(x, 1.0, self.grid)
        else:
            mine = x.copy()
        if tables is not None and lane.part.draws is Draws.PER_LINK:
            sent = sent + tables[:, net.senders, net.receivers].transpose(1, 0, 2)
        elif g is not None:
            sent = sent + g[net.senders]
            mine = mine - ((1 - net.own) / net.own)[:, None, None] * g
        return sent, mine

    def _masked(
        self, net: _Net, lane: Scheme, x: np.ndarray, sent: np.ndarray, g: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """A masked hub's sum (P, R, M) and each agent's own release (P, R, M): its pair
        masks cancel, so the sum is of each term a_mp u_mp on the lattice, u the release
        under the masks (local-ghp: the value; masked-ghp: ghp's, on the grid)."""
        mine = x
        if lane.part.perturbs:
            sent, mine = rng.on_lattice(sent, 1.0, self.grid), rng.on_lattice(x, 1.0, self.grid)
            if g is not None:
                sent = sent + g[net.senders]
                mine = mine - ((1 - net.own) / net.own)[:, None, None] * g
        terms = rng.on_lattice(sent, net.weights[:, None, None], self.grid)
        total = rng.on_lattice(mine, net.own[:, None, None], self.grid) + net.into(terms)
        return total, mine

    # ---- what each hub makes of it ------------------------------------------------------

    def _defended(
        self, net: _Net, received: np.ndarray, mine: np.ndarray, x: np.ndarray
    ) -> np.ndarray:
        """Each hub's combine of what it received, its own term as it is: the weighted
        sum, or each message clipped or trimmed first (the defenses that see messages)."""
        kind = self.defense.kind
        if kind is Defend.CLIP:
            received = self._clipped(net, received, x)
        elif kind is Defend.TRIM:
            received = self._trimmed(net, received, x)
        return net.own[:, None, None] * mine + net.into(net.weights[:, None, None] * received)

    def _clipped(self, net: _Net, received: np.ndarray, x: np.ndarray) -> np.ndarray:
        """ClippedGossip (He, Karimireddy, Jaggi 2022, self-centred clipping): hub p takes
        x_p + clip(y_m - x_p, tau) for each neighbour m's y_m; tau fixed, or hub p's
        distance to its (b+1)-th farthest neighbour (its nearest's, with b or fewer)."""
        center = x[net.receivers]
        d = received - center
        d2 = np.einsum("erm,erm->er", d, d)  # (E, R)
        tau = self.defense["tau"]
        if tau > 0:
            radius2 = np.full_like(d2, tau * tau)
        else:
            b = int(self.defense["b"])
            radius2 = np.empty_like(d2)
            for p in range(self.agents):
                hub = net.hub(p)
                n = hub.stop - hub.start
                if n:
                    radius2[hub] = np.sort(d2[hub], axis=0)[n - 1 - min(b, n - 1)]
        far = d2 > radius2
        scale = np.sqrt(np.divide(radius2, d2, out=np.ones_like(d2), where=far))
        return center + scale[..., None] * d

    def _trimmed(self, net: _Net, received: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Coordinate-wise trimmed mean: per coordinate, each hub's b largest and b
        smallest neighbour values (b at most (n - 1)/2 of its n) become its own value x_p;
        ties ranked by sender id (stable), so the lowest cut go first, the highest last."""
        b = int(self.defense["b"])
        out = received.copy()
        for p in range(self.agents):
            hub = net.hub(p)
            n = hub.stop - hub.start
            cut = min(b, (n - 1) // 2) if n else 0
            if cut:
                rank = np.argsort(np.argsort(received[hub], axis=0, kind="stable"), axis=0)
                out[hub] = np.where((rank < cut) | (rank >= n - cut), x[p], received[hub])
        return out

    def _observe(
        self,
        net: _Net,
        s: int,
        step: int,
        m: int,
        received: np.ndarray | None,
        mine: np.ndarray,
        total: np.ndarray,
    ) -> None:
        """Attacker m's view of the combine it ran as a hub: the messages it received, their
        weighted mean and spread; masked, only its sum is exact, so the mean is the sum
        less its own term, and the spread its own release's distance to that mean. Its
        neighbours' weights sum to 1 - a_mm, which the mean is divided by.

        The mean is the weights' dot with the messages, a repeat at a time, divided by
        1 - a_mm, as a hub forms it: under random and ghp the messages sit on the noise
        grid and metropolis weights are fractions like 3/15, so the mean is often an exact
        multiple of grid/8, and IPM's -mean/2 lands on a tie of the grid's rounding that the
        last bit of the mean decides (a dot of another shape sums in another order)."""
        hub = net.hub(m)
        if net.alone[m] or hub.stop == hub.start:
            return
        rest = 1.0 - net.own[m]
        if received is None:
            mean = (total[m] - net.own[m] * mine[m]) / rest
            self.views[(s, step, m)] = _View(mean, np.abs(mine[m] - mean), {})
            return
        got = received[hub]
        a = net.weights[hub]
        mean = np.array([a @ np.ascontiguousarray(got[:, r]) for r in range(got.shape[1])]) / rest
        spread = np.sqrt(np.mean((got - got.mean(axis=0)) ** 2, axis=0))
        messages = {int(k): got[i] for i, k in enumerate(net.senders[hub])}
        self.views[(s, step, m)] = _View(mean, spread, messages)

    def _bounded(
        self, net: _Net, s: int, step: int, total: np.ndarray, x: np.ndarray
    ) -> np.ndarray:
        """clip-step: each hub's step total - x clipped to tau; tau fixed, or the median of
        its last `window` steps taken (none while fewer: the step as it comes)."""
        if self.defense.kind is not Defend.CLIP_STEP:
            return total
        d = total - x
        norm = np.sqrt(np.einsum("prm,prm->pr", d, d))  # (P, R)
        tau = self.defense["tau"]
        bound = np.full_like(norm, tau if tau > 0 else np.inf)
        if tau <= 0:
            size = int(self.defense["window"])
            window = self.windows.setdefault((s, step), _Window(size, self.agents, self.repeats))
            full = window.count >= size
            bound[full] = np.median(window.taken[:, full], axis=0)
            active = np.flatnonzero(~net.alone)
            slot = window.count[active] % size
            window.taken[slot, active] = np.minimum(norm, bound)[active]
            window.count[active] += 1
        within = norm <= bound
        scale = np.divide(bound, norm, out=np.ones_like(norm), where=~within)
        return np.where(within[..., None], total, x + scale[..., None] * d)


def _capped(v: np.ndarray) -> np.ndarray:
    """Each vector (last axis) longer than attacks.CAP scaled to it; a non-finite one 0."""
    norm = np.sqrt(np.sum(v * v, axis=-1, keepdims=True))
    over = ~(norm <= attacks.CAP)
    safe = np.where(over & np.isfinite(norm), norm, 1.0)
    return np.where(over, np.where(np.isfinite(norm), v * (attacks.CAP / safe), 0.0), v)

"""Time-varying topologies: round i's graph and combination matrix from public inputs.

Every agent expands a `spec.Schedule` itself (no per-round control traffic), and the
orchestrator's engines (memory, oracle, accountant, audit) expand the same one, so all
agree on every round's A_i:

- `one-peer-exponential`: round i links each agent to those at ring distance
  2^((i - 1) mod tau), tau = ceil(log2 P) (Ying et al., NeurIPS 2021, undirected);
- `random-matching`: round i is the union of S random perfect matchings of the members,
  drawn from the public seed and the round (Epidemic Learning's S peers, kept symmetric);
- `matrices`: the user's matrices in turn, round i using number (i - 1) mod L.

Weights follow the rule (metropolis: symmetric, doubly stochastic; averaging: 1/|N_p|);
every a_pp > 0. Agents outside the view's members keep only themselves and no member
hears them: a left-out agent's pairs drop from every later round.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from privnet.agent.spec import STEPS, STRATEGY_STEP, Schedule, StepPlan

Plans = tuple[StepPlan, StepPlan, StepPlan]


@dataclass(frozen=True)
class RoundGraph:
    """One round's A as columns and rows: columns[p] = {m: a_mp} (p's in-weights, p
    included), rows[p] = {k: a_pk} (who listens to p)."""

    columns: tuple[dict[int, float], ...]
    rows: tuple[dict[int, float], ...]

    def senders(self, hub: int) -> list[int]:
        """The hub's in-neighbours this round, itself excluded, sorted."""
        return sorted(m for m in self.columns[hub] if m != hub)

    def dense(self) -> np.ndarray:
        """A as a P x P array (A[m, p] = a_mp)."""
        a = np.zeros((len(self.columns), len(self.columns)))
        for p, column in enumerate(self.columns):
            for m, w in column.items():
                a[m, p] = w
        return a


def period(schedule: Schedule) -> int | None:
    """After how many rounds the graphs repeat (None: a new graph every round)."""
    if schedule.kind == "one-peer-exponential":
        return max(1, math.ceil(math.log2(schedule.agents)))
    if schedule.kind == "matrices":
        return len(schedule.matrices)
    return None


def index(schedule: Schedule, round_: int) -> int:
    """Which graph round `round_` (from 1) uses: rounds with the same index share it."""
    n = period(schedule)
    return round_ if n is None else (round_ - 1) % n


def graph(schedule: Schedule, round_: int) -> RoundGraph:
    """Round `round_`'s graph and weights (cached per graph: every agent of a process and
    every round of a period share one)."""
    return _graph(schedule, index(schedule, round_))


def matrix(schedule: Schedule, round_: int) -> np.ndarray:
    """Round `round_`'s A, P x P, left-stochastic."""
    return graph(schedule, round_).dense()


def plans(schedule: Schedule, round_: int, agent: int) -> Plans:
    """What `agent` does in round `round_`: A_i on the strategy's step, I on the others."""
    g = graph(schedule, round_)
    carrier = STRATEGY_STEP[schedule.strategy]
    out = []
    for j in STEPS:
        if j == carrier:
            out.append(StepPlan(j, dict(g.columns[agent]), dict(g.rows[agent])))
        else:
            out.append(StepPlan(j, {agent: 1.0}, {agent: 1.0}))
    return out[0], out[1], out[2]


def union_plans(schedule: Schedule, first: int, last: int, agent: int) -> Plans:
    """Everyone `agent` may meet at each step in rounds first..last: the pairs keyed once
    per view (links, and the masked schemes' seats). The weights are placeholders (uniform
    over the union); a round's own come from `plans`."""
    ins: dict[int, set[int]] = {j: {agent} for j in STEPS}
    outs: dict[int, set[int]] = {j: {agent} for j in STEPS}
    for round_ in rounds_of(schedule, first, last):
        for plan in plans(schedule, round_, agent):
            ins[plan.step] |= plan.weights_in.keys()
            outs[plan.step] |= plan.weights_out.keys()
    made = [StepPlan(j, _uniform(ins[j]), _uniform(outs[j])) for j in STEPS]
    return made[0], made[1], made[2]


def rounds_of(schedule: Schedule, first: int, last: int) -> range:
    """One round per distinct graph of first..last (all of them without a period)."""
    n = period(schedule)
    return range(first, last + 1 if n is None else min(last, first + n - 1) + 1)


def _uniform(ids: set[int]) -> dict[int, float]:
    return {m: 1.0 / len(ids) for m in sorted(ids)}


@functools.lru_cache(maxsize=256)
def _graph(schedule: Schedule, at: int) -> RoundGraph:
    agents = schedule.agents
    members = sorted(schedule.members) if schedule.members else list(range(agents))
    if schedule.kind == "matrices":
        a = np.array(schedule.matrices[at], dtype=float).reshape(agents, agents)
        return _restricted(a, members)
    if schedule.kind == "one-peer-exponential":
        edges = _ring(agents, 2**at)
    else:
        edges = _matchings(schedule, members, at)
    inside = set(members)
    edges = {(m, k) for m, k in edges if m in inside and k in inside}
    return _weighted(agents, edges, schedule.rule)


def _ring(agents: int, distance: int) -> set[tuple[int, int]]:
    """Each agent and the one `distance` further round the ring (both directions)."""
    edges = set()
    for m in range(agents):
        k = (m + distance) % agents
        if k != m:
            edges.add((min(m, k), max(m, k)))
    return edges


def _matchings(schedule: Schedule, members: list[int], round_: int) -> set[tuple[int, int]]:
    """The union of `peers` random perfect matchings of the members (one left out of each
    when they are odd), from the public seed, the round and the matching's number."""
    edges = set()
    for s in range(schedule.peers):
        draw = np.random.default_rng([schedule.seed, round_, s])
        order = draw.permutation(np.array(members))
        for m, k in zip(order[0::2], order[1::2], strict=False):
            edges.add((min(int(m), int(k)), max(int(m), int(k))))
    return edges


def _weighted(agents: int, edges: set[tuple[int, int]], rule: str) -> RoundGraph:
    near: list[set[int]] = [set() for _ in range(agents)]
    for m, k in edges:
        near[m].add(k)
        near[k].add(m)
    size = [len(n) + 1 for n in near]  # |N_p|, p included
    columns: list[dict[int, float]] = []
    for p in range(agents):
        if rule == "metropolis":
            column = {m: 1.0 / max(size[m], size[p]) for m in sorted(near[p])}
        else:  # averaging: p weighs each of N_p alike
            column = {m: 1.0 / size[p] for m in sorted(near[p])}
        column[p] = 1.0 - sum(column.values())
        columns.append(dict(sorted(column.items())))
    return _with_rows(columns)


def _restricted(a: np.ndarray, members: list[int]) -> RoundGraph:
    """A user's A on the members: others' rows dropped, columns renormalized (each keeps
    its proportions); an agent outside keeps only itself."""
    agents = len(a)
    inside = np.isin(np.arange(agents), members)
    a = a * inside[:, None]
    columns: list[dict[int, float]] = []
    for p in range(agents):
        total = a[:, p].sum() if inside[p] else 0.0
        if total <= 0:
            columns.append({p: 1.0})
            continue
        columns.append({int(m): float(a[m, p] / total) for m in np.flatnonzero(a[:, p])})
    return _with_rows(columns)


def _with_rows(columns: list[dict[int, float]]) -> RoundGraph:
    rows: list[dict[int, float]] = [{} for _ in columns]
    for p, column in enumerate(columns):
        for m, w in column.items():
            rows[m][p] = w
    return RoundGraph(tuple(columns), tuple(dict(sorted(r.items())) for r in rows))

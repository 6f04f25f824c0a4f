"""Time-varying topologies on the orchestrator's side: from the config to the public
`spec.Schedule` every agent expands (privnet.agent.schedule), and the checks and summaries
(union graph, mean matrix) the engines and the plots use.

A schedule is `--topology one-peer-exponential`, `--topology random-matching:S`, or
several user matrices (`--matrix a.txt,b.txt` or a .npy of shape (L, P, P)).
"""

from __future__ import annotations

from dataclasses import replace

import networkx as nx
import numpy as np

from privnet.agent import schedule as expand
from privnet.agent import wire
from privnet.agent.spec import ConfigError, Rekey, Schedule, Scheme, Strategy
from privnet.orchestrator.experiment import seeds, topology
from privnet.orchestrator.experiment.config import ExperimentConfig


def template(config: ExperimentConfig) -> Schedule | None:
    """The run's schedule (strategy ATC, every agent a member), or None for a static one."""
    agents = config.agents
    if config.matrix:
        found = load_matrices(config.matrix)
        if len(found) == 1:
            return None
        numbers, limit = len(found) * agents**2, wire.SETUP_FLOATS // 2  # w0 fits beside
        if numbers > limit:  # every agent's Setup carries them
            raise ConfigError(
                f"--matrix: {len(found)} matrices of {agents} x {agents} are {numbers} numbers; "
                f"every agent's Setup carries them, at most {limit}: give fewer "
                "matrices, or a generated schedule (one-peer-exponential, random-matching:S)"
            )
        flat = tuple(tuple(float(x) for x in a.ravel()) for a in found)
        return Schedule("matrices", agents, Strategy.ATC, matrices=flat)
    kind, peers = topology.parse_topology(config.topology)
    if kind not in topology.TIME_VARYING:
        return None
    if agents < 2:
        raise ConfigError(f"a network needs at least 2 agents, got {agents}")
    seed = seeds.keys(config.seed, seeds.Purpose.SCHEDULE, 0, 1)[0][0]
    return Schedule(kind, agents, Strategy.ATC, config.rule, peers or 0, seed)


def load_matrices(given: str) -> list[np.ndarray]:
    """The matrices of `--matrix`: one file, several comma-separated, or a (L, P, P) .npy."""
    found: list[np.ndarray] = []
    for path in (part.strip() for part in given.split(",")):
        a = topology.load_matrix(path)
        found += list(a) if a.ndim == 3 else [a]
    shapes = {a.shape for a in found}
    if len(shapes) != 1:
        raise ConfigError(
            f"--matrix {given}: the matrices have shapes {sorted(shapes)}; a schedule's "
            "matrices are all P x P for the same P"
        )
    return found


def for_view(made: Schedule, strategy: Strategy, members: frozenset[int] | None = None) -> Schedule:
    """The schedule one session's agents expand: its strategy, the view's members."""
    inside = () if members is None or len(members) == made.agents else tuple(sorted(members))
    return replace(made, strategy=strategy, members=inside)


def union_graph(made: Schedule, first: int, last: int) -> nx.Graph:
    """Every pair some round of first..last links (who may meet: links and keys)."""
    graph: nx.Graph = nx.Graph()
    graph.add_nodes_from(range(made.agents))
    for round_ in expand.rounds_of(made, first, last):
        a = expand.matrix(made, round_)
        graph.add_edges_from((int(m), int(p)) for m, p in np.argwhere((a > 0) | (a.T > 0)) if m < p)
    return graph


def mean_matrix(made: Schedule, first: int, last: int) -> np.ndarray:
    """The mean of the distinct rounds' A over first..last (the Perron weights' source)."""
    rounds = expand.rounds_of(made, first, last)
    return sum((expand.matrix(made, r) for r in rounds), np.zeros((made.agents,) * 2)) / len(rounds)


def check(made: Schedule, rounds: int, scheme: Scheme, rekey: Rekey) -> nx.Graph:
    """ConfigError unless every round's A is left-stochastic with a_mm > 0 and the union
    of the run's graphs is connected; the union graph (laid out on a circle)."""
    if rekey is Rekey.EVERY_ROUND:
        raise ConfigError(
            "a time-varying topology keys its pairs once per view: use --rekey once "
            "(every-round re-keying is not supported on a schedule yet)"
        )
    for round_ in expand.rounds_of(made, 1, rounds):
        a = expand.matrix(made, round_)
        try:
            topology.validate_entries(a)
        except ConfigError as exc:
            raise ConfigError(f"round {round_}'s matrix: {exc}") from None
        zero = [m for m in range(made.agents) if a[m, m] <= 0]
        if zero:
            raise ConfigError(
                f"round {round_}'s matrix has a_mm = 0 for agents {zero}: {scheme} needs every "
                "agent to keep a share of its own model; give each a self weight"
            )
    graph = union_graph(made, 1, rounds)
    if not nx.is_connected(graph):
        parts = nx.number_connected_components(graph)
        raise ConfigError(
            f"the schedule's graphs over {rounds} rounds leave {parts} "
            "groups that never meet; run more rounds or use another schedule"
        )
    layout = nx.circular_layout(graph)
    nx.set_node_attributes(graph, {n: (float(x), float(y)) for n, (x, y) in layout.items()}, "pos")
    return graph

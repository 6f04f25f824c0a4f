"""Graphs and combination matrices: who talks to whom, and with what weights.

Convention (DESIGN.md): A is P x P and left-stochastic. A[m, p] = a_mp >= 0 is the weight
agent p gives to what it receives from neighbour m, so every column sums to 1 and
a_mp > 0 only for m in N_p (the neighbourhood of p, p included).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import networkx as nx
import numpy as np

from privnet.agent.spec import STRATEGY_STEP, WEIGHT_TOL, ConfigError, Scheme, Strategy

# regular is written regular:K (K neighbours each), random-matching:S (S peers a round);
# the others take no parameter.
TOPOLOGIES = (
    "geometric",
    "ring",
    "grid",
    "erdos-renyi",
    "complete",
    "regular",
    "exponential",
    "file",
)
TIME_VARYING = ("one-peer-exponential", "random-matching")  # a graph a round: schedules.py
PARAMETER = {"regular": "K", "random-matching": "S"}  # the kinds written kind:N


def written(kind: str) -> str:
    """How a kind is written: regular:K, random-matching:S, the others as they are."""
    return f"{kind}:{PARAMETER[kind]}" if kind in PARAMETER else kind


RULES = ("metropolis", "averaging")
REDRAWS = 100  # random graphs are redrawn this often before giving up on connectivity
RADIUS_FACTOR = 2.5  # 30 agents -> mean degree ~6, connected on the first draw ~70% of the time
LAYOUT_SEED = 0  # layouts are for plotting only; keep them stable across runs


def default_radius(agents: int) -> float:
    """Radius of the unit-square geometric graph, just above the connectivity threshold."""
    return math.sqrt(RADIUS_FACTOR * math.log(agents) / (math.pi * agents))


def default_p(agents: int) -> float:
    """Edge probability of the Erdos-Renyi graph: twice the connectivity threshold ln(P)/P."""
    return min(1.0, 2 * math.log(agents) / agents)


def parse_topology(name: str) -> tuple[str, int | None]:
    """A topology's name as the config and `--topology` write it: (kind, N), N only for
    regular:K and random-matching:S. Raises ConfigError that says which forms exist."""
    kind, colon, given = name.partition(":")
    if kind not in TOPOLOGIES + TIME_VARYING:
        known = ", ".join(TOPOLOGIES + TIME_VARYING)
        raise ConfigError(f"unknown topology {name!r}; choose one of {known}")
    if kind == "random-matching" and not given.isdigit():
        raise ConfigError(
            f"topology {name!r}: write random-matching:S with S each agent's peers a round, "
            "e.g. random-matching:2"
        )
    if kind not in PARAMETER:
        if colon:
            raise ConfigError(f"topology {kind} takes no parameter: write {kind!r}, not {name!r}")
        return kind, None
    if not given.isdigit():
        raise ConfigError(
            f"topology {name!r}: write regular:K with K each agent's number of neighbours, "
            "e.g. regular:6"
        )
    return kind, int(given)


def make_graph(
    kind: str,
    agents: int,
    seed: int | None = None,
    *,
    radius: float | None = None,
    p: float | None = None,
    path: str | None = None,
) -> nx.Graph:
    """A connected graph on nodes 0..agents-1, each with a `pos` (x, y) in the unit square.

    `radius` is read only by geometric, `p` only by erdos-renyi, `path` only by file, so
    one config can switch topologies without editing the others' settings. Random graphs
    that come out disconnected are redrawn with seed+1, seed+2, ... (the seed used is kept
    in graph.graph["seed"]).
    """
    name = kind
    kind, degree = parse_topology(name)
    if kind in TIME_VARYING:
        raise ConfigError(f"{name} is time-varying: experiment.schedules expands its rounds")
    if agents < 2:
        raise ConfigError(f"a network needs at least 2 agents, got {agents}")
    if kind == "regular":
        graph = _regular(agents, seed, degree or 0)
    elif kind == "exponential":
        graph = _exponential(agents)
    elif kind == "geometric":
        graph = _geometric(agents, seed, default_radius(agents) if radius is None else radius)
    elif kind == "erdos-renyi":
        graph = _erdos_renyi(agents, seed, default_p(agents) if p is None else p)
    elif kind == "ring":
        graph = nx.cycle_graph(agents)
        nx.set_node_attributes(graph, _circle(graph), "pos")
    elif kind == "complete":
        graph = nx.complete_graph(agents)
        nx.set_node_attributes(graph, _circle(graph), "pos")
    elif kind == "grid":
        graph = _grid(agents)
    else:
        graph = _from_file(path, agents)
    graph.graph["kind"] = name
    return graph


def _regular(agents: int, seed: int | None, degree: int) -> nx.Graph:
    """Random `degree`-regular: the degree stays flat however large the network grows."""
    if not 2 <= degree < agents:
        raise ConfigError(
            f"regular:{degree} on {agents} agents: K must be at least 2 (K = 1 pairs agents "
            f"off, never connected) and below the number of agents ({agents})"
        )
    if degree * agents % 2:
        raise ConfigError(
            f"no {degree}-regular graph on {agents} agents: K x agents must be even; "
            f"choose an even K (e.g. regular:{degree + 1}) or an even number of agents"
        )

    def draw(s: int | None) -> nx.Graph:
        return nx.random_regular_graph(degree, agents, seed=s)

    graph = _connected_draw(draw, seed, f"choose a larger K than {degree} or another seed")
    nx.set_node_attributes(graph, _circle(graph), "pos")
    graph.graph["degree"] = degree
    return graph


def _exponential(agents: int) -> nx.Graph:
    """Each agent's neighbours at ring distances 1, 2, 4, ... (Ying et al., NeurIPS 2021),
    both ways: degree about 2 log2(agents)."""
    graph: nx.Graph[int] = nx.Graph()
    graph.add_nodes_from(range(agents))
    hop = 1
    while hop < agents:
        graph.add_edges_from((p, (p + hop) % agents) for p in range(agents))
        hop *= 2
    nx.set_node_attributes(graph, _circle(graph), "pos")
    return graph


def _geometric(agents: int, seed: int | None, radius: float) -> nx.Graph:
    if not (radius > 0 and math.isfinite(radius)):
        raise ConfigError(f"radius must be a positive number, got {radius}")

    def draw(s: int | None) -> nx.Graph:
        graph = nx.random_geometric_graph(agents, radius, seed=s)
        for node, xy in nx.get_node_attributes(graph, "pos").items():
            graph.nodes[node]["pos"] = (float(xy[0]), float(xy[1]))
        graph.graph["radius"] = radius
        return graph

    hint = f"raise --radius above {radius:.3g} (the default for {agents} agents is "
    hint += f"{default_radius(agents):.3g}) or choose another seed"
    return _connected_draw(draw, seed, hint)


def _erdos_renyi(agents: int, seed: int | None, p: float) -> nx.Graph:
    if not 0 < p <= 1:
        raise ConfigError(f"edge probability p must be in (0, 1], got {p}")

    def draw(s: int | None) -> nx.Graph:
        graph = nx.gnp_random_graph(agents, p, seed=s)
        graph.graph["p"] = p
        return graph

    hint = f"raise p above {p:.3g} (the default for {agents} agents is {default_p(agents):.3g})"
    graph = _connected_draw(draw, seed, hint)
    nx.set_node_attributes(graph, _spring(graph), "pos")
    return graph


def _connected_draw(
    draw: Callable[[int | None], nx.Graph], seed: int | None, hint: str
) -> nx.Graph:
    """Draw until connected: seed, seed+1, ... so a given seed always yields the same graph."""
    for attempt in range(REDRAWS):
        s = None if seed is None else seed + attempt
        graph = draw(s)
        if nx.is_connected(graph):
            graph.graph["seed"] = s
            return graph
    raise ConfigError(
        f"no connected graph in {REDRAWS} draws (last one has "
        f"{nx.number_connected_components(graph)} components); {hint}"
    )


def _grid(agents: int) -> nx.Graph:
    rows = max(d for d in range(1, math.isqrt(agents) + 1) if agents % d == 0)
    if rows == 1:
        raise ConfigError(
            f"a grid of {agents} agents would be a single row ({agents} is prime); "
            "choose a count with a divisor > 1 (e.g. 30 = 5 x 6) or another topology"
        )
    cols = agents // rows
    graph = nx.convert_node_labels_to_integers(nx.grid_2d_graph(rows, cols), ordering="sorted")
    for node in graph:
        r, c = divmod(node, cols)
        graph.nodes[node]["pos"] = (c / (cols - 1), r / (rows - 1))
    graph.graph["shape"] = (rows, cols)
    return graph


def _from_file(path: str | None, agents: int) -> nx.Graph:
    if path is None:
        raise ConfigError("the file topology needs the path of an edge-list file ('a b' per line)")
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"cannot read edge list {path}: {err.strerror}; check the path") from err
    graph: nx.Graph[int] = nx.Graph()
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 2 or not all(f.isdigit() for f in fields):
            raise ConfigError(
                f"{path}:{number}: expected two agent ids 'a b', got {line.strip()!r}; "
                "write one edge per line as two non-negative integers (# starts a comment)"
            )
        a, b = int(fields[0]), int(fields[1])
        if a == b:
            raise ConfigError(
                f"{path}:{number}: self-loop {a} {b}; every agent keeps its own model "
                "anyway, remove this line"
            )
        graph.add_edge(a, b)
    ids = set(graph.nodes)
    if ids != set(range(len(ids))):
        raise ConfigError(
            f"{path}: agent ids must be exactly 0..P-1, got {len(ids)} ids from {min(ids)} "
            f"to {max(ids)}; renumber them from 0 (subtract 1 if the file counts from 1)"
        )
    if len(ids) != agents:
        raise ConfigError(
            f"{path} describes {len(ids)} agents but {agents} were asked for; "
            f"set agents = {len(ids)} or use another file"
        )
    ordered: nx.Graph[int] = nx.Graph()
    ordered.add_nodes_from(range(agents))
    ordered.add_edges_from(graph.edges)
    if not nx.is_connected(ordered):
        raise ConfigError(
            f"{path}: the graph has {nx.number_connected_components(ordered)} components; "
            "add edges so every agent can reach every other"
        )
    nx.set_node_attributes(ordered, _spring(ordered), "pos")
    ordered.graph["path"] = str(path)
    return ordered


def _circle(graph: nx.Graph) -> dict[int, tuple[float, float]]:
    return _tuples(nx.circular_layout(graph, scale=0.5, center=(0.5, 0.5)))


def _spring(graph: nx.Graph) -> dict[int, tuple[float, float]]:
    layout = nx.spring_layout(graph, seed=LAYOUT_SEED, scale=0.5, center=(0.5, 0.5))
    return _tuples(layout)


def _tuples(layout: dict) -> dict[int, tuple[float, float]]:
    return {node: (float(xy[0]), float(xy[1])) for node, xy in layout.items()}


def _adjacency(graph: nx.Graph) -> np.ndarray:
    """0/1 adjacency on nodes 0..P-1, without self-loops (a_pp is set by the rule)."""
    agents = graph.number_of_nodes()
    if set(graph.nodes) != set(range(agents)):
        raise ConfigError("graph nodes must be 0..P-1; build the graph with make_graph")
    adj = np.zeros((agents, agents))
    for m, p in graph.edges:
        adj[m, p] = adj[p, m] = 1.0
    np.fill_diagonal(adj, 0.0)
    return adj


def combination_matrix(graph: nx.Graph, rule: str) -> np.ndarray:
    """Left-stochastic A on the graph: metropolis (symmetric) or averaging (1/|N_p|)."""
    adj = _adjacency(graph)
    size = adj.sum(axis=0) + 1.0  # n_p = |N_p|, p included
    if rule == "metropolis":
        a = adj / np.maximum.outer(size, size)
        np.fill_diagonal(a, 1.0 - a.sum(axis=0))
        return a
    if rule == "averaging":
        return (adj + np.eye(len(size))) / size[np.newaxis, :]
    raise ConfigError(f"unknown combination rule {rule!r}; choose one of {', '.join(RULES)}")


def load_matrix(path: str) -> np.ndarray:
    """A user-given A from .npy, or from text with one row per line (spaces or commas)."""
    file = Path(path)
    try:
        if file.suffix == ".npy":
            matrix = np.load(file, allow_pickle=False)
        else:
            lines = file.read_text().splitlines()
            rows = [line.split("#", 1)[0].replace(",", " ").split() for line in lines]
            matrix = np.array([[float(x) for x in row] for row in rows if row])
    except OSError as err:
        raise ConfigError(f"cannot read matrix {path}: {err}; check the path") from err
    except ValueError as err:
        raise ConfigError(
            f"cannot parse matrix {path}: {err}; write one row of A per line, numbers "
            "separated by spaces or commas, every row the same length"
        ) from err
    return np.asarray(matrix, dtype=float)


def graph_of(a: np.ndarray) -> nx.Graph:
    """The undirected support graph of a user-given A: edge m-p if a_mp > 0 or a_pm > 0."""
    _check_square(a)
    support = (a > 0) | (a.T > 0)
    np.fill_diagonal(support, False)
    graph: nx.Graph[int] = nx.Graph()
    graph.add_nodes_from(range(a.shape[0]))
    graph.add_edges_from((int(m), int(p)) for m, p in np.argwhere(np.triu(support)))
    nx.set_node_attributes(graph, _spring(graph), "pos")
    graph.graph["kind"] = "matrix"
    return graph


def _check_square(a: np.ndarray) -> None:
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ConfigError(
            f"A must be a square P x P matrix, got shape {a.shape}; "
            "give one row and one column per agent"
        )


def validate(
    a: np.ndarray,
    graph: nx.Graph | None = None,
    *,
    scheme: str = "none",
    tol: float = WEIGHT_TOL,
) -> None:
    """Raise ConfigError (what is wrong, how to fix it) unless A can run on the graph."""
    try:
        scheme = Scheme(scheme)
    except ValueError:
        valid = ", ".join(s.value for s in Scheme)
        raise ConfigError(f"unknown scheme {scheme!r}; choose one of {valid}") from None
    a = np.asarray(a, dtype=float)
    _check_square(a)
    agents = a.shape[0]
    if graph is not None:
        _check_graph(a, graph)
    _check_entries(a, tol)
    if graph is not None:
        _check_support(a, graph)
    _check_primitive(a)
    zero = [m for m in range(agents) if a[m, m] <= 0]
    if zero:
        # The agent core keeps its own term in every combination, so all schemes need it.
        why = (
            f"{scheme}'s self-term needs a_mm > 0"
            if scheme.homomorphic
            else ("privnet's agents always keep a share of their own model (a_mm > 0)")
        )
        raise ConfigError(
            f"a_mm = 0 for agents {zero}: {why}; use metropolis or averaging, or give "
            f"agent {zero[0]} a self weight"
        )


def validate_entries(a: np.ndarray, tol: float = WEIGHT_TOL) -> None:
    """ConfigError unless A is square, finite, non-negative and left-stochastic (one round
    of a schedule need not be connected: only `validate` asks for primitivity)."""
    _check_square(np.asarray(a))
    _check_entries(np.asarray(a, dtype=float), tol)


def _check_graph(a: np.ndarray, graph: nx.Graph) -> None:
    if graph.number_of_nodes() != a.shape[0]:
        raise ConfigError(
            f"A is {a.shape[0]} x {a.shape[0]} but the graph has {graph.number_of_nodes()} "
            "agents; give one row and one column of A per agent"
        )
    if not nx.is_connected(graph):
        raise ConfigError(
            f"the graph has {nx.number_connected_components(graph)} components, so some "
            "agents can never learn from others; use a larger --radius or another topology"
        )


def _check_entries(a: np.ndarray, tol: float) -> None:
    bad = np.argwhere(~np.isfinite(a))
    if len(bad):
        m, p = bad[0]
        raise ConfigError(
            f"a_{m},{p} = {a[m, p]} is not a finite number; every weight must be a real number"
        )
    negative = np.argwhere(a < 0)
    if len(negative):
        m, p = negative[0]
        raise ConfigError(
            f"a_{m},{p} = {a[m, p]:.6g} is negative; combination weights must be >= 0 "
            "(set it to 0 or use rule metropolis or averaging)"
        )
    sums = a.sum(axis=0)
    off = np.flatnonzero(np.abs(sums - 1.0) > tol)
    if len(off):
        p = off[0]
        raise ConfigError(
            f"column {p} of A sums to {sums[p]:.12g}, not 1 "
            "(a_mp: weight agent p gives to m; columns must sum to 1 (left-stochastic)); "
            f"rescale column {p}, or transpose A if its rows are the ones that sum to 1"
        )


def _check_support(a: np.ndarray, graph: nx.Graph) -> None:
    for m, p in np.argwhere(a > 0):
        if m != p and not graph.has_edge(int(m), int(p)):
            raise ConfigError(
                f"a_{m},{p} = {a[m, p]:.6g} but agents {m} and {p} are not neighbours; "
                f"set a_{m},{p} = 0 or add the edge {m}-{p} to the graph"
            )


def _check_primitive(a: np.ndarray) -> None:
    """Primitive = irreducible (support digraph strongly connected) and aperiodic."""
    flow: nx.DiGraph[int] = nx.DiGraph()
    flow.add_nodes_from(range(a.shape[0]))
    flow.add_edges_from((int(m), int(p)) for m, p in np.argwhere(a > 0))  # m -> p: p hears m
    if not nx.is_strongly_connected(flow):
        parts = nx.number_strongly_connected_components(flow)
        raise ConfigError(
            f"A is reducible: its weights split the agents into {parts} groups that do not "
            "all hear each other; give positive weight a_mp to more graph edges "
            "(e.g. use rule metropolis or averaging)"
        )
    if not nx.is_aperiodic(flow):
        raise ConfigError(
            "A is periodic (not primitive), so the iterates oscillate instead of agreeing; "
            "give some agent a self weight a_pp > 0"
        )


DENSE_PERRON = 2000  # agents; above, a sparse solve (dense least squares is O(P^3))


def _unit(n: int) -> np.ndarray:
    e = np.zeros(n)
    e[-1] = 1.0
    return e


def perron(a: np.ndarray) -> np.ndarray:
    """q with A q = q, q > 0, sum(q) = 1: the weights of the network centroid w_c."""
    validate(a)
    a = np.asarray(a, dtype=float)
    agents = a.shape[0]
    if agents > DENSE_PERRON:  # (A - I) q = 0 with sum(q) = 1 in place of one row: sparse
        from scipy.sparse import csr_matrix, vstack
        from scipy.sparse.linalg import spsolve

        rows = csr_matrix(a)[:-1] - csr_matrix(np.eye(agents)[:-1])
        q = spsolve(vstack([rows, csr_matrix(np.ones((1, agents)))]).tocsc(), _unit(agents))
    else:
        system = np.vstack([a - np.eye(agents), np.ones((1, agents))])
        rhs = np.zeros(agents + 1)
        rhs[-1] = 1.0
        q = np.linalg.lstsq(system, rhs, rcond=None)[0]
    for _ in range(3):  # polish: each step keeps q a fixed point and removes rounding drift
        q = a @ q
        q /= q.sum()
    return q


def strategy_matrices(
    strategy: Strategy | str, a: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A0, A1, A2) of eqs. preComb/update/postComb: A on the strategy's step, I elsewhere."""
    try:
        step = STRATEGY_STEP[Strategy(strategy)]
    except ValueError:
        valid = ", ".join(s.value for s in Strategy)
        raise ConfigError(f"unknown strategy {strategy!r}; choose one of {valid}") from None
    a = np.asarray(a, dtype=float)
    eye = np.eye(a.shape[0])
    a0, a1, a2 = (a.copy() if j == step else eye.copy() for j in range(3))
    return a0, a1, a2

"""Graphs, combination matrices, validation messages and the ghp cancellation condition."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privnet.agent.spec import ConfigError, Scheme, Strategy
from privnet.orchestrator.experiment.topology import (
    RULES,
    TOPOLOGIES,
    combination_matrix,
    default_radius,
    graph_of,
    load_matrix,
    make_graph,
    perron,
    strategy_matrices,
    validate,
)

TOL = 1e-12
RANDOM_KINDS = ("geometric", "erdos-renyi")
# every topology as a config names it (regular with a degree every size below can take)
BUILT_KINDS = tuple(k if k != "regular" else "regular:2" for k in TOPOLOGIES if k != "file")
FAST = settings(max_examples=40, deadline=None)

seeds = st.integers(min_value=0, max_value=2**31)
sizes = st.integers(min_value=2, max_value=40)
grid_sizes = st.sampled_from([4, 6, 8, 9, 12, 15, 16, 20, 24, 30, 36])


def support(graph: nx.Graph) -> np.ndarray:
    """Expected support of A: the graph's edges both ways plus every self weight."""
    adj = nx.to_numpy_array(graph, nodelist=range(graph.number_of_nodes()), weight=None)
    return (adj + np.eye(len(adj))) > 0


def star(leaves: int) -> nx.Graph:
    """Hub 0 with `leaves` leaves: the most non-regular connected graph."""
    return nx.star_graph(leaves)


def ghp_residual(a: np.ndarray, q: np.ndarray | None = None) -> float:
    """max_m |sum_p q_p a_mp c_mp|: how far ghp's noise is from cancelling in the centroid.

    Sender m sends w_m + g_m to every neighbour (c_mp = 1) and adds -(1-a_mm)/a_mm g_m to
    its own term (c_mm), so the sum is (A q)_m - q_m = 0 for any primitive left-stochastic
    A with a_mm > 0.
    """
    a = np.asarray(a, dtype=float)
    validate(a, scheme=Scheme.GHP)
    if q is None:
        q = perron(a)
    factor = np.ones_like(a)
    diag = np.diag(a)
    np.fill_diagonal(factor, -(1.0 - diag) / diag)
    return float(np.max(np.abs((a * factor) @ np.asarray(q, dtype=float))))


def paper_ghp_residual(a: np.ndarray, q: np.ndarray) -> float:
    """eq. GHP-noise as printed: sender m scales g_m by a_mp/a_pm towards receiver p."""
    factor = np.divide(a, a.T, out=np.zeros_like(a), where=a.T > 0)
    diag = np.diag(a)
    np.fill_diagonal(factor, -(1.0 - diag) / diag)
    return float(np.max(np.abs((a * factor) @ q)))


# --- graphs -------------------------------------------------------------------------------


@FAST
@given(kind=st.sampled_from(RANDOM_KINDS), agents=sizes, seed=seeds)
def test_random_graphs_connected_with_nodes_0_to_p(kind: str, agents: int, seed: int) -> None:
    graph = make_graph(kind, agents, seed)
    assert sorted(graph.nodes) == list(range(agents))
    assert nx.is_connected(graph)
    assert all(len(graph.nodes[n]["pos"]) == 2 for n in graph)


@pytest.mark.parametrize("kind", BUILT_KINDS)
@pytest.mark.parametrize("agents", [4, 9, 30])
def test_every_topology_connected_with_positions(kind: str, agents: int) -> None:
    graph = make_graph(kind, agents, seed=7)
    assert sorted(graph.nodes) == list(range(agents))
    assert nx.is_connected(graph)
    assert nx.number_of_selfloops(graph) == 0
    for node in graph:
        x, y = graph.nodes[node]["pos"]
        assert isinstance(x, float) and isinstance(y, float)
        assert -1e-9 <= x <= 1 + 1e-9 and -1e-9 <= y <= 1 + 1e-9
    assert graph.graph["kind"] == kind


@pytest.mark.parametrize("kind", RANDOM_KINDS)
def test_same_seed_same_graph(kind: str) -> None:
    a, b = make_graph(kind, 30, seed=3), make_graph(kind, 30, seed=3)
    assert sorted(a.edges) == sorted(b.edges)
    assert a.graph["seed"] == b.graph["seed"] >= 3


def test_default_geometric_degree_for_the_papers_30_agents() -> None:
    degrees = [np.mean([d for _, d in make_graph("geometric", 30, s).degree]) for s in range(20)]
    assert 4 <= np.mean(degrees) <= 7


def test_geometric_redraws_disconnected_draws_with_the_next_seed() -> None:
    radius = default_radius(30)
    start = next(
        s for s in range(100) if not nx.is_connected(nx.random_geometric_graph(30, radius, seed=s))
    )
    graph = make_graph("geometric", 30, seed=start)
    used = graph.graph["seed"]
    assert used > start
    assert sorted(graph.edges) == sorted(nx.random_geometric_graph(30, radius, seed=used).edges)


@FAST
@given(
    agents=st.integers(min_value=8, max_value=300), degree=st.sampled_from([3, 4, 6]), seed=seeds
)
def test_regular_keeps_the_degree_flat(agents: int, degree: int, seed: int) -> None:
    """regular:K: every agent has exactly K neighbours, at any size (K x agents even)."""
    agents += (degree * agents) % 2
    graph = make_graph(f"regular:{degree}", agents, seed)
    assert {d for _, d in graph.degree} == {degree}
    assert nx.is_connected(graph)
    assert sorted(graph.edges) == sorted(make_graph(f"regular:{degree}", agents, seed).edges)
    a = combination_matrix(graph, "metropolis")
    validate(a, graph, scheme=Scheme.MASKED_GHP)
    assert np.allclose(a, a.T)  # metropolis on a regular graph: doubly stochastic


@FAST
@given(agents=st.integers(min_value=2, max_value=600))
def test_exponential_neighbours_are_powers_of_two_around_the_ring(agents: int) -> None:
    graph = make_graph("exponential", agents)
    hops = {2**k for k in range(agents.bit_length()) if 2**k < agents}
    for p in (0, agents // 2, agents - 1):
        expected = {(p + h) % agents for h in hops} | {(p - h) % agents for h in hops}
        assert set(graph.neighbors(p)) == expected - {p}
    assert max(d for _, d in graph.degree) <= 2 * len(hops)
    validate(combination_matrix(graph, "averaging"), graph, scheme=Scheme.GHP)


@pytest.mark.parametrize(
    ("name", "agents", "words"),
    [
        ("regular", 30, "write regular:K"),
        ("regular:six", 30, "write regular:K"),
        ("regular:1", 30, "K must be at least 2"),
        ("regular:30", 30, "below the number of agents"),
        ("regular:5", 31, "K x agents must be even"),
        ("ring:3", 30, "takes no parameter"),
        ("torus", 30, "unknown topology 'torus'"),
    ],
)
def test_a_bad_topology_name_says_how_to_write_it(name: str, agents: int, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        make_graph(name, agents, seed=1)


def test_the_degree_of_regular_and_exponential_against_geometric() -> None:
    """The reason for flat-degree graphs (issue 31): geometric's degree grows with P."""

    def mean_degree(kind: str, agents: int) -> float:
        return float(np.mean([d for _, d in make_graph(kind, agents, seed=1).degree]))

    assert mean_degree("regular:6", 30) == mean_degree("regular:6", 1000) == 6
    assert mean_degree("exponential", 1000) == 2 * 10  # hops 1 .. 512 both ways
    assert mean_degree("geometric", 1000) > 2 * mean_degree("geometric", 30)


def test_shapes_of_deterministic_topologies() -> None:
    assert make_graph("ring", 10).number_of_edges() == 10
    assert make_graph("complete", 6).number_of_edges() == 15
    grid = make_graph("grid", 30)
    assert grid.graph["shape"] == (5, 6)
    assert grid.number_of_edges() == 5 * 5 + 4 * 6
    assert nx.is_isomorphic(grid, nx.grid_2d_graph(5, 6))


@pytest.mark.parametrize("agents", [2, 3, 7, 29, 31])
def test_grid_with_prime_count_errors(agents: int) -> None:
    with pytest.raises(ConfigError, match=r"prime.*another topology"):
        make_graph("grid", agents)


def test_unknown_topology_lists_valid_ones() -> None:
    with pytest.raises(
        ConfigError,
        match="geometric, ring, grid, erdos-renyi, complete, regular, exponential, file",
    ):
        make_graph("star", 10)


@pytest.mark.parametrize("agents", [1, 0, -3])
def test_too_few_agents(agents: int) -> None:
    with pytest.raises(ConfigError, match="at least 2 agents"):
        make_graph("ring", agents)


def test_geometric_radius_too_small_says_raise_radius() -> None:
    with pytest.raises(ConfigError, match=r"raise --radius"):
        make_graph("geometric", 30, seed=0, radius=0.01)


@pytest.mark.parametrize("radius", [0.0, -0.1, float("nan")])
def test_geometric_bad_radius(radius: float) -> None:
    with pytest.raises(ConfigError, match="radius must be a positive number"):
        make_graph("geometric", 10, radius=radius)


def test_erdos_renyi_p_too_small_says_raise_p() -> None:
    with pytest.raises(ConfigError, match="raise p"):
        make_graph("erdos-renyi", 30, seed=0, p=0.001)


@pytest.mark.parametrize("p", [0.0, 1.5, -0.2])
def test_erdos_renyi_bad_p(p: float) -> None:
    with pytest.raises(ConfigError, match=r"p must be in \(0, 1\]"):
        make_graph("erdos-renyi", 10, p=p)


# --- edge-list files ------------------------------------------------------------------------


def test_file_roundtrip(tmp_path: Path) -> None:
    original = make_graph("geometric", 20, seed=5)
    path = tmp_path / "edges.txt"
    lines = ["# written by the test", ""] + [f"{a} {b}  # edge" for a, b in original.edges]
    path.write_text("\n".join(lines) + "\n")
    loaded = make_graph("file", 20, path=str(path))
    assert sorted(loaded.nodes) == list(range(20))
    assert {frozenset(e) for e in loaded.edges} == {frozenset(e) for e in original.edges}
    assert all("pos" in loaded.nodes[n] for n in loaded)
    assert np.array_equal(
        combination_matrix(loaded, "averaging"), combination_matrix(original, "averaging")
    )


@pytest.mark.parametrize(
    ("text", "agents", "fragment"),
    [
        ("1 2\n2 3\n3 1\n", 3, "renumber them from 0"),
        ("0 1\n1 2\n", 4, "set agents = 3"),
        ("0 1\n1 x\n", 3, r":2: expected two agent ids"),
        ("0 1 2\n", 3, "one edge per line"),
        ("0 1\n1 1\n", 2, "remove this line"),
        ("0 1\n2 3\n", 4, "2 components; add edges"),
    ],
)
def test_bad_edge_list(tmp_path: Path, text: str, agents: int, fragment: str) -> None:
    path = tmp_path / "edges.txt"
    path.write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        make_graph("file", agents, path=str(path))


def test_file_topology_needs_a_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs the path"):
        make_graph("file", 3)
    with pytest.raises(ConfigError, match="check the path"):
        make_graph("file", 3, path=str(tmp_path / "missing.txt"))


# --- combination matrices -----------------------------------------------------------------


@FAST
@given(kind=st.sampled_from(RANDOM_KINDS), agents=sizes, seed=seeds)
def test_metropolis_symmetric_doubly_stochastic(kind: str, agents: int, seed: int) -> None:
    graph = make_graph(kind, agents, seed)
    a = combination_matrix(graph, "metropolis")
    assert np.allclose(a, a.T, atol=0, rtol=0)
    assert np.max(np.abs(a.sum(axis=0) - 1)) <= TOL
    assert np.max(np.abs(a.sum(axis=1) - 1)) <= TOL
    assert np.all(np.diag(a) > 0)
    assert np.array_equal(a > 0, support(graph))
    for m, p in graph.edges:
        assert a[m, p] == 1 / max(graph.degree[m] + 1, graph.degree[p] + 1)
    validate(a, graph, scheme="ghp")


@FAST
@given(kind=st.sampled_from(RANDOM_KINDS), agents=sizes, seed=seeds)
def test_averaging_left_stochastic(kind: str, agents: int, seed: int) -> None:
    graph = make_graph(kind, agents, seed)
    a = combination_matrix(graph, "averaging")
    assert np.max(np.abs(a.sum(axis=0) - 1)) <= TOL
    assert np.all(np.diag(a) > 0)
    assert np.array_equal(a > 0, support(graph))
    for p in range(agents):
        assert np.allclose(a[a[:, p] > 0, p], 1 / (graph.degree[p] + 1), rtol=0, atol=TOL)
    validate(a, graph, scheme="ghp")


def test_averaging_not_symmetric_on_non_regular_graph() -> None:
    a = combination_matrix(star(4), "averaging")
    assert a[1, 0] == pytest.approx(1 / 5)  # the hub weighs each of its 5 neighbourhood
    assert a[0, 1] == pytest.approx(1 / 2)  # a leaf weighs the hub and itself
    assert not np.allclose(a, a.T)
    assert np.abs(a.sum(axis=1) - 1).max() > 0.5  # rows do not sum to 1: not doubly stochastic


def test_metropolis_on_a_star_by_hand() -> None:
    a = combination_matrix(star(3), "metropolis")
    expected = np.array([[1, 1, 1, 1], [1, 3, 0, 0], [1, 0, 3, 0], [1, 0, 0, 3]]) / 4
    assert np.allclose(a, expected, rtol=0, atol=TOL)


def test_unknown_rule_lists_valid_ones() -> None:
    with pytest.raises(ConfigError, match="metropolis, averaging"):
        combination_matrix(star(3), "laplacian")


def test_combination_matrix_needs_nodes_0_to_p() -> None:
    with pytest.raises(ConfigError, match=r"0\.\.P-1"):
        combination_matrix(nx.path_graph(["a", "b", "c"]), "metropolis")


# --- Perron vector and strategies ------------------------------------------------------------


@FAST
@given(kind=st.sampled_from(RANDOM_KINDS), agents=sizes, seed=seeds, rule=st.sampled_from(RULES))
def test_perron_vector(kind: str, agents: int, seed: int, rule: str) -> None:
    a = combination_matrix(make_graph(kind, agents, seed), rule)
    q = perron(a)
    assert np.max(np.abs(a @ q - q)) <= TOL
    assert np.all(q > 0)
    assert abs(q.sum() - 1) <= TOL


def test_perron_of_averaging_is_degree_proportional() -> None:
    graph = make_graph("geometric", 30, seed=11)
    q = perron(combination_matrix(graph, "averaging"))
    size = np.array([graph.degree[p] + 1 for p in range(30)], dtype=float)
    assert np.allclose(q, size / size.sum(), rtol=0, atol=TOL)
    q_metropolis = perron(combination_matrix(graph, "metropolis"))
    assert np.allclose(q_metropolis, 1 / 30, rtol=0, atol=TOL)


def test_perron_validates_first() -> None:
    with pytest.raises(ConfigError, match="reducible"):
        perron(np.eye(3))


@pytest.mark.parametrize("strategy", [*Strategy, "consensus", "cta", "atc"])
def test_strategy_matrices(strategy: Strategy | str) -> None:
    a = combination_matrix(star(3), "averaging")
    mats = strategy_matrices(strategy, a)
    where = {"consensus": 0, "cta": 1, "atc": 2}[str(strategy)]
    for j, m in enumerate(mats):
        assert np.array_equal(m, a if j == where else np.eye(4))
    mats[where][0, 0] = 99.0
    assert a[0, 0] != 99.0  # callers get copies


def test_unknown_strategy() -> None:
    with pytest.raises(ConfigError, match="consensus, cta, atc"):
        strategy_matrices("diffusion", np.eye(2))


# --- the graph-homomorphic condition ------------------------------------------------------


@FAST
@given(kind=st.sampled_from(RANDOM_KINDS), agents=sizes, seed=seeds, rule=st.sampled_from(RULES))
def test_ghp_condition_holds_for_any_rule(kind: str, agents: int, seed: int, rule: str) -> None:
    a = combination_matrix(make_graph(kind, agents, seed), rule)
    assert ghp_residual(a) <= TOL


@FAST
@given(seed=seeds, agents=st.integers(min_value=3, max_value=12))
def test_ghp_condition_holds_for_random_primitive_matrices(seed: int, agents: int) -> None:
    gen = np.random.default_rng(seed)
    a = gen.uniform(0.01, 1.0, (agents, agents)) * (gen.uniform(size=(agents, agents)) < 0.6)
    a[np.diag_indices(agents)] = gen.uniform(0.05, 1.0, agents)
    a += np.roll(np.eye(agents), 1, axis=0) * 0.1  # a directed cycle: strongly connected
    a /= a.sum(axis=0, keepdims=True)
    assert ghp_residual(a) <= TOL


def test_ghp_residual_detects_a_wrong_q() -> None:
    a = combination_matrix(star(4), "averaging")
    assert ghp_residual(a, np.full(5, 1 / 5)) > 0.05


def test_papers_ghp_factor_fails_for_averaging() -> None:
    """Documentation: eq. GHP-noise's a_pm/a_mp factor only cancels for doubly-stochastic A."""
    graph = make_graph("geometric", 30, seed=11)
    metropolis = combination_matrix(graph, "metropolis")
    averaging = combination_matrix(graph, "averaging")
    assert paper_ghp_residual(metropolis, perron(metropolis)) <= TOL
    assert paper_ghp_residual(averaging, perron(averaging)) > 1e-3
    assert ghp_residual(averaging) <= TOL


# --- validate: every bad configuration says what to do ---------------------------------------


def good() -> tuple[np.ndarray, nx.Graph]:
    graph = make_graph("ring", 5)
    return combination_matrix(graph, "metropolis"), graph


def test_validate_accepts_the_builders_output() -> None:
    a, graph = good()
    validate(a, graph, scheme="ghp")
    validate(a, scheme="local-ghp")


def test_validate_not_square() -> None:
    with pytest.raises(ConfigError, match=r"square P x P.*one row and one column per agent"):
        validate(np.ones((2, 3)) / 2)
    with pytest.raises(ConfigError, match="square"):
        validate(np.ones(4))


def test_validate_wrong_size_for_graph() -> None:
    a, _ = good()
    with pytest.raises(ConfigError, match="A is 5 x 5 but the graph has 6 agents"):
        validate(a, make_graph("ring", 6))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_validate_non_finite(value: float) -> None:
    a, graph = good()
    a[1, 2] = value
    with pytest.raises(ConfigError, match=r"a_1,2 = .* not a finite number; every weight"):
        validate(a, graph)


def test_validate_negative() -> None:
    a, graph = good()
    a[1, 0] -= 0.5
    a[0, 0] += 0.5
    with pytest.raises(ConfigError, match=r"a_1,0 = -.*must be >= 0.*set it to 0"):
        validate(a, graph)


def test_validate_column_sum_names_column_and_sum() -> None:
    a, graph = good()
    a[3, 3] += 0.25
    with pytest.raises(ConfigError) as err:
        validate(a, graph)
    message = str(err.value)
    assert "column 3 of A sums to 1.25" in message
    assert "a_mp: weight agent p gives to m; columns must sum to 1 (left-stochastic)" in message
    assert "transpose A" in message


def test_validate_row_stochastic_matrix_suggests_transpose() -> None:
    a = combination_matrix(star(4), "averaging").T
    with pytest.raises(ConfigError, match="transpose A if its rows"):
        validate(a)


def test_validate_tolerance() -> None:
    a, graph = good()
    a[0, 0] += 1e-11
    validate(a, graph)
    with pytest.raises(ConfigError, match="column 0"):
        validate(a, graph, tol=1e-13)


def test_validate_weight_on_non_edge_names_m_and_p() -> None:
    graph = make_graph("ring", 5)
    a = combination_matrix(make_graph("complete", 5), "metropolis")
    with pytest.raises(ConfigError, match=r"agents 0 and 2 are not neighbours.*add the edge 0-2"):
        validate(a, graph)


def test_validate_disconnected_graph() -> None:
    graph = nx.union(nx.path_graph(3), nx.path_graph([3, 4]))
    a = np.eye(5)
    with pytest.raises(ConfigError, match=r"2 components.*larger --radius or another topology"):
        validate(a, graph)


def test_validate_reducible() -> None:
    graph = make_graph("ring", 4)
    a = np.eye(4)
    a[:, 1] = [0.5, 0.5, 0, 0]  # 1 hears 0, but nobody hears 1
    with pytest.raises(ConfigError, match=r"reducible.*give positive weight a_mp to more"):
        validate(a, graph)


def test_validate_periodic() -> None:
    a = np.array([[0.0, 1.0], [1.0, 0.0]])
    with pytest.raises(ConfigError, match=r"periodic.*self weight a_pp > 0"):
        validate(a, make_graph("ring", 2))


def test_validate_ghp_needs_self_weights() -> None:
    a = (np.ones((3, 3)) - np.eye(3)) / 2  # primitive (cycles of length 2 and 3), a_mm = 0
    with pytest.raises(ConfigError, match="always keep a share of their own model"):
        validate(a, make_graph("complete", 3))
    with pytest.raises(ConfigError) as err:
        validate(a, make_graph("complete", 3), scheme="ghp")
    message = str(err.value)
    assert "ghp's self-term needs a_mm > 0" in message
    assert "use metropolis or averaging, or give agent 0 a self weight" in message
    with pytest.raises(ConfigError, match="self-term"):
        ghp_residual(a)


def test_validate_unknown_scheme() -> None:
    a, graph = good()
    with pytest.raises(ConfigError, match="none, random, ghp, local-ghp"):
        validate(a, graph, scheme="dp")


# --- user-given matrices ------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".npy", ".txt", ".csv"])
def test_load_matrix_roundtrip(tmp_path: Path, suffix: str) -> None:
    a = combination_matrix(make_graph("geometric", 12, seed=2), "averaging")
    path = tmp_path / f"A{suffix}"
    if suffix == ".npy":
        np.save(path, a)
    else:
        np.savetxt(path, a, delimiter="," if suffix == ".csv" else " ", header="A for 12")
    loaded = load_matrix(str(path))
    assert np.array_equal(loaded, a)  # %.18e text keeps every bit
    graph = graph_of(loaded)
    assert sorted(graph.nodes) == list(range(12))
    assert np.array_equal(loaded > 0, support(graph))
    validate(loaded, graph, scheme="ghp")


def test_graph_of_counts_one_way_weights() -> None:
    a = np.array([[0.5, 0.0, 0.5], [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]])
    graph = graph_of(a)
    assert {frozenset(e) for e in graph.edges} == {
        frozenset((0, 1)),
        frozenset((1, 2)),
        frozenset((0, 2)),
    }
    assert all(isinstance(n, int) for n in graph.nodes)
    validate(a, graph)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("0.5 0.5\n0.5\n", "every row the same length"), ("0.5 x\n0.5 0.5\n", "one row of A")],
)
def test_load_matrix_bad_text(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "A.txt"
    path.write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        load_matrix(str(path))


def test_load_matrix_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="check the path"):
        load_matrix(str(tmp_path / "nope.npy"))

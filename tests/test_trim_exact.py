"""trim's cheaper combine (issue 34) gives the same bytes as its plain statement: per
coordinate, the neighbours' values sorted (stably), the lowest and highest b replaced by
the hub's own, then the weighted sum; and as numpy's argmin/argmax path, NaN included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from privnet.agent import defenses

# inf - inf in a weighted sum is NaN, on both sides alike: these inputs ask for it
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

# few distinct values, so that ties (and -0.0 against 0.0) come up often
TIED = st.sampled_from([-2.0, -0.0, 0.0, 0.5, 0.5000000000000001, 3.0, 1e300, -np.inf, np.inf])
ANY = st.one_of(TIED, st.floats(allow_nan=False, width=64))


def hub(draw: st.DrawFn, values: st.SearchStrategy[float], unique: bool = False) -> tuple:
    """(weights, inbox, center, me): a hub (id 0) and n neighbours with random weights."""
    n = draw(st.integers(0, 12))
    dim = draw(st.integers(1, 5))
    shape = (n + 1, dim)
    rows = draw(hnp.arrays(np.float64, shape, elements=values, unique=unique))
    center = draw(hnp.arrays(np.float64, dim, elements=st.floats(-5, 5)))
    ids = draw(st.permutations(range(n + 1)))  # the hub anywhere in the weights' order
    a = draw(hnp.arrays(np.float64, n + 1, elements=st.floats(0.01, 1)))
    weights = {int(m): float(w) for m, w in zip(ids, a / a.sum(), strict=True)}
    inbox = {m: rows[i] for i, m in enumerate(sorted(weights))}
    return weights, inbox, center, 0


@st.composite
def hubs(draw: st.DrawFn) -> tuple:
    return hub(draw, ANY)


@st.composite
def distinct_hubs(draw: st.DrawFn) -> tuple:
    return hub(draw, st.floats(-1e6, 1e6), unique=True)


@st.composite
def nan_hubs(draw: st.DrawFn) -> tuple:
    return hub(draw, st.one_of(TIED, st.just(np.nan)))


def by_sort(weights: dict, inbox: dict, center: np.ndarray, me: int, b: int) -> np.ndarray:
    """The plain statement: per coordinate a stable sort of the neighbours' values (the first
    of tied lowest, the last of tied highest), the b at each end replaced by center."""
    others = [m for m in weights if m != me]
    rows = np.array([inbox[me], *[inbox[m] for m in others]])
    n = len(others)
    cut = min(b, (n - 1) // 2) if n else 0
    for j in range(rows.shape[1]):
        order = np.argsort(rows[1:, j], kind="stable")
        for i in [*order[:cut], *order[n - cut :]]:
            rows[1 + i, j] = center[j]
    return np.array([weights[me], *[weights[m] for m in others]]) @ rows


def by_arrays(weights: dict, inbox: dict, center: np.ndarray, me: int, b: int) -> np.ndarray:
    """The numpy path alone (argmin and reversed argmax for b = 1), as trim ran before."""
    h = defenses.Hood.of(weights, me, b)
    rows = np.array([inbox[me], *[inbox[m] for m in h.others]])
    if h.cut:
        defenses._cut_arrays(rows, center, h.cut)
    return np.asarray(h.trim_weights @ rows)


@settings(max_examples=400, deadline=None)
@given(hubs())
def test_trim_b1_is_the_sorted_statement_to_the_byte(case: tuple) -> None:
    weights, inbox, center, me = case
    got = defenses.trimmed(weights, inbox, center, me, 1)
    assert got.tobytes() == by_sort(weights, inbox, center, me, 1).tobytes()
    assert got.tobytes() == by_arrays(weights, inbox, center, me, 1).tobytes()


@settings(max_examples=200, deadline=None)
@given(distinct_hubs(), st.integers(2, 6))
def test_trim_larger_b_is_the_sorted_statement_without_ties(case: tuple, b: int) -> None:
    weights, inbox, center, me = case
    got = defenses.trimmed(weights, inbox, center, me, b)
    assert got.tobytes() == by_sort(weights, inbox, center, me, b).tobytes()


@settings(max_examples=300, deadline=None)
@given(nan_hubs())
def test_trim_with_nan_is_the_numpy_path_to_the_byte(case: tuple) -> None:
    """Python's min and max rank NaN unlike argmin: such a combine takes numpy's path."""
    weights, inbox, center, me = case
    got = defenses.trimmed(weights, inbox, center, me, 1)
    assert got.tobytes() == by_arrays(weights, inbox, center, me, 1).tobytes()


def test_small_models_take_the_listed_path_and_nan_does_not() -> None:
    rows = np.array([[9.0, 9.0], [1.0, 5.0], [1.0, 4.0], [3.0, 4.0], [3.0, 6.0]])
    center = np.array([0.5, 0.25])
    cut = rows.copy()
    assert defenses._cut_listed(cut, center)
    # column 0: the first 1.0 and the last 3.0 cut; column 1: the 4.0 first, the 6.0
    assert cut.tolist() == [[9.0, 9.0], [0.5, 5.0], [1.0, 0.25], [3.0, 4.0], [0.5, 0.25]]
    rows[2, 1] = np.nan
    held = rows.copy()
    assert not defenses._cut_listed(held, center)
    assert np.array_equal(held, rows, equal_nan=True)  # left as it was for numpy's path


@st.composite
def pair_hubs(draw: st.DrawFn) -> tuple:
    """A hub with 1 to 12 neighbours on 2-coordinate models (clip's Python-float path)."""
    n = draw(st.integers(1, 12))
    rows = draw(hnp.arrays(np.float64, (n + 1, 2), elements=st.floats(-1e3, 1e3)))
    center = draw(hnp.arrays(np.float64, 2, elements=st.floats(-5, 5)))
    a = draw(hnp.arrays(np.float64, n + 1, elements=st.floats(0.01, 1)))
    ids = draw(st.permutations(range(n + 1)))
    weights = {int(m): float(w) for m, w in zip(ids, a / a.sum(), strict=True)}
    return weights, {m: rows[m] for m in weights}, center, draw(st.sampled_from([0.0, 0.5, 3.0]))


@settings(max_examples=400, deadline=None)
@given(pair_hubs(), st.integers(0, 4))
def test_clip_on_two_coordinates_is_the_numpy_path(case: tuple, b: int) -> None:
    """clip's Python-float path for the V-A models: the same clipped set (the distances are
    the same bytes), the sum within a few ulps of numpy's product."""
    weights, inbox, center, tau = case
    h = defenses.Hood.of(weights, 0, b)
    got = defenses.clipped_gossip(weights, inbox, center, 0, tau, b, h)
    want = defenses._clipped_arrays(h, inbox, center, 0, tau)
    assert got.shape == (2,) and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)

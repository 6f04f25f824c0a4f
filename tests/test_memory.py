"""The memory engine (the real agent cores, messages routed in memory) against the oracle
(the paper's matrix recursion in numpy, sharing no code with the core): with the same seed
and config, every strategy x scheme gives the same MSD curves."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from probes import matches

from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.curves import Curve
from privnet.orchestrator.engines.memory import run_memory
from privnet.orchestrator.engines.oracle import run_oracle
from privnet.orchestrator.experiment import topology
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance

RTOL = 1e-9
# Seed 34 draws a sparse, irregular geometric graph (degrees 1 to 4): two leaves exercise
# local-ghp's single-neighbour fallback, and few pairs per hub keep the masks cheap.
AGENTS, ITERS, REPEATS, SEED = 10, 100, 2, 34
# random and ghp noise (sigma_g = 0.1) moves the MSD by far more than this, so the
# equalities below are not met by curves that ignore the scheme.
DISTINCT = 1e-3

Curves = dict[tuple[str, str], Curve]


def problem(**settings: Any) -> Instance:
    return Instance.build(
        ExperimentConfig(agents=AGENTS, iters=ITERS, repeats=REPEATS, seed=SEED, **settings)
    )


def by_label(curves: list[Curve]) -> Curves:
    return {(c.strategy, c.scheme): c for c in curves}


def assert_same_curves(got: Curve, want: Curve) -> None:
    label = f"{got.strategy}/{got.scheme} vs {want.strategy}/{want.scheme}"
    assert got.msd_centroid.shape == want.msd_centroid.shape == (REPEATS, ITERS)
    np.testing.assert_allclose(got.msd_centroid, want.msd_centroid, rtol=RTOL, err_msg=label)
    np.testing.assert_allclose(got.msd_avg, want.msd_avg, rtol=RTOL, err_msg=label)


def relative_gap(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b) / np.abs(b)))


@pytest.fixture(scope="module", params=topology.RULES)
def runs(request: pytest.FixtureRequest) -> tuple[Curves, Curves]:
    """Both engines on one problem: metropolis (symmetric A) and averaging (not symmetric)."""
    shared = problem(rule=request.param)
    return by_label(run_memory(shared)), by_label(run_oracle(shared))


def test_memory_matches_oracle_for_every_strategy_and_scheme(runs: tuple[Curves, Curves]) -> None:
    memory, oracle = runs
    everything = {(str(s), str(sc)) for s in Strategy for sc in Scheme}
    assert memory.keys() == oracle.keys() == everything
    for label, curve in memory.items():
        assert_same_curves(curve, oracle[label])


def test_masked_schemes_follow_their_unmasked_twin_in_the_memory_engine(
    runs: tuple[Curves, Curves],
) -> None:
    """local-ghp is none and masked-ghp is ghp but for each term on the noise grid (2^-24
    here; the masks cancel exactly): the models, and so sqrt(MSD), stay within 1e-6."""
    memory, _ = runs
    for strategy in Strategy:
        for masked, twin in ((Scheme.LOCAL_GHP, Scheme.NONE), (Scheme.MASKED_GHP, Scheme.GHP)):
            got, want = memory[(strategy, masked)], memory[(strategy, twin)]
            for ours, theirs in (
                (got.msd_centroid, want.msd_centroid),
                (got.msd_avg, want.msd_avg),
            ):
                gap = np.abs(np.sqrt(ours) - np.sqrt(theirs)).max()
                assert 0 < gap < 1e-6, (strategy, masked, gap)


def test_noisy_schemes_and_repeats_really_differ(runs: tuple[Curves, Curves]) -> None:
    memory, _ = runs
    for strategy in Strategy:
        none = memory[(strategy, Scheme.NONE)].msd_avg
        for scheme in (Scheme.RANDOM, Scheme.GHP, Scheme.MASKED_GHP):
            assert relative_gap(memory[(strategy, scheme)].msd_avg, none) > DISTINCT
        assert relative_gap(none[0], none[1]) > DISTINCT  # each repeat draws its own data


def test_minibatch_memory_matches_oracle() -> None:
    """batch = 10 of 100 samples: the BATCH stream's indices must agree across engines,
    alone and with random's NOISE stream drawn in the same rounds."""
    mini = problem(batch=10, strategies=(Strategy.ATC,), schemes=(Scheme.NONE, Scheme.RANDOM))
    memory, oracle = by_label(run_memory(mini)), by_label(run_oracle(mini))
    assert memory.keys() == oracle.keys() == {("atc", "none"), ("atc", "random")}
    for label, curve in memory.items():
        assert_same_curves(curve, oracle[label])
    full = by_label(run_oracle(problem(strategies=(Strategy.ATC,))))
    key = (Strategy.ATC.value, Scheme.NONE.value)
    assert relative_gap(memory[key].msd_avg, full[key].msd_avg) > DISTINCT


def test_local_steps_memory_matches_oracle() -> None:
    """--local-steps 2 on minibatches of 10: each agent's two steps a round, each on its
    own minibatch stream, are the oracle's for every strategy and scheme; and they are not
    one step (the MSD moves by far more than the tolerance)."""
    two = problem(batch=10, local_steps=2, mu=0.2)
    memory, oracle = by_label(run_memory(two)), by_label(run_oracle(two))
    assert memory.keys() == oracle.keys() == {(str(s), str(sc)) for s in Strategy for sc in Scheme}
    for label, curve in memory.items():
        np.testing.assert_allclose(curve.msd_centroid, oracle[label].msd_centroid, rtol=RTOL)
        np.testing.assert_allclose(curve.msd_avg, oracle[label].msd_avg, rtol=RTOL)
    one = by_label(run_oracle(problem(batch=10, mu=0.2)))
    for strategy in Strategy:
        key = (strategy.value, Scheme.NONE.value)
        assert relative_gap(memory[key].msd_avg, one[key].msd_avg) > DISTINCT


def test_router_filters_match_like_mqtt() -> None:
    """The router's level index delivers exactly what MQTT filter matching says, in
    subscription order, once per subscriber, and forgets an unsubscribed filter."""
    import itertools

    from privnet.agent.inmemory import Filters

    levels = ["a", "b", "+", "#"]
    patterns = ["/".join(p) for n in (1, 2, 3) for p in itertools.product(levels, repeat=n)]
    patterns = [p for p in patterns if "#" not in p[:-1]]
    names = {p: f"c{i % 7}" for i, p in enumerate(patterns)}
    index = Filters()
    for p in patterns:
        index.add(p, names[p], names[p])  # type: ignore[arg-type]
    for n in (1, 2, 3, 4):
        for t in itertools.product(["a", "b", "c"], repeat=n):
            topic = "/".join(t)
            want: dict[str, str] = {}
            for p in patterns:
                if matches(p, topic):
                    want.setdefault(names[p], names[p])
            assert [name for name, _ in index.match(topic)] == list(want), topic
    assert index.remove("a/#", names["a/#"]) == names["a/#"]
    assert names["a/#"] not in dict(index.match("a/b/c")) or any(
        matches(p, "a/b/c") and names[p] == names["a/#"] for p in patterns if p != "a/#"
    )

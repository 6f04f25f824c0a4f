"""The reconstruction attack on the wire of memory-engine runs (the same messages a
recorded `privnet run --audit` holds): none is recovered to float precision; noise keeps
random and ghp out; local-ghp falls exactly where its hub sums pin the models down."""

from __future__ import annotations

import numpy as np
import pytest

from agent.spec import Scheme, Strategy
from orchestrator.attack import attack_session, reconstruct
from orchestrator.audit import replay
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.problem import Problem


def wire_of(problem: Problem, scheme: Scheme):
    run = replay(problem, Strategy.ATC, scheme, 0)
    return run.wire.models, run.clear


@pytest.fixture(scope="module")
def geometric() -> Problem:
    return Problem.build(ExperimentConfig(agents=10, iters=40, strategies=(Strategy.ATC,)))


def test_none_is_recovered_to_float_precision(geometric: Problem) -> None:
    seen, clear = wire_of(geometric, Scheme.NONE)
    record = attack_session(geometric, Strategy.ATC, Scheme.NONE, 0, seen, clear)
    assert record["broken"] and record["trajectory_rel_error_max"] < 1e-12
    assert max(record["minimizer_rel_error"]) < 1e-8  # quadratic losses: an exact affine fit


@pytest.mark.parametrize("scheme", [Scheme.RANDOM, Scheme.GHP, Scheme.LOCAL_GHP])
def test_noise_keeps_the_private_schemes_out(geometric: Problem, scheme: Scheme) -> None:
    seen, clear = wire_of(geometric, scheme)
    record = attack_session(geometric, Strategy.ATC, scheme, 0, seen, clear)
    assert not record["broken"] and record["agents_recovered"] == 0
    assert record["trajectory_rel_error_median"] > 1e-3


def test_local_ghp_estimates_obey_every_hub_sum(geometric: Problem) -> None:
    seen, clear = wire_of(geometric, Scheme.LOCAL_GHP)
    estimate = reconstruct(geometric, Strategy.ATC, Scheme.LOCAL_GHP, seen)
    a = geometric.A
    for hub in range(10):
        others = [m for m in range(10) if m != hub and a[m, hub] > 0]
        if len(others) < 2:
            continue
        for i in (1, 20, 40):
            true = sum(a[m, hub] * clear[(m, i, 2)] for m in others)
            guess = sum(a[m, hub] * estimate[(m, i, 2)] for m in others)
            np.testing.assert_allclose(guess, true, rtol=1e-9, atol=1e-12)


def test_local_ghp_falls_on_a_complete_graph() -> None:
    """Every hub sum is exact and the P x P system has full rank: all models come out."""
    problem = Problem.build(
        ExperimentConfig(agents=5, iters=10, topology="complete", strategies=(Strategy.ATC,))
    )
    seen, clear = wire_of(problem, Scheme.LOCAL_GHP)
    record = attack_session(problem, Strategy.ATC, Scheme.LOCAL_GHP, 0, seen, clear)
    assert record["pinned_directions"] == 5
    assert record["broken"] and record["trajectory_rel_error_max"] < 1e-9
    assert record["verdict"] == "broken"

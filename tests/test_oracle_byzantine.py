"""The oracle's replay of Byzantine agents and defenses (privnet/orchestrator/engines/
oracle_byzantine.py) against the memory engine (the agents' own cores, attacks.py and
defenses.py): the same models, and the same honest curves, for every defense with and
without attackers, under every scheme the defense works in, every attack at once."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import privnet
from privnet.agent.spec import ConfigError, Scheme
from privnet.orchestrator.engines.memory import run_memory
from privnet.orchestrator.engines.oracle import run_oracle
from privnet.orchestrator.experiment.config import ExperimentConfig, load
from privnet.orchestrator.experiment.instance import Instance

RTOL = 1e-9  # tests/test_memory.py's: memory == oracle, curves relative
ATOL = 1e-12  # models: coordinates near 0 get an absolute floor
# Every attack at once, attackers next to attackers included (dissensus reads an ALIE
# message, ALIE a sign flip's): seven of twelve agents.
EVERY_ATTACK = "0:sign-flip;2:large-norm;4:gaussian;6:alie;8:ipm;10:dissensus;11:label-flip"
ATTACKERS = [0, 2, 4, 6, 8, 10, 11]
UNMASKED = "none,random,ghp"
EVERY_SCHEME = "none,random,ghp,local-ghp,masked-ghp"
# Each defense under the schemes it works in (clip and trim judge messages the masked
# schemes hide: refused there, below).
DEFENSES = [
    ("none", EVERY_SCHEME),
    ("clip", UNMASKED),
    ("clip:tau=0.05", UNMASKED),
    ("trim", UNMASKED),
    ("trim:b=2", UNMASKED),
    ("clip-step", EVERY_SCHEME),
    ("clip-step:tau=0.02", EVERY_SCHEME),
]


def experiment(defense: str, schemes: str, byzantine: str, **settings: Any) -> privnet.Experiment:
    # 25 rounds: clip-step's adaptive window (10 steps) fills and then clips
    base: dict[str, Any] = dict(agents=12, iters=25, seed=34, strategies="atc")
    return privnet.Experiment(
        **(base | settings), schemes=schemes, byzantine=byzantine, defense=defense
    )


def both(exp: privnet.Experiment) -> tuple[privnet.Result, privnet.Result]:
    return privnet.simulate(exp, "memory"), privnet.simulate(exp, "oracle")


def assert_equal_runs(memory: privnet.Result, oracle: privnet.Result) -> None:
    """Every agent's models (attackers' too), the honest curves and the attackers' MSD."""
    assert memory.models.keys() == oracle.models.keys()
    for key, models in memory.models.items():
        np.testing.assert_allclose(models, oracle.models[key], rtol=RTOL, atol=ATOL, err_msg=key)
    by_label = {(c.strategy, c.scheme): c for c in oracle.curves}
    for curve in memory.curves:
        want = by_label[(curve.strategy, curve.scheme)]
        label = f"{curve.strategy}/{curve.scheme}"
        np.testing.assert_allclose(curve.msd_avg, want.msd_avg, rtol=RTOL, err_msg=label)
        np.testing.assert_allclose(curve.msd_centroid, want.msd_centroid, rtol=RTOL, err_msg=label)
        assert curve.extra.get("byzantine") == want.extra.get("byzantine"), label
        if "byzantine" in curve.extra:
            got, held = curve.extra["byzantine_msd_avg_db"], want.extra["byzantine_msd_avg_db"]
            assert got == pytest.approx(held, rel=RTOL), label


@pytest.mark.parametrize(("defense", "schemes"), DEFENSES)
def test_the_oracle_replays_every_defense_with_and_without_attackers(
    defense: str, schemes: str
) -> None:
    clean = both(experiment(defense, schemes, ""))
    attacked = both(experiment(defense, schemes, EVERY_ATTACK))
    assert_equal_runs(*clean)
    assert_equal_runs(*attacked)
    for curve, calm in zip(attacked[1].curves, clean[1].curves, strict=True):
        assert curve.extra["byzantine"] == ATTACKERS  # left out of the honest curves
        # the replay is not the clean run: the attacks move the honest agents' MSD
        gap = np.abs(curve.msd_avg[0, -5:] - calm.msd_avg[0, -5:]) / calm.msd_avg[0, -5:]
        assert gap.min() > 1e-3, (defense, curve.scheme)


def test_defenses_change_the_replayed_run() -> None:
    """Each defense's replay differs from the undefended one under the same attack, so
    the equalities above are not met by an oracle that ignores the defense."""
    runs = {
        d: privnet.simulate(experiment(d, UNMASKED, "3,7:sign-flip"), "oracle").curves
        for d in ("none", "clip", "trim", "clip-step")
    }
    for defense in ("clip", "trim", "clip-step"):
        for curve, plain in zip(runs[defense], runs["none"], strict=True):
            assert not np.allclose(curve.msd_avg, plain.msd_avg, rtol=1e-3), defense


@pytest.mark.parametrize(
    ("defense", "byzantine", "settings"),
    [
        ("clip-step", "1,6:alie", {"strategies": "cta,consensus", "repeats": 2}),
        ("trim:b=2", "1,6:ipm", {"strategies": "cta,consensus", "repeats": 2}),
        ("clip", "5:gaussian;9:dissensus", {"batch": 10, "local_steps": 2}),
        ("clip", "0-2:sign-flip", {"topology": "one-peer-exponential", "agents": 8}),
        ("clip-step", "0,3:alie", {"topology": "random-matching:2", "agents": 8}),
    ],
)
def test_the_oracle_replays_attacks_across_strategies_batches_and_schedules(
    defense: str, byzantine: str, settings: dict[str, Any]
) -> None:
    schemes = EVERY_SCHEME if defense.startswith(("none", "clip-step")) else UNMASKED
    assert_equal_runs(*both(experiment(defense, schemes, byzantine, **settings)))


@pytest.mark.parametrize("defense", ["clip", "trim", "clip-step"])
def test_the_oracle_replays_defenses_on_the_u4_wire(defense: str) -> None:
    """u4 (attackers run on f8 only): every release on the lattice, none's too."""
    schemes = EVERY_SCHEME if defense == "clip-step" else UNMASKED
    assert_equal_runs(*both(experiment(defense, schemes, "", wire_dtype="u4")))


@pytest.mark.parametrize("scheme", [Scheme.LOCAL_GHP, Scheme.MASKED_GHP])
@pytest.mark.parametrize("defense", ["clip", "trim"])
def test_the_oracle_refuses_a_defense_that_must_see_masked_messages(
    scheme: Scheme, defense: str
) -> None:
    """The config refuses the pair; so does the oracle when its schemes are given apart."""
    with pytest.raises(ConfigError, match="use clip-step there"):
        ExperimentConfig(agents=6, iters=3, schemes=(scheme,), defense=defense)
    problem = Instance.build(
        ExperimentConfig(agents=6, iters=3, schemes=("none",), defense=defense)
    )
    with pytest.raises(ConfigError, match=f"under {scheme} a hub sees only masked messages"):
        run_oracle(problem, schemes=["none", scheme])


def test_the_oracle_replays_label_flipping_on_the_classification_preset() -> None:
    """Label flipping on class labels (c -> C - 1 - c) beside ALIE under clip-step: the
    models, and the honest agents' test errors, as the memory engine has them."""
    base = replace(
        load("paper-classification"),
        agents=12,
        iters=8,
        schemes=(Scheme.NONE, Scheme.GHP, Scheme.MASKED_GHP),
        byzantine="1,5:label-flip;8:alie",
        defense="clip-step",
    )
    problem = Instance.build(base)
    assert problem.classes > 1
    memory_models: dict[str, np.ndarray] = {}
    oracle_models: dict[str, np.ndarray] = {}
    memory = run_memory(problem, models=memory_models)
    oracle = run_oracle(problem, models=oracle_models)
    for key, models in memory_models.items():
        np.testing.assert_allclose(models, oracle_models[key], rtol=RTOL, atol=ATOL, err_msg=key)
    for got, want in zip(memory, oracle, strict=True):
        assert want.series and want.series.keys() <= got.series.keys()  # memory: per agent too
        for name, values in want.series.items():
            np.testing.assert_array_equal(got.series[name], values, err_msg=name)
        assert got.extra["byzantine"] == want.extra["byzantine"] == [1, 5, 8]

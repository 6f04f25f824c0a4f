"""Issue 34's pure parts: the attacks a Byzantine agent crafts, the defenses an honest hub
combines with, their parsing and refusals, and both inside the memory engine's run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import privnet
from privnet.agent import attacks, defenses
from privnet.agent.spec import ConfigError, Scheme
from privnet.orchestrator.experiment.config import ExperimentConfig

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


def vectors(n: int, dim: int) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.float64, (n, dim), elements=finite)


# ---- defenses ---------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    honest=st.integers(3, 8).flatmap(lambda n: vectors(n, 3)),
    liars=st.integers(0, 2).flatmap(lambda f: vectors(f, 3)),
    center=hnp.arrays(np.float64, 3, elements=finite),
    b=st.integers(0, 3),
)
def test_trimmed_mean_stays_within_the_honest_range(
    honest: np.ndarray, liars: np.ndarray, center: np.ndarray, b: int
) -> None:
    """With no more liars than it trims (b, capped at (n - 1) // 2), every coordinate of the
    trimmed combine is within the range of the honest values and the hub's own."""
    stacked = np.concatenate([honest, liars])
    n = len(stacked)
    if len(liars) > min(b, (n - 1) // 2):
        return  # more liars than trimmed: no promise
    me = n
    weights = {m: 0.5 / n for m in range(n)} | {me: 0.5}
    inbox = {m: stacked[m] for m in range(n)} | {me: center}
    out = defenses.trimmed(weights, inbox, center, me, b)
    low = np.minimum(honest.min(axis=0), center)
    high = np.maximum(honest.max(axis=0), center)
    assert np.all(out >= low - 1e-9 * (1 + np.abs(low)))
    assert np.all(out <= high + 1e-9 * (1 + np.abs(high)))


def test_trimmed_mean_drops_a_liar_that_the_plain_sum_follows() -> None:
    center = np.zeros(2)
    inbox = {0: np.ones(2), 1: np.ones(2), 2: np.full(2, 1e6), 3: center}
    weights = {0: 0.25, 1: 0.25, 2: 0.25, 3: 0.25}
    # b = 1: the liar and the lowest value give way to the hub's own (0); one 1 is kept
    assert np.allclose(defenses.trimmed(weights, inbox, center, 3, 1), [0.25, 0.25])
    assert defenses.trimmed(weights, inbox, center, 3, 0)[0] > 1e5  # b=0: no defense


@settings(max_examples=200, deadline=None)
@given(
    messages=st.integers(1, 6).flatmap(lambda n: vectors(n, 4)),
    center=hnp.arrays(np.float64, 4, elements=finite),
    tau=st.floats(1e-3, 1e3),
)
def test_clipped_gossip_moves_the_hub_at_most_tau(
    messages: np.ndarray, center: np.ndarray, tau: float
) -> None:
    """Its own term its value, each neighbour pulls it at most a_mp tau: the combine lands
    within (1 - a_pp) tau of the hub's model, whatever the neighbours send."""
    n = len(messages)
    me = n
    weights = {m: 0.6 / n for m in range(n)} | {me: 0.4}
    inbox = {m: messages[m] for m in range(n)} | {me: center}
    out = defenses.clipped_gossip(weights, inbox, center, me, tau, b=0)
    assert np.linalg.norm(out - center) <= 0.6 * tau * (1 + 1e-9) + 1e-9


def test_clipped_gossip_adaptive_radius_is_the_next_farthest_neighbour() -> None:
    center = np.zeros(1)
    inbox = {0: np.array([1.0]), 1: np.array([2.0]), 2: np.array([-100.0]), 3: center}
    weights = dict.fromkeys(range(4), 0.25)
    out = defenses.clipped_gossip(weights, inbox, center, 3, 0.0, b=1)
    # the liar (distance 100) is pulled in to distance 2: 0.25 (1 + 2 - 2)
    assert out[0] == pytest.approx(0.25)


@pytest.mark.parametrize("dim", [1, 2, 3])  # 2: the Python-float path
def test_clip_by_default_pulls_the_four_farthest_in_to_the_fifth(dim: int) -> None:
    """b defaults to 4: three liars and a far honest neighbour are all clipped to the
    fifth-farthest distance (2), on every path."""
    assert defenses.parse("clip")["b"] == 4
    center = np.zeros(dim)
    axis = np.eye(dim)[0]
    distances = [1.0, 2.0, 3.0, -50.0, 60.0, -70.0]
    inbox = {m: d * axis for m, d in enumerate(distances)} | {6: center}
    weights = dict.fromkeys(range(7), 1 / 7)
    combiner = defenses.Combiner(defenses.parse("clip"), 6)
    out = combiner.combine(weights, inbox, center)
    # 1 + 2 as they are; 3, -50, 60, -70 pulled in to 2, -2, 2, -2
    assert out == pytest.approx((1 + 2 + 2 - 2 + 2 - 2) / 7 * axis)


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(hnp.arrays(np.float64, 3, elements=finite), min_size=1, max_size=30),
    tau=st.floats(1e-3, 1e3),
)
def test_clip_step_bounds_every_step(steps: list[np.ndarray], tau: float) -> None:
    clipper = defenses.StepClipper(tau, window=5)
    center = np.ones(3)
    for step in steps:
        assert np.linalg.norm(clipper(center + step, center) - center) <= tau * (1 + 1e-12)


def test_adaptive_clip_step_takes_the_median_of_its_window() -> None:
    clipper = defenses.StepClipper(0.0, window=3)
    center = np.zeros(1)
    for size in (1.0, 2.0, 3.0):  # the window fills: taken as they come
        assert clipper(center + size, center)[0] == size
    assert clipper(center + 100.0, center)[0] == 2.0  # the median of 1, 2, 3
    assert clipper(center - 100.0, center)[0] == -2.0  # of 2, 3, 2


@pytest.mark.parametrize("scheme", [Scheme.LOCAL_GHP, Scheme.MASKED_GHP])
@pytest.mark.parametrize("name", ["clip", "trim:b=2"])
def test_a_defense_that_must_see_messages_is_refused_where_they_are_masked(
    scheme: Scheme, name: str
) -> None:
    with pytest.raises(ConfigError, match="use clip-step there"):
        defenses.parse(name, scheme)
    defenses.parse("clip-step", scheme)  # bounds the sum: works under every scheme
    with pytest.raises(ConfigError, match=f"{scheme}"):
        ExperimentConfig(agents=5, iters=3, schemes=("none", scheme), defense=name)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("median", "choose one of none, clip, trim, clip-step"),
        ("clip:tau", "KEY=VALUE"),
        ("clip:z=1", "KEY one of: tau, b"),
        ("trim:b=1.5", "whole number"),
        ("clip-step:tau=-1", "tau must be > 0"),
    ],
)
def test_bad_defenses_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        defenses.parse(text)


# ---- attacks ----------------------------------------------------------------------------


def test_byzantine_groups_parse_and_bad_ones_are_refused() -> None:
    found = attacks.parse_byzantine("0,4:sign-flip; 7-9:alie:z=2", 10)
    assert sorted(found) == [0, 4, 7, 8, 9]
    assert found[8]["z"] == 2.0 and found[0]["scale"] == 1.0
    assert str(found[8]) == "alie:z=2"
    for text, says in [
        ("3", "write IDS:ATTACK"),
        ("3:flip", "choose one of sign-flip"),
        ("10:ipm", r"ids must lie in 0\.\.9"),
        ("1:ipm;1:alie", "named twice"),
        ("a:ipm", "not an id"),
        ("1:alie:eps=2", "KEY one of: z"),
    ]:
        with pytest.raises(ConfigError, match=says):
            attacks.parse_byzantine(text, 10)
    with pytest.raises(ConfigError, match="leave at least one agent honest"):
        ExperimentConfig(agents=3, byzantine="0-2:ipm")


def seen_of(messages: dict[int, np.ndarray]) -> attacks.Seen:
    stacked = np.array(list(messages.values()))
    return attacks.Seen(messages, stacked.mean(axis=0), stacked.std(axis=0))


def test_crafted_messages() -> None:
    x = np.array([1.0, -2.0])
    seen = seen_of({1: np.array([1.0, 1.0]), 2: np.array([3.0, 1.0])})
    out = {0: 0.5, 1: 0.25, 2: 0.25}
    craft = attacks.craft
    assert np.array_equal(craft(attacks.parse("sign-flip"), x, seen, out, 0)[1], -x)
    assert np.allclose(craft(attacks.parse("large-norm"), x, seen, out, 0)[2], 100 * x / 5**0.5)
    assert np.linalg.norm(craft(attacks.parse("sign-flip:scale=1e9"), x, seen, out, 0)[1]) == (
        pytest.approx(attacks.CAP)
    )
    alie = craft(attacks.parse("alie:z=2"), x, seen, out, 0)
    assert np.array_equal(alie[1], [2.0 - 2 * 1.0, 1.0]) and alie.keys() == {1, 2}
    assert np.array_equal(craft(attacks.parse("ipm"), x, seen, out, 0)[2], [-1.0, -0.5])
    # dissensus: receiver 1 (at [1, 1], the mean at [2, 1]) is pushed further from the mean
    pushed = craft(attacks.parse("dissensus:eps=1"), x, seen, out, 0)[1]
    assert pushed[0] < 1.0 and pushed[1] == 1.0
    assert np.array_equal(craft(attacks.parse("alie"), x, None, out, 0)[1], x)  # round 1
    noise = attacks.normals((1, 2), 2, 5, 3, 2)
    assert noise.shape == (3, 2) and np.array_equal(noise, attacks.normals((1, 2), 2, 5, 3, 2))
    gauss = craft(attacks.parse("gaussian:sigma=3"), x, seen, out, 0, noise)
    assert np.allclose(gauss[2], x + 3 * noise[2])


def test_a_masked_hub_learns_its_neighbours_mean_but_not_their_spread() -> None:
    """Masks that cancel in the weighted sum: the attacker's mean is exact; the messages'
    spread is the masks', so it takes its own deviation from the mean instead."""
    rng = np.random.default_rng(3)
    models = {m: rng.normal(size=4) for m in (1, 2, 3)}
    weights = {0: 0.4, 1: 0.2, 2: 0.2, 3: 0.2}
    masks = rng.laplace(scale=50, size=(3, 4))
    masks -= masks.mean(axis=0)  # sum_m a_m n_m / a_m = 0
    own = np.ones(4)
    inbox = {m: models[m] + masks[m - 1] / weights[m] for m in (1, 2, 3)} | {0: own}
    combined = sum(weights[m] * inbox[m] for m in inbox)
    seen = attacks.observe(weights, inbox, 0, np.asarray(combined), own)
    assert seen is not None
    true = np.array(list(models.values()))
    assert np.allclose(seen.mean, true.mean(axis=0))
    assert np.allclose(seen.spread, np.abs(own - true.mean(axis=0)))  # not the masks'
    assert not seen.messages  # dissensus has no receiver's model to push


def test_label_flipping() -> None:
    assert np.array_equal(attacks.flip_labels(np.array([0, 2, 1]), 3), [2, 0, 1])
    assert np.array_equal(attacks.flip_labels(np.array([0.5, -1.0]), 0), [-0.5, 1.0])
    assert attacks.flips("label-flip") and not attacks.flips("") and not attacks.flips("ipm")


# ---- in the memory engine -----------------------------------------------------------------


def honest_msd(byzantine: str, defense: str, schemes: str = "none") -> np.ndarray:
    exp = privnet.Experiment(
        agents=12, iters=60, seed=4, strategies="atc", schemes=schemes,
        byzantine=byzantine, defense=defense, engine="memory",
    )  # fmt: skip
    result = privnet.simulate(exp)
    return np.array([result.metric("msd_avg", "atc", s)[0, -10:].mean() for s in exp.schemes])


def test_attackers_hurt_the_honest_agents_and_clipping_helps() -> None:
    clean = honest_msd("", "none")
    attacked = honest_msd("2,7:sign-flip", "none")
    defended = honest_msd("2,7:sign-flip", "clip")
    assert attacked[0] > 10 * clean[0]
    assert defended[0] < attacked[0] / 10


def test_the_robustness_table_measures_every_cell_it_can(tmp_path: Path) -> None:
    from privnet.orchestrator import robustness as table

    base = ExperimentConfig(iters=6, seed=2)
    cells = table.robustness(
        base, ["sign-flip"], [Scheme.NONE, Scheme.LOCAL_GHP], ["clip", "clip-step"], [1]
    )
    # clip: none only (refused under local-ghp); clip-step: both; each clean + attacked
    assert [(c.defense, c.scheme, c.attackers) for c in cells] == [
        ("clip", "none", 0), ("clip", "none", 1),
        ("clip-step", "none", 0), ("clip-step", "local-ghp", 0),
        ("clip-step", "none", 1), ("clip-step", "local-ghp", 1),
    ]  # fmt: skip
    assert all(np.isfinite(c.honest_db) and c.runs == 1 for c in cells)
    table.write(cells, base, tmp_path)
    text = (tmp_path / "robustness.md").read_text()
    assert "| sign-flip | 1 | clip | 1 | " in text and "n/a (refused)" in text
    assert (tmp_path / "robustness.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_robustness_table_on_the_classification_preset_gives_test_errors() -> None:
    from dataclasses import replace

    from privnet.orchestrator import robustness as table
    from privnet.orchestrator.experiment.config import load

    base = replace(load("paper-classification"), agents=24, iters=4, schemes=(Scheme.NONE,))
    cells = table.robustness(base, ["label-flip"], [Scheme.NONE], ["none"], [3])
    assert [c.attackers for c in cells] == [0, 3]
    assert all(c.honest_error is not None and 0 <= c.honest_error <= 100 for c in cells)
    assert cells[0].delta_points == 0 and cells[1].delta_points is not None
    assert "pt) |" in table.markdown(cells, base)

"""Classification (section V-B) on the shipped UCI Adult data: the loss (against finite
differences of the risk written here from the formula), the dataset, and the engines'
agreement."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from privnet.agent import datasets, wire
from privnet.agent.control import Config
from privnet.agent.losses import Local, make_loss
from privnet.agent.messages import Rejected
from privnet.agent.problems import Rows, samples
from privnet.agent.spec import ConfigError
from privnet.orchestrator.engines.memory import run_memory
from privnet.orchestrator.engines.oracle import run_oracle
from privnet.orchestrator.experiment import config as configuration
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import agent_specs

SMALL = ExperimentConfig(
    problem="classification",
    agents=6,
    samples=120,
    mu=0.5,
    rho=0.001,
    sigma_g2=0.8,
    iters=15,
    strategies=("atc",),
    topology="ring",
)


def test_adult_ships_whole_and_encoded() -> None:
    data = datasets.load("adult")
    assert data.x_train.shape == (32561, data.dim) and data.x_test.shape == (16281, data.dim)
    assert set(np.unique(data.y_train)) == {0, 1} and data.classes == 2
    assert 0.2 < np.mean(data.y_test) < 0.3  # the published 24% positive rate
    assert np.all(data.x_train[:, -1] == 1.0)  # bias column


def test_logistic_gradient_matches_finite_differences() -> None:
    problem = Instance.build(SMALL)
    share = problem.specs(0)[2]
    loss = make_loss(share)
    assert isinstance(loss, Local)
    x, labels = samples(share.data, share.data_key)
    y = 2.0 * labels - 1.0
    w = np.random.default_rng(0).normal(size=loss.dim) * 0.3

    def risk(v: np.ndarray) -> float:
        return float(np.mean(np.log1p(np.exp(-y * (x @ v)))) + SMALL.rho * v @ v)

    np.testing.assert_allclose(loss.risk.value(w[None], None)[0], risk(w), rtol=1e-12)

    eps = 1e-6
    numeric = np.array(
        [(risk(w + eps * e) - risk(w - eps * e)) / (2 * eps) for e in np.eye(len(w))]
    )
    np.testing.assert_allclose(loss.grad(w, 1), numeric, rtol=1e-6, atol=1e-8)


def test_agents_hold_disjoint_noisy_blocks_and_the_neighbour_a_fresh_draw() -> None:
    specs = Instance.build(SMALL).specs(0)
    held = [spec.data for spec in specs]
    assert all(isinstance(data, Rows) for data in held)
    blocks = [set(data.rows) for data in held]  # type: ignore[union-attr]
    assert sum(map(len, blocks)) == len(set().union(*blocks)) == SMALL.agents * SMALL.samples
    x0, _ = samples(specs[0].data, specs[0].data_key)
    x0_again, _ = samples(specs[0].data, specs[0].data_key)
    np.testing.assert_array_equal(x0, x0_again)
    twin = Instance.build(SMALL).twin(0).specs(0)
    x0_twin, _ = samples(twin[0].data, twin[0].data_key)
    assert not np.allclose(x0, x0_twin)
    assert twin[1:] == specs[1:]


def test_the_config_carries_a_classification_problem() -> None:
    problem = Instance.build(SMALL)
    spec = agent_specs(problem, SMALL.strategies[0], SMALL.schemes[1])[0]
    config = Config(spec, problem.specs(0)[0], {}, deadline=1.0, telemetry=True)
    back = wire.decode_config(wire.encode_config(config))
    assert back.problem == config.problem
    for change, words in (
        ({"dataset": "x y"}, "dataset 'x y' is not a plug-in name"),
        ({"rows": ()}, "got 0 rows"),
        ({"rows": (5, 5)}, "distinct entries"),
        ({"feature_noise": -0.1}, "feature_noise is a standard deviation"),
    ):
        bad = dataclasses.replace(
            config,
            problem=dataclasses.replace(config.problem, data=forged(config.problem.data, **change)),
        )
        with pytest.raises(Rejected, match=words):
            wire.decode_config(wire.encode_config(bad))
    # What only the agent's own installation can tell: the agent builds its loss (and, in
    # a node, fails saying so: tests/test_problems.py).
    for change, words in (
        ({"dataset": "x"}, "unknown dataset 'x'"),
        ({"rows": (0, 32561)}, "rows must be distinct rows of the 32561 training rows"),
    ):
        data = dataclasses.replace(config.problem.data, **change)
        share = wire.decode_config(
            wire.encode_config(
                dataclasses.replace(config, problem=dataclasses.replace(config.problem, data=data))
            )
        ).problem
        with pytest.raises(ConfigError, match=words):
            make_loss(share)


def forged(data: Any, **changes: Any) -> Any:
    """A copy of a checked dataclass with `changes`, unchecked: what a hostile encoder sends."""
    copy = dataclasses.replace(data)
    for name, value in changes.items():
        object.__setattr__(copy, name, value)
    return copy


def test_memory_engine_matches_the_oracle_on_classification() -> None:
    problem = Instance.build(SMALL)
    oracle = {c.scheme: c for c in run_oracle(problem)}
    memory = {c.scheme: c for c in run_memory(problem)}
    for scheme, curve in oracle.items():
        np.testing.assert_allclose(memory[scheme].msd_centroid, curve.msd_centroid, rtol=1e-9)
        np.testing.assert_allclose(memory[scheme].msd_avg, curve.msd_avg, rtol=1e-9)
        for name, errors in curve.series.items():
            np.testing.assert_array_equal(memory[scheme].series[name], errors)
    # the masked schemes follow their unmasked twins up to each term on the noise grid
    # (2^-21 at sigma_g^2 = 0.8): 1e-6 of these MSDs
    np.testing.assert_allclose(oracle["local-ghp"].msd_avg, oracle["none"].msd_avg, rtol=1e-5)
    np.testing.assert_allclose(oracle["masked-ghp"].msd_avg, oracle["ghp"].msd_avg, rtol=1e-5)


def test_preset_loads_and_rejects_too_many_samples() -> None:
    preset = configuration.load("paper-classification")
    assert (preset.agents, preset.mu, preset.rho, preset.sigma_g2) == (50, 0.5, 0.001, 0.8)
    too_many = configuration.with_overrides(SMALL, {"samples": 10_000})
    with pytest.raises(ConfigError, match="exceed the 32561 training rows"):
        Instance.build(too_many).specs(0)

"""Classification (section V-B) on the shipped UCI Adult data: the loss, the dataset, and
the three engines' agreement (memory vs the oracle's independently written logistic loss)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from agent import datasets, wire
from agent.control import Config
from agent.losses import ClassificationSpec, Logistic, classification_data, make_loss
from agent.messages import Rejected
from orchestrator.engines.memory import run_memory
from orchestrator.engines.oracle import run_oracle
from orchestrator.experiment import config as configuration
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.problem import Problem
from orchestrator.experiment.specs import agent_specs

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
    assert set(np.unique(data.y_train)) == {-1.0, 1.0}
    assert 0.2 < np.mean(data.y_test > 0) < 0.3  # the published 24% positive rate
    assert np.all(data.x_train[:, -1] == 1.0)  # bias column


def test_logistic_gradient_matches_finite_differences() -> None:
    problem = Problem.build(SMALL)
    loss = make_loss(problem.specs(0)[2])
    assert isinstance(loss, Logistic)
    x, y = loss.x, loss.y
    w = np.random.default_rng(0).normal(size=loss.dim) * 0.3

    def risk(v: np.ndarray) -> float:
        return float(np.mean(np.log1p(np.exp(-y * (x @ v)))) + SMALL.rho * v @ v)

    eps = 1e-6
    numeric = np.array(
        [(risk(w + eps * e) - risk(w - eps * e)) / (2 * eps) for e in np.eye(len(w))]
    )
    np.testing.assert_allclose(loss.grad(w, 1), numeric, rtol=1e-6, atol=1e-8)


def test_agents_hold_disjoint_noisy_blocks_and_the_neighbour_a_fresh_draw() -> None:
    specs = Problem.build(SMALL).classification_specs(0)
    assert all(isinstance(spec, ClassificationSpec) for spec in specs)
    blocks = [set(spec.rows) for spec in specs]
    assert sum(map(len, blocks)) == len(set().union(*blocks)) == SMALL.agents * SMALL.samples
    x0, _ = classification_data(specs[0])
    x0_again, _ = classification_data(specs[0])
    np.testing.assert_array_equal(x0, x0_again)
    twin = Problem.build(SMALL).twin(0).classification_specs(0)
    x0_twin, _ = classification_data(twin[0])
    assert not np.allclose(x0, x0_twin)
    assert twin[1:] == specs[1:]


def test_the_config_carries_a_classification_problem() -> None:
    problem = Problem.build(SMALL)
    spec = agent_specs(problem, SMALL.strategies[0], SMALL.schemes[1])[0]
    config = Config(spec, problem.specs(0)[0], {}, deadline=1.0, telemetry=True)
    back = wire.decode_config(wire.encode_config(config))
    assert back.problem == config.problem
    for change, words in (
        ({"dataset": "x"}, "dataset 'x' is not shipped"),
        ({"rows": (0, 32561)}, "rows must name at least one of the 32561 training rows"),
        ({"rows": ()}, "got 0 rows"),
        ({"rows": (5, 5)}, "distinct entries"),
        ({"feature_noise": -0.1}, "feature_noise is a standard deviation"),
    ):
        bad = dataclasses.replace(config, problem=dataclasses.replace(config.problem, **change))
        with pytest.raises(Rejected, match=words):
            wire.decode_config(wire.encode_config(bad))


def test_memory_engine_matches_the_oracle_on_classification() -> None:
    problem = Problem.build(SMALL)
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
    with pytest.raises(ValueError, match="exceed the 32561 training rows"):
        Problem.build(too_many).specs(0)

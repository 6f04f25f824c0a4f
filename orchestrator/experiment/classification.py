"""The paper's section V-B problem: the public spec, the global minimizer, testing errors.

The agents' data come from agent.losses.classification_data (a dataset shipped in
agent/data); this module draws the per-agent feature noise, solves for w^o by Newton's
method on the pooled data, and scores models on the dataset's own test split.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from agent import datasets
from agent.losses import ClassificationSpec, classification_data
from orchestrator.experiment.config import ExperimentConfig

NEWTON_TOL = 1e-12


def draw_problem(config: ExperimentConfig, repeat: int, neighbour: int) -> ClassificationSpec:
    """Agent-specific feature noise std ~ U[0, feature_noise] (non-iid agents)."""
    seq = np.random.SeedSequence(entropy=config.seed, spawn_key=(repeat, 0))
    noise = np.random.Generator(np.random.Philox(seq)).uniform(
        0, config.feature_noise, config.agents
    )
    rows = len(datasets.load(config.dataset).y_train)
    if config.samples * config.agents > rows:
        raise ValueError(
            f"{config.agents} agents x {config.samples} samples exceed the {rows} training rows "
            f"of {config.dataset}; lower samples to at most {rows // config.agents}"
        )
    return ClassificationSpec(
        dataset=config.dataset,
        dim=config.dim,
        samples=config.samples,
        feature_noise=tuple(noise.tolist()),
        rho=config.rho,
        seed=config.seed,
        repeat=repeat,
        batch=config.batch,
        neighbour=neighbour,
    )


def global_minimizer(spec: ClassificationSpec, agents: int) -> np.ndarray:
    """argmin of 1/P sum_p J_p: Newton's method on the pooled data (equal N per agent)."""
    parts = [classification_data(spec, p) for p in range(agents)]
    return minimizer(
        np.vstack([h for h, _ in parts]), np.concatenate([t for _, t in parts]), spec.rho
    )


def minimizer(x: np.ndarray, y: np.ndarray, rho: float) -> np.ndarray:
    """argmin 1/N sum ln(1 + exp(-y h^T w)) + rho ||w||^2 by Newton's method."""
    w = np.zeros(x.shape[1])
    for _ in range(50):
        s = expit(-y * (x @ w))
        grad = -(x.T @ (y * s)) / len(y) + 2 * rho * w
        hess = (x.T * (s * (1 - s))) @ x / len(y) + 2 * rho * np.eye(x.shape[1])
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.linalg.norm(step) < NEWTON_TOL:
            break
    return w


def error_rate(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Fraction of test points misclassified by sign(h^T w), for models w (..., M)."""
    flat = w.reshape(-1, w.shape[-1])
    wrong = np.empty(len(flat))
    for start in range(0, len(flat), 64):  # bounds the (chunk, N_test) score matrix
        scores = flat[start : start + 64] @ x.T
        wrong[start : start + 64] = np.mean(np.sign(scores) != y, axis=1)
    return wrong.reshape(w.shape[:-1])


def test_errors(
    models: np.ndarray, q: np.ndarray, data: datasets.Dataset
) -> tuple[np.ndarray, np.ndarray]:
    """(centroid testing error, average individual testing error) of models (T, P, M)."""
    centroid = error_rate(np.tensordot(models, q, axes=(1, 0)), data.x_test, data.y_test)
    individual = error_rate(models, data.x_test, data.y_test).mean(axis=1)
    return centroid, individual

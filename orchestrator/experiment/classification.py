"""The paper's section V-B problem: the public spec, the global minimizer, testing errors.

The agents' data come from agent.losses.classification_data (a dataset shipped in
agent/data); this module cuts the training rows into the agents' blocks and draws their
feature noise levels, solves for w^o by Newton's method on the pooled data, and scores
models on the dataset's own test split.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from agent import datasets, rng
from agent.losses import ClassificationSpec, classification_data
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.seeds import Purpose, key, keys

NEWTON_TOL = 1e-12


def draw_problem(
    config: ExperimentConfig, repeat: int, twin: int | None = None
) -> tuple[ClassificationSpec, ...]:
    """Every agent's spec: a disjoint block of `samples` rows of the shuffled training set,
    a feature noise std ~ U[0, feature_noise] (non-iid agents), its own keys. `twin`: the
    agent whose data D' replaces by a fresh sample of rows with fresh feature noise."""
    agents, seed = config.agents, config.seed
    noise = rng.generator(key(seed, Purpose.PROBLEM, repeat)).uniform(
        0, config.feature_noise, agents
    )
    size = len(datasets.load(config.dataset).y_train)
    n = config.samples
    if n * agents > size:
        raise ValueError(
            f"{agents} agents x {n} samples exceed the {size} training rows "
            f"of {config.dataset}; lower samples to at most {size // agents}"
        )
    order = rng.generator(key(seed, Purpose.ROWS, repeat)).permutation(size)
    rows = [order[p * n : (p + 1) * n] for p in range(agents)]
    data = keys(seed, Purpose.DATA, repeat, agents)
    if twin is not None:
        fresh = rng.generator(key(seed, Purpose.TWIN_ROWS, repeat, twin))
        rows[twin] = fresh.choice(size, n, replace=False)
        data[twin] = key(seed, Purpose.TWIN_DATA, repeat, twin)
    batches = keys(seed, Purpose.BATCH, repeat, agents)
    return tuple(
        ClassificationSpec(
            dataset=config.dataset,
            dim=config.dim,
            rows=tuple(rows[p].tolist()),
            feature_noise=float(noise[p]),
            rho=config.rho,
            data_key=data[p],
            batch_key=batches[p],
            batch=config.batch,
        )
        for p in range(agents)
    )


def global_minimizer(specs: tuple[ClassificationSpec, ...]) -> np.ndarray:
    """argmin of 1/P sum_p J_p: Newton's method on the pooled data (equal N per agent)."""
    parts = [classification_data(spec) for spec in specs]
    return minimizer(
        np.vstack([h for h, _ in parts]), np.concatenate([t for _, t in parts]), specs[0].rho
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

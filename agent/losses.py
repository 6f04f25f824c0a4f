"""Local risks behind one small interface, and each agent's data.

An agent generates (regression) or takes (classification, from a dataset shipped in
agent/data) its own samples from its own problem spec, so raw data never crosses the
wire. A spec holds the public data model and this agent's own keys and rows, which the
orchestrator derives from the run's master seed (orchestrator/experiment/seeds.py): they
regenerate this agent's data and minibatches and nobody else's. The orchestrator computes
w^o from the same functions over every agent's spec. `make_loss` is the one place that
turns a problem spec into an agent's loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from agent import datasets, rng


class Loss(Protocol):
    dim: int

    def grad(self, w: np.ndarray, round_: int) -> np.ndarray:
        """Gradient estimate at w in round `round_` (minibatches are drawn per round)."""
        ...


@dataclass(frozen=True)
class RegressionSpec:
    """One agent's share of the paper's section V-A problem: its N samples of
    d = u^T w* + o, u ~ N(0, R_u), o ~ N(0, noise_var), drawn from its own `data_key`."""

    dim: int
    samples: int  # N
    w_star: tuple[float, ...]
    r_u: tuple[tuple[float, ...], ...]
    noise_var: float  # sigma_o,p^2 of this agent (they differ: non-iid)
    rho: float
    data_key: tuple[int, int]  # this agent's samples
    batch_key: tuple[int, int]  # this agent's minibatch indices
    batch: int | None = None  # None: full batch (exact local gradients)


@dataclass(frozen=True)
class ClassificationSpec:
    """One agent's share of the paper's section V-B problem on a shipped dataset:
    regularized logistic regression on its `rows` of the training set (the agents' blocks
    are disjoint), with N(0, feature_noise^2) added to every feature but the bias from its
    own `data_key`, which makes the agents' data non-iid."""

    dataset: str
    dim: int
    rows: tuple[int, ...]  # this agent's rows of the training split
    feature_noise: float  # this agent's std
    rho: float
    data_key: tuple[int, int]  # this agent's feature noise
    batch_key: tuple[int, int]  # this agent's minibatch indices
    batch: int | None = None


ProblemSpec = RegressionSpec | ClassificationSpec


def regression_data(spec: RegressionSpec) -> tuple[np.ndarray, np.ndarray]:
    """The agent's samples (u of shape (N, M), d of shape (N,)), reproducible from its spec."""
    gen = rng.generator(spec.data_key)
    chol = np.linalg.cholesky(np.asarray(spec.r_u))
    u = gen.standard_normal((spec.samples, spec.dim)) @ chol.T
    o = gen.standard_normal(spec.samples) * np.sqrt(spec.noise_var)
    d = u @ np.asarray(spec.w_star) + o
    return u, d


class _Samples:
    """What every loss holds: its samples, rho, and which of them a round's gradient uses."""

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        rho: float,
        *,
        batch: int | None = None,
        key: tuple[int, int] = (0, 0),
    ) -> None:
        self.dim = x.shape[1]
        self.x, self.y, self.rho = x, y, rho
        self.batch = batch if batch and batch < len(y) else None
        self.key = key

    def sample(self, round_: int) -> tuple[np.ndarray, np.ndarray]:
        """This round's minibatch (the same in every engine)."""
        assert self.batch is not None
        idx = batch_indices(self.key, round_, self.batch, len(self.y))
        return self.x[idx], self.y[idx]


class LeastSquares(_Samples):
    """J_p(w) = 1/N sum (d - u^T w)^2 + rho ||w||^2; full batch or per-round minibatches.

    Samples: x = u (N, M) regressors, y = d (N,) targets."""

    def __init__(self, u: np.ndarray, d: np.ndarray, rho: float, **batching: Any) -> None:
        super().__init__(u, d, rho, **batching)
        n = len(d)
        # Full batch: precomputed moments, so the gradient is one small matvec.
        self.hessian = 2.0 * (u.T @ u / n + rho * np.eye(self.dim))
        self.r = 2.0 * (u.T @ d / n)

    def grad(self, w: np.ndarray, round_: int) -> np.ndarray:
        g: np.ndarray
        if self.batch is None:
            g = self.hessian @ w - self.r
        else:
            u, d = self.sample(round_)
            g = 2.0 * (u.T @ (u @ w - d) / self.batch + self.rho * w)
        return g


def classification_data(spec: ClassificationSpec) -> tuple[np.ndarray, np.ndarray]:
    """The agent's features (N, M), bias column last, and +-1 labels (N,)."""
    data = datasets.load(spec.dataset)
    rows = np.asarray(spec.rows)
    x = data.x_train[rows].copy()
    x[:, :-1] += spec.feature_noise * rng.generator(spec.data_key).standard_normal(
        (len(rows), spec.dim - 1)
    )
    return x, data.y_train[rows]


class Logistic(_Samples):
    """J_p(w) = 1/N sum ln(1 + exp(-y h^T w)) + rho ||w||^2 (the paper's section V-B).

    Samples: x = h (N, M) features, y (N,) labels in {-1, +1}."""

    def grad(self, w: np.ndarray, round_: int) -> np.ndarray:
        x, y = (self.x, self.y) if self.batch is None else self.sample(round_)
        # d/dw ln(1 + e^{-y h^T w}) = -y h sigmoid(-y h^T w), sigmoid written overflow-free.
        weight = -y * _sigmoid(-y * (x @ w))
        g: np.ndarray = x.T @ weight / len(y) + 2.0 * self.rho * w
        return g


def _sigmoid(z: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(z))
    s: np.ndarray = np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return s


def make_loss(spec: ProblemSpec) -> Loss:
    """The local risk an agent's problem spec describes (the one factory every engine uses)."""
    kind: type[LeastSquares | Logistic]
    if isinstance(spec, RegressionSpec):
        kind, (x, y) = LeastSquares, regression_data(spec)
    else:
        kind, (x, y) = Logistic, classification_data(spec)
    return kind(x, y, spec.rho, batch=spec.batch, key=spec.batch_key)


def batch_indices(key: tuple[int, int], round_: int, batch: int, n: int) -> np.ndarray:
    """The minibatch of one agent in one round (with replacement), same in every engine."""
    return rng.indices(rng.raw_row(key, rng.Domain.BATCH, 0, round_, batch), n)

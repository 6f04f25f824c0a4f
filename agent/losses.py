"""Local risks behind one small interface, and each agent's data.

An agent generates (regression) or takes (classification, from a dataset shipped in
agent/data) its own samples from a public problem spec and its id, so raw data never
crosses the wire; the orchestrator computes w^o from the same functions. `make_loss` is
the one place that turns a problem spec into an agent's loss.

A spec's `neighbour` names the agent whose data is replaced by a fresh draw from the same
data model: the neighbouring dataset D' of the paper's Definition DP, for the accountant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from agent import datasets, rng

NO_NEIGHBOUR = -1  # every agent keeps its own data (the dataset D)


class Loss(Protocol):
    dim: int

    def grad(self, w: np.ndarray, round_: int) -> np.ndarray:
        """Gradient estimate at w in round `round_` (minibatches are drawn per round)."""
        ...


@dataclass(frozen=True)
class RegressionSpec:
    """The paper's section V-A problem: d = u^T w* + o, u ~ N(0, R_u), o ~ N(0, noise_var[p])."""

    dim: int
    samples: int  # N per agent
    w_star: tuple[float, ...]
    r_u: tuple[tuple[float, ...], ...]
    noise_var: tuple[float, ...]  # sigma_o,p^2, one per agent (non-iid)
    rho: float
    seed: int
    repeat: int = 0
    batch: int | None = None  # None: full batch (exact local gradients)
    neighbour: int = NO_NEIGHBOUR  # this agent's data is a fresh draw (D')


@dataclass(frozen=True)
class ClassificationSpec:
    """The paper's section V-B problem on a shipped dataset: regularized logistic regression.

    Agent p takes `samples` rows of the shuffled training set (a disjoint block; 0 means
    an even split) and adds N(0, feature_noise[p]^2) to every feature but the bias, which
    makes the agents' data non-iid.
    """

    dataset: str
    dim: int
    samples: int
    feature_noise: tuple[float, ...]  # one std per agent
    rho: float
    seed: int
    repeat: int = 0
    batch: int | None = None
    neighbour: int = NO_NEIGHBOUR


ProblemSpec = RegressionSpec | ClassificationSpec


def _stream(spec: ProblemSpec, kind: int, agent: int) -> np.random.Generator:
    """Data streams: kind 1 an agent's own draw, kind 4 the replacement draw of D'."""
    if agent == spec.neighbour:
        kind = 4
    seq = np.random.SeedSequence(entropy=spec.seed, spawn_key=(spec.repeat, kind, agent))
    return np.random.Generator(np.random.Philox(seq))


def regression_data(spec: RegressionSpec, agent: int) -> tuple[np.ndarray, np.ndarray]:
    """Agent `agent`'s samples (u of shape (N, M), d of shape (N,)), reproducible from the spec."""
    gen = _stream(spec, 1, agent)
    chol = np.linalg.cholesky(np.asarray(spec.r_u))
    u = gen.standard_normal((spec.samples, spec.dim)) @ chol.T
    o = gen.standard_normal(spec.samples) * np.sqrt(spec.noise_var[agent])
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
        agent: int = 0,
        agents: int = 1,
    ) -> None:
        self.dim = x.shape[1]
        self.x, self.y, self.rho = x, y, rho
        self.batch = batch if batch and batch < len(y) else None
        self.key, self.agent, self.agents = key, agent, agents

    def sample(self, round_: int) -> tuple[np.ndarray, np.ndarray]:
        """This round's minibatch (the same in every engine)."""
        assert self.batch is not None
        idx = batch_indices(self.key, round_, self.agent, self.agents, self.batch, len(self.y))
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


def shuffled_rows(spec: ClassificationSpec) -> np.ndarray:
    """The training set's row order for this seed and repeat (agents take disjoint blocks)."""
    seq = np.random.SeedSequence(entropy=spec.seed, spawn_key=(spec.repeat, 2))
    n = len(datasets.load(spec.dataset).y_train)
    return np.random.Generator(np.random.Philox(seq)).permutation(n)


def per_agent_samples(spec: ClassificationSpec) -> int:
    n = len(datasets.load(spec.dataset).y_train)
    return spec.samples or n // len(spec.feature_noise)


def classification_data(spec: ClassificationSpec, agent: int) -> tuple[np.ndarray, np.ndarray]:
    """Agent `agent`'s features (N, M), bias column last, and +-1 labels (N,).

    The neighbour of D' takes a fresh sample of rows from the whole training set instead
    of its block, with fresh feature noise.
    """
    data = datasets.load(spec.dataset)
    n = per_agent_samples(spec)
    gen = _stream(spec, 1, agent)
    if agent == spec.neighbour:
        rows = gen.choice(len(data.y_train), n, replace=False)
    else:
        rows = shuffled_rows(spec)[agent * n : (agent + 1) * n]
    x = data.x_train[rows].copy()
    x[:, :-1] += spec.feature_noise[agent] * gen.standard_normal((n, spec.dim - 1))
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


def make_loss(spec: ProblemSpec, agent: int, agents: int) -> Loss:
    """Agent `agent`'s local risk for any problem spec (the one factory every engine uses)."""
    key = rng.run_key(spec.seed, spec.repeat)
    kind: type[LeastSquares | Logistic]
    if isinstance(spec, RegressionSpec):
        kind, (x, y) = LeastSquares, regression_data(spec, agent)
    else:
        kind, (x, y) = Logistic, classification_data(spec, agent)
    return kind(x, y, spec.rho, batch=spec.batch, key=key, agent=agent, agents=agents)


def batch_indices(
    key: tuple[int, int], round_: int, agent: int, agents: int, batch: int, n: int
) -> np.ndarray:
    """The minibatch of one agent in one round (with replacement), same in every engine."""
    raw = rng.raw_row(key, rng.Domain.BATCH, 0, round_, agent, agents, batch)
    return rng.indices(raw, n)

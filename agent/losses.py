"""Local risks behind one small interface, and the paper's regression data.

An agent generates its own samples from a public problem spec and its id, so raw data
never crosses the wire; the orchestrator draws the spec and computes w^o from the same
function. Logistic regression plugs in as another `Loss`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from agent import rng


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


def regression_data(spec: RegressionSpec, agent: int) -> tuple[np.ndarray, np.ndarray]:
    """Agent `agent`'s samples (u of shape (N, M), d of shape (N,)), reproducible from the spec."""
    seq = np.random.SeedSequence(entropy=spec.seed, spawn_key=(spec.repeat, 1, agent))
    gen = np.random.Generator(np.random.Philox(seq))
    chol = np.linalg.cholesky(np.asarray(spec.r_u))
    u = gen.standard_normal((spec.samples, spec.dim)) @ chol.T
    o = gen.standard_normal(spec.samples) * np.sqrt(spec.noise_var[agent])
    d = u @ np.asarray(spec.w_star) + o
    return u, d


class LeastSquares:
    """J_p(w) = 1/N sum (d - u^T w)^2 + rho ||w||^2; full batch or per-round minibatches."""

    def __init__(
        self,
        u: np.ndarray,
        d: np.ndarray,
        rho: float,
        *,
        batch: int | None = None,
        key: tuple[int, int] = (0, 0),
        agent: int = 0,
        agents: int = 1,
    ) -> None:
        self.dim = u.shape[1]
        self.u, self.d, self.rho = u, d, rho
        self.batch = batch if batch and batch < len(d) else None
        self.key, self.agent, self.agents = key, agent, agents
        n = len(d)
        # Full batch: precomputed moments, so the gradient is one small matvec.
        self.hessian = 2.0 * (u.T @ u / n + rho * np.eye(self.dim))
        self.r = 2.0 * (u.T @ d / n)

    @classmethod
    def from_spec(cls, spec: RegressionSpec, agent: int, agents: int) -> LeastSquares:
        u, d = regression_data(spec, agent)
        key = rng.run_key(spec.seed, spec.repeat)
        return cls(u, d, spec.rho, batch=spec.batch, key=key, agent=agent, agents=agents)

    def grad(self, w: np.ndarray, round_: int) -> np.ndarray:
        g: np.ndarray
        if self.batch is None:
            g = self.hessian @ w - self.r
            return g
        idx = batch_indices(self.key, round_, self.agent, self.agents, self.batch, len(self.d))
        u, d = self.u[idx], self.d[idx]
        g = 2.0 * (u.T @ (u @ w - d) / self.batch + self.rho * w)
        return g


def batch_indices(
    key: tuple[int, int], round_: int, agent: int, agents: int, batch: int, n: int
) -> np.ndarray:
    """The minibatch of one agent in one round (with replacement), same in every engine."""
    raw = rng.raw_row(key, rng.Domain.BATCH, 0, round_, agent, agents, batch)
    return rng.indices(raw, n)

"""The paper's regression problem: draw the public spec, and the global minimizer w^o."""

from __future__ import annotations

import numpy as np

from agent.losses import RegressionSpec, regression_data


def draw_problem(
    seed: int,
    agents: int,
    *,
    repeat: int = 0,
    dim: int = 2,
    samples: int = 100,
    rho: float = 0.01,
    batch: int | None = None,
) -> RegressionSpec:
    """Random w*, a random SPD R_u (eigenvalues in [0.1, 0.5]) and non-iid noise variances."""
    seq = np.random.SeedSequence(entropy=seed, spawn_key=(repeat, 0))
    gen = np.random.Generator(np.random.Philox(seq))
    w_star = gen.standard_normal(dim)
    q, _ = np.linalg.qr(gen.standard_normal((dim, dim)))
    r_u = q @ np.diag(gen.uniform(0.1, 0.5, dim)) @ q.T
    r_u = (r_u + r_u.T) / 2
    noise_var = gen.uniform(0.1, 1.0, agents)
    return RegressionSpec(
        dim=dim,
        samples=samples,
        w_star=tuple(w_star.tolist()),
        r_u=tuple(tuple(row) for row in r_u.tolist()),
        noise_var=tuple(noise_var.tolist()),
        rho=rho,
        seed=seed,
        repeat=repeat,
        batch=batch,
    )


def local_moments(spec: RegressionSpec, agents: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-agent sample moments R_p = u^T u / N (P, M, M) and r_p = u^T d / N (P, M)."""
    r_hat = np.empty((agents, spec.dim, spec.dim))
    r_ud = np.empty((agents, spec.dim))
    for p in range(agents):
        u, d = regression_data(spec, p)
        r_hat[p] = u.T @ u / spec.samples
        r_ud[p] = u.T @ d / spec.samples
    return r_hat, r_ud


def global_minimizer(spec: RegressionSpec, agents: int) -> np.ndarray:
    """w^o = (R_u + rho I)^-1 (1/P sum_p u^T d / N): the paper's closed form."""
    r_hat, r_ud = local_moments(spec, agents)
    return np.linalg.solve(r_hat.mean(0) + spec.rho * np.eye(spec.dim), r_ud.mean(0))

"""The paper's regression problem: every agent's spec, and the global minimizer w^o."""

from __future__ import annotations

import numpy as np

from agent import rng
from agent.losses import RegressionSpec, regression_data
from orchestrator.experiment.seeds import Purpose, key, keys


def draw_problem(
    seed: int,
    agents: int,
    *,
    repeat: int = 0,
    dim: int = 2,
    samples: int = 100,
    rho: float = 0.01,
    batch: int | None = None,
    twin: int | None = None,
) -> tuple[RegressionSpec, ...]:
    """Every agent's spec: a random w*, a random SPD R_u (eigenvalues in [0.1, 0.5]) and
    non-iid noise variances, shared; each agent's own data and minibatch keys. `twin`:
    the agent whose data D' replaces by a fresh draw (its data key is another)."""
    gen = rng.generator(key(seed, Purpose.PROBLEM, repeat))
    w_star = tuple(gen.standard_normal(dim).tolist())
    q, _ = np.linalg.qr(gen.standard_normal((dim, dim)))
    r_u = q @ np.diag(gen.uniform(0.1, 0.5, dim)) @ q.T
    r_u = (r_u + r_u.T) / 2
    noise_var = gen.uniform(0.1, 1.0, agents)
    data = keys(seed, Purpose.DATA, repeat, agents)
    if twin is not None:
        data[twin] = key(seed, Purpose.TWIN_DATA, repeat, twin)
    batches = keys(seed, Purpose.BATCH, repeat, agents)
    return tuple(
        RegressionSpec(
            dim=dim,
            samples=samples,
            w_star=w_star,
            r_u=tuple(tuple(row) for row in r_u.tolist()),
            noise_var=float(noise_var[p]),
            rho=rho,
            data_key=data[p],
            batch_key=batches[p],
            batch=batch,
        )
        for p in range(agents)
    )


def local_moments(specs: tuple[RegressionSpec, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per-agent sample moments R_p = u^T u / N (P, M, M) and r_p = u^T d / N (P, M)."""
    dim = specs[0].dim
    r_hat = np.empty((len(specs), dim, dim))
    r_ud = np.empty((len(specs), dim))
    for p, spec in enumerate(specs):
        u, d = regression_data(spec)
        r_hat[p] = u.T @ u / spec.samples
        r_ud[p] = u.T @ d / spec.samples
    return r_hat, r_ud


def global_minimizer(specs: tuple[RegressionSpec, ...]) -> np.ndarray:
    """w^o = (R_u + rho I)^-1 (1/P sum_p u^T d / N): the paper's closed form."""
    r_hat, r_ud = local_moments(specs)
    rho, dim = specs[0].rho, specs[0].dim
    return np.linalg.solve(r_hat.mean(0) + rho * np.eye(dim), r_ud.mean(0))

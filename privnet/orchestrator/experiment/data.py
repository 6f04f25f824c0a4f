"""Every agent's share of the data, drawn from the run's seed, and the reference w^o.

Generated data (`linear`, the paper's section V-A): the data model (w*, R_u with
eigenvalues in [0.1, 0.5], each agent's noise variance) is drawn here, once, and each agent
draws its own samples from its own data key. A dataset (the paper's section V-B, and any
other): the partition deals the training rows out, each agent's feature noise std is drawn
~ U[0, feature_noise], and each agent adds its noise from its own data key. The agent whose
data the neighbouring dataset D' replaces (`twin`) gets a fresh draw: new samples, or a
fresh sample of rows with fresh noise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from privnet.agent import datasets, problems, rng
from privnet.agent.problems import LINEAR, Linear, Params, Rows, Share
from privnet.orchestrator.experiment import partition
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.seeds import Purpose, key, keys

Parts = list[tuple[np.ndarray, np.ndarray]]  # every agent's samples (x, y)


def draw_shares(
    config: ExperimentConfig, params: Params, features: int, repeat: int, twin: int | None = None
) -> tuple[Share, ...]:
    """Every agent's Share in `repeat`: its data (generated with `features` columns, or rows
    of the dataset) and its own keys; `twin`: the agent whose data D' replaces by a fresh
    draw."""
    agents, seed = config.agents, config.seed
    data = keys(seed, Purpose.DATA, repeat, agents)
    if twin is not None:
        data[twin] = key(seed, Purpose.TWIN_DATA, repeat, twin)
    batches = keys(seed, Purpose.BATCH, repeat, agents)
    held: Sequence[Linear | Rows] = (
        _linear(config, features, repeat)
        if config.dataset == LINEAR
        else _rows(config, repeat, twin)
    )
    return tuple(
        Share(config.problem, params, part, config.dim, data[p], batches[p], config.batch)
        for p, part in enumerate(held)
    )


def _linear(config: ExperimentConfig, dim: int, repeat: int) -> list[Linear]:
    gen = rng.generator(key(config.seed, Purpose.PROBLEM, repeat))
    w_star = tuple(gen.standard_normal(dim).tolist())
    q, _ = np.linalg.qr(gen.standard_normal((dim, dim)))
    r_u = q @ np.diag(gen.uniform(0.1, 0.5, dim)) @ q.T
    r_u = tuple(tuple(row) for row in ((r_u + r_u.T) / 2).tolist())
    noise_var = gen.uniform(0.1, 1.0, config.agents)
    return [Linear(config.samples, w_star, r_u, float(v)) for v in noise_var]


def _rows(config: ExperimentConfig, repeat: int, twin: int | None) -> list[Rows]:
    agents, seed = config.agents, config.seed
    assert config.dataset is not None
    noise = rng.generator(key(seed, Purpose.PROBLEM, repeat)).uniform(
        0, config.feature_noise, agents
    )
    labels = datasets.load(config.dataset).y_train
    gen = rng.generator(key(seed, Purpose.ROWS, repeat))
    dealt = partition.rows(config.partition, labels, agents, config.samples, gen)
    if twin is not None:
        fresh = rng.generator(key(seed, Purpose.TWIN_ROWS, repeat, twin))
        dealt[twin] = fresh.choice(len(labels), len(dealt[twin]), replace=False)
    return [
        Rows(config.dataset, tuple(rows.tolist()), float(noise[p])) for p, rows in enumerate(dealt)
    ]


def parts(shares: Sequence[Share]) -> Parts:
    """Every agent's samples, as each agent draws them from its Share."""
    return [problems.samples(share.data, share.data_key) for share in shares]


def reference(
    problem: problems.Problem, risks: Sequence[problems.Risk], parts: Parts, dim: int
) -> np.ndarray | None:
    """w^o = argmin 1/P sum_p J_p: the problem's own optimum when it has one (None: no
    reference), else found by L-BFGS from the risks' values and gradients (Hessian-free; a
    problem without `value` has no reference)."""
    optimum = getattr(problem, "optimum", None)
    if optimum is not None:
        found = optimum(parts)
        return None if found is None else np.asarray(found, dtype=np.float64)
    if not all(callable(getattr(risk, "value", None)) for risk in risks):
        return None
    from scipy.optimize import minimize

    def risk(w: np.ndarray) -> tuple[float, np.ndarray]:
        model = w[None]
        value = np.mean([r.value(model, None)[0] for r in risks])  # type: ignore[attr-defined]
        grad = np.mean([r.gradient(model, None)[0] for r in risks], axis=0)
        return float(value), grad

    solved = minimize(
        risk,
        np.zeros(dim),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": 10_000, "ftol": 1e-15, "gtol": 1e-12},
    )
    return np.asarray(solved.x, dtype=np.float64)

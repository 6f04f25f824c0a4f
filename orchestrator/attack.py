"""The reconstruction attack: what an eavesdropper with the whole wire can rebuild.

It records every model message of a run (as `privnet run --audit` does) and knows the
public combination matrix, the strategy, the scheme and mu. Per round and combine step it
solves for the clear values y_m (what each sender privatized) by least squares:
  - every link message m -> k observes y_m (none: exactly; random: plus its own noise;
    ghp: plus the sender's one draw; local-ghp: plus pair masks of scale b / a_mk);
  - local-ghp only: every hub k with two or more other neighbours gets
    sum_l a_lk (message l -> k) = sum_l a_lk y_l exactly, since the masks cancel there.
    These sums are exact constraints (Mrini, Cyffers and Bellet, ICML 2024, reconstruct
    data from gossip averages the same way); the link messages, weighted by a_mk^2, settle
    only what the sums leave free.
With the trajectory it estimates each agent's local minimizer (ATC): the update
psi_p = phi_p - mu grad J_p(phi_p) gives grad J_p at phi_p = sum_m a_mp (what p received),
and an affine fit grad ~ H w - r over the rounds has its root at H^-1 r.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from rich.table import Table
from scipy.linalg import lstsq, null_space

from agent.spec import Scheme, Strategy
from orchestrator.experiment import classification
from orchestrator.experiment.problem import Problem
from orchestrator.report import titled_table

Seen = Mapping[tuple[int, int, int, int], np.ndarray]  # (sender, receiver, round, step)
RECOVERED = 1e-9  # relative error below which a trajectory counts as recovered exactly


def reconstruct(
    problem: Problem, strategy: Strategy, scheme: Scheme, seen: Seen
) -> dict[tuple[int, int, int], np.ndarray]:
    """Estimates of y[(sender, round, step)] from the messages on the wire."""
    matrices = problem.matrices(strategy)
    by_slot: dict[tuple[int, int], list[tuple[int, int, np.ndarray]]] = {}
    for (m, k, i, step), vector in seen.items():
        by_slot.setdefault((i, step), []).append((m, k, np.asarray(vector)))
    out = {}
    for (i, step), links in by_slot.items():
        a = matrices[step]
        senders = sorted({m for m, _, _ in links})
        column = {m: n for n, m in enumerate(senders)}
        rows = np.zeros((len(links), len(senders)))
        weights = np.ones(len(links))
        for r, (m, k, _) in enumerate(links):
            rows[r, column[m]] = 1.0
            if scheme is Scheme.LOCAL_GHP:
                weights[r] = a[m, k]
        values = np.array([v for *_, v in links])
        exact, sums = _hub_sums(a, links, column) if scheme is Scheme.LOCAL_GHP else (None, None)
        y = _solve(rows * weights[:, None], values * weights[:, None], exact, sums)
        out.update({(m, i, step): y[column[m]] for m in senders})
    return out


def _hub_sums(a: np.ndarray, links, column) -> tuple[np.ndarray | None, np.ndarray | None]:
    """local-ghp: sum_l a_lk y_l = sum_l a_lk (message l -> k) at hubs with >= 2 senders."""
    into: dict[int, list[tuple[int, np.ndarray]]] = {}
    for m, k, v in links:
        into.setdefault(k, []).append((m, v))
    rows, sums = [], []
    for k, heard in sorted(into.items()):
        if len(heard) < 2:
            continue  # the hub pairs with its sole neighbour: its sum stays masked
        row = np.zeros(len(column))
        for m, _ in heard:
            row[column[m]] = a[m, k]
        rows.append(row)
        sums.append(sum(a[m, k] * v for m, v in heard))
    return (np.array(rows), np.array(sums)) if rows else (None, None)


def _solve(rows, values, exact, sums) -> np.ndarray:
    """Least squares for `rows y = values`, subject to `exact y = sums` when given."""
    if exact is None:
        return lstsq(rows, values)[0]
    pinned = lstsq(exact, sums)[0]
    free = null_space(exact)
    if free.shape[1] == 0:
        return pinned
    z = lstsq(rows @ free, values - rows @ pinned)[0]
    return pinned + free @ z


def local_minimizers(problem: Problem, repeat: int) -> np.ndarray:
    """The true argmin J_p of every agent, (P, M)."""
    from agent.losses import classification_data

    c = problem.config
    if problem.classifies:
        specs = problem.classification_specs(repeat)
        return np.array([classification.minimizer(*classification_data(s), c.rho) for s in specs])
    r_hat, r_ud = problem.moments(repeat)
    return np.array(
        [np.linalg.solve(r_hat[p] + c.rho * np.eye(c.dim), r_ud[p]) for p in range(c.agents)]
    )


def estimate_minimizers(
    problem: Problem, estimate: dict[tuple[int, int, int], np.ndarray], seen: Seen
) -> np.ndarray:
    """ATC: the root of an affine fit of grad J_p against phi_p over the rounds."""
    c = problem.config
    a = problem.A
    out = np.full((c.agents, c.dim), np.nan)
    for p in range(c.agents):
        phis, grads = [], []
        for i in range(1, c.iters + 1):
            if (p, i, 2) not in estimate:
                continue
            if i == 1:
                phi = np.zeros(c.dim)  # w_0
            else:
                heard = [m for m in range(c.agents) if a[m, p] > 0]
                if any(m != p and (m, p, i - 1, 2) not in seen for m in heard):
                    continue
                phi = sum(
                    a[m, p] * (estimate[(p, i - 1, 2)] if m == p else seen[(m, p, i - 1, 2)])
                    for m in heard
                )
            phis.append(phi)
            grads.append((phi - estimate[(p, i, 2)]) / c.mu)
        if len(phis) > c.dim:
            design = np.hstack([np.array(phis), -np.ones((len(phis), 1))])
            coef = lstsq(design, np.array(grads))[0]  # grad = phi @ H^T - r
            h_t, r = coef[:-1], coef[-1]
            out[p] = lstsq(h_t.T, r)[0]
    return out


def attack_session(
    problem: Problem,
    strategy: Strategy,
    scheme: Scheme,
    repeat: int,
    seen: Seen,
    clear: Mapping[tuple[int, int, int], np.ndarray],
) -> dict[str, Any]:
    """Per-agent relative errors of the trajectory and local-minimizer estimates."""
    estimate = reconstruct(problem, strategy, scheme, seen)
    c = problem.config
    errors = []
    for p in range(c.agents):
        keys = [key for key in clear if key[0] == p and key in estimate]
        truth = np.array([clear[key] for key in keys])
        guess = np.array([estimate[key] for key in keys])
        scale = max(float(np.linalg.norm(truth)), 1e-300)
        errors.append(float(np.linalg.norm(guess - truth)) / scale)
    record: dict[str, Any] = {
        "strategy": str(strategy),
        "scheme": str(scheme),
        "repeat": repeat,
        "trajectory_rel_error": errors,
        "trajectory_rel_error_median": float(np.median(errors)),
        "trajectory_rel_error_max": float(np.max(errors)),
        "agents_recovered": int(np.sum(np.array(errors) < RECOVERED)),
    }
    if strategy is Strategy.ATC:
        truth = local_minimizers(problem, repeat)
        guess = estimate_minimizers(problem, estimate, seen)
        rel = np.linalg.norm(guess - truth, axis=1) / np.linalg.norm(truth, axis=1)
        record["minimizer_rel_error"] = [float(e) for e in rel]
        record["minimizer_rel_error_median"] = float(np.nanmedian(rel))
    record["pinned_directions"] = pinned_directions(problem, strategy, scheme)
    recovered = record["agents_recovered"]
    record["broken"] = recovered == c.agents
    record["verdict"] = (
        "broken"
        if record["broken"]
        else f"partly broken: {recovered} of {c.agents} agents"
        if recovered
        else "not broken"
    )
    return record


def pinned_directions(problem: Problem, strategy: Strategy, scheme: Scheme) -> int:
    """How many of the P unknowns per step the exact hub sums fix (local-ghp; else 0)."""
    if scheme is not Scheme.LOCAL_GHP:
        return 0
    a = problem.A  # the matrix of the communicating step, for every strategy
    b = a.T - np.diag(np.diag(a))
    return int(np.linalg.matrix_rank(b[(b > 0).sum(axis=1) >= 2]))


def attack_table(records: list[dict[str, Any]]) -> Table:
    table = titled_table(
        "reconstruction attack: an eavesdropper with the whole wire and A",
        (
            "session",
            "recovered",
            "pinned",
            "traj. err (median)",
            "traj. err (max)",
            "argmin J_p err (median)",
            "verdict",
        ),
        left=1,
    )
    for r in records:
        table.add_row(
            f"{r['strategy']}/{r['scheme']} r{r['repeat']}",
            f"{r['agents_recovered']}/{len(r['trajectory_rel_error'])}",
            f"{r['pinned_directions']}/{len(r['trajectory_rel_error'])}",
            f"{r['trajectory_rel_error_median']:.3g}",
            f"{r['trajectory_rel_error_max']:.3g}",
            f"{r['minimizer_rel_error_median']:.3g}" if "minimizer_rel_error_median" in r else "–",
            r["verdict"],
        )
    return table

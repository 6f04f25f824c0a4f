"""`privnet dp-audit`: check the accountant's epsilon against an attacker, empirically.

Many short trials of one scheme run on D and on D' (agent p's data replaced), each with
fresh noise, and an attacker sees what its place shows it (`views_for`: the links out of p,
one link, a hub's weighted sum, or the whole wire's). It scores each trial by a Laplace
log-likelihood ratio fitted on half the trials and counts false positives and negatives on
the other half; any test gives a valid lower bound (Jagielski et al. 2020, Nasr et al.
2023), eps_LB = the larger `epsilon_bound` at the upper ends of 95% Clopper-Pearson
intervals, so eps_LB <= eps with >= 95% confidence if the mechanism is eps-DP. The claim it
is checked against is the accountant's epsilon for that attacker, its largest over trials.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.table import Table
from scipy import stats

from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.experiment import seeds
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.privacy.accountant import INFINITE, Adversary, Charges, view_weights
from privnet.orchestrator.replay import replay
from privnet.orchestrator.terminal import titled_table

CONFIDENCE = 0.95
Seen = Mapping[tuple[int, int, int, int], np.ndarray]  # (sender, receiver, round, step)


@dataclass(frozen=True)
class View:
    """Who attacks: `links-out` of the changed agent, `one-link` to `hub`, the `hub`, or
    the whole `wire`."""

    kind: str
    hub: int | None = None

    def __str__(self) -> str:
        return self.kind if self.hub is None else f"{self.kind} (hub {self.hub})"

    def adversary(self, agent: int) -> Adversary:
        """The accountant's adversary that reads what this view shows."""
        if self.kind == "links-out":
            return Adversary("links-out", sender=agent)
        if self.kind == "one-link":
            return Adversary("link", sender=agent, receiver=self.hub)
        if self.kind == "hub":
            assert self.hub is not None
            return Adversary("hub", frozenset({self.hub}))
        return Adversary("wire")


def views_for(problem: Instance, scheme: Scheme, strategy: Strategy, agent: int) -> list[View]:
    """The attackers each scheme claims a finite epsilon against: an unmasked one the
    links out of the agent; a masked one a link and the hub that weighs the agent most,
    and with noise of its own under the masks (masked-ghp) the whole wire too."""
    if not scheme.masked:
        return [View("links-out")]
    hub = _largest_hub(problem, strategy, agent)
    views = [View("one-link", hub), View("hub", hub)]
    return [*views, View("wire")] if scheme.part.perturbs else views


def _largest_hub(problem: Instance, strategy: Strategy, agent: int) -> int:
    """The neighbour that weighs the agent most (its masks are the smallest there)."""
    a = problem.A  # the matrix of the communicating step, for every strategy
    row = a[agent].copy()
    row[agent] = 0.0
    return int(np.argmax(row))


def observe(
    view: View, seen: Seen, agent: int, problem: Instance, strategy: Strategy
) -> np.ndarray:
    """The attacker's observation of one trial, as one flat vector in a fixed order."""
    if view.kind == "links-out":
        picked = sorted((i, j, k) for m, k, i, j in seen if m == agent)
        return np.concatenate([seen[(agent, k, i, j)] for i, j, k in picked])
    if view.kind == "one-link":
        links = sorted((k, i, j) for m, k, i, j in seen if m == agent and k == view.hub)
        return np.concatenate([seen[(agent, k, i, j)] for k, i, j in links])
    sums: dict[tuple[int, int, int], np.ndarray] = {}
    matrices: dict[int, tuple[np.ndarray, ...]] = {}  # a schedule's per round, else one
    for (m, k, i, j), vector in seen.items():
        if view.kind == "wire" or k == view.hub:
            at = 0 if problem.schedule is None else i
            if at not in matrices:
                matrices[at] = problem.round_matrices(strategy, i)
            sums[(k, i, j)] = sums.get((k, i, j), 0.0) + matrices[at][j][m, k] * vector
    return np.concatenate([sums[key] for key in sorted(sums)])


def clopper_pearson(
    errors: int, trials: int, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """Two-sided exact binomial interval for a rate of `errors` in `trials`."""
    tail = (1 - confidence) / 2
    lo = 0.0 if errors == 0 else float(stats.beta.ppf(tail, errors, trials - errors + 1))
    hi = 1.0 if errors == trials else float(stats.beta.ppf(1 - tail, errors + 1, trials - errors))
    return lo, hi


def epsilon_bound(fpr_hi: float, fnr_hi: float, way: int) -> float:
    """One of the two ratios DP bounds: TPR / FPR (way 0) or TNR / FNR (way 1)."""
    a, b = (fnr_hi, fpr_hi) if way == 0 else (fpr_hi, fnr_hi)
    return max(0.0, math.log((1 - a) / b)) if b > 0 and a < 1 else 0.0


def _scores(views: np.ndarray, mean_d: np.ndarray, mean_twin: np.ndarray, scale: np.ndarray):
    """Laplace log-likelihood ratio log f_D(x) / f_D'(x), one per trial (rows of `views`)."""
    return ((np.abs(views - mean_twin) - np.abs(views - mean_d)) / scale).sum(axis=1)


@dataclass
class AttackResult:
    view: str
    trials: int  # per dataset, in the held-out half
    false_positives: int
    false_negatives: int
    fpr_interval: tuple[float, float]
    fnr_interval: tuple[float, float]
    epsilon_hat: float  # from the point estimates (rates floored at 1/trials)
    epsilon_lb: float  # the 95% lower bound


def attack(on_d: np.ndarray, on_twin: np.ndarray, view: str) -> AttackResult:
    """Fit on the first half of the trials, test on the second half (see module doc)."""
    half = len(on_d) // 2
    fit_d, fit_twin, test_d, test_twin = on_d[:half], on_twin[:half], on_d[half:], on_twin[half:]
    mean_d, mean_twin = np.median(fit_d, axis=0), np.median(fit_twin, axis=0)
    spread = np.abs(np.concatenate([fit_d - mean_d, fit_twin - mean_twin])).mean(axis=0)
    scale = np.maximum(spread, 1e-12 * (1 + np.abs(mean_d)))  # none: no noise at all
    fit_d, fit_twin, s_d, s_twin = (
        _scores(v, mean_d, mean_twin, scale) for v in (fit_d, fit_twin, test_d, test_twin)
    )
    # Scores on a grid of 1e-9 of their range: the Laplace ratio is flat beyond both means,
    # and the float rounding of those ties would otherwise pass for evidence.
    unit = 1e-9 * max(np.abs(fit_d).max(), np.abs(fit_twin).max(), 1e-300)
    fit_d, fit_twin, s_d, s_twin = (np.rint(v / unit) for v in (fit_d, fit_twin, s_d, s_twin))
    threshold, way = _best_threshold(fit_d, fit_twin)
    n = len(s_d)
    fp, fn = int(np.sum(s_twin > threshold)), int(np.sum(s_d <= threshold))
    fpr, fnr = clopper_pearson(fp, n), clopper_pearson(fn, n)
    floor = 1 / n
    hat = epsilon_bound(max(fp / n, floor), max(fn / n, floor), way)
    return AttackResult(view, n, fp, fn, fpr, fnr, hat, epsilon_bound(fpr[1], fnr[1], way))


def _best_threshold(s_d: np.ndarray, s_twin: np.ndarray) -> tuple[float, int]:
    """The threshold (call D when score > it) and the ratio (`epsilon_bound`'s way) whose
    Clopper-Pearson eps_LB on the fitted half is largest: a point estimate would favour
    far tails, where a few counts decide. Both are fixed before the held-out half is seen."""
    n = len(s_d)
    values = np.unique(np.concatenate([s_d, s_twin]))
    # Midway between observed scores, so a tie on the fitted half does not sit on its edge.
    candidates = np.concatenate([[values[0] - 1.0], (values[:-1] + values[1:]) / 2])
    fp = (s_twin[None, :] > candidates[:, None]).sum(axis=1)
    fn = (s_d[None, :] <= candidates[:, None]).sum(axis=1)
    tail = (1 - CONFIDENCE) / 2
    fpr_hi = np.where(fp == n, 1.0, stats.beta.ppf(1 - tail, fp + 1, np.maximum(n - fp, 1)))
    fnr_hi = np.where(fn == n, 1.0, stats.beta.ppf(1 - tail, fn + 1, np.maximum(n - fn, 1)))
    pairs = zip(fpr_hi, fnr_hi, strict=True)
    bounds = np.array([[epsilon_bound(a, b, way) for way in (0, 1)] for a, b in pairs])
    best, way = np.unravel_index(int(np.argmax(bounds)), bounds.shape)
    return float(candidates[best]), int(way)


def run_trials(
    problem: Instance, strategy: Strategy, scheme: Scheme, agent: int, trials: int, seed: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Views on D and on D' of every trial, and per view the accountant's eps of each
    D/D' pair."""
    twin = problem.twin(agent)
    views = views_for(problem, scheme, strategy, agent)
    seen: dict[str, dict[str, list[np.ndarray]]] = {"d": {}, "twin": {}}
    weights = view_weights(problem, strategy, None)
    claimed = {str(view): np.zeros(trials) for view in views}
    c = problem.config
    for t in range(trials):
        # Fresh noise per trial (every agent's own keys, as for repeat t + 1), shared by the
        # D/D' pair.
        keys = seeds.keys(seed, seeds.Purpose.NOISE, t + 1, problem.config.agents)
        runs = {}
        for name, which in (("d", problem), ("twin", twin)):
            runs[name] = replay(which, strategy, scheme, 0, noise_keys=keys)
            for view in views:
                obs = observe(view, runs[name].wire.models, agent, which, strategy)
                seen[name].setdefault(str(view), []).append(obs)
        charges = Charges(scheme, c.sigma_g, c.iters, runs["d"], runs["twin"], weights)
        for view in views:
            claimed[str(view)][t] = charges.epsilon(view.adversary(agent))[-1]
    stack = {name: {v: np.array(obs) for v, obs in d.items()} for name, d in seen.items()}
    return stack["d"], stack["twin"], claimed


def dp_audit(
    problem: Instance, strategy: Strategy, scheme: Scheme, agent: int, trials: int, seed: int = 1
) -> list[dict[str, Any]]:
    """One record per attacker view: eps_LB with its intervals, and the claimed eps."""
    on_d, on_twin, claimed = run_trials(problem, strategy, scheme, agent, trials, seed)
    records = []
    for view in views_for(problem, scheme, strategy, agent):
        result = attack(on_d[str(view)], on_twin[str(view)], str(view))
        claims = claimed[str(view)]
        claim = float(claims.max())
        finite = bool(np.all(np.isfinite(claims)))
        records.append(
            {
                "strategy": str(strategy),
                "scheme": str(scheme),
                "agent": agent,
                "view": str(view),
                "rounds": problem.config.iters,
                "trials_per_dataset": trials,
                "held_out_per_dataset": result.trials,
                "false_positives": result.false_positives,
                "false_negatives": result.false_negatives,
                "fpr_95": list(result.fpr_interval),
                "fnr_95": list(result.fnr_interval),
                "epsilon_hat": result.epsilon_hat,
                "epsilon_lb": result.epsilon_lb,
                "epsilon_claimed": claim if math.isfinite(claim) else INFINITE,
                "epsilon_claimed_range": [float(claims.min()), claim] if finite else None,
                "consistent": result.epsilon_lb <= claim,
            }
        )
    return records


def audit_table(records: list[dict[str, Any]]) -> Table:
    table = titled_table(
        "dp-audit: empirical lower bound vs claimed epsilon (95% Clopper-Pearson)",
        (
            "scheme",
            "attacker",
            "trials",
            "FP",
            "FN",
            "eps_hat",
            "eps_LB",
            "eps claimed",
            "ok",
        ),
        left=2,
    )
    for r in records:
        claim = r["epsilon_claimed"]
        table.add_row(
            r["scheme"],
            r["view"],
            f"{r['held_out_per_dataset']}+{r['held_out_per_dataset']}",
            str(r["false_positives"]),
            str(r["false_negatives"]),
            f"{r['epsilon_hat']:.3f}",
            f"{r['epsilon_lb']:.3f}",
            claim if claim == INFINITE else f"{claim:.3f}",
            "yes" if r["consistent"] else "NO",
        )
    return table


def sampler_table(report: dict[str, Any]) -> Table:
    """Mironov's test: releases for x = shift that x = 0 cannot produce (0 = no leak)."""
    table = titled_table(
        "Laplace sampler leak: releases impossible under x = 0 "
        f"(the grid thins out beyond {report['first_hole_scales']:.1f} scales)",
        ("sampler", "shift (scales b)", "draws", "impossible"),
        left=1,
    )
    for r in report["releases"]:
        table.add_row(
            r["sampler"],
            f"{r['shift_scales']:g}",
            str(r["draws"]),
            f"{r['impossible_fraction']:.4f}",
        )
    return table

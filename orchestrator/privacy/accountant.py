"""The accountant: epsilon(i) per agent and for the network, from twin trajectories.

The paper's Definition DP compares what an observer sees when one agent's data is
replaced (D -> D'). The accountant runs the experiment on D and on D' through the memory
engine's agent cores with the same seed, so `random` and `ghp` draw the very same noise
and every difference between the two runs is the change of data. It records the clear
value y behind every model an agent sends and, with b = sigma_g / sqrt(2) the Laplace
scale, adds up the privacy loss of each release (paper's proof of eq. (eps), corrected):

    eps_p(i) = 1/b * sum_{j <= i} sum_steps  c_p * || y_p,j - y'_p,j ||_1

The Laplace mechanism's loss is the L1 distance over the scale; the paper writes the L2
norm, which undercounts by up to sqrt(M). c_p says how many independent releases of y_p
the scheme makes on the links out of p:
  random     one per receiver (fresh noise on every link): c_p = |N_p| - 1
  ghp        one draw g_p on all links: c_p = 1
  local-ghp  per link to hub k, y_p + (a sum of pair masks, each Laplace(b) / a_pk):
             at most a_pk / b per unit of L1 distance, so c_p = sum_{k != p} a_pk
  none       the clear value: eps = infinity.
This is epsilon for this neighbouring pair, this noise level and this realisation; the
paper's network form sqrt(2) P / sigma_g * sum_{j<i} Delta(j) and its high-probability
linear bound (B, B' the largest distances of either trajectory to w^o, measured here) are
reported beside it. An observer of the whole wire sees every agent's releases: for random
and ghp its epsilon is the sum over agents; for local-ghp it can add an agent's messages
to a hub and cancel the masks (the hub sums are in the clear), so its epsilon is infinite.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from rich.table import Table

from agent.losses import Loss
from agent.spec import Scheme, Strategy
from orchestrator.experiment.problem import Problem
from orchestrator.experiment.specs import agent_specs
from orchestrator.report import DPI, SCHEME_ORDER, SCHEME_STYLE, Curve, titled_table

INFINITE = "inf"  # how summary.json spells an infinite epsilon (strict JSON has no inf)


@dataclass
class Account:
    """One strategy x scheme x repeat: per-round distances and epsilons."""

    delta: np.ndarray  # (T,): Delta(i) = ||w_i - w'_i|| over the whole network
    epsilon: np.ndarray  # (T, P): eps_p(i), links out of agent p
    epsilon_network: np.ndarray  # (T,): an eavesdropper on every link
    epsilon_paper: np.ndarray  # (T,): sqrt(2) P / sigma_g * sum_{j<i} Delta(j)
    bound_slope: float  # the paper's linear bound on eps(i) / i, with B, B' measured
    models: np.ndarray  # (T, P, M) on D
    twin_models: np.ndarray  # (T, P, M) on D'


def releases(problem: Problem, strategy: Strategy, scheme: Scheme) -> dict[tuple[int, int], float]:
    """c_p per (agent, step): how many Laplace(b) releases of y_p the links out of p carry."""
    out = {}
    for spec in agent_specs(problem, strategy, scheme):
        for plan in spec.steps:
            receivers = plan.receivers(spec.agent)
            if not receivers:
                continue
            if scheme is Scheme.RANDOM:
                out[(spec.agent, plan.step)] = float(len(receivers))
            elif scheme is Scheme.GHP:
                out[(spec.agent, plan.step)] = 1.0
            elif scheme is Scheme.LOCAL_GHP:
                out[(spec.agent, plan.step)] = sum(plan.weights_out[k] for k in receivers)
            else:
                out[(spec.agent, plan.step)] = math.inf
    return out


def account(
    problem: Problem,
    strategy: Strategy,
    scheme: Scheme,
    neighbour: int,
    repeat: int = 0,
    losses: tuple[Sequence[Loss], Sequence[Loss]] | None = None,
) -> Account:
    """Run D and D' (agent `neighbour`'s data replaced) and account every release.

    `losses`: one loss per agent on D and on D' to run instead of the problem's own,
    e.g. losses written by hand.
    """
    from orchestrator.audit import replay  # the memory engine, noting clear values

    c = problem.config
    twin = problem.twin(neighbour)
    ours_losses, twin_losses = losses or (None, None)
    ours = replay(problem, strategy, scheme, repeat, losses=ours_losses)
    theirs = replay(twin, strategy, scheme, repeat, losses=twin_losses)
    per_round = np.zeros((c.iters, c.agents))
    for (agent, step), count in releases(problem, strategy, scheme).items():
        for i in range(1, c.iters + 1):
            distance = np.abs(ours.clear[(agent, i, step)] - theirs.clear[(agent, i, step)]).sum()
            if distance > 0:  # 0 * inf is no leak: an unchanged release tells nothing
                per_round[i - 1, agent] += count * distance
    per_round *= math.sqrt(2.0) / c.sigma_g if c.sigma_g > 0 else math.inf
    epsilon = np.cumsum(per_round, axis=0)
    network = epsilon.sum(axis=1)
    if scheme is Scheme.LOCAL_GHP:
        network = np.where(network > 0, math.inf, 0.0)
    delta = np.linalg.norm((ours.models - theirs.models).reshape(c.iters, -1), axis=1)
    noisy = c.sigma_g > 0 and scheme is not Scheme.NONE
    scale = math.sqrt(2.0) * c.agents / c.sigma_g if noisy else math.inf
    before = np.concatenate([[0.0], np.cumsum(delta)[:-1]])
    paper = np.where(before > 0, scale * np.where(before > 0, before, 1.0), 0.0)
    w_o, w_o_twin = problem.w_opt[repeat], twin.w_opt[repeat]
    b = np.linalg.norm((ours.models - w_o).reshape(c.iters, -1), axis=1).max()
    b_twin = np.linalg.norm((theirs.models - w_o_twin).reshape(c.iters, -1), axis=1).max()
    slope = scale * (b + b_twin + math.sqrt(c.agents) * np.linalg.norm(w_o - w_o_twin))
    return Account(delta, epsilon, network, paper, float(slope), ours.models, theirs.models)


Accounting = Callable[[Problem, Strategy, Scheme, int, int], Account]


def attach(
    curve: Curve, problem: Problem, neighbour: int, account_of: Accounting | None = None
) -> list[Account]:
    """Account every repeat of `curve` and add the result to it: per-round series for
    metrics.csv and a `privacy` record for summary.json. `account_of`: where the accounts
    come from (default `account`; the live view's, which ran them while the network did)."""
    strategy, scheme = Strategy(curve.strategy), Scheme(curve.scheme)
    accounts = [
        (account_of or account)(problem, strategy, scheme, neighbour, r)
        for r in range(problem.config.repeats)
    ]
    curve.series["delta"] = np.stack([a.delta for a in accounts])
    curve.series["epsilon_network"] = np.stack([a.epsilon_network for a in accounts])
    curve.series["epsilon_paper"] = np.stack([a.epsilon_paper for a in accounts])
    for p in range(problem.config.agents):
        curve.series[f"epsilon_{p}"] = np.stack([a.epsilon[:, p] for a in accounts])
    first = accounts[0]
    curve.extra["privacy"] = {
        "neighbour_agent": neighbour,
        "changed_data": _changed(problem, neighbour),
        "sigma_g": problem.config.sigma_g,
        "epsilon_per_agent": [_finite(e) for e in first.epsilon[-1]],
        "epsilon_neighbour": _finite(first.epsilon[-1, neighbour]),
        "epsilon_network": _finite(first.epsilon_network[-1]),
        "epsilon_paper": _finite(first.epsilon_paper[-1]),
        "paper_bound_slope_per_round": _finite(first.bound_slope),
        "final_delta": float(first.delta[-1]),
        "holds_against": HOLDS_AGAINST[scheme],
        "what_this_is": (
            "epsilon(i) for this neighbouring pair (D, D'), this noise level and this noise "
            "realisation, repeat 0; per agent: an eavesdropper on the links out of that agent"
        ),
    }
    return accounts


HOLDS_AGAINST = {
    Scheme.NONE: "no one: every model crosses the wire in the clear (epsilon is infinite)",
    Scheme.RANDOM: (
        "an eavesdropper on the links out of the agent, a hub (it sees one of those links), "
        "the whole wire (epsilon_network); colluders pool their links' releases"
    ),
    Scheme.GHP: (
        "an eavesdropper on the links out of the agent, a hub, the whole wire "
        "(epsilon_network); the sender's one draw per round is the same on all its links"
    ),
    Scheme.LOCAL_GHP: (
        "an eavesdropper on the links out of the agent only; not a hub (it learns its "
        "weighted sum exactly), not the whole wire (it can form the hub sums), not two "
        "colluding partners (they know the pair's mask); and in exact arithmetic only: "
        "its masks, divided by a_pk, are off the noise grid and leak low-order bits"
    ),
}


def _changed(problem: Problem, neighbour: int) -> str:
    if problem.classifies:
        return (
            f"agent {neighbour}'s {problem.config.samples} rows replaced by a fresh sample of "
            f"{problem.config.dataset}'s training set with fresh feature noise"
        )
    return f"agent {neighbour}'s {problem.config.samples} samples redrawn from the data model"


def _finite(value: float) -> float | str:
    return float(value) if math.isfinite(value) else INFINITE


def plot_epsilon(curves: list[Curve], path: Path, neighbour: int) -> None:
    """eps(i) per scheme: every agent (thin), the neighbour (bold), the whole wire and the
    paper's formula (dashed); `none` is infinite and says so."""
    accounted = [c for c in curves if "epsilon_network" in c.series]
    order = sorted(accounted, key=lambda c: (c.strategy, SCHEME_ORDER.index(c.scheme)))
    fig = Figure(figsize=(4.4 * len(order), 4.4), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, len(order), squeeze=False)[0]
    for ax, curve in zip(axes, order, strict=True):
        ax.set_title(f"{curve.strategy}/{curve.scheme}")
        ax.set_xlabel("iteration $i$")
        ax.grid(True, alpha=0.3)
        if curve.scheme == Scheme.NONE:
            ax.text(
                0.5,
                0.5,
                "$\\epsilon = \\infty$\nmodels cross the wire in the clear",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
            continue
        iters = np.arange(1, curve.msd_centroid.shape[1] + 1)
        color = SCHEME_STYLE[curve.scheme]["color"]
        for p in range(len(curve.extra["privacy"]["epsilon_per_agent"])):
            ax.plot(iters, curve.series[f"epsilon_{p}"][0], color=color, alpha=0.3, linewidth=0.7)
        ax.plot(
            iters,
            curve.series[f"epsilon_{neighbour}"][0],
            color=color,
            linewidth=2.2,
            label=f"agent {neighbour} (data changed)",
        )
        network = curve.series["epsilon_network"][0]
        if np.all(np.isfinite(network)):
            ax.plot(iters, network, color="black", linewidth=1.4, label="whole wire")
        else:
            ax.plot([], [], " ", label="whole wire: infinite (hub sums)")
        ax.plot(
            iters,
            curve.series["epsilon_paper"][0],
            color="0.4",
            linestyle="--",
            label="paper's eq. (eps)",
        )
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8, loc="upper left")
    axes[0].set_ylabel(r"$\epsilon(i)$ (thin: each agent)")
    fig.savefig(path, dpi=DPI)


def epsilon_table(records: list[dict[str, Any]]) -> Table:
    """Final epsilon per strategy x scheme: the changed agent, the worst agent, the wire."""
    table = titled_table(
        "Privacy accounted (epsilon at the last round; inf = no privacy)",
        (
            "strategy",
            "scheme",
            "neighbour",
            "eps (neighbour)",
            "eps (max agent)",
            "eps (whole wire)",
            "paper's eq. (eps)",
        ),
        left=2,
    )
    for r in records:
        privacy = r.get("privacy")
        if privacy is None:
            continue
        worst = max(privacy["epsilon_per_agent"], key=_sortable)
        table.add_row(
            str(r["strategy"]),
            str(r["scheme"]),
            str(privacy["neighbour_agent"]),
            *(
                _show(v)
                for v in (
                    privacy["epsilon_neighbour"],
                    worst,
                    privacy["epsilon_network"],
                    privacy["epsilon_paper"],
                )
            ),
        )
    return table


def _sortable(value: float | str) -> float:
    return math.inf if value == INFINITE else float(value)


def _show(value: float | str) -> str:
    return INFINITE if value == INFINITE else f"{float(value):.4g}"

"""The accountant: epsilon(i) per agent, per adversary and for the network, from twin runs.

Definition DP compares what an observer sees when one agent's data is replaced (D -> D').
The accountant runs the experiment on D and on D' through the agent cores with the same
seed, so every scheme draws the very same noise and every difference is the change of data;
it records the clear value y behind every model frame and charges each release what it can
leak to the adversary reading it (`Adversary`), L = ||y - y'||_1 / b per Laplace(b) release
(the paper's L2 norm undercounts by sqrt(M)). The charges per scheme and adversary, and how
redone rounds count, are in docs/tasks/privacy.md. This is epsilon for this
pair, noise level and realisation; the paper's network bounds are reported beside it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.table import Table

from privnet.agent import schedule as expand
from privnet.agent.losses import Loss
from privnet.agent.problems import LINEAR
from privnet.agent.schemes.base import Draws
from privnet.agent.spec import Schedule, Scheme, Strategy
from privnet.orchestrator.curves import DPI, Curve, scheme_order, scheme_style
from privnet.orchestrator.experiment import schedules, topology
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import view_matrix
from privnet.orchestrator.replay import Replay, SessionWire, replay, session_views
from privnet.orchestrator.terminal import titled_table

if TYPE_CHECKING:
    from privnet.orchestrator.conductor import View

INFINITE = "inf"  # how summary.json spells an infinite epsilon (strict JSON has no inf)
KINDS = ("link", "links-out", "hub", "coalition", "wire")


@dataclass(frozen=True)
class Adversary:
    """Who reads which model frames, and whether it can cancel the pair masks.

    `link`: an outsider on the link sender -> receiver; `links-out`: on every link out of
    `sender`; `hub` and `coalition`: insiders, who read the frames addressed to `members`
    (with or without sealing: their own link keys open them), know their own values and
    hold their own pair masks; `wire`: the broker, or anyone on every link. `sealed`: peer
    frames sealed end to end, so an outsider reads none.
    """

    kind: str
    members: frozenset[int] = frozenset()
    sender: int | None = None
    receiver: int | None = None
    sealed: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown adversary {self.kind!r}; one of {', '.join(KINDS)}")

    @property
    def insider(self) -> bool:
        return self.kind in ("hub", "coalition")

    @property
    def strips(self) -> bool:
        """Whether it adds up every frame into a hub, where the masks cancel: an insider at
        its own hubs, the whole wire at every hub."""
        return self.insider or self.kind == "wire"

    @property
    def blind(self) -> bool:
        """An outsider on sealed links: it reads no frame."""
        return self.sealed and not self.insider

    def reads(self, sender: int, receiver: int) -> bool:
        """Whether the frame sender -> receiver is on its links (`blind` aside): for an
        insider every frame addressed to it (its members' own too: charging them keeps a
        coalition's bound above each of its hubs')."""
        if self.insider:
            return receiver in self.members
        if self.kind == "wire":
            return True
        if self.kind == "links-out":
            return sender == self.sender
        return (sender, receiver) == (self.sender, self.receiver)

    def __str__(self) -> str:
        seal = " (sealed)" if self.sealed and not self.insider else ""
        names = {
            "link": f"link {self.sender}->{self.receiver}",
            "links-out": f"links out of {self.sender}",
            "hub": f"hub {min(self.members, default=-1)}",
            "coalition": f"coalition {','.join(str(m) for m in sorted(self.members))}",
            "wire": "whole wire",
        }
        return names[self.kind] + seal


Frames = dict[tuple[int, int, int], list[tuple[int, int]]]  # (m, i, j) -> [(view, k)]


@dataclass
class Account:
    """One strategy x scheme x repeat: per-round distances and epsilons, and the twin
    replays to charge any other adversary (`against`)."""

    delta: np.ndarray  # (T,): Delta(i) = ||w_i - w'_i|| over the whole network
    epsilon: np.ndarray  # (T, P): eps_p(i), links out of agent p
    epsilon_network: np.ndarray  # (T,): an eavesdropper on every link
    epsilon_paper: np.ndarray  # (T,): sqrt(2) P / sigma_g * sum_{j<i} Delta(j)
    bound_slope: float  # the paper's linear bound on eps(i) / i, with B, B' measured
    models: np.ndarray  # (T, P, M) on D
    twin_models: np.ndarray  # (T, P, M) on D'
    charges: Charges | None = field(default=None, repr=False)

    def against(self, adversary: Adversary) -> np.ndarray:
        """eps(i) (T,) of what `adversary` reads."""
        assert self.charges is not None
        return self.charges.epsilon(adversary)


@dataclass
class Charges:
    """The releases of one session on D and D' (every view's frames, re-sent ones
    included) and what each costs, per the module docstring."""

    scheme: Scheme
    sigma_g: float
    iters: int
    ours: Replay
    theirs: Replay
    weights: ViewWeights  # (view, round, step) -> the A_j of that view and round
    frames: Frames = field(default_factory=dict)

    def __post_init__(self) -> None:
        frames: Frames = defaultdict(list)
        for v, m, k, i, j in self.ours.released:
            if k != m:
                frames[(m, i, j)].append((v, k))
        self.frames = dict(frames)

    def epsilon(self, adversary: Adversary) -> np.ndarray:
        """eps(i) (T,) against `adversary`."""
        per_round = np.zeros(self.iters)
        for (m, i, j), sent in self.frames.items():
            read = [] if adversary.blind else [(v, k) for v, k in sent if adversary.reads(m, k)]
            if read:
                per_round[i - 1] += self.charge(m, i, j, read, adversary.strips)
        return np.cumsum(per_round)

    def per_sender(self, strips: bool) -> np.ndarray:
        """(T, P): eps(i) of every frame of each sender (the links out of it, or with
        `strips` what the whole wire learns of it)."""
        agents = self.ours.models.shape[1]
        per_round = np.zeros((self.iters, agents))
        for (m, i, j), sent in self.frames.items():
            per_round[i - 1, m] += self.charge(m, i, j, sent, strips)
        return np.cumsum(per_round, axis=0)

    def charge(self, m: int, i: int, j: int, read: list[tuple[int, int]], strips: bool) -> float:
        """What the frames `read` of sender m's value of round i, step j cost together:
        what the release under the masks costs (the value in the clear, a draw per link,
        or one draw per sender, the same in every view), and, to an adversary who cannot
        strip a masked scheme's masks, at most what the masks hide."""
        part = self.scheme.part
        views = sorted({v for v, _ in read})
        if part.draws is Draws.PER_LINK:  # a draw per link, the same in every view
            links = {k for _, k in read}
            on = [sorted(v for v, k in read if k == to) for to in links]
            clear = sum(self._shared(m, i, j, views) for views in on)
        elif part.draws is Draws.PER_SENDER:
            clear = self._shared(m, i, j, views)
        else:
            clear = self._leak(m, i, j, views)
        if not part.masked or strips:
            return clear
        masks = sum(self.weights.at(v, i, j)[m, k] * self._cost(m, i, j, v) for v, k in read)
        return masks if part.draws is Draws.NONE else min(clear, masks)

    def _difference(self, m: int, i: int, j: int, v: int) -> np.ndarray:
        return self.ours.views[(v, m, i, j)] - self.theirs.views[(v, m, i, j)]

    def _cost(self, m: int, i: int, j: int, v: int) -> float:
        """L = ||y - y'||_1 / b of one release (0 when y = y', whatever b)."""
        distance = float(np.abs(self._difference(m, i, j, v)).sum())
        if distance == 0:
            return 0.0
        return distance * math.sqrt(2.0) / self.sigma_g if self.sigma_g > 0 else math.inf

    def _leak(self, m: int, i: int, j: int, views: list[int]) -> float:
        """A value read in the clear: infinite unless it is the same on D and D'."""
        return math.inf if any(self._cost(m, i, j, v) > 0 for v in views) else 0.0

    def _shared(self, m: int, i: int, j: int, views: list[int]) -> float:
        """Releases of one value under the same noise draw in each view: the first costs
        L; a later one with another value gives the difference away."""
        first, *later = views
        cost = self._cost(m, i, j, first)
        base = self._difference(m, i, j, first)
        for v in later:
            if np.any(self._difference(m, i, j, v) != base):
                return math.inf
        return cost


@dataclass(frozen=True)
class ViewWeights:
    """The weights each release was combined with: A_j of a view's members' graph (view 0:
    the whole network), and under a schedule that of the release's round."""

    static: Mapping[tuple[int, int], np.ndarray]  # (view, step) -> A_j
    strategy: Strategy
    timed: Mapping[int, Schedule] = field(default_factory=dict)  # view -> its schedule

    def at(self, view: int, round_: int, step: int) -> np.ndarray:
        made = self.timed.get(view)
        if made is None:
            return self.static[(view, step)]
        return topology.strategy_matrices(self.strategy, expand.matrix(made, round_))[step]


def view_weights(
    problem: Instance, strategy: Strategy, views: Sequence[View] | None
) -> ViewWeights:
    """The weights of every view of a session (its static A_j, or its schedule)."""
    out = {(0, j): a for j, a in enumerate(problem.matrices(strategy))}
    timed: dict[int, Schedule] = {}
    made = problem.schedule
    if made is not None:
        timed[0] = schedules.for_view(made, Strategy.ATC)
    for view in views or ():
        members = frozenset(view.members)
        if made is not None:
            timed[view.view] = schedules.for_view(made, Strategy.ATC, members)
            continue
        a = problem.A if len(members) == problem.config.agents else view_matrix(problem, members)
        for j, a_j in enumerate(topology.strategy_matrices(strategy, a)):
            out[(view.view, j)] = a_j
    return ViewWeights(out, strategy, timed)


def account(
    problem: Instance,
    strategy: Strategy,
    scheme: Scheme,
    neighbour: int,
    repeat: int = 0,
    losses: tuple[Sequence[Loss], Sequence[Loss]] | None = None,
    views: Sequence[View] | None = None,
    reach: Mapping[int, int] | None = None,
    ours: Replay | None = None,
) -> Account:
    """Run D and D' (agent `neighbour`'s data replaced) and account every release.

    `losses`: one loss per agent on D and on D' to run instead of the problem's own,
    e.g. losses written by hand. `views`, `reach`: the membership views the session ran
    under and how far each ran on the wire (`replay.replay`): both twins replay them, and
    the frames of every round a later view redid are charged as the releases they are.
    `ours`: the replay on D, when the caller has it (the audit's ground truth).
    """
    c = problem.config
    twin = problem.twin(neighbour)
    ours_losses, twin_losses = losses or (None, None)
    if ours is None:
        ours = replay(
            problem, strategy, scheme, repeat, losses=ours_losses, views=views, reach=reach
        )
    theirs = replay(twin, strategy, scheme, repeat, losses=twin_losses, views=views, reach=reach)
    charges = Charges(
        scheme, c.sigma_g, c.iters, ours, theirs, view_weights(problem, strategy, views)
    )
    epsilon = charges.per_sender(strips=False)
    network = charges.epsilon(Adversary("wire"))
    delta = np.linalg.norm(np.nan_to_num(ours.models - theirs.models).reshape(c.iters, -1), axis=1)
    noisy = c.sigma_g > 0 and scheme.part.hides
    scale = math.sqrt(2.0) * c.agents / c.sigma_g if noisy else math.inf
    before = np.concatenate([[0.0], np.cumsum(delta)[:-1]])
    paper = np.where(before > 0, scale * np.where(before > 0, before, 1.0), 0.0)
    w_o, w_o_twin = problem.w_opt[repeat], twin.w_opt[repeat]
    b = np.nanmax(np.linalg.norm((ours.models - w_o).reshape(c.iters, -1), axis=1))
    b_twin = np.nanmax(np.linalg.norm((theirs.models - w_o_twin).reshape(c.iters, -1), axis=1))
    slope = scale * (b + b_twin + math.sqrt(c.agents) * np.linalg.norm(w_o - w_o_twin))
    return Account(
        delta, epsilon, network, paper, float(slope), ours.models, theirs.models, charges
    )


Accounting = Callable[[Instance, Strategy, Scheme, int, int], Account]


def attach(
    curve: Curve,
    problem: Instance,
    neighbour: int,
    sessions: Sequence[int] = (),
    membership: Sequence[View] | None = None,
    reach: Mapping[int, Mapping[int, int]] | None = None,
    account_of: Accounting | None = None,
) -> list[Account]:
    """Account every repeat of `curve` and add the result to it: per-round series for
    metrics.csv and a `privacy` record for summary.json. `sessions`: the session of each
    repeat, whose views in `membership` (the run's) both twins replay; `reach`: per
    session, how far each view ran on the wire (audit.Recording), whose redone rounds are
    then charged too. `account_of`: where the accounts of a session without membership
    changes come from (default `account`; the live view's, which ran them while the
    network did)."""
    strategy, scheme = Strategy(curve.strategy), Scheme(curve.scheme)
    everyone = SessionWire(setups={0: set(range(problem.config.agents))})
    accounts, redone = [], "no membership change"
    for r in range(problem.config.repeats):
        s = sessions[r] if sessions else r
        views = session_views(membership, s, everyone, problem.config.agents)
        seen = (reach or {}).get(s) if views is not None else None
        if views is None:
            accounted = (account_of or account)(problem, strategy, scheme, neighbour, r)
            accounts.append(replace(accounted, charges=None))  # the replays: let them go
            continue
        redone = "membership changed: the twins replay the run's views; the rounds a view " + (
            "began before the next redid them were read off the recorded wire and "
            "their re-releases charged"
            if seen is not None
            else "began before the next redid them are not known without the recorded "
            "wire (run with --audit, or `privnet inspect --attack`): not charged"
        )
        accounted = account(problem, strategy, scheme, neighbour, r, views=views, reach=seen)
        accounts.append(replace(accounted, charges=None))
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
        "epsilon_per_agent": [finite(e) for e in first.epsilon[-1]],
        "epsilon_neighbour": finite(first.epsilon[-1, neighbour]),
        "epsilon_network": finite(first.epsilon_network[-1]),
        "epsilon_paper": finite(first.epsilon_paper[-1]),
        "paper_bound_slope_per_round": finite(first.bound_slope),
        "final_delta": float(first.delta[-1]),
        "holds_against": scheme.part.holds_against,
        "redone_rounds": redone,
        "what_this_is": (
            "epsilon(i) for this neighbouring pair (D, D'), this noise level and this noise "
            "realisation, repeat 0; per agent: an eavesdropper on the links out of that agent"
        ),
    }
    return accounts


def _changed(problem: Instance, neighbour: int) -> str:
    if problem.config.dataset != LINEAR:
        return (
            f"agent {neighbour}'s rows replaced by as many freshly sampled from "
            f"{problem.config.dataset}'s training set with fresh feature noise"
        )
    return f"agent {neighbour}'s {problem.config.samples} samples redrawn from the data model"


def finite(value: float) -> float | str:
    """An epsilon for JSON: the number, or INFINITE."""
    return float(value) if math.isfinite(value) else INFINITE


def plot_epsilon(curves: list[Curve], path: Path, neighbour: int) -> None:
    """eps(i) per scheme: every agent (thin), the neighbour (bold), the whole wire and the
    paper's formula (dashed); `none` is infinite and says so."""
    from matplotlib.figure import Figure  # as the report's plots: only when drawing

    accounted = [c for c in curves if "epsilon_network" in c.series]
    order = sorted(accounted, key=lambda c: (c.strategy, scheme_order().index(c.scheme)))
    fig = Figure(figsize=(4.4 * len(order), 4.4), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, len(order), squeeze=False)[0]
    for ax, curve in zip(axes, order, strict=True):
        ax.set_title(f"{curve.strategy}/{curve.scheme}")
        ax.set_xlabel("iteration $i$")
        ax.grid(True, alpha=0.3)
        if not Scheme(curve.scheme).part.hides:
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
        color = scheme_style(curve.scheme)["color"]
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

"""Membership: who is alive, who runs the current session's view, who is held, lost or
asking back in, how far each has come, and where a new view (or a resumed run) starts.

The conductor decides when a view changes; this part keeps the state the decision reads
and the bookkeeping a change does, so the decision stays short.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privnet.agent import control
from privnet.agent.spec import AgentSpec, ConfigError
from privnet.orchestrator.conductor.records import STALLS, SessionPlan, View


@dataclass
class Moved:
    """The slowest member's completed rounds, and when that last grew (or a wait began):
    a stall is a deadline without growth."""

    rounds: int = 0
    since: float = 0.0


@dataclass
class Pause:
    """A view change under way: since when the network stood still, and how many rounds
    the next view redoes (reported once the next view runs)."""

    since: float = 0.0
    redone: int = 0


@dataclass
class MemberIds:
    """The members of a view as numpy indices, made once per view, not per message."""

    members: frozenset[int] = frozenset()
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))


def specs_of(plan: SessionPlan, members: frozenset[int], agents: int) -> list[AgentSpec]:
    """The specs of a view with these members (ConfigError: no view of them runs)."""
    if len(members) == agents:
        return plan.specs
    if plan.view_specs is None:
        raise ConfigError("this session cannot change membership (no view_specs)")
    return [s for s in plan.view_specs(members) if s.agent in members]


def splits(plan: SessionPlan, members: Iterable[int], agents: int) -> bool:
    """Whether these members' graph is not connected (a view on it would not run)."""
    if plan.view_specs is None:
        return False  # no view but the whole network can run: nothing to wait for
    try:
        specs_of(plan, frozenset(members), agents)
    except ConfigError:
        return True
    return False


@dataclass
class Membership:
    """Who is alive, the views of a run and the state of the current one."""

    agents: int
    alive: set[int] = field(default_factory=set)  # registered and not lost since
    views: list[View] = field(default_factory=list)  # every view of every session, in order
    members: frozenset[int] = frozenset()  # of the current view
    completed: np.ndarray = field(init=False)  # rounds each completed, this view
    ready: set[int] = field(default_factory=set)  # members keyed for the view
    finished: dict[int, control.Finished] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)  # stopped for the next view, at round
    lost: dict[int, str] = field(default_factory=dict)  # to leave out of the next view, why
    joining: dict[int, control.Rejoin] = field(default_factory=dict)  # asking back in
    waiting: dict[int, tuple[int, ...]] = field(default_factory=dict)  # whom each waits for
    excluded_at: dict[int, int] = field(default_factory=dict)  # start of the view left out of
    offers: dict[int, control.Rejoin] = field(default_factory=dict)  # resuming: what each holds
    reason: str = ""  # of the view change under way
    moved: Moved = field(default_factory=Moved)
    stalls: int = 0  # views in a row that brought no round forward
    report_redos: int = 0  # views this session added at its end for reports that never came
    pause: Pause = field(default_factory=Pause)
    split_due: float | None = None  # holding: when a split view stops waiting
    pauses: list[dict[str, Any]] = field(default_factory=list)  # what each view change cost
    _ids: MemberIds = field(default_factory=MemberIds)

    def __post_init__(self) -> None:
        self.completed = np.zeros(self.agents, dtype=np.int64)

    @property
    def view(self) -> View | None:
        return self.views[-1] if self.views else None

    def number(self, session: int) -> int:
        """The current view's number in `session` (-1: none yet)."""
        view = self.view
        return view.view if view is not None and view.session == session else -1

    @property
    def ids(self) -> np.ndarray:
        if self._ids.members is not self.members:
            self._ids = MemberIds(self.members, np.fromiter(self.members, dtype=np.intp))
        return self._ids.ids

    def rounds_done(self, counts: np.ndarray) -> int:
        """Rounds every member has completed (by its heartbeats or its telemetry)."""
        ids = self.ids
        return int(np.maximum(self.completed[ids], counts[ids]).min()) if ids.size else 0

    def lose(self, agent: int, reason: str) -> bool:
        """`agent` is gone: not alive, not asking back in, and, a member, to be left out
        of the next view (True)."""
        self.alive.discard(agent)
        self.joining.pop(agent, None)
        if agent not in self.members:
            return False
        self.lost[agent] = reason
        return True

    def known(self, counts: np.ndarray) -> np.ndarray:
        """Rounds each agent has completed by its heartbeats or its telemetry (`counts`),
        whichever says more: a copy."""
        if counts.size != self.completed.size:  # no session yet
            return self.completed.copy()
        most: np.ndarray = np.maximum(self.completed, counts)
        return most

    def expected(self) -> frozenset[int]:
        """Whose silence counts: the members (and those about to be, while holding)."""
        return (self.members - self.lost.keys()) & self.alive

    def expects(self, agent: int) -> bool:
        """`agent in self.expected()`, without building the set."""
        return agent in self.members and agent not in self.lost and agent in self.alive

    def may_join(self, agent: int) -> bool:
        """An alive agent out of the view (or about to be) that has not asked yet."""
        return (
            agent in self.alive
            and (agent not in self.members or agent in self.lost)
            and agent not in self.joining
        )

    def progress(self, agent: int, round: int, counts: np.ndarray, now: float) -> None:
        self.completed[agent] = round
        self.waiting.pop(agent, None)
        slowest = self.rounds_done(counts)
        if slowest > self.moved.rounds:
            self.moved, self.stalls = Moved(slowest, now), 0

    def slowest(self, counts: np.ndarray, keying: bool) -> list[int]:
        """The members a stall holds back: keying, those not keyed yet; running, those
        with the fewest rounds completed."""
        if keying:
            return sorted(self.members - self.ready)
        done = {m: max(int(self.completed[m]), int(counts[m])) for m in self.members}
        least = min(done.values(), default=0)
        return sorted(m for m, n in done.items() if n == least)

    def stalled(self, now: float) -> bool:
        """One more stall; True once there were too many in a row."""
        self.stalls += 1
        if self.stalls > STALLS:
            return True
        self.moved.since = now
        return False

    def hold(self, still: float, now: float, deadline: float) -> None:
        """Members stop for a view change; the network stood still since `still`."""
        self.pause = Pause(min(still, now), 0)
        self.held = {}
        self.split_due = now + deadline

    def begin(self, view: View, now: float) -> None:
        """`view` is the current one: every member keys again, from its start."""
        self.views.append(view)
        self.members = frozenset(view.members)
        self.ready, self.finished, self.held = set(), {}, {}
        self.waiting = {}
        self.completed[:] = 0
        self.completed[sorted(self.members)] = view.start - 1
        self.moved = Moved(view.start - 1, now)

    def leave(self, members: Iterable[int], start: int) -> dict[int, str]:
        """Those of the current view not among `members`, and why: out from `start`."""
        left = {m: self.lost.get(m, "left out") for m in sorted(self.members - set(members))}
        for m in left:
            self.excluded_at[m] = start
        self.settle()
        return left

    def settle(self) -> None:
        """The change under way is decided: nobody is lost or joining any more."""
        self.lost.clear()
        self.joining.clear()
        self.reason = ""

    def new_session(self) -> None:
        self.excluded_at, self.stalls, self.report_redos = {}, 0, 0
        self.members = frozenset()

    def first(self, session: int) -> int:
        """The first round of the current view's records in `session`."""
        view = self.view
        return view.start if view is not None and view.session == session else 1

    def view_end(self, view: int, session: int, rounds: int) -> int:
        """The last round of `view` that stands: views after it redo from their start."""
        later = [v.start - 1 for v in self.views if v.session == session and v.view > view]
        return min(later) if later else rounds

    def record_pause(self, view: View, now: float) -> None:
        self.pauses.append(
            {
                "session": view.session,
                "view": view.view,
                "reason": view.reason,
                "start": view.start,
                "rounds_redone": self.pause.redone,
                "seconds_lost": round(now - self.pause.since, 3),
            }
        )

    def resume_of(self, agent: int, rejoin: control.Rejoin, start: int, session: int) -> int:
        """The latest round whose model the agent holds and that stands (before the view
        that left it out); 0, its initial model, when none does."""
        if rejoin.session != session:
            return 0
        end = min(self.excluded_at.get(agent, start) - 1, start - 1)
        return max((r for r in rejoin.rounds if r <= end), default=0)

    def resume_point(self, session: int, rounds: int, recorded: int, telemetry: bool) -> int:
        """The latest round before the last whose model every agent holds and, with
        telemetry, whose models the first run `recorded` (0: the start): no round after it
        goes without a model."""
        held = [set(o.rounds) if o.session == session else {0} for o in self.offers.values()]
        common = set.intersection(*held) if held else {0}
        last = min(rounds - 1, recorded) if telemetry else rounds - 1
        return max((r for r in common if r <= last), default=0)

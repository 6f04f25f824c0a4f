"""How a session moves through its views: hold the members for a change (a loss, a
return, a stall), switch to the next view once they stopped, configure it (a sealed
Setup each), Go once every member is keyed, and on to the next session once every member
finished. The conductor's deliveries and deadlines call these; nothing here reads the
wire.
"""

from __future__ import annotations

from collections.abc import Mapping

from privnet.agent import control
from privnet.agent.protocol import BEATS, Event, Output
from privnet.agent.spec import ConfigError
from privnet.orchestrator.conductor.membership import specs_of, splits
from privnet.orchestrator.conductor.records import (
    IN_SESSION,
    STALLS,
    SessionResult,
    Stage,
    View,
    describe,
)
from privnet.orchestrator.conductor.setups import Terms, setups
from privnet.orchestrator.conductor.state import Parts

# Rounds the members may run past what the conductor has read of them (1024, not 256: a
# broker killed while every member holds at the window's end loses queued telemetry that no
# stall redoes, docs/tasks/liveness.md). The conductor grants
# WINDOW more (a Go with a later `until`) each time they are halfway through: a busy
# orchestrator slows the run, and its view of the network, its faults and its decisions stay
# at most WINDOW rounds behind the agents, instead of a backlog without bound (issue 30).
WINDOW = 1024


class Sessions(Parts):
    """The decisions that move a session; `Conductor` feeds them deliveries and time."""

    # ---- views ------------------------------------------------------------------------

    def _stalled(self, now: float) -> bool:
        """Every member alive, and the slowest one no further for a deadline (keying: no
        Go within a deadline of the Setups): frames were lost (a broker restart, say); the
        round, or the keying, is redone under a new view."""
        return self._may_stall and now - self.group.moved.since >= self.deadline

    def _change(self, now: float, reason: str) -> Output:
        """Ask every member to stop at a round boundary; the next view follows (_switch)."""
        if self.stage not in IN_SESSION or self.script is not None:
            return Output()
        group = self.group
        still = group.moved.since if self.stage is Stage.RUNNING else now  # stood since
        if reason == "stalled" and group.stalled(now):
            waiting = {m: int(group.completed[m]) for m in sorted(group.members)}
            return self._fail(
                f"no round completed through {STALLS} views ({self._label}); rounds per "
                f"member: {dict(list(waiting.items())[:20])}"
            )
        group.reason = group.reason or reason
        if self.stage is not Stage.HOLDING:
            group.hold(still, now, self.deadline)
            self.stage, self._since = Stage.HOLDING, now
            self._next_beat = now + self.deadline / BEATS
            out = Output([self._down("all", self._hold())], [Event("holding", reason)])
            return out + self._maybe_switch(now)
        return self._maybe_switch(now)

    def _hold(self) -> control.Hold:
        return control.Hold(self.session, self._view_number + 1)

    def _maybe_switch(self, now: float) -> Output:
        """The next view once every member still in has stopped (holding), or once a
        replay's members reach the recorded round."""
        group = self.group
        staying = group.expected(self.alive)
        if self.stage is Stage.RUNNING and self.script is not None:
            view = self.script.get((self.session, self._view_number + 1))
            if view is None or any(group.held.get(m) != view.start - 1 for m in staying):
                return Output()
            return self._switch(now, view.start, view.reason, view.members, view.resume)
        if self.stage is not Stage.HOLDING or not staying <= group.held.keys():
            return Output()
        plan = self.plans[self.session]
        if splits(plan, staying | group.joining.keys(), self.agents) and (
            now - self._since < self.deadline
        ):
            return Output()  # a lost cut vertex may be back soon (restarted): wait a deadline
        start = self._first_unrecorded(min((group.held[m] for m in staying), default=0) + 1)
        if start > plan.rounds:  # every member still in has finished: nothing to redo
            group.lost.clear()
            group.joining.clear()
            group.members = frozenset(staying)
            self.stage = Stage.RUNNING
            return self._maybe_done(now)
        group.pause.redone = max((group.held[m] for m in staying), default=start - 1) - (start - 1)
        resume = {m: start - 1 for m in staying}
        for agent, rejoin in group.joining.items():
            resume[agent] = group.resume_of(agent, rejoin, start, self.session)
        return self._switch(now, start, group.reason, tuple(sorted(resume)), resume)

    def _first_unrecorded(self, start: int) -> int:
        """The round the next view starts at: after the slowest member's last, or earlier
        where a report of the current view's members never came: a lost member's last
        batch (killed, or stopped, before it sealed it) or one a broker went down with.
        That round is redone under the new view, so every round that stands has every
        member's report. Staying members hold every model of the session, so any round can
        be redone; without telemetry there are no reports to wait for."""
        if not self.telemetry:
            return start
        first = self.group.first(self.session)
        return self.collection.first_gap(first, start, self.group.members)

    def _switch(
        self,
        now: float,
        start: int,
        reason: str,
        members: tuple[int, ...],
        resume: Mapping[int, int],
    ) -> Output:
        left = self.group.leave(members, start)
        self.collection.redo(start)
        view = View(self.session, self._view_number + 1, start, members, reason, dict(resume), left)
        out = Output(events=[Event("view", describe(view))])
        for m in left:
            out.publish.append(self._down(m, control.Excluded(m, self.session, view.view)))
        return out + self._configure(view, now)

    def _configure(self, view: View, now: float) -> Output:
        """Setup for every member of `view`, sealed to it."""
        plan = self.plans[self.session]
        members = frozenset(view.members)
        if len(members) < 2:
            return self._fail(
                f"{len(members)} agent(s) left in {plan.label} (view {view.view}): a network "
                f"needs two; lost: {view.left}"
            )
        try:
            specs = specs_of(plan, members, self.agents)
        except ConfigError as exc:
            return self._fail(f"view {view.view} of {plan.label}: {exc}")
        self.group.begin(view, now)
        self.stage, self._since = Stage.CONFIGURING, now
        heard = self.registry.heard
        for m in members:
            self.registry.hear(m, max(heard.get(m, now), now))  # a fresh deadline to answer
        identities = {m: a.identity for m, a in self.registry.registered.items()}
        terms = Terms(
            self.deadline,
            self.telemetry,
            self.checkpoint_every,
            self.seal_links,
            self.escrow,
            self.models_every,
        )
        out = Output(events=[Event("configuring", plan.label)])
        for setup in setups(self.run, self.session, plan, view, specs, identities, terms):
            out.publish.append(self._down(setup.agent, setup))
        return out

    def _maybe_go(self, now: float) -> Output:
        group = self.group
        if not group.members <= group.ready:
            return Output()
        view = self.view
        assert view is not None
        self.stage, self._since = Stage.RUNNING, now
        group.moved.since = now
        if view.view == 0 or not self._go_at:
            self._go_at = now
        if view.view > 0 and self.script is None:
            group.record_pause(view, now)
        until = self.plans[self.session].rounds
        if self.script is not None and (later := self.script.get((self.session, view.view + 1))):
            until = later.start - 1
        self._final, self._granted = until, min(until, view.start - 1 + WINDOW)
        go = control.Go(self.session, view.view, self._granted)
        return Output([self._down("all", go)], [Event("started", self._label)])

    def _pace(self) -> Output:
        """WINDOW more rounds, once the members are halfway through the last grant."""
        view = self.view
        if self.stage is not Stage.RUNNING or self._granted >= self._final or view is None:
            return Output()
        done = self.rounds_done
        if done + WINDOW // 2 < self._granted:
            return Output()
        self._granted = min(self._final, done + WINDOW)
        return Output([self._down("all", control.Go(self.session, view.view, self._granted))])

    # ---- sessions ---------------------------------------------------------------------

    def _done(self) -> Output:
        self.stage = Stage.DONE
        return Output(events=[Event("done")])

    def _maybe_done(self, now: float) -> Output:
        group = self.group
        if self.stage is not Stage.RUNNING or not group.members <= group.finished.keys():
            return Output()
        plan = self.plans[self.session]
        views = [v for v in group.views if v.session == self.session]
        wall = now - self._go_at
        result = SessionResult(plan.label, self.models, dict(group.finished), wall, views)
        result.metrics, result.models_every = self.collection.metrics, self.models_every
        self.results.append(result)
        out = Output(events=[Event("session-done", plan.label)])
        return out + self._next_session(now)

    def _next_session(self, now: float) -> Output:
        self.session += 1
        self._since = now
        if self.session == len(self.plans):
            self.stage = Stage.CLOSING
            return Output([self._down("all", control.Close())], [Event("closing")])
        plan = self.plans[self.session]
        self.collection.new_session(plan.rounds, self.agents, plan.dim, self.models_every)
        self.group.new_session()
        self.blame.parked.clear()  # a Rejoin of the last session: everyone alive is in
        self._go_at = 0.0
        scripted = self.script.get((self.session, 0)) if self.script is not None else None
        members = scripted.members if scripted is not None else tuple(sorted(self.alive))
        reason = scripted.reason if scripted is not None else "start"
        start = 1
        if self.resume is not None:  # the interrupted session: on from what all agents hold
            point = self.group.resume_point(
                self.session, plan.rounds, self.resume.recorded, self.telemetry
            )
            start, reason = point + 1, "resumed"
            self.collection.restore(self.resume.models, self.resume.metrics, start)
            self.resume, self.group.offers = None, {}
        view = View(self.session, 0, start, members, reason, {m: start - 1 for m in members})
        out = Output(events=[Event("view", describe(view))] if start > 1 else [])
        return out + self._configure(view, now)

    # ---- helpers ----------------------------------------------------------------------

    def _fail(self, reason: str) -> Output:
        if self.stage in (Stage.FAILED, Stage.CLOSED):
            return Output()
        self.stage, self.failure = Stage.FAILED, reason
        return Output([self._down("all", control.Abort(reason[:1000]))], [Event("failed", reason)])

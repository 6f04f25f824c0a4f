"""How a session moves through its views: hold the members for a change (a loss, a
return, a stall), switch to the next view once they stopped, configure it (a sealed
Setup each), Go once every member is keyed, and on to the next session once every member
finished. The conductor hands it the deliveries and deadlines that concern a session;
nothing here reads the wire. It keeps no state of its own: it decides on the conductor's
parts and changes its stage through `Conductor.to`.
"""

from __future__ import annotations

from collections.abc import Mapping

from privnet.agent import control
from privnet.agent.messages import Reason, Rejected
from privnet.agent.protocol import Event, Output
from privnet.agent.spec import ConfigError
from privnet.orchestrator.conductor.membership import specs_of, splits
from privnet.orchestrator.conductor.owner import Owner
from privnet.orchestrator.conductor.pacing import recorded_step
from privnet.orchestrator.conductor.records import (
    IN_SESSION,
    REPORT_REDOS,
    STALLS,
    SessionResult,
    Stage,
    View,
    describe,
)
from privnet.orchestrator.conductor.setups import setups


class Steward:
    """The decisions that move a session, on the parts of the conductor it serves."""

    def __init__(self, conductor: Owner) -> None:
        self.c = conductor

    # ---- what the conductor asks ------------------------------------------------------

    def at(self, stage: Stage, session: int, view: int) -> bool:
        c = self.c
        return c.stage is stage and session == c.session and view == self.view_number

    @property
    def view_number(self) -> int:
        return self.c.membership.number(self.c.session)

    def can_join(self, agent: int) -> bool:
        c = self.c
        return c.stage in IN_SESSION and c.script is None and c.membership.may_join(agent)

    def hold(self) -> control.Hold:
        return control.Hold(self.c.session, self.view_number + 1)

    # ---- deliveries -------------------------------------------------------------------

    def progress(self, msg: control.Progress, now: float) -> Output:
        c, agent, membership = self.c, msg.agent, self.c.membership
        number = self.view_number
        out_of_view = agent not in membership.members and agent not in membership.joining
        if out_of_view and msg.view < number:  # left out, still at it: its Excluded was lost
            return Output([c.down(agent, control.Excluded(agent, c.session, msg.view + 1))])
        if agent not in membership.members or msg.view != number:
            return Output()  # a late heartbeat of an earlier view
        membership.progress(agent, msg.round, c.collection.counts, now)
        if msg.waiting:
            membership.waiting[agent] = msg.waiting
        if not msg.held:
            return Output()
        membership.held[agent] = msg.round
        return self.maybe_switch(now)

    def rejoin(self, msg: control.Rejoin, now: float) -> Output:
        if self.c.blame.park(msg, now):  # left out for stalling: back once it ends
            return Output()
        self.c.membership.joining[msg.agent] = msg
        return self.change(now, "returned")

    def offer(self, rejoin: control.Rejoin, now: float) -> Output:
        """Resuming: what an agent holds; the session goes on once every agent said."""
        c, offers = self.c, self.c.membership.offers
        if rejoin.agent in offers:
            raise Rejected(Reason.DUPLICATE, f"second Rejoin of agent {rejoin.agent}")
        offers[rejoin.agent] = rejoin
        if len(offers) < c.agents or not c.registry.complete:
            return Output()
        return self.next_session(now)

    def ready(self, msg: control.Ready, now: float) -> Output:
        membership = self.c.membership
        if msg.agent in membership.ready:
            raise Rejected(Reason.DUPLICATE, f"second Ready of agent {msg.agent}")
        membership.ready.add(msg.agent)
        return self._maybe_go(now)

    def finished(self, msg: control.Finished, now: float) -> Output:
        c, membership = self.c, self.c.membership
        if msg.view != self.view_number:
            raise Rejected(
                Reason.STALE_VIEW, f"Finished of view {msg.view}, now {self.view_number}"
            )
        if msg.agent in membership.finished:
            raise Rejected(Reason.DUPLICATE, f"second Finished of agent {msg.agent}")
        membership.finished[msg.agent] = msg
        membership.completed[msg.agent] = c.plans[c.session].rounds
        return self._maybe_done(now)

    # ---- views ------------------------------------------------------------------------

    def change(self, now: float, reason: str) -> Output:
        """Ask every member to stop at a round boundary; the next view follows (_switch)."""
        c, membership = self.c, self.c.membership
        if c.stage not in IN_SESSION or c.script is not None:
            return Output()
        still = membership.moved.since if c.stage is Stage.RUNNING else now  # stood since
        if reason == "stalled" and membership.stalled(now):
            waiting = {m: int(membership.completed[m]) for m in sorted(membership.members)}
            return c.fail(
                f"no round completed through {STALLS} views ({c.label}); rounds per "
                f"member: {dict(list(waiting.items())[:20])}"
            )
        membership.reason = membership.reason or reason
        if c.stage is not Stage.HOLDING:
            membership.hold(still, now, c.deadline)
            c.to(Stage.HOLDING, now)
            c.pacing.schedule(now)
            out = Output([c.down("all", self.hold())], [Event("holding", reason)])
            return out + self.maybe_switch(now)
        return self.maybe_switch(now)

    def maybe_switch(self, now: float) -> Output:
        """The next view once every member still in has stopped (holding), or once a
        replay's members reach the recorded round."""
        c, membership = self.c, self.c.membership
        staying = membership.expected()
        if c.stage is Stage.RUNNING and c.script is not None:
            view = c.script.get((c.session, self.view_number + 1))
            if view is None or any(membership.held.get(m) != view.start - 1 for m in staying):
                return Output()
            return self._switch(now, view.start, view.reason, view.members, view.resume)
        if c.stage is not Stage.HOLDING or not staying <= membership.held.keys():
            return Output()
        plan = c.plans[c.session]
        if splits(plan, staying | membership.joining.keys(), c.agents) and (
            now - c.since < c.deadline
        ):
            return Output()  # a lost cut vertex may be back soon (restarted): wait a deadline
        held = membership.held
        start = self._first_unrecorded(min((held[m] for m in staying), default=0) + 1)
        if start > plan.rounds:  # every member still in has finished: nothing to redo
            membership.lost.clear()
            membership.joining.clear()
            membership.members = frozenset(staying)
            c.to(Stage.RUNNING)
            return self._maybe_done(now)
        membership.pause.redone = max((held[m] for m in staying), default=start - 1) - (start - 1)
        resume = {m: start - 1 for m in staying}
        for agent, rejoin in membership.joining.items():
            resume[agent] = membership.resume_of(agent, rejoin, start, c.session)
        return self._switch(now, start, membership.reason, tuple(sorted(resume)), resume)

    def _first_unrecorded(self, start: int) -> int:
        """The round the next view starts at: after the slowest member's last, or earlier
        where a report of the current view's members never came: a lost member's last
        batch (killed, or stopped, before it sealed it) or one a broker went down with.
        That round is redone under the new view, so every round that stands has every
        member's report. Staying members hold every model of the session, so any round can
        be redone; without telemetry there are no reports to wait for."""
        c = self.c
        if not c.telemetry:
            return start
        first = c.membership.first(c.session)
        return c.collection.first_gap(first, start, c.membership.members)

    def _reports_lost(self, rounds: int) -> bool:
        """Every member finished, yet a round of this view lacks a member's report: they
        went down with a broker while every member was held (nothing stalled, so no view
        redid them). A member sends its reports before its Finished, on the same connection,
        so none is still on its way; the rounds are redone, up to REPORT_REDOS times."""
        c = self.c
        if c.script is not None or c.membership.report_redos >= REPORT_REDOS:
            return False
        return self._first_unrecorded(rounds + 1) <= rounds

    def _switch(
        self,
        now: float,
        start: int,
        reason: str,
        members: tuple[int, ...],
        resume: Mapping[int, int],
    ) -> Output:
        c = self.c
        left = c.membership.leave(members, start)
        c.collection.redo(start)
        view = View(c.session, self.view_number + 1, start, members, reason, dict(resume), left)
        out = Output(events=[Event("view", describe(view))])
        for m in left:
            out.publish.append(c.down(m, control.Excluded(m, c.session, view.view)))
        return out + self._configure(view, now)

    def _configure(self, view: View, now: float) -> Output:
        """Setup for every member of `view`, sealed to it."""
        c = self.c
        plan = c.plans[c.session]
        members = frozenset(view.members)
        if len(members) < 2:
            return c.fail(
                f"{len(members)} agent(s) left in {plan.label} (view {view.view}): a network "
                f"needs two; lost: {view.left}"
            )
        try:
            specs = specs_of(plan, members, c.agents)
        except ConfigError as exc:
            return c.fail(f"view {view.view} of {plan.label}: {exc}")
        c.membership.begin(view, now)
        c.to(Stage.CONFIGURING, now)
        registry = c.registry
        for m in members:
            registry.hear(m, max(registry.heard.get(m, now), now))  # a fresh deadline to answer
        identities = {m: a.identity for m, a in registry.registered.items()}
        out = Output(events=[Event("configuring", plan.label)])
        for setup in setups(c.run, c.session, plan, view, specs, identities, c.terms):
            out.publish.append(c.down(setup.agent, setup))
        return out

    def _maybe_go(self, now: float) -> Output:
        c, membership = self.c, self.c.membership
        if not membership.members <= membership.ready:
            return Output()
        view = membership.view
        assert view is not None
        c.to(Stage.RUNNING, now)
        membership.moved.since = now
        if view.view == 0 or not c.pacing.go_at:
            c.pacing.go_at = now
        if view.view > 0 and c.script is None:
            membership.record_pause(view, now)
        until = c.plans[c.session].rounds
        if c.script is not None and (later := c.script.get((c.session, view.view + 1))):
            until = later.start - 1
        go = control.Go(c.session, view.view, c.pacing.go(view.start, until))
        return Output([c.down("all", go)], [Event("started", c.label)])

    def pace(self) -> Output:
        """WINDOW more rounds, once the members are halfway through the last grant; the
        round through which every member's reports are in, once that frees their models."""
        c = self.c
        view = c.membership.view
        if c.stage is not Stage.RUNNING or view is None:
            return Output()
        out = Output()
        granted = None if c.pacing.whole else c.pacing.more(c.rounds_done)
        if granted is not None:
            out.publish.append(c.down("all", control.Go(c.session, view.view, granted)))
        if c.telemetry:  # without reports, no round is recorded: the agents keep every model
            through = c.collection.through(c.membership.ids, c.pacing.recorded)
            if through >= c.pacing.recorded + recorded_step(c.plans[c.session].dim):
                c.pacing.recorded = through
                out.publish.append(c.down("all", control.Recorded(c.session, view.view, through)))
        return out

    # ---- sessions ---------------------------------------------------------------------

    def done(self) -> Output:
        self.c.to(Stage.DONE)
        return Output(events=[Event("done")])

    def _maybe_done(self, now: float) -> Output:
        c, membership = self.c, self.c.membership
        if c.stage is not Stage.RUNNING or not membership.members <= membership.finished.keys():
            return Output()
        plan = c.plans[c.session]
        if self._reports_lost(plan.rounds):
            membership.report_redos += 1
            return self.change(now, "lost reports")
        views = [v for v in membership.views if v.session == c.session]
        wall = now - c.pacing.go_at
        finished, collection = dict(membership.finished), c.collection
        collection.unfinished()
        result = SessionResult(plan.label, collection.models, finished, wall, views)
        result.metrics, result.models_every = collection.metrics, c.models_every
        c.results.append(result)
        out = Output(events=[Event("session-done", plan.label)])
        return out + self.next_session(now)

    def next_session(self, now: float) -> Output:
        c = self.c
        c.session += 1
        if c.session == len(c.plans):
            c.to(Stage.CLOSING, now)
            return Output([c.down("all", control.Close())], [Event("closing")])
        plan = c.plans[c.session]
        c.collection.new_session(
            plan.rounds, c.agents, plan.dim, c.models_every, plan.telemetry_dtype
        )
        c.membership.new_session()
        c.blame.parked.clear()  # a Rejoin of the last session: everyone alive is in
        c.pacing.go_at = 0.0
        scripted = c.script.get((c.session, 0)) if c.script is not None else None
        members = scripted.members if scripted is not None else tuple(sorted(c.membership.alive))
        reason = scripted.reason if scripted is not None else "start"
        start = 1
        if c.resume is not None:  # the interrupted session: on from what all agents hold
            point = c.membership.resume_point(
                c.session, plan.rounds, c.resume.recorded, c.telemetry
            )
            start, reason = point + 1, "resumed"
            c.collection.restore(c.resume.models, c.resume.metrics, start)
            c.resume, c.membership.offers = None, {}
        view = View(c.session, 0, start, members, reason, {m: start - 1 for m in members})
        out = Output(events=[Event("view", describe(view))] if start > 1 else [])
        return out + self._configure(view, now)

"""The orchestrator's side of a run's life cycle, as a sans-IO state machine.

Like the agent node (`agent.node`), it is fed deliveries (`receive`) and time (`tick`) and
returns what to publish and what happened; process launching, the broker and the console
stay outside. Phases: REGISTERING (a Hello from every agent, each proving its launch
token) -> per session CONFIGURING (sealed Setup out, Ready back) -> RUNNING (Go out,
sealed telemetry and Finished back) -> CLOSING (Close out, each agent stops reading peers
and answers Left with what it dropped since) -> DONE (the caller writes its outputs, then
`bye`) -> CLOSED, or FAILED from anywhere (an agent failed, or a deadline
passed: registration has a fixed deadline, a session one of silence).

Identities are pinned at registration (`registry`): every later upward frame must be
signed by the identity the agent registered, carry a sequence number it has not used, and
fit the phase. Anything else is dropped and counted under exactly one reason. Views are
kept by `membership`, models and escrow by `collection`; this module decides.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent import control, wire
from agent.messages import Reason, Rejected
from agent.protocol import BEATS, Event, Output
from agent.spec import ConfigError
from orchestrator.conductor.membership import specs_of, splits
from orchestrator.conductor.records import (
    BEATING,
    IN_SESSION,
    STALLS,
    SessionResult,
    Stage,
    View,
    describe,
)
from orchestrator.conductor.setups import Terms, setups
from orchestrator.conductor.state import Parts


class Conductor(Parts):
    """Drives every session of a run; see the module docstring."""

    def start(self, now: float) -> Output:
        self._since = now
        return Output()

    def tick(self, now: float) -> Output:
        """Deadlines (registration, an agent's silence, a stalled network) and Beats."""
        if self.stage is Stage.REGISTERING and now - self._since >= self.register_deadline:
            missing = self.registry.missing()
            return self._fail(
                f"registration closed after {self.register_deadline:.0f} s; agents "
                f"{missing[:20]} never registered (not started, or launched with another "
                "run's token?)"
            )
        out = Output()
        if self.stage in IN_SESSION:
            heard, expected = self.registry.heard, self.group.expected(self.alive)
            silent = [m for m in expected if now - heard.get(m, 0.0) >= self.deadline]
            for m in silent:
                out += self.lost(m, f"silent for {self.deadline:.0f} s", now)
            if self._stalled(now):
                out += self._change(now, "stalled")
            due = self.group.split_due
            if self.stage is Stage.HOLDING and due is not None and now >= due:
                self.group.split_due = None
                out += self._maybe_switch(now)  # nobody came back to join a split network
        if self.stage is Stage.CLOSING and now - self._since >= self.deadline:
            return out + self._done()  # results are complete; a silent agent costs its Left
        if self.stage in BEATING and now >= self._next_beat:
            self._next_beat = now + self.deadline / BEATS
            beat = control.Beat() if self.stage is not Stage.HOLDING else self._hold()
            out.publish.append(self._down("all", beat))
        return out

    def next_tick(self) -> float | None:
        if self.stage is Stage.REGISTERING:
            return self._since + self.register_deadline
        if self.stage in BEATING:
            return min(self.deadline_at, self._next_beat)
        return None

    @property
    def deadline_at(self) -> float:
        """When the next wait runs out: registration, the oldest silence, a stall, Lefts."""
        if self.stage is Stage.REGISTERING:
            return self._since + self.register_deadline
        if self.stage is Stage.CLOSING:
            return self._since + self.deadline
        oldest = self.registry.oldest(self._expects)
        waits = [oldest + self.deadline] if oldest is not None else []
        if self._may_stall:  # else a past stall time would be due for ever (a busy loop)
            waits.append(self.group.moved.since + self.deadline)
        if self.stage is Stage.HOLDING and self.group.split_due is not None:
            waits.append(self.group.split_due)  # a split view waits this long at most
        return min(waits) if waits else self._next_beat

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output:
        """One delivery: used, or dropped and counted under exactly one reason (a retained
        frame is nobody's of this run: privnet publishes nothing retained)."""
        self.deliveries.received += 1
        try:
            if retained:
                raise Rejected(Reason.RETAINED, f"a retained frame on {topic!r}")
            out = self._receive(topic, payload, now)
        except Rejected as exc:
            self.deliveries.rejected[exc.reason.value] += 1
            return Output()
        self.deliveries.used += 1
        return out

    def lost(self, agent: int, reason: str, now: float) -> Output:
        """`agent` is gone (its process ended, it went silent, it failed): leave it out of
        the next view. The shell calls this when it sees a process end."""
        if agent not in self.alive or self.stage not in (*IN_SESSION, Stage.REGISTERING):
            return Output()
        self.alive.discard(agent)
        self.group.joining.pop(agent, None)
        if self.stage is Stage.REGISTERING:
            return self._fail(f"agent {agent} lost during registration: {reason}")
        if agent not in self.group.members:
            return Output()
        self.group.lost[agent] = reason
        out = Output(events=[Event("lost", f"agent {agent}: {reason}")])
        return out + self._change(now, "lost")

    def deaf(self, now: float) -> Output:
        """The orchestrator could not hear until now (its broker connection was down, or
        its process was stopped): every silence and stall deadline starts again now."""
        self.registry.deaf(now)
        moved = self.group.moved
        moved.since = max(moved.since, now)
        return Output()

    def bye(self) -> Output:
        """Dismiss the agents once the caller has what it needs."""
        if self.stage is not Stage.DONE:
            raise RuntimeError(f"bye in stage {self.stage}: only once every session is done")
        self.stage = Stage.CLOSED
        return Output([self._down("all", control.Bye())], [Event("closed")])

    def unsubscribed(self, topic: str, now: float) -> Output:
        raise RuntimeError(f"the conductor never unsubscribes (from {topic!r})")

    def abort(self, reason: str) -> Output:
        """Stop every agent now (Ctrl-C, a failure the caller noticed)."""
        return self._fail(reason)

    # ---- deliveries -------------------------------------------------------------------

    def _receive(self, topic: str, payload: bytes, now: float) -> Output:
        registry = self.registry
        agent = registry.sender(topic)
        if self.stage in (Stage.FAILED, Stage.CLOSED):
            raise Rejected(Reason.CLOSED, f"the run is {self.stage}")
        frame = registry.frame(agent, payload)
        msg = frame.msg
        if isinstance(msg, control.Hello):
            return self._hello(frame, msg, now)
        pinned = registry.verified(agent, frame)
        if not isinstance(msg, control.Failed):  # a valid frame: it is alive (again)
            registry.alive.add(agent)
            registry.hear(agent, now)
        out = self._obey(msg, now)
        pinned.seen.add(frame.seq)
        if isinstance(msg, control.Left):  # sent after its last Finished: tallied here
            self.collection.left_traffic.add("control", topic, payload)
        return out

    def _hello(self, frame: wire.SignedFrame, hello: control.Hello, now: float) -> Output:
        agent = hello.agent
        identity = self.registry.introduced(frame, hello, self.stage in IN_SESSION)
        out = Output()
        if agent in self.registry.registered:
            # Its launcher started it again (the token proves it): the old process is gone.
            out += self.lost(agent, "restarted", now)
            out.events.append(Event("restarted", f"agent {agent}"))
        self.registry.pin(agent, identity, frame.seq, now)
        late = self.stage is not Stage.REGISTERING or self.resume is not None
        out.publish.append(self._down(agent, control.Welcome(agent, late)))  # late: Rejoin
        if self.stage is Stage.REGISTERING and self.registry.complete:
            out.events.append(Event("registered", f"{self.agents} agents"))
            self._next_beat = now + self.deadline / BEATS
            if self.resume is None:
                out += self._next_session(now)
        return out

    def _obey(self, msg: control.Control, now: float) -> Output:
        group = self.group
        match msg:
            case control.Failed(agent=agent, reason=reason):
                if agent not in self.alive:  # out already: its last words change nothing
                    return Output()
                if self.stage in IN_SESSION:  # left out of the next view: the run goes on
                    return self.lost(agent, f"failed: {reason}", now)
                return self._fail(f"agent {agent} failed: {reason}")
            case control.Progress(session=n) if n == self.session and self.stage in IN_SESSION:
                return self._progress(msg, now)
            case control.Rejoin(agent=agent) if self._can_join(agent):
                group.joining[agent] = msg
                return self._change(now, "returned")
            case control.Rejoin(agent=agent) if (
                self.resume is not None and self.stage is Stage.REGISTERING
            ):
                return self._offer(msg, now)
            case control.Ready(agent=agent, session=n, view=v) if (
                self._at(Stage.CONFIGURING, n, v) and agent in group.members
            ):
                if agent in group.ready:
                    raise Rejected(Reason.DUPLICATE, f"second Ready of agent {agent}")
                group.ready.add(agent)
                return self._maybe_go(now)
            case control.Telemetry(session=n) if n == self.session and self.stage in IN_SESSION:
                plan = self.plans[n]
                end = group.view_end(msg.view, n, plan.rounds)
                self.collection.telemetry(msg, n, plan.dim, end)
                return Output()
            case control.Escrow(session=n) if (
                self.escrow and n == self.session and self.stage in IN_SESSION
            ):
                self.collection.escrowed(msg, n)
                return Output()
            case control.Left() if self.stage is Stage.CLOSING:
                return self._left(msg)
            case control.Finished(agent=agent, session=n) if (
                self.stage in (Stage.RUNNING, Stage.HOLDING)
                and n == self.session
                and agent in group.members
            ):
                return self._finished(msg, now)
        raise Rejected(Reason.OUT_OF_PHASE, f"{type(msg).__name__} in stage {self.stage}")

    def _offer(self, rejoin: control.Rejoin, now: float) -> Output:
        """Resuming: what an agent holds; the session goes on once every agent said."""
        offers = self.group.offers
        if rejoin.agent in offers:
            raise Rejected(Reason.DUPLICATE, f"second Rejoin of agent {rejoin.agent}")
        offers[rejoin.agent] = rejoin
        if len(offers) < self.agents or not self.registry.complete:
            return Output()
        return self._next_session(now)

    def _left(self, msg: control.Left) -> Output:
        left = self.collection.left
        if msg.agent in left:
            raise Rejected(Reason.DUPLICATE, f"second Left of agent {msg.agent}")
        left[msg.agent] = msg.rejected
        return self._done() if self.alive <= left.keys() else Output()

    def _finished(self, msg: control.Finished, now: float) -> Output:
        if msg.view != self._view_number:
            raise Rejected(
                Reason.STALE_VIEW, f"Finished of view {msg.view}, now {self._view_number}"
            )
        if msg.agent in self.group.finished:
            raise Rejected(Reason.DUPLICATE, f"second Finished of agent {msg.agent}")
        self.group.finished[msg.agent] = msg
        self.group.completed[msg.agent] = self.plans[self.session].rounds
        return self._maybe_done(now)

    def _can_join(self, agent: int) -> bool:
        return (
            self.stage in IN_SESSION
            and self.script is None
            and self.group.may_join(agent, self.alive)
        )

    def _progress(self, msg: control.Progress, now: float) -> Output:
        agent, group = msg.agent, self.group
        number = self._view_number
        if agent not in group.members and agent not in group.joining and msg.view < number:
            # left out, and still at it: its Excluded was lost (a broker restart, say)
            return Output([self._down(agent, control.Excluded(agent, self.session, msg.view + 1))])
        if agent not in group.members or msg.view != number:
            return Output()  # a late heartbeat of an earlier view
        group.progress(agent, msg.round, self.collection.counts, now)
        if not msg.held:
            return Output()
        group.held[agent] = msg.round
        return self._maybe_switch(now)

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
            self.deadline, self.telemetry, self.checkpoint_every, self.seal_links, self.escrow
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
        go = control.Go(self.session, view.view, until)
        return Output([self._down("all", go)], [Event("started", self._label)])

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
        self.collection.new_session(plan.rounds, self.agents, plan.dim)
        self.group.new_session()
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
            self.collection.restore(self.resume.models, start)
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

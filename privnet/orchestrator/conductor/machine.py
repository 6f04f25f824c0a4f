"""The orchestrator's side of a run's life cycle, as a sans-IO state machine.

Like the agent node (`privnet.agent.node`), it is fed deliveries (`receive`) and time (`tick`) and
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
kept by `membership`, models and escrow by `collection`; this module reads deliveries and
time, and `sessions` moves a session through its views.
"""

from __future__ import annotations

from privnet.agent import control, wire
from privnet.agent.messages import Reason, Rejected
from privnet.agent.protocol import BEATS, Event, Output
from privnet.orchestrator.conductor.blame import suspects
from privnet.orchestrator.conductor.membership import splits
from privnet.orchestrator.conductor.records import BEATING, IN_SESSION, Stage
from privnet.orchestrator.conductor.sessions import Sessions


class Conductor(Sessions):
    """Drives every session of a run; see the module docstring."""

    def start(self, now: float) -> Output:
        self._since = now
        return Output()

    def tick(self, now: float) -> Output:
        """Deadlines (registration, an agent's silence, a stalled network) and Beats."""
        sent, beating = self.outbox.broadcasts, self.stage in BEATING
        out = self._tick(now)
        if beating and self.outbox.broadcasts != sent:
            self.beats.note(now)
        return out

    def _tick(self, now: float) -> Output:
        if self.stage is Stage.REGISTERING and now - self._since >= self.register_deadline:
            missing = self.registry.missing()
            return self._fail(
                f"registration closed after {self.register_deadline:.0f} s; agents "
                f"{missing[:20]} never registered (not started, or launched with another "
                "run's token?)"
            )
        out = self._waits(now) if self.stage in IN_SESSION else Output()
        if self.stage is Stage.CLOSING and now - self._since >= self.deadline:
            return out + self._done()  # results are complete; a silent agent costs its Left
        if self.stage in BEATING and now >= self._next_beat:
            self._next_beat = now + self.deadline / BEATS
            beat = control.Beat() if self.stage is not Stage.HOLDING else self._hold()
            out.publish.append(self._down("all", beat))
        return out

    def _waits(self, now: float) -> Output:
        """In a session: a member silent for a deadline, a stall, a quarantine's end, a
        hold a member did not answer within a deadline (or a split view waited out)."""
        out = Output()
        heard, expected = self.registry.heard, self.group.expected(self.alive)
        for m in [m for m in expected if now - heard.get(m, 0.0) >= self.deadline]:
            out += self.lost(m, f"silent for {self.deadline:.0f} s", now)
        if self._stalled(now):
            out += self._stall(now)
        for rejoin in self.blame.due(now):  # out of quarantine: back in as any Rejoin
            if self._can_join(rejoin.agent):
                self.group.joining[rejoin.agent] = rejoin
                out += self._change(now, "returned")
        due = self.group.split_due
        if self.stage is Stage.HOLDING and due is not None and now >= due:
            self.group.split_due = None
            staying = self.group.expected(self.alive)
            unheld = staying - self.group.held.keys()
            if 2 * len(unheld) < len(staying):  # a few hold the others up: a deadline at most
                why = f"did not stop for a view change in {self.deadline:g} s"
                for m in sorted(unheld):
                    out += self.lost(m, why, now)
            elif unheld:  # most of them are slow (a busy machine): wait on, and look again
                self.group.split_due = now + self.deadline
            out += self._maybe_switch(now)  # nobody came back to join a split network
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
        if (parked := self.blame.next_due()) is not None:
            waits.append(parked)  # a member in quarantine asked back in
        return min(waits) if waits else self._next_beat

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output:
        """One delivery: used, or dropped and counted under exactly one reason (a retained
        frame is nobody's of this run: privnet publishes nothing retained)."""
        self.deliveries.received += 1
        sent, beating = self.outbox.broadcasts, self.stage in BEATING
        try:
            if retained:
                raise Rejected(Reason.RETAINED, f"a retained frame on {topic!r}")
            out = self._receive(topic, payload, now)
        except Rejected as exc:
            self.deliveries.rejected[exc.reason.value] += 1
            return Output()
        self.deliveries.used += 1
        if beating and self.outbox.broadcasts != sent:
            self.beats.note(now)
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

    def _stall(self, now: float) -> Output:
        """A stall: the round (or the keying) is redone under a new view; a member the
        held-back members' waits keep naming (`blame`) is left out instead, unless the
        others' graph would split without it."""
        group = self.group
        held_back = group.slowest(self.collection.counts, self.stage is Stage.CONFIGURING)
        members, plan = group.members, self.plans[self.session]
        named = {
            m
            for m in suspects(group.waiting, held_back)
            if m in members and not splits(plan, members - {m}, self.agents)
        }
        agent = self.blame.stall(named, now)
        if agent is None:
            return self._change(now, "stalled")
        why = f"stalled the network (left out {self.blame.outs[agent]} time(s) for it)"
        return self.lost(agent, why, now)

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
                return self._progress(msg, now) + self._pace()
            case control.Rejoin(agent=agent) if self._can_join(agent):
                if self.blame.park(msg, now):  # left out for stalling: back once it ends
                    return Output()
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
                return self._pace()
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
        if msg.waiting:
            group.waiting[agent] = msg.waiting
        if not msg.held:
            return Output()
        group.held[agent] = msg.round
        return self._maybe_switch(now)

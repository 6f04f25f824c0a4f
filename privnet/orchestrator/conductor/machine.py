"""The orchestrator's side of a run's life cycle, as a sans-IO state machine.

Like the agent node (`privnet.agent.node`), it is fed deliveries (`receive`) and time
(`tick`) and returns what to publish and what happened; launching, the broker and the
console stay outside. Its stages and the moves between them are `records.TRANSITIONS`; the
stage changes only through `Conductor.to`. Every upward frame must be signed by the
identity its agent registered with, carry a new sequence number and fit the stage; anything
else is dropped and counted under exactly one reason. The conductor holds its parts, each
owning its state: `registry` (identities, silences), `membership` (who is alive, views),
`collection` (telemetry, escrow, the agents' Left), `outbox` (what it sends), `blame` (who
stalls the network), `pacing` (grants, Beats); `steward` (a session's course through its
views) and `liveness` (deadlines, Beats) decide on them. This class reads deliveries and
hands each to the part it concerns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Literal

import numpy as np

from privnet.agent import control, keys, topics, wire
from privnet.agent.messages import Reason, Rejected
from privnet.agent.protocol import Deliveries, Event, Output, Publish
from privnet.orchestrator.conductor.blame import Blame
from privnet.orchestrator.conductor.collection import Collection, Outbox
from privnet.orchestrator.conductor.liveness import Liveness
from privnet.orchestrator.conductor.membership import Membership
from privnet.orchestrator.conductor.pacing import Pacing
from privnet.orchestrator.conductor.records import (
    BEAT_STAGES,
    IN_SESSION,
    REGISTER_DEADLINE,
    TRANSITIONS,
    Resume,
    SessionPlan,
    SessionResult,
    Stage,
    View,
)
from privnet.orchestrator.conductor.registry import Registry
from privnet.orchestrator.conductor.setups import Terms
from privnet.orchestrator.conductor.steward import Steward


class Conductor:
    """Drives every session of a run; see the module docstring."""

    def __init__(
        self,
        run: str,
        identity: keys.Identity,
        tokens: dict[int, bytes],
        plans: list[SessionPlan],
        *,
        deadline: float = 30.0,
        telemetry: bool = True,
        register_deadline: float = REGISTER_DEADLINE,
        checkpoint_every: int = 0,
        script: Iterable[View] | None = None,
        resume: Resume | None = None,
        seal_links: bool = True,
        escrow: bool = False,
        models_every: int | None = None,
    ) -> None:
        if not plans:
            raise ValueError("a run needs at least one session")
        agents = len(tokens)
        for plan in plans:
            if sorted(s.agent for s in plan.specs) != list(range(agents)):
                raise ValueError(f"session {plan.label}: one spec per agent 0..{agents - 1}")
        self.run, self.identity, self.tokens, self.agents = run, identity, tokens, agents
        self.plans, self.deadline, self.telemetry = plans, deadline, telemetry
        self.register_deadline, self.checkpoint_every = register_deadline, checkpoint_every
        self.seal_links, self.escrow = seal_links, escrow
        # telemetry: agents' metrics every round, their models every K (None: by the size)
        self.models_every = models_every or wire.default_models_every(plans[0].dim)
        self.terms = Terms(
            deadline,
            telemetry,
            checkpoint_every,
            seal_links,
            escrow,
            self.models_every,
            plans[0].models_f4,
        )
        # A replay applies recorded views at their rounds and decides nothing itself.
        self.script = {(v.session, v.view): v for v in script} if script is not None else None
        self.resume = resume  # a run started again (`privnet run --resume`)
        self.session = (resume.session if resume is not None else 0) - 1  # index into plans
        self.results: list[SessionResult] = []
        self.failure = ""
        self.deliveries = Deliveries()
        self._stage = Stage.REGISTERING
        self.moves: Counter[tuple[Stage, Stage]] = Counter()  # every stage change made
        self.since = 0.0  # start of the current stage's wait (registration: of the run)
        self.registry = Registry(run, tokens)
        self.membership = Membership(agents)
        self.blame = Blame(deadline)
        self.collection = Collection(run, identity)
        self.outbox = Outbox(run, identity, agents)
        self.pacing = Pacing(deadline)
        self.steward = Steward(self)
        self.liveness = Liveness(self, self.steward)

    # ---- the stage --------------------------------------------------------------------

    @property
    def stage(self) -> Stage:
        return self._stage

    def to(self, stage: Stage, now: float | None = None) -> None:
        """The one way the stage changes: a move `TRANSITIONS` allows (anything else is
        a bug, raised), from `now` on (the start of the new stage's wait)."""
        if stage not in TRANSITIONS[self._stage]:
            raise RuntimeError(f"the conductor cannot go from {self._stage} to {stage}")
        self.moves[self._stage, stage] += 1
        self._stage = stage
        if now is not None:
            self.since = now

    # ---- what the engines, the live view and the tests read -----------------------------

    @property
    def subscriptions(self) -> list[str]:
        return topics.up_filters(self.run)

    @property
    def current(self) -> SessionPlan | None:
        return self.plans[self.session] if 0 <= self.session < len(self.plans) else None

    @property
    def label(self) -> str:
        plan = self.current
        return plan.label if plan is not None else ""

    @property
    def rounds_done(self) -> int:
        """Rounds every member has completed in the current session (by its heartbeats,
        or by its telemetry, which comes more often)."""
        return self.membership.rounds_done(self.collection.counts)

    @property
    def completed(self) -> np.ndarray:
        """Rounds each agent has completed in the current session as far as the conductor
        knows (heartbeats or telemetry, whichever says more): read-only, for the live view."""
        return self.membership.known(self.collection.counts)

    # ---- time -------------------------------------------------------------------------

    def start(self, now: float) -> Output:
        self.since = now
        return Output()

    def tick(self, now: float) -> Output:  # deadlines and Beats: the `liveness` part's
        return self.liveness.tick(now)

    def next_tick(self) -> float | None:
        return self.liveness.next_tick()

    def deaf(self, now: float) -> Output:
        """The orchestrator could not hear until now (its broker connection was down, or
        its process was stopped): every silence and stall deadline starts again now."""
        self.registry.deaf(now)
        moved = self.membership.moved
        moved.since = max(moved.since, now)
        return Output()

    # ---- what the shell tells it ------------------------------------------------------

    def lost(self, agent: int, reason: str, now: float) -> Output:
        """`agent` is gone (its process ended, it went silent, it failed): leave it out of
        the next view. The shell calls this when it sees a process end."""
        membership = self.membership
        if agent not in membership.alive or self.stage not in (*IN_SESSION, Stage.REGISTERING):
            return Output()
        if self.stage is Stage.REGISTERING:
            membership.lose(agent, reason)
            return self.fail(f"agent {agent} lost during registration: {reason}")
        if not membership.lose(agent, reason):
            return Output()
        out = Output(events=[Event("lost", f"agent {agent}: {reason}")])
        return out + self.steward.change(now, "lost")

    def bye(self) -> Output:
        """Dismiss the agents once the caller has what it needs."""
        if self.stage is not Stage.DONE:
            raise RuntimeError(f"bye in stage {self.stage}: only once every session is done")
        self.to(Stage.CLOSED)
        return Output([self.down("all", control.Bye())], [Event("closed")])

    def unsubscribed(self, topic: str, now: float) -> Output:
        raise RuntimeError(f"the conductor never unsubscribes (from {topic!r})")

    def abort(self, reason: str) -> Output:
        """Stop every agent now (Ctrl-C, a failure the caller noticed)."""
        return self.fail(reason)

    def fail(self, reason: str) -> Output:
        if self.stage in (Stage.FAILED, Stage.CLOSED):
            return Output()
        self.to(Stage.FAILED)
        self.failure = reason
        return Output([self.down("all", control.Abort(reason[:1000]))], [Event("failed", reason)])

    def down(self, to: int | Literal["all"], msg: control.Control) -> Publish:
        return self.outbox.down(to, msg)

    # ---- deliveries -------------------------------------------------------------------

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output:
        """One delivery: used, or dropped and counted under exactly one reason (a retained
        frame is nobody's of this run: privnet publishes nothing retained)."""
        self.deliveries.received += 1
        sent, beating = self.outbox.broadcasts, self.stage in BEAT_STAGES
        try:
            if retained:
                raise Rejected(Reason.RETAINED, f"a retained frame on {topic!r}")
            out = self._receive(topic, payload, now)
        except Rejected as exc:
            self.deliveries.rejected[exc.reason.value] += 1
            return Output()
        self.deliveries.used += 1
        if beating and self.outbox.broadcasts != sent:
            self.pacing.beats.note(now)
        return out

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
            self.membership.alive.add(agent)
            registry.hear(agent, now)
        out = self._obey(msg, now)
        pinned.seen.add(frame.seq)
        if isinstance(msg, control.Left):  # sent after its last Finished: tallied here
            self.collection.farewell_traffic.add("control", topic, payload)
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
        self.membership.alive.add(agent)
        late = self.stage is not Stage.REGISTERING or self.resume is not None
        out.publish.append(self.down(agent, control.Welcome(agent, late)))  # late: Rejoin
        if self.stage is Stage.REGISTERING and self.registry.complete:
            out.events.append(Event("registered", f"{self.agents} agents"))
            self.pacing.schedule(now)
            if self.resume is None:
                out += self.steward.next_session(now)
        return out

    def _obey(self, msg: control.Control, now: float) -> Output:
        steward, in_session = self.steward, self.stage in IN_SESSION
        match msg:
            case control.Failed(agent=agent, reason=reason):
                if agent not in self.membership.alive:  # out already: its last words change nothing
                    return Output()
                if in_session:  # left out of the next view: the run goes on
                    return self.lost(agent, f"failed: {reason}", now)
                return self.fail(f"agent {agent} failed: {reason}")
            case control.Progress(session=n) if n == self.session and in_session:
                return steward.progress(msg, now) + steward.pace()
            case control.Rejoin(agent=agent) if steward.can_join(agent):
                return steward.rejoin(msg, now)
            case control.Rejoin() if self.resume is not None and self.stage is Stage.REGISTERING:
                return steward.offer(msg, now)
            case control.Ready(agent=agent, session=n, view=v) if (
                steward.at(Stage.CONFIGURING, n, v) and agent in self.membership.members
            ):
                return steward.ready(msg, now)
            case control.Telemetry(session=n) if n == self.session and in_session:
                plan = self.plans[n]
                end = self.membership.view_end(msg.view, n, plan.rounds)
                self.collection.telemetry(msg, n, plan.dim, end)
                return steward.pace()
            case control.Escrow(session=n) if self.escrow and n == self.session and in_session:
                self.collection.escrowed(msg, n)
                return Output()
            case control.Left() if self.stage is Stage.CLOSING:  # its answer to Close
                farewells = self.collection.farewell(msg)
                return steward.done() if self.membership.alive <= farewells.keys() else Output()
            case control.Finished(agent=agent, session=n) if (
                self.stage in (Stage.RUNNING, Stage.HOLDING)
                and n == self.session
                and agent in self.membership.members
            ):
                return steward.finished(msg, now)
        raise Rejected(Reason.OUT_OF_PHASE, f"{type(msg).__name__} in stage {self.stage}")

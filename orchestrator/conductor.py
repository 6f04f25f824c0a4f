"""The orchestrator's side of a run's life cycle, as a sans-IO state machine.

Like the agent node (`agent.node`), it is fed deliveries (`receive`) and time (`tick`) and
returns what to publish and what happened; process launching, the broker and the console
stay outside. Phases: REGISTERING (a Hello from every agent, each proving its launch
token) -> per session CONFIGURING (sealed Setup out, Ready back) -> RUNNING (Go out,
sealed telemetry and Finished back) -> CLOSING (Close out, each agent stops reading peers
and answers Left with what it dropped since) -> DONE (the caller writes its outputs, then
`bye`) -> CLOSED, or FAILED from anywhere (an agent failed, or a deadline
passed: registration has a fixed deadline, a session one of silence).

Identities are pinned at registration: every later upward frame must be signed by the
identity the agent registered, carry a sequence number it has not used, and fit the
phase. Anything else is dropped and counted under exactly one reason.
"""

from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

import numpy as np

from agent import control, keys, topics, wire
from agent.losses import ProblemSpec
from agent.messages import Rejected
from agent.node import (
    Deliveries,
    Event,
    Output,
    Publish,
    Traffic,
    hello_proof,
    setup_context,
    telemetry_context,
)
from agent.spec import AgentSpec

REGISTER_DEADLINE = 120.0  # seconds from start for every agent to register
BEATS = 3  # Beats per deadline while sessions run: agents stop after a deadline of silence


class Stage(StrEnum):
    REGISTERING = "registering"
    CONFIGURING = "configuring"
    RUNNING = "running"
    CLOSING = "closing"
    DONE = "done"
    FAILED = "failed"
    CLOSED = "closed"


BEATING = (Stage.CONFIGURING, Stage.RUNNING, Stage.CLOSING)


@dataclass(frozen=True)
class SessionPlan:
    """One session: every agent's spec and the problem they sample their data from."""

    label: str
    specs: list[AgentSpec]
    problem: ProblemSpec

    @property
    def rounds(self) -> int:
        return self.specs[0].rounds

    @property
    def dim(self) -> int:
        return self.specs[0].dim


def add_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Count maps added key by key (zeros kept, unlike Counter's `+`)."""
    total: Counter[str] = Counter()
    for count in counts:
        total.update(count)
    return dict(total)


@dataclass
class SessionResult:
    label: str
    models: np.ndarray  # (rounds, P, M): every agent's true model after every round
    finished: dict[int, control.Finished]
    wall: float  # Go to last Finished

    def totals(self, field_name: str) -> dict[str, int]:
        """One of Finished's count maps (rejected, bytes, messages), summed over agents."""
        return add_counts(getattr(done, field_name) for done in self.finished.values())


@dataclass
class _Agent:
    identity: keys.PublicIdentity
    seen: set[int] = field(default_factory=set)  # sequence numbers used


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
    ) -> None:
        if not plans:
            raise ValueError("a run needs at least one session")
        agents = len(tokens)
        for plan in plans:
            if sorted(s.agent for s in plan.specs) != list(range(agents)):
                raise ValueError(f"session {plan.label}: one spec per agent 0..{agents - 1}")
        self.run, self.identity, self.tokens = run, identity, tokens
        self.plans, self.deadline, self.telemetry = plans, deadline, telemetry
        self.register_deadline = register_deadline
        self.agents = agents
        self.stage = Stage.REGISTERING
        self.deliveries = Deliveries()
        self.traffic = Traffic()  # what it published, as the agents count theirs
        self.recipients = 0  # deliveries of what it published (a broadcast reaches everyone)
        self.registered: dict[int, _Agent] = {}
        self.results: list[SessionResult] = []
        self.left: dict[int, dict[str, int]] = {}  # what each dropped after its last Finished
        self.left_traffic = Traffic()  # the agents' Left frames
        self.failure = ""
        self.session = -1  # index into plans
        self._seq = 0
        self._since = 0.0  # start of the current wait (registration: of the run)
        self._ready: set[int] = set()
        self._finished: dict[int, control.Finished] = {}
        self._go_at = 0.0
        self._next_beat = 0.0
        self.models = np.zeros((0, 0, 0))
        self.counts = np.zeros(0, dtype=np.int64)  # rounds reported, per agent

    # ---- public API -------------------------------------------------------------------

    @property
    def subscriptions(self) -> list[str]:
        return topics.up_filters(self.run)

    @property
    def rounds_done(self) -> int:
        """Rounds every agent has reported in the current session."""
        return int(self.counts.min()) if self.counts.size else 0

    @property
    def current(self) -> SessionPlan | None:
        return self.plans[self.session] if 0 <= self.session < len(self.plans) else None

    def start(self, now: float) -> Output:
        self._since = now
        return Output()

    def tick(self, now: float) -> Output:
        """Fail a registration past its deadline, or a session silent past its deadline."""
        if self.stage is Stage.REGISTERING and now - self._since >= self.register_deadline:
            missing = sorted(set(range(self.agents)) - self.registered.keys())
            return self._fail(
                f"registration closed after {self.register_deadline:.0f} s; agents "
                f"{missing[:20]} never registered (not started, or launched with another "
                "run's token?)"
            )
        if self._silence_counts and now - self._since >= self.deadline:
            return self._fail(f"nothing heard for {self.deadline:.0f} s while {self._waiting()}")
        if self.stage is Stage.CLOSING and now - self._since >= self.deadline:
            return self._done()  # the results are complete; a silent agent only costs its Left
        if self.stage in BEATING and now >= self._next_beat:
            self._next_beat = now + self.deadline / BEATS
            return Output([self._down("all", control.Beat())])
        return Output()

    def next_tick(self) -> float | None:
        if self.stage is Stage.REGISTERING:
            return self._since + self.register_deadline
        if self.stage in BEATING:
            return min(self.deadline_at, self._next_beat)
        return None

    @property
    def _silence_counts(self) -> bool:
        """Whether silence from the agents means trouble: while configuring, and while
        running with telemetry. Without it a running agent says nothing until Finished;
        a dead or stalled one is then caught by its neighbours' deadlines (they fail and
        say so) and by the shell's process checks."""
        return self.stage is Stage.CONFIGURING or (self.stage is Stage.RUNNING and self.telemetry)

    @property
    def deadline_at(self) -> float:
        """When the current wait runs out (registration, or a session's silence)."""
        wait = self.register_deadline if self.stage is Stage.REGISTERING else self.deadline
        return self._since + wait

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output:
        """One delivery: used, or dropped and counted under exactly one reason (a retained
        frame is nobody's of this run: privnet publishes nothing retained)."""
        self.deliveries.received += 1
        try:
            if retained:
                raise Rejected("retained", f"a retained frame on {topic!r}")
            out = self._receive(topic, payload, now)
        except Rejected as exc:
            self.deliveries.rejected[exc.reason] += 1
            return Output()
        self.deliveries.used += 1
        return out

    def bye(self) -> Output:
        """Dismiss the agents once the caller has what it needs."""
        if self.stage is not Stage.DONE:
            raise RuntimeError(f"bye in stage {self.stage}: only once every session is done")
        self.stage = Stage.CLOSED
        return Output([self._down("all", control.Bye())], [Event("closed")])

    def unsubscribed(self, topic: str, now: float) -> Output:
        raise RuntimeError(f"the conductor never unsubscribes (from {topic!r})")

    def abort(self, reason: str) -> Output:
        """Stop every agent now (Ctrl-C, a dead process the caller noticed)."""
        return self._fail(reason)

    # ---- deliveries -------------------------------------------------------------------

    def _receive(self, topic: str, payload: bytes, now: float) -> Output:
        where = topics.parse_up_topic(topic)
        if where is None or where[0] != self.run:
            raise Rejected("wrong-topic", f"the orchestrator does not read {topic!r}")
        agent = where[1]
        if agent not in self.tokens:
            raise Rejected("unknown-sender", f"agent {agent} is not part of this run")
        if self.stage in (Stage.FAILED, Stage.CLOSED):
            raise Rejected("closed", f"the run is {self.stage}")
        frame = wire.decode_signed(payload)
        if frame.run != self.run:
            raise Rejected("wrong-run", f"frame for run {frame.run!r}, this is {self.run!r}")
        msg = frame.msg
        if getattr(msg, "agent", None) != agent:
            raise Rejected("spoofed", f"{type(msg).__name__} on the topic of agent {agent}")
        if isinstance(msg, control.Hello):
            return self._hello(frame, msg, now)
        pinned = self.registered.get(agent)
        if pinned is None:
            raise Rejected("unregistered", f"{type(msg).__name__} from agent {agent}")
        frame.verify(pinned.identity, f"agent {agent}'s registered identity")
        if frame.seq in pinned.seen:
            raise Rejected("replay", f"agent {agent} already used sequence number {frame.seq}")
        out = self._obey(msg, now)
        pinned.seen.add(frame.seq)
        if isinstance(msg, control.Left):  # sent after its last Finished: tallied here
            self.left_traffic.add("control", topic, payload)
        return out

    def _hello(self, frame: wire.SignedFrame, hello: control.Hello, now: float) -> Output:
        agent = hello.agent
        identity = keys.PublicIdentity.from_bytes(hello.identity)  # 64 bytes: wire-checked
        frame.verify(identity, f"the identity in agent {agent}'s Hello")
        expected = hello_proof(self.tokens[agent], self.run, agent, hello.identity)
        if not hmac.compare_digest(expected, hello.proof):
            raise Rejected("bad-proof", f"Hello of agent {agent} lacks its launch token")
        pinned = self.registered.get(agent)
        if pinned is not None:
            if pinned.identity != identity:
                raise Rejected("identity-change", f"agent {agent} registered another identity")
            raise Rejected("duplicate", f"agent {agent} is registered already")
        self.registered[agent] = _Agent(identity, {frame.seq})
        out = Output([self._down(agent, control.Welcome(agent))])
        if len(self.registered) == self.agents:
            out.events.append(Event("registered", f"{self.agents} agents"))
            self._next_beat = now + self.deadline / BEATS
            out += self._next_session(now)
        return out

    def _obey(self, msg: control.Control, now: float) -> Output:
        match msg:
            case control.Failed(agent=agent, reason=reason):
                return self._fail(f"agent {agent} failed: {reason}")
            case control.Ready(agent=agent, session=n) if self._in(Stage.CONFIGURING, n):
                if agent in self._ready:
                    raise Rejected("duplicate", f"second Ready of agent {agent}")
                self._ready.add(agent)
                self._since = now
                if len(self._ready) < self.agents:
                    return Output()
                self.stage, self._go_at = Stage.RUNNING, now
                return Output([self._down("all", control.Go(n))], [Event("started", self._label)])
            case control.Telemetry(session=n) if self._in(Stage.RUNNING, n):
                self._telemetry(msg)
                self._since = now
                return Output()
            case control.Left(agent=agent, rejected=rejected) if self.stage is Stage.CLOSING:
                if agent in self.left:
                    raise Rejected("duplicate", f"second Left of agent {agent}")
                self.left[agent] = rejected
                return self._done() if len(self.left) == self.agents else Output()
            case control.Finished(agent=agent, session=n) if self._in(Stage.RUNNING, n):
                if agent in self._finished:
                    raise Rejected("duplicate", f"second Finished of agent {agent}")
                self._finished[agent] = msg
                self._since = now
                return self._maybe_done(now)
        raise Rejected("out-of-phase", f"{type(msg).__name__} in stage {self.stage}")

    def _in(self, stage: Stage, session: int) -> bool:
        return self.stage is stage and session == self.session

    def _telemetry(self, msg: control.Telemetry) -> None:
        plan = self.plans[self.session]
        context = telemetry_context(self.run, msg.agent, self.session, msg.round)
        try:
            blob = keys.open_sealed(self.identity.static, msg.sealed, context)
        except keys.BadKey as exc:
            raise Rejected("bad-seal", f"telemetry of agent {msg.agent}: {exc}") from exc
        reports = wire.decode_reports(blob, plan.dim)
        for report in reports:
            if report.sender != msg.agent or not 1 <= report.round <= plan.rounds:
                raise Rejected(
                    "schema",
                    f"agent {msg.agent} reported agent {report.sender}, round {report.round}",
                )
            if not np.isnan(self.models[report.round - 1, report.sender, 0]):
                raise Rejected("duplicate", f"round {report.round} of agent {msg.agent} again")
        for report in reports:
            self.models[report.round - 1, report.sender] = report.w
            self.counts[report.sender] += 1

    def _done(self) -> Output:
        self.stage = Stage.DONE
        return Output(events=[Event("done")])

    def _maybe_done(self, now: float) -> Output:
        if len(self._finished) < self.agents:
            return Output()
        plan = self.plans[self.session]
        if self.telemetry and np.isnan(self.models).any():
            missing = np.argwhere(np.isnan(self.models[..., 0]))[:5].tolist()
            return self._fail(f"telemetry incomplete: missing (round-1, agent) {missing}")
        result = SessionResult(plan.label, self.models, dict(self._finished), now - self._go_at)
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
        self.stage = Stage.CONFIGURING
        self._ready, self._finished = set(), {}
        self.models = np.full((plan.rounds, self.agents, plan.dim), np.nan)
        self.counts = np.zeros(self.agents, dtype=np.int64)
        identities = {m: a.identity.to_bytes() for m, a in self.registered.items()}
        near = {spec.agent: spec.neighbours for spec in plan.specs}
        out = Output(events=[Event("configuring", plan.label)])
        for spec in plan.specs:
            # Whom this agent may meet: its neighbours (link keys) and theirs (local-ghp
            # partners, whose signed key shares it verifies); not the whole network, which
            # would make every Setup, and the link keys agreed, grow with P.
            mine = near[spec.agent]
            reach = {spec.agent, *mine}.union(*(near[k] for k in mine))
            directory = {m: identities[m] for m in sorted(reach)}
            config = control.Config(spec, plan.problem, directory, self.deadline, self.telemetry)
            sealed = keys.seal(
                self.registered[spec.agent].identity.static,
                wire.encode_config(config),
                setup_context(self.run, spec.agent, self.session),
            )
            out.publish.append(
                self._down(spec.agent, control.Setup(spec.agent, self.session, sealed))
            )
        return out

    # ---- helpers ----------------------------------------------------------------------

    @property
    def _label(self) -> str:
        plan = self.current
        return plan.label if plan is not None else ""

    def _waiting(self) -> str:
        if self.stage is Stage.CONFIGURING:
            missing = sorted(set(range(self.agents)) - self._ready)
            return f"waiting for Ready of agents {missing[:20]} ({self._label})"
        unfinished = [a for a in range(self.agents) if a not in self._finished]
        low = self.counts[unfinished].min()  # those not finished that reported the least
        lagging = [a for a in unfinished if self.counts[a] == low]
        return (
            f"running round {self.rounds_done + 1} ({self._label}); slowest agents: {lagging[:10]}"
        )

    def _down(self, to: int | Literal["all"], msg: control.Control) -> Publish:
        self._seq += 1
        topic = topics.ctl_down(self.run, to)
        payload = wire.encode_signed(msg, self.run, self._seq, self.identity)
        self.traffic.add("control", topic, payload)
        self.recipients += self.agents if to == "all" else 1
        return Publish(topic, payload, "control")

    def _fail(self, reason: str) -> Output:
        if self.stage in (Stage.FAILED, Stage.CLOSED):
            return Output()
        self.stage, self.failure = Stage.FAILED, reason
        return Output([self._down("all", control.Abort(reason[:1000]))], [Event("failed", reason)])

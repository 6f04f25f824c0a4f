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

import hashlib
import heapq
import hmac
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal

import numpy as np

from agent import control, keys, topics, wire
from agent.messages import Reason, Rejected
from agent.problems import Share
from agent.protocol import (
    BEATS,
    Deliveries,
    Event,
    Output,
    Publish,
    Traffic,
    escrow_context,
    hello_proof,
    setup_context,
    telemetry_context,
)
from agent.spec import AgentSpec, ConfigError

REGISTER_DEADLINE = 120.0  # seconds from start for every agent to register


class Stage(StrEnum):
    REGISTERING = "registering"
    CONFIGURING = "configuring"
    RUNNING = "running"
    HOLDING = "holding"
    CLOSING = "closing"
    DONE = "done"
    FAILED = "failed"
    CLOSED = "closed"


BEATING = (Stage.CONFIGURING, Stage.RUNNING, Stage.HOLDING, Stage.CLOSING)
IN_SESSION = (Stage.CONFIGURING, Stage.RUNNING, Stage.HOLDING)
STALLS = 3  # views in a row that bring no round forward: then the run fails, saying why


ViewSpecs = Callable[[frozenset[int]], list[AgentSpec]]


@dataclass(frozen=True)
class SessionPlan:
    """One session: every agent's spec and its own problem spec (by agent id: the data
    model and that agent's keys); `view_specs` gives the specs of a membership view
    (weights on its graph)."""

    label: str
    specs: list[AgentSpec]
    problems: tuple[Share, ...]
    view_specs: ViewSpecs | None = None

    @property
    def rounds(self) -> int:
        return self.specs[0].rounds

    @property
    def dim(self) -> int:
        return self.specs[0].dim


@dataclass(frozen=True)
class View:
    """One membership view: who runs `session` from round `start` on, and why it changed.

    `resume[m]` is the round after which member m's own model is where it starts: start - 1
    for members that carry on, an earlier round for one that comes back."""

    session: int
    view: int
    start: int
    members: tuple[int, ...]
    reason: str
    resume: dict[int, int] = field(default_factory=dict)
    left: dict[int, str] = field(default_factory=dict)  # agent -> why it is out

    def to_json(self) -> dict[str, object]:
        return {
            "session": self.session,
            "view": self.view,
            "start": self.start,
            "members": list(self.members),
            "reason": self.reason,
            "resume": {str(m): r for m, r in self.resume.items()},
            "left": {str(m): why for m, why in self.left.items()},
        }

    @classmethod
    def from_json(cls, item: Mapping[str, Any]) -> View:
        return cls(
            int(item["session"]),
            int(item["view"]),
            int(item["start"]),
            tuple(int(m) for m in item["members"]),
            str(item["reason"]),
            {int(m): int(r) for m, r in item.get("resume", {}).items()},
            {int(m): str(w) for m, w in item.get("left", {}).items()},
        )


def add_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Count maps added key by key (zeros kept, unlike Counter's `+`)."""
    total: Counter[str] = Counter()
    for count in counts:
        total.update(count)
    return dict(total)


@dataclass
class SessionResult:
    label: str
    models: np.ndarray  # (rounds, P, M): every agent's true model after every round (NaN: missed)
    finished: dict[int, control.Finished]
    wall: float  # Go to last Finished
    views: list[View] = field(default_factory=list)  # the session's membership views

    def totals(self, field_name: str) -> dict[str, int]:
        """One of Finished's count maps (rejected, bytes, messages), summed over agents."""
        return add_counts(getattr(done, field_name) for done in self.finished.values())

    @property
    def counted(self) -> int:
        """Rounds its counts (bytes, messages, `wall`) cover: every round, or of a session
        `privnet run --resume` went on with, those from where it went on (the counts of the
        rounds before died with the first run's agents)."""
        resumed = self.views and self.views[0].reason == "resumed"
        rounds: int = self.models.shape[0]
        return rounds - (self.views[0].start - 1 if resumed else 0)

    @property
    def missed(self) -> dict[int, int]:
        """Rounds whose model each agent did not report (out of the view, or lost)."""
        counts = np.isnan(self.models[..., 0]).sum(axis=0) if self.models.size else []
        return {m: int(n) for m, n in enumerate(counts) if n}


@dataclass(frozen=True)
class Resume:
    """Where a run started again goes on: the session it was in, the models of it the first
    run received (rounds x P x M, NaN where none) and how many of its rounds it recorded
    (every member's report in). The agents say which of their own models they hold
    (checkpoints); the session goes on after the latest round all do and that the first run
    recorded: agents that outlived their orchestrator ran on unrecorded, and are rewound."""

    session: int
    models: np.ndarray
    recorded: int


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
        checkpoint_every: int = 0,
        script: Iterable[View] | None = None,
        resume: Resume | None = None,
        seal_links: bool = True,
        escrow: bool = False,
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
        self.checkpoint_every = checkpoint_every
        self.seal_links, self.escrow = seal_links, escrow
        # (session, view) -> {(a, b): link key}, a < b, as the agents escrowed them (--audit)
        self.link_keys: dict[tuple[int, int], dict[tuple[int, int], bytes]] = {}
        # A replay applies recorded views at their rounds and decides nothing itself.
        self.script = {(v.session, v.view): v for v in script} if script is not None else None
        self.agents = agents
        self.stage = Stage.REGISTERING
        self.deliveries = Deliveries()
        self.traffic = Traffic()  # what it published, as the agents count theirs
        self.recipients = 0  # deliveries of what it published (a broadcast reaches everyone)
        self.registered: dict[int, _Agent] = {}
        self.results: list[SessionResult] = []
        self.membership: list[View] = []  # every view of every session, in order
        self.left: dict[int, dict[str, int]] = {}  # what each dropped after its last Finished
        self.left_traffic = Traffic()  # the agents' Left frames
        self.failure = ""
        self.resume = resume  # a run started again (`privnet run --resume`)
        self.session = (resume.session if resume is not None else 0) - 1  # index into plans
        self._offers: dict[int, control.Rejoin] = {}  # resuming: what each agent holds
        self.alive: set[int] = set()  # registered and not lost
        self.members: frozenset[int] = frozenset()  # of the current view
        self._seq = 0
        self._since = 0.0  # start of the current wait (registration: of the run)
        self._heard: dict[int, float] = {}  # when each agent last sent a valid frame
        # (time, agent) of every _heard update, a heap: the oldest silence without a walk over
        # every agent per delivery; an entry a later one superseded is dropped as it surfaces
        self._hearing: list[tuple[float, int]] = []
        self._ready: set[int] = set()
        self._finished: dict[int, control.Finished] = {}
        self._completed = np.zeros(agents, dtype=np.int64)  # rounds each completed, this view
        self._member_ids = (frozenset[int](), np.zeros(0, dtype=np.intp))  # members, as indices
        self._held: dict[int, int] = {}  # members stopped for the next view, at that round
        self._lost: dict[int, str] = {}  # members to leave out of the next view, and why
        self._joining: dict[int, control.Rejoin] = {}  # agents asking back in
        self._excluded_at: dict[int, int] = {}  # start of the view that left an agent out
        self._reason = ""
        self._moved = (0, 0.0)  # (slowest member's rounds, when that last grew)
        self._stalls = 0
        self._pause = (0.0, 0)  # (since when the network stood still, rounds to redo)
        self._split_due: float | None = None  # holding: when a split view stops waiting
        self.pauses: list[dict[str, Any]] = []  # what each view change cost
        self._go_at = 0.0
        self._next_beat = 0.0
        self.models = np.zeros((0, 0, 0))
        self.counts = np.zeros(0, dtype=np.int64)  # rounds reported, per agent

    # ---- public API -------------------------------------------------------------------

    @property
    def subscriptions(self) -> list[str]:
        return topics.up_filters(self.run)

    @property
    def view(self) -> View | None:
        return self.membership[-1] if self.membership else None

    @property
    def member_ids(self) -> np.ndarray:
        """The current view's members as indices (in no order), for numpy: made once per view,
        not per message."""
        if self._member_ids[0] is not self.members:
            self._member_ids = (self.members, np.fromiter(self.members, dtype=np.intp))
        return self._member_ids[1]

    @property
    def rounds_done(self) -> int:
        """Rounds every member has completed in the current session (by its heartbeats,
        or by its telemetry, which comes more often)."""
        ids = self.member_ids
        return int(np.maximum(self._completed[ids], self.counts[ids]).min()) if ids.size else 0

    @property
    def completed(self) -> np.ndarray:
        """Rounds each agent has completed in the current session as far as the conductor
        knows (heartbeats or telemetry, whichever says more): read-only, for the live view."""
        if self.counts.size != self._completed.size:  # no session yet
            return self._completed.copy()
        return np.maximum(self._completed, self.counts)

    @property
    def current(self) -> SessionPlan | None:
        return self.plans[self.session] if 0 <= self.session < len(self.plans) else None

    def start(self, now: float) -> Output:
        self._since = now
        return Output()

    def tick(self, now: float) -> Output:
        """Deadlines (registration, an agent's silence, a stalled network) and Beats."""
        if self.stage is Stage.REGISTERING and now - self._since >= self.register_deadline:
            missing = sorted(set(range(self.agents)) - self.registered.keys())
            return self._fail(
                f"registration closed after {self.register_deadline:.0f} s; agents "
                f"{missing[:20]} never registered (not started, or launched with another "
                "run's token?)"
            )
        out = Output()
        if self.stage in IN_SESSION:
            silent = [m for m in self._expected() if now - self._heard.get(m, 0.0) >= self.deadline]
            for m in silent:
                out += self.lost(m, f"silent for {self.deadline:.0f} s", now)
            if self._stalled(now):
                out += self._change(now, "stalled")
            if (
                self.stage is Stage.HOLDING
                and self._split_due is not None
                and (now >= self._split_due)
            ):
                self._split_due = None
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
        oldest = self._oldest_heard()
        waits = [oldest + self.deadline] if oldest is not None else []
        if self._may_stall:  # else a past stall time would be due for ever (a busy loop)
            waits.append(self._moved[1] + self.deadline)
        if self.stage is Stage.HOLDING and self._split_due is not None:
            waits.append(self._split_due)  # a split view waits this long at most
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
        self._joining.pop(agent, None)
        if self.stage is Stage.REGISTERING:
            return self._fail(f"agent {agent} lost during registration: {reason}")
        if agent not in self.members:
            return Output()
        self._lost[agent] = reason
        out = Output(events=[Event("lost", f"agent {agent}: {reason}")])
        return out + self._change(now, "lost")

    def deaf(self, now: float) -> Output:
        """The orchestrator could not hear until now (its broker connection was down, or
        its process was stopped): every silence and stall deadline starts again now."""
        for m, when in list(self._heard.items()):
            self._hear(m, max(when, now))
        self._moved = (self._moved[0], max(self._moved[1], now))
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
        where = topics.parse_up_topic(topic)
        if where is None or where[0] != self.run:
            raise Rejected(Reason.WRONG_TOPIC, f"the orchestrator does not read {topic!r}")
        agent = where[1]
        if agent not in self.tokens:
            raise Rejected(Reason.UNKNOWN_SENDER, f"agent {agent} is not part of this run")
        if self.stage in (Stage.FAILED, Stage.CLOSED):
            raise Rejected(Reason.CLOSED, f"the run is {self.stage}")
        frame = wire.decode_signed(payload)
        if frame.run != self.run:
            raise Rejected(Reason.WRONG_RUN, f"frame for run {frame.run!r}, this is {self.run!r}")
        msg = frame.msg
        if getattr(msg, "agent", None) != agent:
            raise Rejected(Reason.SPOOFED, f"{type(msg).__name__} on the topic of agent {agent}")
        if isinstance(msg, control.Hello):
            return self._hello(frame, msg, now)
        pinned = self.registered.get(agent)
        if pinned is None:
            raise Rejected(Reason.UNREGISTERED, f"{type(msg).__name__} from agent {agent}")
        frame.verify(pinned.identity, f"agent {agent}'s registered identity")
        if frame.seq in pinned.seen:
            raise Rejected(Reason.REPLAY, f"agent {agent} already used sequence number {frame.seq}")
        if not isinstance(msg, control.Failed):  # a valid frame: it is alive (again)
            self.alive.add(agent)
            self._hear(agent, now)
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
            raise Rejected(Reason.BAD_PROOF, f"Hello of agent {agent} lacks its launch token")
        pinned = self.registered.get(agent)
        out = Output()
        if pinned is not None:
            if pinned.identity == identity:
                raise Rejected(Reason.DUPLICATE, f"agent {agent} is registered already")
            if self.stage not in IN_SESSION:
                raise Rejected(Reason.IDENTITY_CHANGE, f"agent {agent} registered another identity")
            # Its launcher started it again (the token proves it): the old process is gone.
            out += self.lost(agent, "restarted", now)
            out.events.append(Event("restarted", f"agent {agent}"))
        self.registered[agent] = _Agent(identity, {frame.seq})
        self.alive.add(agent)
        self._hear(agent, now)
        late = self.stage is not Stage.REGISTERING or self.resume is not None
        out.publish.append(self._down(agent, control.Welcome(agent, late)))  # late: Rejoin
        if self.stage is Stage.REGISTERING and len(self.registered) == self.agents:
            out.events.append(Event("registered", f"{self.agents} agents"))
            self._next_beat = now + self.deadline / BEATS
            if self.resume is None:
                out += self._next_session(now)
        return out

    def _obey(self, msg: control.Control, now: float) -> Output:
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
                self._joining[agent] = msg
                return self._change(now, "returned")
            case control.Rejoin(agent=agent) if (
                self.resume is not None and self.stage is Stage.REGISTERING
            ):
                if agent in self._offers:
                    raise Rejected(Reason.DUPLICATE, f"second Rejoin of agent {agent}")
                self._offers[agent] = msg
                if len(self._offers) < self.agents or len(self.registered) < self.agents:
                    return Output()
                return self._next_session(now)
            case control.Ready(agent=agent, session=n, view=v) if (
                self._at(Stage.CONFIGURING, n, v) and agent in self.members
            ):
                if agent in self._ready:
                    raise Rejected(Reason.DUPLICATE, f"second Ready of agent {agent}")
                self._ready.add(agent)
                return self._maybe_go(now)
            case control.Telemetry(session=n) if n == self.session and self.stage in IN_SESSION:
                self._telemetry(msg)
                return Output()
            case control.Escrow(session=n) if (
                self.escrow and n == self.session and self.stage in IN_SESSION
            ):
                self._escrowed(msg)
                return Output()
            case control.Left(agent=agent, rejected=rejected) if self.stage is Stage.CLOSING:
                if agent in self.left:
                    raise Rejected(Reason.DUPLICATE, f"second Left of agent {agent}")
                self.left[agent] = rejected
                return self._done() if self.alive <= self.left.keys() else Output()
            case control.Finished(agent=agent, session=n, view=v) if (
                self.stage in (Stage.RUNNING, Stage.HOLDING)
                and n == self.session
                and agent in self.members
            ):
                if v != self._view_number:
                    raise Rejected(
                        Reason.STALE_VIEW, f"Finished of view {v}, now {self._view_number}"
                    )
                if agent in self._finished:
                    raise Rejected(Reason.DUPLICATE, f"second Finished of agent {agent}")
                self._finished[agent] = msg
                self._completed[agent] = self.plans[self.session].rounds
                return self._maybe_done(now)
        raise Rejected(Reason.OUT_OF_PHASE, f"{type(msg).__name__} in stage {self.stage}")

    def _at(self, stage: Stage, session: int, view: int) -> bool:
        return self.stage is stage and session == self.session and view == self._view_number

    @property
    def _view_number(self) -> int:
        view = self.view
        return view.view if view is not None and view.session == self.session else -1

    def _can_join(self, agent: int) -> bool:
        return (
            self.stage in IN_SESSION
            and self.script is None
            and agent in self.alive
            and (agent not in self.members or agent in self._lost)
            and agent not in self._joining
        )

    def _progress(self, msg: control.Progress, now: float) -> Output:
        agent = msg.agent
        if (
            agent not in self.members
            and agent not in self._joining
            and msg.view < (self._view_number)
        ):  # left out, and still at it: its Excluded was lost (a broker restart, say)
            return Output([self._down(agent, control.Excluded(agent, self.session, msg.view + 1))])
        if agent not in self.members or msg.view != self._view_number:
            return Output()  # a late heartbeat of an earlier view
        self._completed[msg.agent] = msg.round
        slowest = self.rounds_done
        if slowest > self._moved[0]:
            self._moved, self._stalls = (slowest, now), 0
        if not msg.held:
            return Output()
        self._held[msg.agent] = msg.round
        return self._maybe_switch(now)

    def _telemetry(self, msg: control.Telemetry) -> None:
        plan = self.plans[self.session]
        context = telemetry_context(self.run, msg.agent, self.session, msg.view, msg.round)
        try:
            blob = keys.open_sealed(self.identity.static, msg.sealed, context)
        except keys.BadKey as exc:
            raise Rejected(Reason.BAD_SEAL, f"telemetry of agent {msg.agent}: {exc}") from exc
        reports = wire.decode_reports(blob, plan.dim)
        end = self._view_end(msg.view)
        for report in reports:
            if report.sender != msg.agent or not 1 <= report.round <= plan.rounds:
                raise Rejected(
                    Reason.SCHEMA,
                    f"agent {msg.agent} reported agent {report.sender}, round {report.round}",
                )
            if report.round > end:
                raise Rejected(
                    Reason.STALE_VIEW,
                    f"round {report.round} of view {msg.view}, which ended at {end}",
                )
            if not np.isnan(self.models[report.round - 1, report.sender, 0]):
                raise Rejected(Reason.DUPLICATE, f"round {report.round} of agent {msg.agent} again")
        for report in reports:
            self.models[report.round - 1, report.sender] = report.w
            self.counts[report.sender] += 1

    def _escrowed(self, msg: control.Escrow) -> None:
        """Keep an agent's link keys of a view; both ends of a link must escrow the same."""
        context = escrow_context(self.run, msg.agent, self.session, msg.view)
        try:
            blob = keys.open_sealed(self.identity.static, msg.sealed, context)
        except keys.BadKey as exc:
            raise Rejected(Reason.BAD_SEAL, f"escrow of agent {msg.agent}: {exc}") from exc
        escrowed = self.link_keys.setdefault((self.session, msg.view), {})
        for peer, key in wire.decode_link_keys(blob).items():
            link = (min(msg.agent, peer), max(msg.agent, peer))
            if escrowed.setdefault(link, key) != key:
                raise Rejected(
                    Reason.SCHEMA,
                    f"agent {msg.agent} escrowed another key for link {link} than {peer}",
                )

    def _view_end(self, view: int) -> int:
        """The last round of `view` that stands: views after it redo from their start."""
        session = self.session
        later = [v.start - 1 for v in self.membership if v.session == session and v.view > view]
        return min(later) if later else self.plans[session].rounds

    # ---- views ------------------------------------------------------------------------

    def _expected(self) -> frozenset[int]:
        """Whose silence counts: the members (and those about to be, while holding)."""
        return (self.members - self._lost.keys()) & self.alive

    def _expects(self, agent: int) -> bool:
        """`agent in self._expected()`, without building the set."""
        return agent in self.members and agent not in self._lost and agent in self.alive

    def _hear(self, agent: int, when: float) -> None:
        self._heard[agent] = when
        heapq.heappush(self._hearing, (when, agent))

    def _oldest_heard(self) -> float | None:
        """When the expected agent heard longest ago was last heard (None: nobody is
        expected): `min(self._heard[m] for m in self._expected())` in O(log P) amortized,
        as `deadline_at` is asked after every delivery. Heard times only grow, so an entry
        older than its agent's current time is stale for good; an agent not expected now
        may be again, so its entry is set aside and put back."""
        heap, aside = self._hearing, []
        while heap:
            when, agent = heap[0]
            if self._heard.get(agent) != when:
                heapq.heappop(heap)
            elif self._expects(agent):
                break
            else:
                aside.append(heapq.heappop(heap))
        oldest = heap[0][0] if heap else None
        for entry in aside:
            heapq.heappush(heap, entry)
        return oldest

    @property
    def _may_stall(self) -> bool:
        """Keying or running, not replaying, and rounds left to run."""
        return (
            self.stage in (Stage.CONFIGURING, Stage.RUNNING)
            and self.script is None
            and self.rounds_done < self.plans[self.session].rounds
        )

    def _stalled(self, now: float) -> bool:
        """Every member alive, and the slowest one no further for a deadline (keying: no
        Go within a deadline of the Setups): frames were lost (a broker restart, say); the
        round, or the keying, is redone under a new view."""
        return self._may_stall and now - self._moved[1] >= self.deadline

    def _change(self, now: float, reason: str) -> Output:
        """Ask every member to stop at a round boundary; the next view follows (_switch)."""
        if self.stage not in IN_SESSION or self.script is not None:
            return Output()
        still = self._moved[1] if self.stage is Stage.RUNNING else now  # stood since
        if reason == "stalled":
            self._stalls += 1
            if self._stalls > STALLS:
                waiting = {m: int(self._completed[m]) for m in sorted(self.members)}
                return self._fail(
                    f"no round completed through {STALLS} views ({self._label}); rounds per "
                    f"member: {dict(list(waiting.items())[:20])}"
                )
            self._moved = (self._moved[0], now)
        self._reason = self._reason or reason
        if self.stage is not Stage.HOLDING:
            self._pause = (min(still, now), 0)
            self.stage, self._held, self._since = Stage.HOLDING, {}, now
            self._split_due = now + self.deadline
            self._next_beat = now + self.deadline / BEATS
            out = Output([self._down("all", self._hold())], [Event("holding", reason)])
            return out + self._maybe_switch(now)
        return self._maybe_switch(now)

    def _hold(self) -> control.Hold:
        return control.Hold(self.session, self._view_number + 1)

    def _maybe_switch(self, now: float) -> Output:
        """The next view once every member still in has stopped (holding), or once a
        replay's members reach the recorded round."""
        staying = self._expected()
        if self.stage is Stage.RUNNING and self.script is not None:
            view = self.script.get((self.session, self._view_number + 1))
            if view is None or any(self._held.get(m) != view.start - 1 for m in staying):
                return Output()
            return self._switch(now, view.start, view.reason, view.members, view.resume)
        if self.stage is not Stage.HOLDING or not staying <= self._held.keys():
            return Output()
        if self._splits(staying | self._joining.keys()) and now - self._since < self.deadline:
            return Output()  # a lost cut vertex may be back soon (restarted): wait a deadline
        start = self._first_unrecorded(min((self._held[m] for m in staying), default=0) + 1)
        rounds = self.plans[self.session].rounds
        if start > rounds:  # every member still in has finished: nothing to redo
            self._lost.clear()
            self._joining.clear()
            self.members = frozenset(staying)
            self.stage = Stage.RUNNING
            return self._maybe_done(now)
        self._pause = (
            self._pause[0],
            max((self._held[m] for m in staying), default=start - 1) - (start - 1),
        )
        resume = {m: start - 1 for m in staying}
        for agent, rejoin in self._joining.items():
            resume[agent] = self._resume_of(agent, rejoin, start)
        return self._switch(now, start, self._reason, tuple(sorted(resume)), resume)

    def _first_unrecorded(self, start: int) -> int:
        """The round the next view starts at: after the slowest member's last, or earlier
        where a report of the current view's members never came: a lost member's last
        batch (killed, or stopped, before it sealed it) or one a broker went down with.
        That round is redone under the new view, so every round that stands has every
        member's report. Staying members hold every model of the session, so any round can
        be redone; without telemetry there are no reports to wait for."""
        view = self.view
        first = view.start if view is not None and view.session == self.session else 1
        if not self.telemetry:
            return start
        missing = np.isnan(self.models[first - 1 : start - 1, sorted(self.members), 0])
        gaps = np.flatnonzero(missing.any(axis=1))
        return first + int(gaps[0]) if gaps.size else start

    def _splits(self, members: Iterable[int]) -> bool:
        """Whether these members' graph is not connected (a view on it would not run)."""
        plan = self.plans[self.session]
        if plan.view_specs is None:
            return False  # no view but the whole network can run: nothing to wait for
        try:
            self._specs(plan, frozenset(members))
        except ConfigError:
            return True
        return False

    def _resume_of(self, agent: int, rejoin: control.Rejoin, start: int) -> int:
        """The latest round whose model the agent holds and that stands (before the view
        that left it out); 0, its initial model, when none does."""
        if rejoin.session != self.session:
            return 0
        end = min(self._excluded_at.get(agent, start) - 1, start - 1)
        return max((r for r in rejoin.rounds if r <= end), default=0)

    def _switch(
        self,
        now: float,
        start: int,
        reason: str,
        members: tuple[int, ...],
        resume: Mapping[int, int],
    ) -> Output:
        left = {m: self._lost.get(m, "left out") for m in sorted(self.members - set(members))}
        for m in left:
            self._excluded_at[m] = start
        self._lost.clear()
        self._joining.clear()
        self._reason = ""
        self.models[start - 1 :] = np.nan  # redone (or never done) under the new view
        self.counts = (~np.isnan(self.models[..., 0])).sum(axis=0)
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
            specs = self._specs(plan, members)
        except ConfigError as exc:
            return self._fail(f"view {view.view} of {plan.label}: {exc}")
        self.membership.append(view)
        self.members = members
        self.stage, self._since = Stage.CONFIGURING, now
        self._ready, self._finished, self._held = set(), {}, {}
        self._completed[:] = 0
        self._completed[sorted(members)] = view.start - 1
        self._moved = (view.start - 1, now)
        for m in members:
            self._hear(m, max(self._heard.get(m, now), now))  # a fresh deadline to answer
        identities = {m: a.identity.to_bytes() for m, a in self.registered.items()}
        near = {spec.agent: spec.neighbours for spec in specs}
        out = Output(events=[Event("configuring", plan.label)])
        for spec in specs:
            session = view_session(spec.session, view.view)
            spec = replace(spec, view=view.view, start=view.start, session=session)
            # Whom this agent may meet: its neighbours (link keys) and theirs (mask pair
            # partners, whose signed key shares it verifies); not the whole network, which
            # would make every Setup, and the link keys agreed, grow with P.
            mine = near[spec.agent]
            reach = {spec.agent, *mine}.union(*(near[k] for k in mine))
            directory = {m: identities[m] for m in sorted(reach)}
            config = control.Config(
                spec,
                plan.problems[spec.agent],
                directory,
                self.deadline,
                self.telemetry,
                view.resume.get(spec.agent, view.start - 1),
                self.checkpoint_every,
                self.seal_links,
                self.escrow,
            )
            sealed = keys.seal(
                self.registered[spec.agent].identity.static,
                wire.encode_config(config),
                setup_context(self.run, spec.agent, self.session, view.view),
            )
            setup = control.Setup(spec.agent, self.session, view.view, sealed)
            out.publish.append(self._down(spec.agent, setup))
        return out

    def _specs(self, plan: SessionPlan, members: frozenset[int]) -> list[AgentSpec]:
        if len(members) == self.agents:
            return plan.specs
        if plan.view_specs is None:
            raise ConfigError("this session cannot change membership (no view_specs)")
        return [s for s in plan.view_specs(members) if s.agent in members]

    def _maybe_go(self, now: float) -> Output:
        if not self.members <= self._ready:
            return Output()
        view = self.view
        assert view is not None
        self.stage, self._since = Stage.RUNNING, now
        self._moved = (self._moved[0], now)
        if view.view == 0 or not self._go_at:
            self._go_at = now
        if view.view > 0 and self.script is None:
            since, redone = self._pause
            self.pauses.append(
                {
                    "session": view.session,
                    "view": view.view,
                    "reason": view.reason,
                    "start": view.start,
                    "rounds_redone": redone,
                    "seconds_lost": round(now - since, 3),
                }
            )
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
        if self.stage is not Stage.RUNNING or not self.members <= self._finished.keys():
            return Output()
        plan = self.plans[self.session]
        views = [v for v in self.membership if v.session == self.session]
        result = SessionResult(
            plan.label, self.models, dict(self._finished), now - self._go_at, views
        )
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
        self.models = np.full((plan.rounds, self.agents, plan.dim), np.nan)
        self.counts = np.zeros(self.agents, dtype=np.int64)
        self._excluded_at, self._go_at, self._stalls = {}, 0.0, 0
        scripted = self.script.get((self.session, 0)) if self.script is not None else None
        members = scripted.members if scripted is not None else tuple(sorted(self.alive))
        reason = scripted.reason if scripted is not None else "start"
        start = 1
        if self.resume is not None:  # the interrupted session: on from what all agents hold
            start = self._resume_point(plan.rounds, self.resume.recorded) + 1
            reason = "resumed"
            self.models[: start - 1] = self.resume.models[: start - 1]
            self.counts = (~np.isnan(self.models[..., 0])).sum(axis=0)
            self.resume, self._offers = None, {}
        self.members = frozenset()
        view = View(self.session, 0, start, members, reason, {m: start - 1 for m in members})
        out = Output(events=[Event("view", describe(view))] if start > 1 else [])
        return out + self._configure(view, now)

    def _resume_point(self, rounds: int, recorded: int) -> int:
        """The latest round before the last whose model every agent holds and, with
        telemetry, whose models the first run `recorded` (0: the start): no round after it
        goes without a model."""
        held = [set(o.rounds) if o.session == self.session else {0} for o in self._offers.values()]
        common = set.intersection(*held) if held else {0}
        last = min(rounds - 1, recorded) if self.telemetry else rounds - 1
        return max((r for r in common if r <= last), default=0)

    # ---- helpers ----------------------------------------------------------------------

    @property
    def _label(self) -> str:
        plan = self.current
        return plan.label if plan is not None else ""

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


def view_session(session: bytes, view: int) -> bytes:
    """The session id of a view: every key, MAC and mask of the view is bound to it, so
    nothing of an earlier view is ever reused. View 0 keeps the session's own."""
    if view == 0:
        return session
    return hashlib.sha256(b"privnet/view\0" + session + view.to_bytes(8, "big")).digest()[:16]


def describe(view: View) -> str:
    left = ", ".join(f"{m} ({why})" for m, why in view.left.items())
    back = [m for m, r in view.resume.items() if r != view.start - 1]
    parts = [f"session {view.session} view {view.view} from round {view.start}: {view.reason}"]
    parts.append(f"{len(view.members)} members")
    if left:
        parts.append(f"out: {left}")
    if back:
        parts.append("back: " + ", ".join(f"{m} (from round {view.resume[m]})" for m in back))
    return "; ".join(parts)

"""An agent's whole life cycle as one sans-IO state machine (h11-style).

Fed deliveries (`receive`) and time (`tick`), it returns an `Output` and never touches
sockets, clocks or event loops: the MQTT shell, the in-memory transport and the tests drive
the very same rules. A control frame is obeyed only if it is signed by the run's
orchestrator, names this run, carries a sequence number above every one seen and fits the
phase; anything else, and every peer message the round logic does not use, is dropped and
counted under exactly one reason (`rejected`). The orchestrator decides who is in: an agent
never gives up on a silent neighbour, only on a silent orchestrator.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from privnet.agent import attacks, control, keys, lattice, phases, topics, wire
from privnet.agent.core import AgentCore
from privnet.agent.links import Links
from privnet.agent.losses import make_loss
from privnet.agent.messages import Message, Reason, Rejected, Report
from privnet.agent.phases import ACTIVE, BEATING, IDLE, PAUSED, WAITING, Phase, Trigger
from privnet.agent.protocol import (
    BEATS,
    PATIENCE,
    PEER_QOS,
    QOS,
    Checkpoint,
    Deliveries,
    Event,
    Output,
    Publish,
    Traffic,
    Unsubscribe,
    hello_proof,
)
from privnet.agent.session import (
    TELEMETRY_BATCH as TELEMETRY_BATCH,  # re-exported: where the tests look for it
)
from privnet.agent.session import (
    Early,
    Sealing,
    Session,
    history_for,
    offered,
    open_setup,
)
from privnet.agent.spec import ConfigError

HELLO_EVERY = 2.0  # seconds between Hellos until Welcome: the orchestrator may subscribe late
REGISTER_TIMEOUT = 120.0
IDLE_TIMEOUT = 600.0  # between sessions: an orchestrator gone this long is not coming back


@dataclass(frozen=True)
class Launch:
    """What an agent learns out of band when it is started: never from the broker."""

    run: str
    agent: int
    orchestrator: keys.PublicIdentity  # verifies control frames; telemetry is sealed to it
    token: bytes  # proves this process is the one launched as `agent` (see control.Hello)
    rejoin: bool = False  # started again mid-run: the shell loads its checkpoint


class AgentNode:
    """One agent's life cycle; see the module docstring."""

    def __init__(
        self,
        launch: Launch,
        identity: keys.Identity,
        core: Callable[..., AgentCore] = AgentCore,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        if checkpoint and (checkpoint.run, checkpoint.agent) != (launch.run, launch.agent):
            raise ValueError(
                f"checkpoint of run {checkpoint.run!r} agent {checkpoint.agent} given to "
                f"agent {launch.agent} of run {launch.run!r}"
            )
        self.launch, self.identity, self._core_type = launch, identity, core
        self.me, self.run = launch.agent, launch.run
        self.checkpoint = checkpoint  # what a restarted agent comes back with
        self.phase = phases.INITIAL  # then only `_move` changes it
        self.deliveries = Deliveries()
        self.session: Session | None = None
        self._sealing = Sealing(launch.run, launch.agent, launch.orchestrator)
        self._registration = Traffic()  # Hellos: charged to the first session
        self._unreported: Counter[str] = Counter()  # rejections since the last Finished
        self._seq = 0  # of our own upward frames
        self._heard = -1  # highest orchestrator sequence number obeyed or seen signed
        self._early = Early()  # peer frames awaiting a view
        self._since = 0.0  # when the current wait began (deadlines)
        self._orchestrator_at = 0.0  # when the orchestrator last said something valid
        self._peers_at = -1e18  # when a neighbour last sent a frame that authenticated
        self._next_hello = 0.0
        self._next_progress = 0.0
        self.failure = ""
        self._ending = False  # a Hold came: this view ends, no later Go extends it

    # ---- public API -------------------------------------------------------------------

    @property
    def subscriptions(self) -> list[str]:
        """Everything this agent reads: its inbox and the orchestrator's topics for it."""
        return [
            topics.inbox_filter(self.run, self.me),
            topics.ctl_down(self.run, self.me),
            topics.ctl_down(self.run, "all"),
        ]

    @property
    def subscription_qos(self) -> dict[str, int]:
        """The QoS of each subscription: the peer inbox at PEER_QOS, control at QOS."""
        inbox, *control_topics = self.subscriptions
        return {inbox: PEER_QOS, **{t: QOS for t in control_topics}}

    @property
    def done(self) -> bool:
        return self.phase in phases.FINAL

    @property
    def view(self) -> int:
        return -1 if self.session is None else self.session.view

    def start(self, now: float) -> Output:
        """The first Hello."""
        self._since = now
        return self.tick(now)

    def tick(self, now: float) -> Output:
        """Hello again while unanswered; Progress while in a session; stop when the
        orchestrator has been silent past its deadline."""
        out = Output()
        if self.phase is Phase.REGISTERING:
            if now - self._since >= REGISTER_TIMEOUT:
                return self._fail(
                    f"agent {self.me}: no answer to registration within "
                    f"{REGISTER_TIMEOUT:.0f} s: is the orchestrator running?"
                )
            if now >= self._next_hello:
                self._next_hello = now + HELLO_EVERY
                out.publish.append(self._hello())
        elif self.session is not None and self.phase not in IDLE:
            if now >= self._silent_until():
                silent = now - self._orchestrator_at
                return self._fail(
                    f"agent {self.me}: the orchestrator has been silent for {silent:.0f} s "
                    f"({self.phase}; deadline {self.session.config.deadline:g} s); stopping"
                )
            if self.phase in BEATING and now >= self._next_progress:
                out.publish.append(self._progress(now))
        elif self.phase in IDLE and now - self._since >= IDLE_TIMEOUT:
            return self._fail(
                f"agent {self.me}: no word from the orchestrator for {IDLE_TIMEOUT:.0f} s; leaving"
            )
        return out

    def next_tick(self) -> float | None:
        """When `tick` has something to do next (None: nothing, ever)."""
        if self.done:
            return None
        if self.phase is Phase.REGISTERING:
            return min(self._next_hello, self._since + REGISTER_TIMEOUT)
        if self.session is not None and self.phase not in IDLE:
            silent = self._silent_until()
            return min(silent, self._next_progress) if self.phase in BEATING else silent
        return self._since + IDLE_TIMEOUT

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output:
        """One delivery: used, kept for the next view (then used or counted), or dropped
        and counted under exactly one reason.

        privnet publishes nothing retained, so a retained frame is someone else's."""
        self.deliveries.received += 1
        if self.done:
            self._count(Reason.CLOSED)
            return Output()
        try:
            if retained:
                raise Rejected(Reason.RETAINED, f"a retained frame on {topic!r}")
            peer = topics.parse_peer_topic(topic)
            if peer is not None:
                return self._on_peer(peer, payload, now)  # counts it used or kept
            if topic not in self.subscriptions[1:]:
                raise Rejected(Reason.WRONG_TOPIC, f"agent {self.me} does not read {topic!r}")
            out = self._on_control(payload, now)
        except Rejected as exc:
            self._count(exc.reason)
            return Output()
        self.deliveries.used += 1
        return out

    def unsubscribed(self, topic: str, now: float) -> Output:
        """The shell has stopped the inbox (the broker acknowledged, and every frame that
        came before is delivered): report what is left, so nothing goes unreported."""
        if not self._can(Trigger.UNSUBSCRIBED) or topic != self.subscriptions[0]:
            raise RuntimeError(f"unsubscribed from {topic!r} in phase {self.phase}")
        self._drop_early()
        rejected, self._unreported = self._unreported, Counter()
        self._move(Trigger.UNSUBSCRIBED)
        left = control.Left(self.me, dict(rejected))
        return Output([self._up(topics.ctl_up(self.run, self.me), left)], [Event("left")])

    def _silent_until(self) -> float:
        """When the orchestrator's silence means it is gone: a deadline after its last word,
        or up to PATIENCE of them while the neighbours still speak (until a deadline after
        their last frame). Held or left out, an agent waits on the orchestrator's own
        decision, with no neighbours to hear: PATIENCE deadlines (a busy orchestrator, or an
        insider holding this agent's connection, is not a dead one)."""
        assert self.session is not None
        deadline, heard = self.session.config.deadline, self._orchestrator_at
        if self.phase in (Phase.HELD, Phase.EXCLUDED):
            return heard + deadline * PATIENCE
        if self._peers_at > heard:
            return min(heard + deadline * PATIENCE, self._peers_at + deadline)
        return heard + deadline

    def deaf(self, now: float) -> Output:
        """This agent could not hear until now (its broker connection was down, or its
        process was stopped): the orchestrator's silence deadline starts again now."""
        self._orchestrator_at = max(self._orchestrator_at, now)
        return Output()

    def fail(self, reason: str) -> Output:
        """Give up from outside the protocol (a harness ending a node): tell the orchestrator
        why, if we can. The process shell has no such case: it stops on Bye or a lost broker."""
        return self._fail(reason)

    @property
    def rejected(self) -> Counter[str]:
        return self.deliveries.rejected

    # ---- control plane ----------------------------------------------------------------

    def _on_control(self, payload: bytes, now: float) -> Output:
        frame = wire.decode_signed(payload)
        if frame.run != self.run:
            raise Rejected(Reason.WRONG_RUN, f"frame for run {frame.run!r}, this is {self.run!r}")
        frame.verify(self.launch.orchestrator, "this run's orchestrator")
        if frame.seq <= self._heard:
            raise Rejected(Reason.REPLAY, f"sequence number {frame.seq}, already at {self._heard}")
        out = self._obey(frame.msg, now)  # raises Rejected("out-of-phase") if it does not fit
        self._heard, self._orchestrator_at = frame.seq, now
        return out

    def _obey(self, msg: control.Control, now: float) -> Output:
        match msg:
            case control.Welcome(agent=agent) if agent == self.me and self._can(Trigger.WELCOME):
                self._move(Trigger.WELCOME)
                self._since = now
                out = Output(events=[Event("registered")])
                if msg.rejoin:
                    out.publish.append(self._rejoin())
                return out
            case control.Setup(agent=agent) if agent == self.me and self._fits(msg):
                return self._configure(msg, now)
            case control.Go(session=n, view=v) if self._can(Trigger.GO) and self._at(n, v):
                return self._go(msg.until, now)
            case control.Go() if self._extends(msg):
                return self._extend(msg.until, now)
            case control.Hold(session=n, view=v) if self._can(Trigger.HOLD) and self._holds(n, v):
                self._move(Trigger.HOLD)  # HELD, or stays HELD or FINISHED
                self._ending = True
                # The reports first: the next view starts where one is missing (a broker
                # that went down with it), so it must not start where one is still here.
                session = self.session
                flush = self._telemetry(session) if session and session.reports else []
                return Output([*flush, self._progress(now)])
            case control.Excluded(agent=agent, session=n, view=v) if (
                agent == self.me and self._can(Trigger.EXCLUDED) and self._holds(n, v)
            ):
                self._move(Trigger.EXCLUDED)
                return Output([self._rejoin()], [Event("excluded", f"view {v}")])
            case control.Abort(reason=reason):
                return self._fail(f"aborted by the orchestrator: {reason}", tell=False)
            case control.Beat():
                return Output()
            case control.Recorded(session=n, view=v):  # of a view left behind: nothing
                if self._at(n, v) and self.session is not None:
                    self.session.forget(msg.round, self.session.config.checkpoint_every)
                return Output()
            case control.Close() if self._can(Trigger.CLOSE):
                self._move(Trigger.CLOSE)
                inbox, probe = self.subscriptions[0], topics.peer_topic(self.run, self.me, self.me)
                return Output(unsubscribe=[Unsubscribe(inbox, probe)])
            case control.Bye() if self._can(Trigger.BYE):
                self._move(Trigger.BYE)
                return Output(events=[Event("closed")])
        raise Rejected(
            Reason.OUT_OF_PHASE,
            f"{type(msg).__name__} does not fit agent {self.me} in phase {self.phase}",
        )

    def _can(self, trigger: Trigger) -> bool:
        """Whether the table has a move on `trigger` from this phase (a frame fits it)."""
        return phases.allows(self.phase, trigger)

    def _move(self, trigger: Trigger) -> None:
        """Every phase change, checked against the table (IllegalTransition: a bug)."""
        self.phase = phases.next_phase(self.phase, trigger)

    def _at(self, session: int, view: int) -> bool:
        current = self.session
        return current is not None and (current.number, current.view) == (session, view)

    def _holds(self, session: int, view: int) -> bool:
        """A Hold or Excluded for a later view of this session."""
        current = self.session
        return current is not None and current.number == session and view > current.view

    def _fits(self, setup: control.Setup) -> bool:
        """A Setup opens a later session (the first, from REGISTERED) or a later view of
        this one, in a phase it moves on."""
        current = self.session
        later = current is None or (setup.session, setup.view) > (current.number, current.view)
        return later and self._can(Trigger.SETUP)

    def _configure(self, setup: control.Setup, now: float) -> Output:
        opened = open_setup(setup, self.identity, self.run)
        config = opened.config
        try:
            loss = make_loss(config.problem, attacks.flips(config.spec.attack))
        except ConfigError as exc:  # a problem or dataset this agent cannot build
            return self._fail(f"agent {self.me}: {exc}")
        number, spec = setup.session, config.spec
        history = history_for(self.session, self.checkpoint, number, spec, loss.start)
        if config.resume not in history:
            return self._fail(
                f"agent {self.me}: view {setup.view} resumes from my model after round "
                f"{config.resume}, which I do not hold (I hold {sorted(history)[-5:]})"
            )
        history = {r: w for r, w in history.items() if r <= config.resume}
        # Let back in with an older model, that model is this view's after its start - 1: a
        # stall before this agent's first round here redoes the view from there.
        history[spec.start - 1] = history[config.resume]
        core = self._core_type(config.spec, loss, self.identity, opened.directory)
        core.resume_from(history[config.resume])
        self.session = self._next_session(setup, config, core, opened.links, history)
        self._move(Trigger.SETUP)
        self._ending = False
        self._next_progress = now + config.deadline / BEATS
        out = Output(events=[Event("configured", f"session {setup.session} view {setup.view}")])
        if config.escrow:
            escrow = self.session.escrow(self._sealing)
            out.publish.append(self._up(topics.telemetry(self.run, self.me), escrow, "audit"))
        out += self._emit(core.prepare())
        for early in self._early.take():  # now they can be authenticated, or counted
            self.deliveries.kept -= 1
            try:
                out += self._peer(early.sender, early.payload, now)
            except Rejected as exc:
                self._count(exc.reason)
            else:
                self.deliveries.used += 1
        return out + self._keyed()

    def _next_session(
        self,
        setup: control.Setup,
        config: control.Config,
        core: AgentCore,
        links: Links,
        history: dict[int, np.ndarray],
    ) -> Session:
        """A new session, or the next view of this one (`Session.next_view`); a Finished
        the new view voids gives its rejections back, for the next one."""
        old = self.session
        if old is None or old.number != setup.session:
            first, self._registration = self._registration, Traffic()
            return Session(setup.session, setup.view, config, core, links, history, traffic=first)
        if self.phase is Phase.FINISHED:
            self._unreported += old.finished
        return old.next_view(setup.view, config, core, links, history)

    def _keyed(self) -> Output:
        assert self.session is not None
        if not self._can(Trigger.KEYED) or not self.session.core.keyed:
            return Output()
        self._move(Trigger.KEYED)
        ready = control.Ready(self.me, self.session.number, self.session.view)
        return Output([self._up(topics.ctl_up(self.run, self.me), ready)], [Event("keyed")])

    def _go(self, until: int, now: float) -> Output:
        assert self.session is not None
        self._move(Trigger.GO)
        self._since = now
        if self.session.began is None:  # the session's first Go (not a later view's)
            self.session.began = now
        out = Output(events=[Event("started", f"session {self.session.number}")])
        try:
            out += self._emit(self.session.core.start(until))
        except lattice.OutOfRange as exc:
            return out + self._out_of_range(exc)
        return out + self._maybe_finish(now)

    def _extends(self, go: control.Go) -> bool:
        """A later `until` for the view this agent runs (or has run up to the last one)."""
        session = self.session
        return (
            session is not None
            and self._can(Trigger.EXTEND)
            and not self._ending
            and self._at(go.session, go.view)
            and go.until > session.core.until
        )

    def _extend(self, until: int, now: float) -> Output:
        assert self.session is not None
        self._move(Trigger.EXTEND)
        return self._emit(self.session.core.extend(until)) + self._maybe_finish(now)

    def _out_of_range(self, exc: lattice.OutOfRange) -> Output:
        """A model the u4 wire cannot carry: counted, and the agent stops with the reason
        (lattice.py: a wrapped value would be a wrong model, and a stalled round no answer)."""
        self._count(exc.reason)
        return self._fail(exc.detail)  # it names the agent, round and step

    def _up(self, topic: str, msg: control.Control, category: str = "control") -> Publish:
        self._seq += 1
        payload = wire.encode_signed(msg, self.run, self._seq, self.identity)
        traffic = self._registration if self.session is None else self.session.traffic
        traffic.add(category, topic, payload)
        return Publish(topic, payload, category)

    def _hello(self) -> Publish:
        identity = self.identity.public.to_bytes()
        proof = hello_proof(self.launch.token, self.run, self.me, identity)
        return self._up(topics.ctl_up(self.run, self.me), control.Hello(self.me, identity, proof))

    def _progress(self, now: float) -> Publish:
        session = self.session
        assert session is not None
        self._next_progress = now + session.config.deadline / BEATS
        core = session.core
        msg = control.Progress(
            self.me,
            session.number,
            session.view,
            core.round - 1,  # rounds completed (the core is at the next one)
            self.phase in PAUSED,
            tuple(core.waiting_for()[:20]) if self.phase in ACTIVE else (),
        )
        return self._up(topics.ctl_up(self.run, self.me), msg)

    def _rejoin(self) -> Publish:
        """Ask back in, offering the rounds whose model this agent holds."""
        if self.session is not None:
            number, rounds = self.session.number, sorted(self.session.history)
        elif self.checkpoint is not None:
            number, rounds = self.checkpoint.session, sorted(self.checkpoint.models)
        else:
            number, rounds = -1, []
        rejoin = control.Rejoin(self.me, number, offered(rounds))
        return self._up(topics.ctl_up(self.run, self.me), rejoin)

    def _fail(self, reason: str, *, tell: bool = True) -> Output:
        if self.done:
            return Output()
        out = Output(events=[Event("failed", reason)])
        if tell and self.phase is not Phase.REGISTERING:
            out.publish.append(
                self._up(topics.ctl_up(self.run, self.me), control.Failed(self.me, reason[:1000]))
            )
        self._drop_early()
        self._move(Trigger.FAILURE)
        self.failure = reason
        return out

    def _drop_early(self) -> None:
        """Peer frames still waiting for a view that will not come: counted, unused."""
        dropped = len(self._early.take())
        self.deliveries.kept -= dropped
        self._count_n(Reason.NO_SESSION, dropped)

    # ---- data plane -------------------------------------------------------------------

    def _on_peer(self, peer: tuple[str, int, int], payload: bytes, now: float) -> Output:
        run, receiver, sender = peer
        if run != self.run or receiver != self.me:
            raise Rejected(Reason.WRONG_TOPIC, f"peer topic for run {run!r}, agent {receiver}")
        if self.phase in WAITING:
            return self._keep(sender, payload)
        try:
            out = self._peer(sender, payload, now)
        except Rejected as exc:
            if exc.reason is not Reason.AHEAD_VIEW:
                raise
            return self._keep(sender, payload)  # a neighbour has the next view's Setup first
        self.deliveries.used += 1
        return out

    def _keep(self, sender: int, payload: bytes) -> Output:
        """Keep a frame until the next Setup can authenticate it (bounded): used or
        counted then."""
        self._early.keep(sender, payload)
        self.deliveries.kept += 1
        return Output()

    def _peer(self, sender: int, payload: bytes, now: float) -> Output:
        session = self.session
        assert session is not None
        core = session.core
        msg = session.links.decode(payload, sender)
        self._peers_at = now  # a neighbour's own frame (a chunk too): the run goes on
        if msg is None:  # a chunk of a model still incomplete
            return Output()
        try:
            produced = core.receive(msg)
        except keys.BadKey as exc:
            raise Rejected(Reason.BAD_KEY, str(exc)) from exc
        except lattice.OutOfRange as exc:
            return self._out_of_range(exc)
        out = self._emit(produced, frame=True)  # a fresh Output: add to it in place
        if self.phase is Phase.CONFIGURED:
            out += self._keyed()
        elif core.held:  # else there is nothing to finish: spare building an empty Output
            out += self._maybe_finish(now)
        return out

    def _emit(self, messages: list[Message], frame: bool = False) -> Output:
        """Peer messages sealed (or MACed) for their link; reports kept, batched and sealed."""
        session = self.session
        assert session is not None
        out, every, noted = Output(), session.config.checkpoint_every, False
        for msg in messages:
            if isinstance(msg, Report):
                session.history[msg.round] = msg.w
                if session.config.telemetry:
                    session.note(msg)
                    noted = True
                if every and msg.round % every == 0:
                    out.checkpoint = session.checkpoint(self._sealing, every)
                continue
            topic = topics.peer_topic(self.run, msg.receiver, self.me)
            category = wire.category(msg)
            for payload in session.links.frames(msg):
                session.traffic.add(category, topic, payload)
                out.publish.append(Publish(topic, payload, category))
        # After a peer frame only a report it made can make it due: `due` counts (per round)
        if session.reports and (session.core.held or ((noted or not frame) and session.due())):
            out.publish += self._telemetry(session)
        return out

    def _telemetry(self, session: Session) -> list[Publish]:
        topic = topics.telemetry(self.run, self.me)
        return [self._up(topic, t, "telemetry") for t in session.telemetry(self._sealing)]

    def _maybe_finish(self, now: float) -> Output:
        session = self.session
        assert session is not None
        if not self._can(Trigger.LAST_ROUND) or not session.core.held:
            return Output()
        if not session.core.done:  # Go's `until`: hold for the next view
            self._move(Trigger.UNTIL)
            return Output([self._progress(now)])
        self._move(Trigger.LAST_ROUND)
        self._since = now
        rejected, self._unreported = self._unreported, Counter()
        session.finished = rejected
        topic = topics.ctl_up(self.run, self.me)
        own, size = -1, 0  # Finished counts its own PUBLISH, whose size depends on that count:
        while size != own:  # iterate to the fixed point (sizes only grow, so it comes fast)
            own = size
            sent = session.traffic.octets + Counter(control=own)
            messages = session.traffic.messages + Counter(control=1)
            finished = control.Finished(
                self.me,
                session.number,
                session.view,
                dict(rejected),
                dict(sent),
                dict(messages),
                session.wall(now),
            )
            payload = wire.encode_signed(finished, self.run, self._seq + 1, self.identity)
            size = topics.mqtt_publish_size(topic, len(payload), QOS)
        did = (
            f"session {session.number}, view {session.view}, in {finished.wall:.2f} s: sent "
            f"{dict(messages)} messages, {dict(sent)} bytes; rejected {dict(rejected) or 'none'}"
        )
        return Output([self._up(topic, finished)], [Event("finished", did)])

    def _count(self, reason: Reason) -> None:
        self._count_n(reason, 1)

    def _count_n(self, reason: Reason, n: int) -> None:
        if n:  # counted under the plain string: what Finished and Left carry
            self.deliveries.rejected[reason.value] += n
            self._unreported[reason.value] += n

    # ---- for tests and the audit --------------------------------------------------------

    @property
    def w(self) -> np.ndarray | None:
        return None if self.session is None else self.session.core.w

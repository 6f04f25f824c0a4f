"""The agent node (privnet/agent/node.py), driven directly and through the in-memory router.

No broker, no processes, no asyncio: a fake clock moves time, `runs.Harness` delivers
attack frames in the exact phase they target. Every bad control frame must be dropped,
counted under one specific reason, and change nothing: the run's models stay those of a
clean run (to runs.RTOL; local-ghp masks differ run to run but cancel).
"""

from __future__ import annotations

import dataclasses
import tracemalloc
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from hypothesis import given, settings
from hypothesis import strategies as st
from probes import inject, matches, uncounted
from runs import CONTROL_TYPES, ROUNDS, RUN, Harness, assert_same_models, clean

from privnet.agent import control, keys, topics, wire
from privnet.agent.messages import KeyShare
from privnet.agent.node import (
    HELLO_EVERY,
    IDLE_TIMEOUT,
    REGISTER_TIMEOUT,
    AgentNode,
    Launch,
)
from privnet.agent.phases import Phase
from privnet.agent.protocol import (
    BEATS,
    PATIENCE,
    Event,
    Output,
    Publish,
    hello_proof,
    setup_context,
)
from privnet.agent.session import EARLY_BYTES, EARLY_COUNT, RECENT, offered
from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.conductor import Stage

TARGET = 0  # the node under attack: a hub with four neighbours (seed 34's graph)
STRANGER = keys.Identity.generate()  # signs forgeries
OTHER_RUN = "other-run"
Frame = tuple[str, bytes]
FUZZ = settings(derandomize=True, max_examples=100, deadline=None)


# ---- building frames for the target -------------------------------------------------------


def config_for(h: Harness, agent: int, *, view: int = 0, **changes: object) -> control.Config:
    """The Config the conductor would seal for `agent` in session 0 (for `view`: the spec
    of view 0 relabelled, enough to test what the node checks)."""
    plan = h.conductor.plans[0]
    directory = {m: node.identity.public.to_bytes() for m, node in enumerate(h.nodes)}
    spec = dataclasses.replace(plan.specs[agent], view=view)
    config = control.Config(spec, plan.problems[agent], directory, h.conductor.deadline, True)
    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


def setup(
    h: Harness,
    *,
    agent: int = TARGET,
    session: int = 0,
    config: control.Config | None = None,
    seal_to: int = TARGET,
    context: int = 0,
    view: int = 0,
    seal_view: int | None = None,
) -> control.Setup:
    """A Setup whose Config is sealed the way the conductor seals it, unless told otherwise."""
    plain = wire.encode_config(config or config_for(h, seal_to))
    recipient = h.nodes[seal_to].identity.public.static
    seal_view = view if seal_view is None else seal_view
    sealed = keys.seal(recipient, plain, setup_context(RUN, seal_to, context, seal_view))
    return control.Setup(agent, session, view, sealed)


def replay(kind: type, to: int | str = TARGET) -> Callable[[Harness], Frame]:
    """The last genuine frame of type `kind` the conductor sent, again."""

    def build(h: Harness) -> Frame:
        topic = topics.ctl_down(RUN, to)  # type: ignore[arg-type]
        return topic, h.recorded(kind, topic)[-1].payload

    return build


def down(make: Callable[[Harness], control.Control], **options: object) -> Callable[..., Frame]:
    return lambda h: h.down(make(h), TARGET, **options)  # type: ignore[arg-type]


def const(msg: control.Control) -> Callable[[Harness], control.Control]:
    return lambda _: msg


def raw(topic: str, payload: bytes) -> Callable[[Harness], Frame]:
    return lambda _: (topic, payload)


@dataclass(frozen=True)
class Attack:
    name: str
    phase: Phase  # of the target when the frame arrives
    frame: Callable[[Harness], Frame]
    reason: str
    timely: bool = False  # genuine, and obeyed in a later phase: the flood leaves it out

    def __str__(self) -> str:
        return self.name


WELCOME, GO, BYE = (
    const(control.Welcome(TARGET)),
    const(control.Go(0, 0, ROUNDS)),
    const(control.Bye()),
)
CLOSE, BEAT = const(control.Close()), const(control.Beat())
RECORDED = const(control.Recorded(0, 0, 2))
ABORT = const(control.Abort("forged"))
HOLD, EXCLUDED = const(control.Hold(0, 1)), const(control.Excluded(TARGET, 0, 1))
BAD_IDENTITY = STRANGER.public.signing + bytes(32)  # a low-order X25519 key: no link key

ATTACKS = [
    # Welcome
    Attack("welcome-forged", Phase.REGISTERING, down(WELCOME, signer=STRANGER), "bad-signature"),
    Attack("welcome-other-run", Phase.REGISTERING, down(WELCOME, run=OTHER_RUN), "wrong-run"),
    Attack(
        "welcome-for-agent-1", Phase.REGISTERING, down(const(control.Welcome(1))), "out-of-phase"
    ),
    Attack("welcome-twice", Phase.REGISTERED, down(WELCOME), "out-of-phase"),
    Attack("welcome-replayed", Phase.REGISTERED, replay(control.Welcome), "replay"),
    Attack("welcome-while-running", Phase.RUNNING, down(WELCOME), "out-of-phase"),
    # Setup
    Attack("setup-forged", Phase.REGISTERED, down(setup, signer=STRANGER), "bad-signature"),
    Attack("setup-other-run", Phase.REGISTERED, down(setup, run=OTHER_RUN), "wrong-run"),
    Attack("setup-before-welcome", Phase.REGISTERING, down(setup), "out-of-phase"),
    Attack(
        "setup-for-agent-1", Phase.REGISTERED, down(lambda h: setup(h, agent=1)), "out-of-phase"
    ),
    Attack(
        "setup-bad-seal",
        Phase.REGISTERED,
        down(const(control.Setup(TARGET, 0, 0, bytes(200)))),
        "bad-seal",
    ),
    Attack(
        "setup-sealed-to-agent-1", Phase.REGISTERED, down(lambda h: setup(h, seal_to=1)), "bad-seal"
    ),
    Attack(
        "setup-sealed-for-session-1",
        Phase.REGISTERED,
        down(lambda h: setup(h, context=1)),
        "bad-seal",
    ),
    Attack(
        "setup-config-of-agent-1",
        Phase.REGISTERED,
        down(lambda h: setup(h, config=config_for(h, 1))),
        "schema",
    ),
    Attack(
        "setup-bad-directory-key",
        Phase.REGISTERED,
        down(lambda h: setup(h, config=config_for(h, TARGET, directory={5: BAD_IDENTITY}))),
        "bad-key",
    ),
    Attack("setup-replayed", Phase.KEYED, replay(control.Setup), "replay"),
    Attack("setup-while-configured", Phase.CONFIGURED, down(setup), "out-of-phase"),
    Attack(
        "setup-while-running", Phase.RUNNING, down(lambda h: setup(h, session=1)), "out-of-phase"
    ),
    Attack("setup-for-a-played-session", Phase.FINISHED, down(setup), "out-of-phase"),
    # Go
    Attack("go-forged", Phase.KEYED, down(GO, signer=STRANGER), "bad-signature"),
    Attack("go-other-run", Phase.KEYED, down(GO, run=OTHER_RUN), "wrong-run"),
    Attack("go-before-setup", Phase.REGISTERED, down(GO), "out-of-phase"),
    Attack("go-before-keyed", Phase.CONFIGURED, down(GO), "out-of-phase"),
    Attack("go-other-session", Phase.KEYED, down(const(control.Go(1, 0, ROUNDS))), "out-of-phase"),
    Attack("go-replayed", Phase.RUNNING, replay(control.Go, "all"), "replay"),
    Attack("go-when-finished", Phase.FINISHED, down(GO), "out-of-phase"),
    Attack("go-no-later-until", Phase.RUNNING, down(GO), "out-of-phase"),  # paces nothing
    Attack(
        "go-for-another-view", Phase.KEYED, down(const(control.Go(0, 1, ROUNDS))), "out-of-phase"
    ),
    # Setup of a view
    Attack(
        "setup-sealed-for-view-1",
        Phase.REGISTERED,
        down(lambda h: setup(h, context=0, view=0, config=config_for(h, TARGET), seal_view=1)),
        "bad-seal",
    ),
    Attack(
        "setup-config-of-another-view",
        Phase.REGISTERED,
        down(lambda h: setup(h, config=config_for(h, TARGET, view=1))),
        "schema",
    ),
    Attack(
        "setup-of-the-next-view-while-running",
        Phase.RUNNING,
        down(lambda h: setup(h, view=1, config=config_for(h, TARGET, view=1))),
        "out-of-phase",
    ),
    # Hold (obeyed while in a session, for a later view of it)
    Attack("hold-forged", Phase.RUNNING, down(HOLD, signer=STRANGER), "bad-signature"),
    Attack("hold-other-run", Phase.RUNNING, down(HOLD, run=OTHER_RUN), "wrong-run"),
    Attack("hold-old-sequence-number", Phase.RUNNING, down(HOLD, seq=1), "replay"),
    Attack("hold-before-setup", Phase.REGISTERED, down(HOLD), "out-of-phase", timely=True),
    Attack(
        "hold-for-the-current-view", Phase.RUNNING, down(const(control.Hold(0, 0))), "out-of-phase"
    ),
    Attack("hold-other-session", Phase.KEYED, down(const(control.Hold(1, 1))), "out-of-phase"),
    Attack("hold-after-close", Phase.LEFT, down(HOLD), "out-of-phase"),
    # Excluded
    Attack("excluded-forged", Phase.RUNNING, down(EXCLUDED, signer=STRANGER), "bad-signature"),
    Attack("excluded-other-run", Phase.FINISHED, down(EXCLUDED, run=OTHER_RUN), "wrong-run"),
    Attack("excluded-old-sequence-number", Phase.RUNNING, down(EXCLUDED, seq=1), "replay"),
    Attack(
        "excluded-for-agent-1",
        Phase.RUNNING,
        down(const(control.Excluded(1, 0, 1))),
        "out-of-phase",
    ),
    Attack(
        "excluded-from-the-current-view",
        Phase.KEYED,
        down(const(control.Excluded(TARGET, 0, 0))),
        "out-of-phase",
    ),
    Attack("excluded-before-setup", Phase.REGISTERED, down(EXCLUDED), "out-of-phase", timely=True),
    # Abort (obeyed in any phase when genuine, so only frames that are not)
    Attack("abort-forged", Phase.RUNNING, down(ABORT, signer=STRANGER), "bad-signature"),
    Attack("abort-forged-early", Phase.REGISTERING, down(ABORT, signer=STRANGER), "bad-signature"),
    Attack("abort-other-run", Phase.RUNNING, down(ABORT, run=OTHER_RUN), "wrong-run"),
    Attack("abort-old-sequence-number", Phase.RUNNING, down(ABORT, seq=1), "replay"),
    # Bye
    Attack("bye-forged", Phase.FINISHED, down(BYE, signer=STRANGER), "bad-signature"),
    Attack("bye-other-run", Phase.FINISHED, down(BYE, run=OTHER_RUN), "wrong-run"),
    Attack("bye-old-sequence-number", Phase.FINISHED, down(BYE, seq=1), "replay"),
    Attack("bye-while-configured", Phase.CONFIGURED, down(BYE), "out-of-phase"),
    Attack("bye-while-keyed", Phase.KEYED, down(BYE), "out-of-phase"),
    Attack("bye-while-running", Phase.RUNNING, down(BYE), "out-of-phase"),
    Attack("bye-before-close", Phase.FINISHED, down(BYE), "out-of-phase"),
    # Beat (obeyed in any phase when genuine, and changes nothing but the orchestrator's clock)
    Attack("beat-forged", Phase.RUNNING, down(BEAT, signer=STRANGER), "bad-signature"),
    Attack("beat-other-run", Phase.RUNNING, down(BEAT, run=OTHER_RUN), "wrong-run"),
    Attack("beat-old-sequence-number", Phase.RUNNING, down(BEAT, seq=1), "replay"),
    # Recorded (obeyed in any phase when genuine: it only prunes the current view's models)
    Attack("recorded-forged", Phase.RUNNING, down(RECORDED, signer=STRANGER), "bad-signature"),
    Attack("recorded-other-run", Phase.RUNNING, down(RECORDED, run=OTHER_RUN), "wrong-run"),
    Attack("recorded-old-sequence-number", Phase.RUNNING, down(RECORDED, seq=1), "replay"),
    # Close
    Attack("close-forged", Phase.FINISHED, down(CLOSE, signer=STRANGER), "bad-signature"),
    Attack("close-other-run", Phase.FINISHED, down(CLOSE, run=OTHER_RUN), "wrong-run"),
    Attack("close-while-running", Phase.RUNNING, down(CLOSE), "out-of-phase"),
    Attack("close-replayed", Phase.LEFT, replay(control.Close, "all"), "replay"),
    Attack("close-again", Phase.LEFT, down(CLOSE), "out-of-phase"),
    # upward messages have no business on a node's control topics
    Attack(
        "hello-signed-by-the-agent",
        Phase.REGISTERING,
        lambda h: h.up(
            control.Hello(TARGET, bytes(64), bytes(32)), TARGET, topic=topics.ctl_down(RUN, TARGET)
        ),
        "bad-signature",
    ),
    Attack(
        "progress-downward",
        Phase.RUNNING,
        down(const(control.Progress(TARGET, 0, 0, 1, True, ()))),
        "out-of-phase",
    ),
    Attack(
        "rejoin-downward",
        Phase.FINISHED,
        down(const(control.Rejoin(TARGET, 0, (0,)))),
        "out-of-phase",
    ),
    Attack("ready-downward", Phase.KEYED, down(const(control.Ready(TARGET, 0, 0))), "out-of-phase"),
    Attack("left-downward", Phase.RUNNING, down(const(control.Left(TARGET, {}))), "out-of-phase"),
    Attack("failed-downward", Phase.RUNNING, down(const(control.Failed(1, "x"))), "out-of-phase"),
    Attack(
        "finished-downward",
        Phase.RUNNING,
        down(const(control.Finished(TARGET, 0, 0, {}, {}, {}, 1.0))),
        "out-of-phase",
    ),
    Attack(
        "telemetry-downward",
        Phase.RUNNING,
        down(const(control.Telemetry(TARGET, 0, 0, 1, bytes(60)))),
        "out-of-phase",
    ),
    Attack(
        "escrow-downward",
        Phase.KEYED,
        down(const(control.Escrow(TARGET, 0, 0, bytes(60)))),
        "out-of-phase",
    ),
    # junk
    Attack("malformed", Phase.RUNNING, raw(topics.ctl_down(RUN, "all"), b"\xc1"), "malformed"),
    Attack(
        "oversized",
        Phase.RUNNING,
        raw(topics.ctl_down(RUN, TARGET), bytes(wire.MAX_CONTROL_BYTES + 1)),
        "oversized",
    ),
    Attack("other-agents-topic", Phase.RUNNING, raw(topics.ctl_down(RUN, 1), b""), "wrong-topic"),
    Attack(
        "peer-topic-of-another-run",
        Phase.RUNNING,
        raw(topics.peer_topic(OTHER_RUN, TARGET, 2), b""),
        "wrong-topic",
    ),
    Attack(
        "peer-topic-of-another-receiver",
        Phase.RUNNING,
        raw(topics.peer_topic(RUN, 1, 2), b""),
        "wrong-topic",
    ),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=str)
def test_a_bad_control_frame_is_dropped_counted_and_changes_nothing(attack: Attack) -> None:
    h = Harness.build()
    node = h.nodes[TARGET]
    h.strike(node, lambda: node.phase is attack.phase, lambda: attack.frame(h), attack.reason)


def test_every_control_type_is_attacked() -> None:
    assert {a.name.split("-")[0] for a in ATTACKS} >= CONTROL_TYPES


def test_a_flood_of_every_attack_through_the_router_changes_nothing() -> None:
    """Each phase's attack frames, ten times over, injected when the target enters it and
    routed like a broker would: the broadcast ones reach every node; all are counted, and
    the result is a clean run's."""
    h = Harness.build()
    node = h.nodes[TARGET]
    phases: list[Phase] = []
    routed = 0

    def inject_all() -> None:
        nonlocal routed
        phases.append(node.phase)
        for attack in ATTACKS * 10:
            if attack.phase is node.phase and not attack.timely:
                topic, payload = attack.frame(h)
                inject(h.net.router, topic, payload)
                routed += any(matches(s, topic) for s in node.subscriptions)
        if node.phase is not Phase.LEFT:
            h.when(lambda: node.phase is not phases[-1], inject_all)

    h.when(lambda: True, inject_all)
    results = h.play()
    # leaving lasts no longer than the Router takes to stop the inbox
    assert phases == [*list(Phase)[:5], Phase.FINISHED, Phase.LEFT]
    assert node.rejected.total() == routed >= 10 * (len(ATTACKS) - 5)
    h.assert_all_counted()
    assert_same_models(results, clean())


# ---- time: Hello, registration, silence, idleness -------------------------------------------


def bare_node(agent: int = TARGET) -> tuple[AgentNode, keys.Identity, bytes]:
    """A node with nobody around it: (node, the orchestrator's identity, launch token)."""
    orchestrator, token = keys.Identity.generate(), bytes(range(32))
    launch = Launch(RUN, agent, orchestrator.public, token)
    return AgentNode(launch, keys.Identity.generate()), orchestrator, token


def upward(node: AgentNode, out: Output) -> list[control.Control]:
    """The messages in `out`, each checked to be signed by the node's identity."""
    msgs = []
    for frame in out.publish:
        assert frame.topic in (topics.ctl_up(RUN, node.me), topics.telemetry(RUN, node.me))
        signed = wire.decode_signed(frame.payload)
        signed.verify(node.identity.public, "the node")
        assert signed.run == RUN
        msgs.append(signed.msg)
    return msgs


def test_hello_is_sent_at_start_and_every_hello_every_until_welcome() -> None:
    node, orchestrator, token = bare_node()
    (hello,) = upward(node, node.start(50.0))
    identity = node.identity.public.to_bytes()
    assert hello == control.Hello(TARGET, identity, hello_proof(token, RUN, TARGET, identity))
    assert node.next_tick() == 50.0 + HELLO_EVERY
    assert node.tick(50.0 + HELLO_EVERY - 0.01) == Output()
    assert upward(node, node.tick(50.0 + HELLO_EVERY)) == [hello]
    assert node.next_tick() == 50.0 + 2 * HELLO_EVERY
    welcome = wire.encode_signed(control.Welcome(TARGET), RUN, 1, orchestrator)
    out = node.receive(topics.ctl_down(RUN, TARGET), welcome, 53.0)
    assert out == Output(events=[Event("registered")]) and node.phase is Phase.REGISTERED
    assert node.tick(50.0 + 3 * HELLO_EVERY) == Output()  # no more Hello
    assert node.next_tick() == 53.0 + IDLE_TIMEOUT


def test_registration_times_out_without_telling_anybody() -> None:
    node, _, _ = bare_node()
    node.start(0.0)
    for t in range(2, int(REGISTER_TIMEOUT), 2):
        assert len(node.tick(float(t)).publish) == 1  # a Hello
    assert node.next_tick() == REGISTER_TIMEOUT
    out = node.tick(REGISTER_TIMEOUT)
    assert out.publish == [] and [e.kind for e in out.events] == ["failed"]
    assert "no answer to registration within 120 s" in node.failure
    assert node.phase is Phase.FAILED and node.done and node.next_tick() is None
    assert node.tick(1e9) == Output() and node.fail("again") == Output()
    assert node.receive(topics.ctl_down(RUN, "all"), b"", 1e9) == Output()
    assert node.rejected == Counter({"closed": 1}) and uncounted(node.deliveries) == 0


@pytest.mark.parametrize("phase", [Phase.REGISTERED, Phase.LEFT])
def test_an_idle_node_leaves_and_says_why(phase: Phase) -> None:
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    if phase is Phase.REGISTERED:
        h.hold = lambda _, frame: is_setup(frame)
    h.start()
    node = h.nodes[TARGET]
    assert node.phase is phase
    since = h.clock.now
    assert node.next_tick() == since + IDLE_TIMEOUT
    assert node.tick(since + IDLE_TIMEOUT - 1) == Output()
    out = node.tick(since + IDLE_TIMEOUT)
    (failed,) = upward(node, out)
    assert isinstance(failed, control.Failed) and "no word from the orchestrator" in failed.reason
    assert node.phase is Phase.FAILED and out.events[0].kind == "failed"


def test_a_finished_node_heartbeats_then_stops_when_the_orchestrator_is_silent() -> None:
    """A finished node waits for the next session or Close, sending a held Progress every
    deadline / BEATS; a deadline without a word from the orchestrator (which Beats while
    sessions run) means it is gone."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    h.hold = lambda _, frame: is_control(frame, control.Close, "all")
    h.start()
    node = h.nodes[TARGET]
    assert node.phase is Phase.FINISHED
    since, beats = h.clock.now, []
    while not node.done:
        wake = node.next_tick()
        assert wake is not None and node.tick(wake - 0.01) == Output()
        beats += upward(node, node.tick(wake))
    (*progress, failed) = beats
    assert progress == [control.Progress(TARGET, 0, 0, ROUNDS, True, ())] * (BEATS - 1)
    assert isinstance(failed, control.Failed) and "orchestrator has been silent" in failed.reason
    assert wake == since + 30.0


def is_control(frame: Publish, kind: type, to: int | str = TARGET) -> bool:
    topic = topics.ctl_down(RUN, to)  # type: ignore[arg-type]
    return frame.topic == topic and isinstance(wire.decode_signed(frame.payload).msg, kind)


def is_setup(frame: Publish, to: int | str = TARGET) -> bool:
    return is_control(frame, control.Setup, to)


def hold_peer_frames_to(agent: int, categories: tuple[str, ...]) -> Callable[[str, Publish], bool]:
    inbox = topics.inbox_filter(RUN, agent)
    return lambda _, f: f.category in categories and matches(inbox, f.topic)


@pytest.mark.parametrize(
    ("held", "phase"), [(("keys",), Phase.CONFIGURED), (("model",), Phase.RUNNING)]
)
def test_a_silent_neighbour_never_fails_a_node_its_progress_names_whom_it_waits_for(
    held: tuple[str, ...], phase: Phase
) -> None:
    """Nothing reaches the target from its neighbours for ten deadlines: while the
    orchestrator Beats, the node waits, heartbeating Progress naming the neighbours it
    waits for (keying: for their key shares); the orchestrator decides membership. Once
    the frames come, the run is a clean run."""
    h = Harness.build(deadline=30.0)
    h.hold = hold_peer_frames_to(TARGET, held)
    h.start()
    node = h.nodes[TARGET]
    assert node.phase is phase
    end, sent = h.clock.now + 300.0, []
    while (wake := node.next_tick()) is not None and wake <= end:
        h.clock.now = wake
        h.deliver(node, *h.beat())
        sent += upward(node, node.tick(wake))
    assert node.phase is phase and len(sent) == 300 // 10
    assert {type(m) for m in sent} == {control.Progress}
    progress = sent[-1]
    assert isinstance(progress, control.Progress)
    assert (progress.round, progress.held, progress.view) == (0, False, 0)
    assert progress.waiting and set(progress.waiting) <= {2, 6, 7, 9}  # its neighbours
    assert_same_models(h.finish(), clean())
    h.assert_all_counted()


def test_the_session_deadline_is_the_orchestrators_and_progress_is_due_between() -> None:
    """A neighbour's frame does not move the node's deadline (the orchestrator's silence
    does); a Beat does; a Progress is due every deadline / BEATS."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    h.hold = hold_peer_frames_to(TARGET, ("model",))
    h.start()
    node = h.nodes[TARGET]
    start = h.clock.now
    assert node.next_tick() == start + 30.0 / BEATS
    h.clock.now += 20.0
    (_, frame), h.held = h.held[0], h.held[1:]  # one neighbour's model arrives, 20 s later
    h.deliver(node, frame.topic, frame.payload)
    assert node.next_tick() == start + 30.0 / BEATS  # overdue: nothing moved it
    assert len(upward(node, node.tick(h.clock.now))) == 1  # the Progress
    assert node.next_tick() == start + 30.0  # the orchestrator said nothing since `start`
    beat = h.conductor.tick(h.clock.now)  # its Beat is due: it says it is alive
    assert [type(wire.decode_signed(f.payload).msg) for f in beat.publish] == [control.Beat]
    h.deliver(node, beat.publish[0].topic, beat.publish[0].payload)
    assert node.next_tick() == h.clock.now + 30.0 / BEATS
    h.clock.now += 1.0
    assert h.finish()[0].models.shape[0] == ROUNDS
    h.assert_all_counted()


def test_a_lost_orchestrator_stops_a_running_node_once_its_neighbours_fall_silent() -> None:
    """The orchestrator says nothing (no Beat) and a neighbour speaks 20 s later: its frame
    is evidence the run goes on, so the node waits past the deadline (at most PATIENCE of
    them), and stops a deadline after the neighbour's frame, and says so."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    h.hold = hold_peer_frames_to(TARGET, ("model",))
    h.start()
    node = h.nodes[TARGET]
    assert node.phase is Phase.RUNNING
    last = h.clock.now
    h.clock.now += 20.0
    (_, frame), h.held = h.held[0], h.held[1:]
    h.deliver(node, frame.topic, frame.payload)  # a neighbour is alive
    while node.phase is Phase.RUNNING:
        wake = node.next_tick()
        assert wake is not None and wake <= last + 50.0
        out = node.tick(wake)
    assert wake == last + 20.0 + 30.0 < last + PATIENCE * 30.0
    assert node.phase is Phase.FAILED and "orchestrator has been silent for 50 s" in node.failure
    assert out.events[0].kind == "failed"


def test_neighbours_that_keep_speaking_hold_a_node_for_patience_deadlines_at_most() -> None:
    """Neighbours' frames every 10 s, the orchestrator silent: the node stops PATIENCE
    deadlines after the orchestrator's last frame, however long its neighbours speak."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    h.hold = hold_peer_frames_to(TARGET, ("model",))
    h.start()
    node = h.nodes[TARGET]
    assert len(h.held) >= PATIENCE * 30 // 10 - 1  # one frame every 10 s past 80 s
    last = h.clock.now
    while not node.done:
        h.clock.now += 10.0
        if h.held:
            (_, frame), h.held = h.held[0], h.held[1:]
            h.deliver(node, frame.topic, frame.payload)  # a neighbour's own frame, once
        wake = node.next_tick()
        assert wake is not None
        if wake <= h.clock.now:
            node.tick(h.clock.now)
    assert h.clock.now == last + PATIENCE * 30.0
    assert "orchestrator has been silent for 90 s" in node.failure


def test_a_node_left_out_waits_patience_deadlines_for_the_orchestrator() -> None:
    """Left out, a node has no neighbours to hear and waits on the orchestrator's decision:
    a busy orchestrator (or an insider holding its connection, missing Beats) is given
    PATIENCE deadlines before the node calls it gone (issue 30)."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    h.hold = hold_peer_frames_to(TARGET, ("model",))
    h.start()
    node = h.nodes[TARGET]
    h.deliver(node, *down(EXCLUDED)(h))
    assert node.phase is Phase.EXCLUDED
    heard = h.clock.now
    assert node.next_tick() == heard + PATIENCE * 30.0
    assert not node.tick(heard + 30.0).events and node.phase is Phase.EXCLUDED
    out = node.tick(heard + PATIENCE * 30.0)
    assert node.phase is Phase.FAILED and "silent for 90 s (excluded" in node.failure
    assert out.events[0].kind == "failed"


def test_the_shell_may_give_up() -> None:
    h = Harness.build([(Strategy.ATC, Scheme.NONE)]).start()
    node = h.nodes[TARGET]
    (failed,) = upward(node, node.fail("lost the broker"))
    assert failed == control.Failed(TARGET, "lost the broker") and node.phase is Phase.FAILED


# ---- resources: the early buffer, relays, bad key shares --------------------------------------


def peer_junk(n: int, size: int) -> list[bytes]:
    """`n` distinct payloads of `size` bytes each (none of them a valid frame)."""
    return [n_.to_bytes(4, "big") + bytes(size - 4) for n_ in range(n)]


def test_the_early_buffer_is_bounded_in_count() -> None:
    node, _, _ = bare_node()
    node.start(0.0)
    topic = topics.peer_topic(RUN, TARGET, 3)
    for payload in peer_junk(EARLY_COUNT + 100, 8):
        assert node.receive(topic, payload, 1.0) == Output()
    assert node.rejected == Counter({"overflow": 100})
    assert uncounted(node.deliveries) == 0
    node.fail("test over")  # the buffered frames will never be used: counted as such
    assert node.rejected == Counter({"overflow": 100, "no-session": EARLY_COUNT})
    assert node.deliveries.received == EARLY_COUNT + 100 and uncounted(node.deliveries) == 0


def test_the_early_buffer_is_bounded_in_bytes_and_memory_stays_bounded() -> None:
    node, _, _ = bare_node()
    node.start(0.0)
    topic, mib = topics.peer_topic(RUN, TARGET, 3), 1 << 20
    flood = 3 * EARLY_BYTES // mib  # 48 MiB offered, one MiB at a time
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(flood):
            node.receive(topic, n.to_bytes(4, "big") + bytes(mib - 4), 1.0)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    kept = EARLY_BYTES // mib
    assert node.rejected == Counter({"overflow": flood - kept})
    assert grown <= EARLY_BYTES + mib  # what the buffer may hold, and no more
    assert uncounted(node.deliveries) == 0


def test_early_frames_are_replayed_into_the_session_and_each_counted() -> None:
    """Setup held back from the target: its neighbours' key plans wait in the early buffer
    with junk injected beside them; once configured, the genuine ones are used, the junk
    counted under its own reasons, and the run is a clean run."""
    h = Harness.build()
    h.hold = lambda _, frame: is_setup(frame)
    h.start()
    node = h.nodes[TARGET]
    assert node.phase is Phase.REGISTERED
    inbox = topics.peer_topic(RUN, TARGET, 2)
    share = KeyShare(2, 0, 2, 0, 6, 0, 0, bytes(32), bytes(64))
    wrong = ChaCha20Poly1305(bytes(32))
    junk = {
        b"\xc1": "malformed",
        wire.seal_peer(share, wrong, RUN, seq=1000): "bad-seal",  # past the genuine ones
        wire.seal_peer(share, wrong, RUN, seq=0): "replay",  # the place of a genuine one
        wire.encode_peer(share, bytes(32)): "unsealed",
    }
    for payload in junk:
        assert h.deliver(node, inbox, payload) == Output()
    assert node.rejected == Counter() and uncounted(node.deliveries) == 0
    results = h.finish()
    assert node.rejected == Counter(junk.values())
    h.assert_all_counted()
    assert_same_models(results, clean())


def shares_to(h: Harness, hub: int) -> list[Publish]:
    """Genuine key shares an owner sent to `hub` for a partner of its."""
    found = []
    for frame in h.peer_frames():
        if frame.category == "keys" and matches(topics.inbox_filter(RUN, hub), frame.topic):
            msg = h.read(frame)
            if isinstance(msg, KeyShare) and msg.sender == msg.owner and msg.partner != hub:
                found.append(frame)
    return found


def test_a_hub_relays_each_key_share_once() -> None:
    """Each genuine share sent to the hub, replayed 50 times while it runs: still one
    relay per share, the replays counted at the hub (by its link, before the core)."""
    h = Harness.build()
    hub = h.nodes[TARGET]
    replays = 50

    def replay_shares() -> None:
        for share in shares_to(h, TARGET):
            for _ in range(replays):
                inject(h.net.router, share.topic, share.payload)

    h.when(lambda: hub.phase is Phase.RUNNING, replay_shares)
    results = h.play()
    shares = shares_to(h, TARGET)
    assert len(shares) == 8  # pairs (2, 6), (2, 9), (7, 6), (7, 9): both ways
    assert hub.session is not None
    assert hub.session.core.counters.relayed == len(shares)
    assert hub.rejected == Counter({"replay": replays * len(shares)})
    h.assert_all_counted()
    assert_same_models(results, clean())


def relayed_share(h: Harness, frame: Publish | None) -> KeyShare | None:
    """The key share in `frame` if it is one the target relays as hub (sender != owner)."""
    if frame is None or frame.category != "keys" or not frame.topic.endswith(f"/from/{TARGET}"):
        return None
    msg = h.read(frame)
    return msg if isinstance(msg, KeyShare) and msg.owner != TARGET else None


def test_a_bad_key_share_from_one_neighbour_is_counted_and_the_run_goes_on() -> None:
    """Just before the hub's relay reaches the partner, a copy with another ephemeral key
    arrives (MACed right on the hub's link, so only the owner's signature tells): counted
    bad-key; the genuine share behind it completes the pair and the run is a clean run.
    On the visible wire: only the hub could seal such a frame, and its seal would number
    it after the genuine one."""
    h = Harness.build(seal_links=False)
    victims: list[int] = []

    def tamper() -> None:
        assert h.in_flight is not None
        share = relayed_share(h, h.in_flight)
        assert share is not None
        partner = h.nodes[share.receiver]
        assert partner.session is not None
        forged = dataclasses.replace(share, public=keys.Ephemeral.generate().public)
        payload = wire.encode_peer(forged, partner.session.links.keys[TARGET])
        assert h.deliver(partner, h.in_flight.topic, payload) == Output()
        victims.append(share.receiver)

    h.when(lambda: relayed_share(h, h.in_flight) is not None, tamper)
    results = h.play()
    assert h.fired == 1
    assert h.nodes[victims[0]].rejected == Counter({"bad-key": 1})
    assert h.rejected() == Counter({"bad-key": 1})
    h.assert_all_counted()
    assert_same_models(results, clean())


# ---- the node's own output --------------------------------------------------------------------


def test_a_clean_run_counts_every_delivery_and_reports_its_traffic() -> None:
    """Finished tells the exact MQTT bytes and messages the node published, by category
    (its Hellos charged to the first session), itself included."""
    h = Harness.build()
    results = h.play()
    h.assert_all_counted()
    assert h.rejected() == Counter()
    for node in h.nodes:
        assert node.phase is Phase.CLOSED and node.done and node.next_tick() is None
        assert node.deliveries.received == node.deliveries.used > 0
    sent = [f for p, f in h.sent if p == f"agent-{TARGET}" and not is_left(f)]
    finished = results[0].finished[TARGET]
    assert finished.messages == Counter(f.category for f in sent)
    size: Counter[str] = Counter()
    for f in sent:
        size[f.category] += topics.mqtt_publish_size(f.topic, len(f.payload), f.qos)
    assert finished.bytes == size
    assert node_subscriptions_are_its_own(h.nodes[TARGET])


def is_left(frame: Publish) -> bool:
    return frame.category == "control" and isinstance(
        wire.decode_signed(frame.payload).msg, control.Left
    )


def node_subscriptions_are_its_own(node: AgentNode) -> bool:
    return node.subscriptions == [
        f"privnet/{RUN}/to/{node.me}/from/+",
        f"privnet/{RUN}/ctl/down/{node.me}",
        f"privnet/{RUN}/ctl/down/all",
    ]


def test_without_telemetry_no_model_leaves_the_node() -> None:
    h = Harness.build([(Strategy.ATC, Scheme.GHP)], telemetry=False)
    h.start()
    assert not [f for _, f in h.sent if f.category == "telemetry"]
    assert h.conductor.stage is Stage.DONE
    assert all(n.w is not None for n in h.nodes) and bare_node()[0].w is None


def test_control_junk_never_raises_and_never_moves_the_node() -> None:
    node, orchestrator, _ = bare_node()
    node.start(0.0)
    junk = [b"", b"\x00", msgpack.packb([wire.VERSION, "go", b"", b""]), bytes(100)]
    for payload in junk:
        assert node.receive(topics.ctl_down(RUN, "all"), payload, 1.0) == Output()
    forged = wire.encode_signed(control.Welcome(TARGET), RUN, 1, STRANGER)
    assert node.receive(topics.ctl_down(RUN, TARGET), forged, 1.0) == Output()
    assert node.rejected == Counter({"malformed": len(junk), "bad-signature": 1})
    assert node.phase is Phase.REGISTERING and uncounted(node.deliveries) == 0
    genuine = wire.encode_signed(control.Welcome(TARGET), RUN, 1, orchestrator)
    assert node.receive(topics.ctl_down(RUN, TARGET), genuine, 1.0).events == [Event("registered")]


NODE_TOPICS = [
    topics.ctl_down(RUN, "all"),
    topics.ctl_down(RUN, TARGET),
    topics.peer_topic(RUN, TARGET, 3),
    topics.ctl_up(RUN, TARGET),
]


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(NODE_TOPICS), st.binary(max_size=200)), max_size=20))
def test_any_delivery_is_used_or_counted_and_never_raises(deliveries: list[Frame]) -> None:
    node, _, _ = bare_node()
    node.start(0.0)
    for topic, payload in deliveries:
        assert node.receive(topic, payload, 1.0).publish == []
    assert uncounted(node.deliveries) == 0 and node.phase is Phase.REGISTERING
    node.fail("test over")
    assert node.deliveries.received == len(deliveries) == node.rejected.total()


def test_a_retained_frame_is_counted_never_used() -> None:
    """privnet publishes nothing retained: a retained frame (an old run's, an attacker's
    left on a topic) is dropped, whatever it holds."""
    h = Harness.build()
    node = h.nodes[TARGET]
    welcome = h.down(control.Welcome(TARGET), TARGET)
    assert node.receive(*welcome, 0.0, retained=True) == Output()
    assert node.phase is Phase.REGISTERING
    assert node.rejected == Counter({"retained": 1}) and uncounted(node.deliveries) == 0


def test_a_node_that_could_not_hear_gives_the_orchestrator_a_fresh_deadline() -> None:
    """After a broker outage or its own stop (the shell says `deaf`), silence before it
    proves nothing: the orchestrator's deadline counts from then."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    h.hold = lambda _, frame: is_control(frame, control.Close, "all")
    h.start()
    node = h.nodes[TARGET]
    since = h.clock.now
    assert node.deaf(since + 25.0) == Output()
    assert node.next_tick() is not None and node.tick(since + 54.0).events == []
    assert not node.done
    out = node.tick(since + 55.0)
    assert node.phase is Phase.FAILED and "orchestrator has been silent" in node.failure
    assert out.events[0].kind == "failed"


def test_a_rejoin_offers_the_latest_rounds_held_and_older_ones_spread() -> None:
    """Up to RECENT rounds: all when fewer are held; else the latest half and the older
    ones evenly spread, the initial model included (a resumed run may rewind that far)."""
    assert offered([0, 25, 50]) == (0, 25, 50)
    held = list(range(0, 3001, 25))  # 121 checkpoints
    offer = offered(held)
    assert len(offer) == RECENT and list(offer) == sorted(set(offer))
    assert offer[-RECENT // 2 :] == tuple(held[-RECENT // 2 :]) and offer[0] == 0
    gaps = np.diff(offer[: RECENT // 2 + 1])
    assert gaps.max() <= 3 * 25  # no stretch of the older rounds left out

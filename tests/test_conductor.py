"""The conductor (privnet/orchestrator/conductor/), driven directly and with 10 nodes in memory.

Whole runs through the in-memory router must equal the oracle (the paper's recursion in
numpy) for every strategy x scheme, with every delivery counted. Every bad upward frame
must be dropped, counted under one specific reason and change nothing; the deadlines
hold against junk, which never extends them.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from hypothesis import given, settings
from hypothesis import strategies as st
from probes import inject, matches, uncounted
from runs import (
    AGENTS,
    CONTROL_TYPES,
    LATTICE_RTOL,
    ROUNDS,
    RTOL,
    RUN,
    Harness,
    assert_same_models,
    assert_whole_rounds,
    clean,
    model_place,
    problem,
)

from privnet.agent import control, keys, topics, wire
from privnet.agent.messages import Report
from privnet.agent.node import TELEMETRY_BATCH
from privnet.agent.phases import Phase
from privnet.agent.protocol import (
    Checkpoint,
    Event,
    Output,
    Publish,
    escrow_context,
    hello_proof,
    telemetry_context,
)
from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.conductor import (
    REGISTER_DEADLINE,
    STALLS,
    Conductor,
    SessionPlan,
    Stage,
    View,
    describe,
)
from privnet.orchestrator.conductor.pacing import WINDOW
from privnet.orchestrator.engines import journal
from privnet.orchestrator.engines.memory import CONDUCTOR, Network, results_curve
from privnet.orchestrator.engines.oracle import run_oracle
from privnet.orchestrator.errors import RunFailed
from privnet.orchestrator.experiment.instance import msd
from privnet.orchestrator.experiment.specs import session_plans

TARGET = 1  # the agent whose frames are forged: a leaf, neither first nor last to report
OTHER = 2  # the agent a spoofed frame names
STRANGER = keys.Identity.generate()
OTHER_RUN = "other-run"
ORACLE_ROUNDS = 10
DIM = 2
Frame = tuple[str, bytes]
Predicate = Callable[[Harness], bool]


# ---- whole runs -----------------------------------------------------------------------------


def msd_curves(models: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = problem(ORACLE_ROUNDS)
    pairs = [msd(w, p.w_opt[0], p.q) for w in models]
    return np.array([c for c, _ in pairs]), np.array([a for _, a in pairs])


EVERY_SESSION = [(s, sc) for s in Strategy for sc in Scheme]


@pytest.fixture(scope="module")
def every_session() -> Harness:
    """One run of every strategy x scheme as 12 sessions of one conductor and 10 nodes."""
    h = Harness.build(EVERY_SESSION, rounds=ORACLE_ROUNDS)
    h.play()
    return h


def test_a_whole_run_equals_the_oracle_for_every_strategy_and_scheme(
    every_session: Harness,
) -> None:
    results = every_session.conductor.results
    assert [r.label for r in results] == [f"{s}/{sc}/0" for s, sc in EVERY_SESSION]
    for (strategy, scheme), result in zip(EVERY_SESSION, results, strict=True):
        (curve,) = run_oracle(problem(ORACLE_ROUNDS), [strategy], [scheme])
        centroid, average = msd_curves(result.models)
        np.testing.assert_allclose(centroid, curve.msd_centroid[0], rtol=1e-9, err_msg=result.label)
        np.testing.assert_allclose(average, curve.msd_avg[0], rtol=1e-9, err_msg=result.label)


def test_a_whole_run_counts_every_delivery_and_leaves_nothing_behind(
    every_session: Harness,
) -> None:
    h = every_session
    h.assert_all_counted()
    assert h.rejected() == Counter()
    assert h.conductor.stage is Stage.CLOSED and h.conductor.next_tick() is None
    assert all(n.phase is Phase.CLOSED for n in h.nodes)
    assert len(h.recorded(control.Hello)) == AGENTS  # nobody registered twice
    assert len(h.recorded(control.Go)) == len(EVERY_SESSION)
    for result in h.conductor.results:
        assert sorted(result.finished) == list(range(AGENTS))
        assert result.totals("messages")["model"] > 0 and result.wall == 0.0  # fake clock
    mine = [f for p, f in h.sent if p == CONDUCTOR]
    assert h.conductor.outbox.traffic.messages == Counter(control=len(mine))
    assert h.conductor.outbox.traffic.octets == Counter(
        control=sum(topics.mqtt_publish_size(f.topic, len(f.payload), 1) for f in mine)
    )
    broadcast = topics.ctl_down(RUN, "all")
    assert h.conductor.outbox.recipients == sum(AGENTS if f.topic == broadcast else 1 for f in mine)


def test_the_members_run_a_window_ahead_of_what_the_conductor_has_read() -> None:
    """Go grants WINDOW rounds, and a later Go WINDOW more once the conductor has read
    the members halfway through (issue 30): a busy orchestrator's backlog stays bounded.
    The paced run is the oracle's, and no Go is refused."""
    rounds = 2 * WINDOW + 10
    h = Harness.build([(Strategy.ATC, Scheme.LOCAL_GHP)], rounds=rounds)
    h.play()
    grants = [wire.decode_signed(f.payload).msg.until for f in h.recorded(control.Go)]
    assert grants[0] == WINDOW and grants[-1] == rounds, grants
    steps = np.diff(grants)
    assert len(grants) >= 3 and (steps > 0).all() and (steps <= WINDOW).all(), grants
    assert h.rejected() == Counter() and all(n.phase is Phase.CLOSED for n in h.nodes)
    (result,) = h.conductor.results
    (curve,) = run_oracle(problem(rounds), [Strategy.ATC], [Scheme.LOCAL_GHP])
    np.testing.assert_allclose(msd_curves(result.models)[0], curve.msd_centroid[0], rtol=1e-9)


def test_local_ghp_equals_none_and_each_session_equals_a_run_of_its_own(
    every_session: Harness,
) -> None:
    by_label = {r.label: r for r in every_session.conductor.results}
    for strategy in Strategy:
        none, local = by_label[f"{strategy}/none/0"], by_label[f"{strategy}/local-ghp/0"]
        assert_same_models([local], [none], LATTICE_RTOL)
    alone = Harness.build([(Strategy.CTA, Scheme.RANDOM)], rounds=ORACLE_ROUNDS).play()
    np.testing.assert_array_equal(alone[0].models, by_label["cta/random/0"].models)


# ---- attacks on the conductor ---------------------------------------------------------------


def stage_is(stage: Stage) -> Predicate:
    return lambda h: h.conductor.stage is stage


def sent_by_target(kind: type, stage: Stage) -> Predicate:
    """The target's genuine `kind` has been delivered and the conductor is still in `stage`."""
    topic = topics.telemetry if kind in (control.Telemetry, control.Escrow) else topics.ctl_up

    def ready(h: Harness) -> bool:
        return h.conductor.stage is stage and bool(h.recorded(kind, topic(RUN, TARGET)))

    return ready


def before_hello(h: Harness) -> bool:
    return h.conductor.stage is Stage.REGISTERING and TARGET not in h.conductor.registry.registered


def registered(h: Harness) -> bool:
    return h.conductor.stage is Stage.REGISTERING and TARGET in h.conductor.registry.registered


def up(make: Callable[[Harness], control.Control], **options: object) -> Callable[..., Frame]:
    return lambda h: h.up(make(h), TARGET, **options)  # type: ignore[arg-type]


def const(msg: control.Control) -> Callable[[Harness], control.Control]:
    return lambda _: msg


def replay(kind: type) -> Callable[[Harness], Frame]:
    topic = topics.telemetry if kind is control.Telemetry else topics.ctl_up

    def build(h: Harness) -> Frame:
        return topic(RUN, TARGET), h.recorded(kind, topic(RUN, TARGET))[-1].payload

    return build


def hello(
    identity: keys.Identity | None = None, token: bytes | None = None, agent: int = TARGET
) -> Callable[[Harness], control.Hello]:
    """A Hello with `identity` (the target's) and a proof made with `token` (its own)."""

    def make(h: Harness) -> control.Hello:
        public = (identity or h.nodes[agent].identity).public.to_bytes()
        proof = hello_proof(token or h.conductor.tokens[agent], RUN, agent, public)
        return control.Hello(agent, public, proof)

    return make


def telemetry(
    rounds: tuple[int, ...] = (1,),
    *,
    sender: int = TARGET,
    dim: int = DIM,
    context_round: int | None = None,
    view: int = 0,
) -> Callable[[Harness], control.Telemetry]:
    """Telemetry of the target, sealed to the orchestrator, with whatever reports we like."""

    def make(h: Harness) -> control.Telemetry:
        reports = [Report(sender, i, np.full(dim, 0.5)) for i in rounds]
        last = rounds[-1]
        context = telemetry_context(
            RUN, TARGET, 0, view, last if context_round is None else context_round
        )
        sealed = keys.seal(
            h.conductor.identity.public.static, wire.encode_reports(reports), context
        )
        return control.Telemetry(TARGET, 0, view, last, sealed)

    return make


def escrow(*, zeroed: bool = False, context_agent: int = TARGET) -> Callable[..., control.Escrow]:
    """The target's escrowed link keys of view 0 (all zeros, if `zeroed`), sealed to the
    orchestrator with the context of `context_agent`."""

    def make(h: Harness) -> control.Escrow:
        session = h.nodes[TARGET].session
        assert session is not None
        mine = {m: bytes(32) if zeroed else k for m, k in session.links.keys.items()}
        context = escrow_context(RUN, context_agent, 0, 0)
        plain = wire.encode_link_keys(mine)
        sealed = keys.seal(h.conductor.identity.public.static, plain, context)
        return control.Escrow(TARGET, 0, 0, sealed)

    return make


def topic_only(topic: str, payload: bytes = b"") -> Callable[[Harness], Frame]:
    return lambda _: (topic, payload)


@dataclass(frozen=True)
class Attack:
    name: str
    when: Predicate
    frame: Callable[[Harness], Frame]
    reason: str

    def __str__(self) -> str:
        return self.name


def again(kind: type, make: Callable[[Harness], control.Control], stage: Stage) -> list[Attack]:
    """Once the target's genuine `kind` is in: the same bytes again (a replay), and a fresh
    frame saying the same again (a duplicate)."""
    name, sent = kind.__name__.lower(), sent_by_target(kind, stage)
    return [
        Attack(f"{name}-replayed", sent, replay(kind), "replay"),
        Attack(f"{name}-twice", sent, up(make), "duplicate"),
    ]


READY, FINISHED = control.Ready(TARGET, 0, 0), control.Finished(TARGET, 0, 0, {}, {}, {}, 0.0)
FAILED, LEFT = control.Failed(TARGET, "forged"), control.Left(TARGET, {})
FINISHED_1 = control.Finished(TARGET, 0, 1, {}, {}, {}, 0.0)
PROGRESS = control.Progress(TARGET, 0, 0, 0, False, ())
REJOIN = control.Rejoin(TARGET, 0, (0,))
CONFIGURING, RUNNING = stage_is(Stage.CONFIGURING), stage_is(Stage.RUNNING)
CLOSING = stage_is(Stage.CLOSING)

ATTACKS = [
    # Hello
    Attack("hello-forged", before_hello, up(hello(), signer=STRANGER), "bad-signature"),
    Attack(
        "hello-bad-proof",
        before_hello,
        up(hello(STRANGER, bytes(32)), signer=STRANGER),
        "bad-proof",
    ),
    Attack("hello-other-run", before_hello, up(hello(), run=OTHER_RUN), "wrong-run"),
    Attack("hello-spoofed", before_hello, up(hello(agent=OTHER)), "spoofed"),
    Attack(
        "hello-unknown-agent",
        before_hello,
        up(hello(), topic=topics.ctl_up(RUN, AGENTS)),
        "unknown-sender",
    ),
    Attack("hello-replayed", registered, replay(control.Hello), "duplicate"),
    Attack(
        "hello-another-identity",
        registered,
        up(hello(STRANGER), signer=STRANGER),
        "identity-change",
    ),
    Attack("hello-while-running", RUNNING, replay(control.Hello), "duplicate"),
    # Ready
    Attack("ready-unregistered", before_hello, up(const(READY)), "unregistered"),
    Attack("ready-forged", CONFIGURING, up(const(READY), signer=STRANGER), "bad-signature"),
    Attack("ready-other-run", CONFIGURING, up(const(READY), run=OTHER_RUN), "wrong-run"),
    Attack("ready-spoofed", CONFIGURING, up(const(control.Ready(OTHER, 0, 0))), "spoofed"),
    *again(control.Ready, const(READY), Stage.CONFIGURING),
    Attack(
        "ready-other-session", CONFIGURING, up(const(control.Ready(TARGET, 1, 0))), "out-of-phase"
    ),
    Attack("ready-while-running", RUNNING, up(const(READY)), "out-of-phase"),
    # Telemetry
    Attack("telemetry-before-setup", registered, up(telemetry()), "out-of-phase"),
    Attack("telemetry-unregistered", before_hello, up(telemetry()), "unregistered"),
    Attack("telemetry-forged", RUNNING, up(telemetry(), signer=STRANGER), "bad-signature"),
    Attack("telemetry-other-run", RUNNING, up(telemetry(), run=OTHER_RUN), "wrong-run"),
    Attack(
        "telemetry-spoofed",
        RUNNING,
        up(telemetry(), topic=topics.telemetry(RUN, OTHER)),
        "spoofed",
    ),
    Attack(
        "telemetry-bad-seal",
        RUNNING,
        up(const(control.Telemetry(TARGET, 0, 0, 1, bytes(100)))),
        "bad-seal",
    ),
    Attack(
        "telemetry-sealed-for-another-round", RUNNING, up(telemetry(context_round=2)), "bad-seal"
    ),
    Attack("telemetry-of-another-agent", RUNNING, up(telemetry(sender=OTHER)), "schema"),
    Attack("telemetry-round-0", RUNNING, up(telemetry((0,))), "schema"),
    Attack("telemetry-beyond-the-rounds", RUNNING, up(telemetry((ROUNDS + 1,))), "schema"),
    Attack("telemetry-wrong-dimension", RUNNING, up(telemetry(dim=3)), "shape"),
    Attack(
        "telemetry-other-session",
        RUNNING,
        up(lambda h: control.Telemetry(TARGET, 1, 0, 1, telemetry()(h).sealed)),
        "out-of-phase",
    ),
    *again(control.Telemetry, telemetry(), Stage.RUNNING),
    # Escrow: taken only from a run that audits (tests below)
    Attack("escrow-without-audit", RUNNING, up(escrow()), "out-of-phase"),
    # Finished
    Attack("finished-before-go", CONFIGURING, up(const(FINISHED)), "out-of-phase"),
    Attack("finished-unregistered", before_hello, up(const(FINISHED)), "unregistered"),
    Attack(
        "finished-spoofed",
        RUNNING,
        up(const(control.Finished(OTHER, 0, 0, {}, {}, {}, 0.0))),
        "spoofed",
    ),
    Attack("finished-forged", RUNNING, up(const(FINISHED), signer=STRANGER), "bad-signature"),
    Attack("finished-other-run", RUNNING, up(const(FINISHED), run=OTHER_RUN), "wrong-run"),
    Attack(
        "finished-other-session",
        RUNNING,
        up(const(control.Finished(TARGET, 1, 0, {}, {}, {}, 0.0))),
        "out-of-phase",
    ),
    *again(control.Finished, const(FINISHED), Stage.RUNNING),
    Attack("finished-when-done", stage_is(Stage.DONE), up(const(FINISHED)), "out-of-phase"),
    # Left
    Attack("left-while-running", RUNNING, up(const(LEFT)), "out-of-phase"),
    Attack("left-forged", CLOSING, up(const(LEFT), signer=STRANGER), "bad-signature"),
    Attack("left-other-run", CLOSING, up(const(LEFT), run=OTHER_RUN), "wrong-run"),
    Attack("left-spoofed", CLOSING, up(const(control.Left(OTHER, {}))), "spoofed"),
    *again(control.Left, const(LEFT), Stage.CLOSING),
    Attack("finished-of-another-view", RUNNING, up(const(FINISHED_1)), "stale-view"),
    # Progress (a heartbeat: obeyed in a session when genuine; another view's is ignored)
    Attack("progress-unregistered", before_hello, up(const(PROGRESS)), "unregistered"),
    Attack("progress-forged", RUNNING, up(const(PROGRESS), signer=STRANGER), "bad-signature"),
    Attack("progress-other-run", RUNNING, up(const(PROGRESS), run=OTHER_RUN), "wrong-run"),
    Attack(
        "progress-spoofed",
        RUNNING,
        up(const(PROGRESS), topic=topics.ctl_up(RUN, OTHER)),
        "spoofed",
    ),
    Attack("progress-old-sequence-number", RUNNING, up(const(PROGRESS), seq=1), "replay"),
    Attack("progress-when-done", stage_is(Stage.DONE), up(const(PROGRESS)), "out-of-phase"),
    Attack(
        "progress-other-session",
        RUNNING,
        up(const(control.Progress(TARGET, 1, 0, 0, False, ()))),
        "out-of-phase",
    ),
    # Rejoin (only from a registered agent that is not a member)
    Attack("rejoin-unregistered", before_hello, up(const(REJOIN)), "unregistered"),
    Attack("rejoin-forged", RUNNING, up(const(REJOIN), signer=STRANGER), "bad-signature"),
    Attack("rejoin-other-run", RUNNING, up(const(REJOIN), run=OTHER_RUN), "wrong-run"),
    Attack(
        "rejoin-spoofed", RUNNING, up(const(REJOIN), topic=topics.ctl_up(RUN, OTHER)), "spoofed"
    ),
    Attack("rejoin-old-sequence-number", RUNNING, up(const(REJOIN), seq=1), "replay"),
    Attack("rejoin-of-a-member", RUNNING, up(const(REJOIN)), "out-of-phase"),
    Attack("rejoin-while-registering", registered, up(const(REJOIN)), "out-of-phase"),
    Attack("rejoin-when-closing", CLOSING, up(const(REJOIN)), "out-of-phase"),
    # Failed (obeyed in any stage when genuine, so only frames that are not)
    Attack("failed-unregistered", before_hello, up(const(FAILED)), "unregistered"),
    Attack("failed-forged", RUNNING, up(const(FAILED), signer=STRANGER), "bad-signature"),
    Attack("failed-other-run", RUNNING, up(const(FAILED), run=OTHER_RUN), "wrong-run"),
    Attack("failed-spoofed", RUNNING, up(const(control.Failed(OTHER, "x"))), "spoofed"),
    Attack("failed-old-sequence-number", RUNNING, up(const(FAILED), seq=1), "replay"),
    # downward messages have no business on the upward topics
    Attack("welcome-upward", registered, up(const(control.Welcome(TARGET))), "out-of-phase"),
    Attack("go-upward", RUNNING, up(const(control.Go(0, 0, ROUNDS))), "spoofed"),
    Attack(
        "setup-upward", CONFIGURING, up(const(control.Setup(TARGET, 0, 0, b""))), "out-of-phase"
    ),
    Attack(
        "abort-upward",
        RUNNING,
        up(const(control.Abort("x")), signer=STRANGER),
        "spoofed",
    ),
    Attack("bye-upward", RUNNING, up(const(control.Bye())), "spoofed"),
    Attack("close-upward", RUNNING, up(const(control.Close())), "spoofed"),
    Attack("beat-upward", RUNNING, up(const(control.Beat())), "spoofed"),
    Attack("recorded-upward", RUNNING, up(const(control.Recorded(0, 0, 1))), "spoofed"),
    Attack("hold-upward", RUNNING, up(const(control.Hold(0, 1))), "spoofed"),
    Attack("excluded-upward", RUNNING, up(const(control.Excluded(TARGET, 0, 1))), "out-of-phase"),
    # junk
    Attack("malformed", RUNNING, topic_only(topics.ctl_up(RUN, TARGET), b"\xc1"), "malformed"),
    Attack(
        "oversized",
        RUNNING,
        topic_only(topics.telemetry(RUN, TARGET), bytes(wire.MAX_CONTROL_BYTES + 1)),
        "oversized",
    ),
    Attack("other-runs-topic", RUNNING, topic_only(topics.ctl_up(OTHER_RUN, 0)), "wrong-topic"),
    Attack("a-peer-topic", RUNNING, topic_only(topics.peer_topic(RUN, 1, 0)), "wrong-topic"),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=str)
def test_a_bad_upward_frame_is_dropped_counted_and_changes_nothing(attack: Attack) -> None:
    h = Harness.build()
    h.strike(h.conductor, lambda: attack.when(h), lambda: attack.frame(h), attack.reason)


def test_every_control_type_is_attacked() -> None:
    assert {a.name.split("-")[0] for a in ATTACKS} >= CONTROL_TYPES


# ---- escrow (--audit) -----------------------------------------------------------------------


def test_an_audited_run_escrows_every_link_key_of_every_view_and_they_open_its_frames() -> None:
    """Both ends escrow each link's seal key; with them every recorded peer frame opens,
    and the run is a clean run's."""
    h = Harness.build(escrow=True)
    results = h.play()
    (keys_of_view,) = h.conductor.collection.link_keys.values()
    A = problem().A
    links = {(a, b) for a in range(AGENTS) for b in range(a + 1, AGENTS) if A[a, b] or A[b, a]}
    assert set(keys_of_view) == links
    frames = [f for _, f in h.sent if topics.parse_peer_topic(f.topic) is not None]
    assert frames
    for frame in frames:
        head = wire.read_head(frame.payload)
        link = (min(head.sender, head.receiver), max(head.sender, head.receiver))
        aead = ChaCha20Poly1305(keys_of_view[link])
        assert wire.open_head(head, aead, RUN, DIM).sender == head.sender
    h.assert_all_counted()
    assert_same_models(results, clean())


ESCROW_ATTACKS = [
    Attack(
        "escrow-bad-seal", RUNNING, up(const(control.Escrow(TARGET, 0, 0, bytes(80)))), "bad-seal"
    ),
    Attack("escrow-sealed-for-another", RUNNING, up(escrow(context_agent=OTHER)), "bad-seal"),
    Attack("escrow-other-keys", RUNNING, up(escrow(zeroed=True)), "schema"),
    Attack("escrow-forged", RUNNING, up(escrow(), signer=STRANGER), "bad-signature"),
]


@pytest.mark.parametrize("attack", ESCROW_ATTACKS, ids=str)
def test_a_bad_escrow_is_dropped_counted_and_changes_nothing(attack: Attack) -> None:
    h = Harness.build(escrow=True)
    h.strike(h.conductor, lambda: attack.when(h), lambda: attack.frame(h), attack.reason)


# ---- deadlines ------------------------------------------------------------------------------


def plans(sessions: int = 1) -> list[SessionPlan]:
    return session_plans(problem(), [(Strategy.ATC, Scheme.NONE, r) for r in range(sessions)])


def conductor(**options: object) -> tuple[Conductor, dict[int, bytes], keys.Identity]:
    tokens = {p: bytes([p]) * 32 for p in range(AGENTS)}
    identity = keys.Identity.generate()
    return Conductor(RUN, identity, tokens, plans(), **options), tokens, identity  # type: ignore[arg-type]


def signed_hello(agent: int, token: bytes, identity: keys.Identity, seq: int = 1) -> Frame:
    public = identity.public.to_bytes()
    msg = control.Hello(agent, public, hello_proof(token, RUN, agent, public))
    return topics.ctl_up(RUN, agent), wire.encode_signed(msg, RUN, seq, identity)


def test_the_registration_deadline_holds_whatever_junk_arrives() -> None:
    """Nine agents register; junk keeps coming (sybil Hellos, forgeries, garbage), none of
    it moves the deadline: at 60 s the conductor fails, naming the missing agent."""
    c, tokens, _ = conductor(register_deadline=60.0)
    assert c.start(100.0) == Output() and c.next_tick() == 160.0
    for agent in range(AGENTS - 1):
        out = c.receive(*signed_hello(agent, tokens[agent], keys.Identity.generate()), 100.0)
        assert [m.topic for m in out.publish] == [topics.ctl_down(RUN, agent)]
    missing = AGENTS - 1
    sybil = keys.Identity.generate()
    junk = [
        signed_hello(missing, bytes(32), sybil),  # no launch token
        signed_hello(AGENTS, bytes(32), sybil),  # no such agent
        signed_hello(0, tokens[0], sybil),  # somebody else's identity
        (topics.ctl_up(RUN, missing), b"\x00" * 50),
        (
            topics.ctl_up(RUN, missing),
            wire.encode_signed(control.Ready(missing, 0, 0), RUN, 2, sybil),
        ),
    ]
    t = 100.0
    while t < 160.0:
        for frame in junk:
            assert c.receive(*frame, t) == Output()
        assert c.tick(t) == Output() and c.next_tick() == 160.0
        t += 0.5
    out = c.tick(160.0)
    assert c.stage is Stage.FAILED and f"agents [{missing}] never registered" in c.failure
    (abort,) = out.publish
    assert abort.topic == topics.ctl_down(RUN, "all")
    signed = wire.decode_signed(abort.payload)
    signed.verify(c.identity.public, "the orchestrator")
    assert (
        isinstance(signed.msg, control.Abort)
        and "registration closed after 60 s" in signed.msg.reason
    )
    assert c.deliveries.rejected == Counter(
        {
            "bad-proof": 120,
            "unknown-sender": 120,
            "identity-change": 120,
            "malformed": 120,
            "unregistered": 120,
        }
    )
    assert c.receive(*junk[0], 161.0) == Output() and c.deliveries.rejected["closed"] == 1
    assert uncounted(c.deliveries) == 0 and c.next_tick() is None and c.tick(1e9) == Output()


def test_registration_has_a_default_deadline() -> None:
    c, _, _ = conductor()
    c.start(0.0)
    assert c.next_tick() == REGISTER_DEADLINE
    assert c.tick(REGISTER_DEADLINE - 1) == Output() and c.stage is Stage.REGISTERING


def holding(kind: type | tuple[type, ...], agent: int) -> Callable[[str, Publish], bool]:
    """Hold back `agent`'s upward frames of type `kind`."""
    mine = (topics.ctl_up(RUN, agent), topics.telemetry(RUN, agent))
    return lambda _, f: f.topic in mine and isinstance(wire.decode_signed(f.payload).msg, kind)


def views(h: Harness) -> list[tuple[int, int, tuple[int, ...], str]]:
    """(view, start, members, reason) of every view recorded."""
    return [(v.view, v.start, v.members, v.reason) for v in h.conductor.membership.views]


EVERYONE = tuple(range(AGENTS))


@pytest.mark.parametrize(
    "kind",
    [control.Finished, (control.Telemetry, control.Finished)],
    ids=["finished", "telemetry-and-finished"],
)
def test_a_session_waiting_for_a_finished_waits_beating_and_never_busy(
    kind: type | tuple[type, ...],
) -> None:
    """Agent 3's Finished (and telemetry) held back for ten deadlines: every agent
    heartbeats, nobody is silent, no round is left to stall, so the conductor waits,
    Beating, with its next tick always ahead of the clock; then the run completes."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)], deadline=30.0)
    h.hold = holding(kind, 3)
    h.start()
    c = h.conductor
    assert c.stage is Stage.RUNNING and h.held
    assert c.rounds_done == (ROUNDS if kind is control.Finished else 0)
    for _ in range(30):
        h.advance(10.0)
        wake = c.next_tick()
        assert wake is not None and wake > h.clock.now
    assert c.stage is Stage.RUNNING and views(h) == [(0, 1, EVERYONE, "start")]
    assert c.rounds_done == ROUNDS  # held Progress of a finished agent says so
    assert_same_models(h.finish(), clean([(Strategy.ATC, Scheme.NONE)]))
    h.assert_all_counted()


def test_keying_that_stalls_is_redone_under_a_new_view_then_fails_naming_the_members() -> None:
    """Agent 3's Ready never arrives (every view's): junk and heartbeats do not move the
    deadline; a deadline after the Setups the keying is redone under a new view (same
    members, "stalled"), and after STALLS such views the run fails, saying so."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)], deadline=30.0)
    h.hold = holding(control.Ready, 3)
    h.start()
    c = h.conductor
    assert c.stage is Stage.CONFIGURING and len(h.held) == 1
    deadline = c.liveness.deadline_at()
    assert deadline == h.clock.now + 30.0
    assert c.next_tick() == h.clock.now + 10.0  # a Beat first: every deadline / 3
    assert c.receive(topics.ctl_up(RUN, 3), b"junk", h.clock.now) == Output()
    h.advance(29.5)
    assert c.liveness.deadline_at() == deadline and c.stage is Stage.CONFIGURING
    h.advance(0.5)
    assert views(h)[1] == (1, 1, EVERYONE, "stalled")
    h.advance(30.0 * STALLS)
    assert [v[3] for v in views(h)] == ["start", *["stalled"] * STALLS]
    assert c.stage is Stage.FAILED
    assert f"no round completed through {STALLS} views (atc/none/0)" in c.failure
    assert all(n.phase is Phase.FAILED for n in h.nodes)
    assert all("aborted by the orchestrator: no round" in n.failure for n in h.nodes)
    with pytest.raises(RunFailed, match="no round completed"):
        h.net.play()


def test_keying_that_stalls_once_completes_under_the_next_view() -> None:
    """Key shares to the target lost once: a deadline later the keying is redone under
    view 1 (fresh keys), and the run equals a clean run."""
    h = Harness.build(deadline=30.0)
    inbox = topics.inbox_filter(RUN, TARGET)
    h.lose = lambda _, f: f.category == "keys" and matches(inbox, f.topic)
    h.start()
    assert h.conductor.stage is Stage.CONFIGURING and h.lost
    h.lose = None
    h.advance(30.0)
    assert views(h) == [(0, 1, EVERYONE, "start"), (1, 1, EVERYONE, "stalled")]
    assert_same_models(h.finish(), clean())
    assert h.rejected() == Counter()  # the lost frames never arrived
    h.assert_all_counted()


def test_missing_telemetry_is_reported_as_missed_rounds() -> None:
    """Agent 3's telemetry is lost for good: the session is redone once from its first
    round, then completes; its rounds are NaN and missed."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    h.lose = holding(control.Telemetry, 3)
    (result,) = h.play()
    assert views(h) == [(0, 1, EVERYONE, "start"), (1, 1, EVERYONE, "lost reports")]
    assert result.missed == {3: ROUNDS}
    assert np.isnan(result.models[:, 3]).all() and not np.isnan(result.models[:, :3]).any()
    (want,) = clean([(Strategy.ATC, Scheme.NONE)])
    np.testing.assert_allclose(result.models[:, 4:], want.models[:, 4:], rtol=1e-12)
    h.assert_all_counted()


def test_reports_lost_while_every_member_ran_on_are_redone_at_the_end() -> None:
    """Agent 3's first telemetry batch is lost (a broker down with it while every member
    was held: nothing stalled): once every member finished, the session is redone from the
    first round lacking a report, and the result has every round, equal to a clean run."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    telemetry_of_3, lost = holding(control.Telemetry, 3), []

    def first_batch(topic: str, frame: Publish) -> bool:
        if lost or not telemetry_of_3(topic, frame):
            return False
        lost.append(wire.decode_signed(frame.payload).msg.round)
        return True

    h.lose = first_batch
    (result,) = h.play()
    ((_, _, _, first), (view, start, members, reason)) = views(h)
    assert (first, view, members, reason) == ("start", 1, EVERYONE, "lost reports")
    assert 1 <= start <= lost[0] and result.missed == {}
    assert not np.isnan(result.models).any()
    assert_same_models([result], clean([(Strategy.ATC, Scheme.NONE)]))
    h.assert_all_counted()


def test_without_telemetry_the_run_completes_with_no_models() -> None:
    h = Harness.build([(Strategy.ATC, Scheme.GHP)], telemetry=False)
    (result,) = h.play()
    assert np.isnan(result.models).all() and sorted(result.finished) == list(range(AGENTS))
    assert not h.recorded(control.Telemetry)
    h.assert_all_counted()


def test_without_telemetry_a_long_silent_session_is_not_a_failure() -> None:
    """Running agents say nothing but Progress until Finished when telemetry is off: the
    conductor keeps Beating and waits, however long the session."""
    h = Harness.build([(Strategy.ATC, Scheme.GHP)], telemetry=False)
    h.hold = holding(control.Finished, 3)
    h.start()
    c = h.conductor
    assert c.stage is Stage.RUNNING
    h.advance(600.0)
    assert c.stage is Stage.RUNNING and len(c.membership.views) == 1
    h.release()
    h.finish()
    assert c.stage is Stage.CLOSED


# ---- failures and the end of a run ------------------------------------------------------------


def test_an_agent_that_fails_is_left_out_and_a_split_network_stops_the_run() -> None:
    """Agent 5 fails while running: no view runs without it, since the survivors' graph
    splits ({4, 8} hang on 5): the conductor holds a deadline for it to come back (restarted),
    then fails naming the groups, and every node stops."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    h.when(
        lambda: h.nodes[5].phase is Phase.RUNNING,
        lambda: h.net.router.send("agent-5", h.nodes[5].fail("disk full")),
    )
    h.start()
    c = h.conductor
    assert c.stage is Stage.HOLDING
    h.advance(c.deadline - 1.0)
    assert c.stage is Stage.HOLDING
    h.advance(2.0)
    assert c.stage is Stage.FAILED
    assert "the 9 agents left form 2 disconnected groups [[4, 8], [0, 1, 2, 3, 6, 7, 9]]" in (
        c.failure
    )
    assert c.next_tick() is None and c.current is not None
    assert all(n.phase is Phase.FAILED for n in h.nodes)
    assert all("aborted by the orchestrator: view 1" in n.failure for n in h.nodes[:5])
    assert [e.detail for _, e in h.net.router.events if e.kind == "lost"] == [
        "agent 5: failed: disk full"
    ]
    h.assert_all_counted()
    with pytest.raises(RuntimeError, match="bye in stage failed"):
        c.bye()


def test_abort_stops_every_node_once() -> None:
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    h.when(
        lambda: h.conductor.stage is Stage.RUNNING,
        lambda: h.net.router.send("orchestrator", h.conductor.abort("Ctrl-C")),
    )
    h.start()
    assert h.fired == 1 and h.conductor.failure == "Ctrl-C"
    assert all(n.failure == "aborted by the orchestrator: Ctrl-C" for n in h.nodes)
    assert h.conductor.abort("again") == Output()
    h.assert_all_counted()


def test_after_bye_everything_is_counted_as_closed() -> None:
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    h.play()
    c = h.conductor
    assert c.stage is Stage.CLOSED and c.current is None and c.rounds_done == ROUNDS
    assert c.subscriptions == [f"privnet/{RUN}/ctl/up/+", f"privnet/{RUN}/telemetry/+"]
    for node in h.nodes:
        assert c.receive(*h.up(control.Failed(node.me, "late"), node.me), 0.0) == Output()
    assert c.deliveries.rejected == Counter({"closed": AGENTS})
    assert uncounted(c.deliveries) == 0 and c.abort("late") == Output()


def test_bye_only_when_every_session_is_done() -> None:
    c, _, _ = conductor()
    with pytest.raises(RuntimeError, match="bye in stage registering"):
        c.bye()


def test_a_run_needs_sessions_with_one_spec_per_agent() -> None:
    tokens = {p: bytes(32) for p in range(AGENTS)}
    identity = keys.Identity.generate()
    with pytest.raises(ValueError, match="at least one session"):
        Conductor(RUN, identity, tokens, [])
    with pytest.raises(ValueError, match=f"one spec per agent 0..{AGENTS}"):
        Conductor(RUN, identity, {**tokens, AGENTS: bytes(32)}, plans())


UP_TOPICS = [
    topics.ctl_up(RUN, 0),
    topics.telemetry(RUN, 0),
    topics.ctl_up(RUN, AGENTS),
    topics.ctl_down(RUN, "all"),
]


@settings(derandomize=True, max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(UP_TOPICS), st.binary(max_size=200)), max_size=20))
def test_any_delivery_is_counted_and_never_raises(deliveries: list[Frame]) -> None:
    c, _, _ = conductor(register_deadline=60.0)
    c.start(0.0)
    for topic, payload in deliveries:
        assert c.receive(topic, payload, 1.0) == Output()
    assert c.deliveries.rejected.total() == c.deliveries.received == len(deliveries)
    assert c.stage is Stage.REGISTERING and c.next_tick() == 60.0


def test_a_retained_frame_is_counted_never_used() -> None:
    h = Harness.build()
    topic, payload = h.up(hello()(h), TARGET)
    assert h.conductor.receive(topic, payload, 0.0, retained=True) == Output()
    assert h.conductor.registry.registered == {}
    assert h.conductor.deliveries.rejected == Counter({"retained": 1})


def test_an_agent_silent_after_its_last_finished_costs_only_its_left() -> None:
    """The results are complete once every Finished is in: a missing Left ends the closing
    at the deadline, with the run done and the missing agent known."""
    h = Harness.build()
    h.hold = lambda publisher, frame: (
        publisher == f"agent-{TARGET}"
        and frame.category == ("control")
        and isinstance(wire.decode_signed(frame.payload).msg, control.Left)
    )
    h.start()
    c = h.conductor
    assert (
        c.stage is Stage.CLOSING
        and TARGET not in c.collection.farewells
        and len(c.collection.farewells) == c.agents - 1
    )
    wake = c.liveness.deadline_at()
    assert c.tick(wake - 1).events == [] and c.stage is Stage.CLOSING  # only a Beat
    assert c.tick(wake).events == [Event("done")]
    assert c.stage is Stage.DONE and len(c.results) == 1
    with pytest.raises(RuntimeError, match="never unsubscribes"):
        c.unsubscribed(topics.inbox_filter(RUN, 0), wake)


# ---- membership: crashed, silent, returning and restarted agents; stalls ---------------------

VICTIM = 3  # not a cut vertex of seed 34's graph: its neighbours 2 and 7 are hubs
LONG = 8  # rounds: room for a fault mid-run
LATE = 2 * TELEMETRY_BATCH  # rounds: room for a fault after a telemetry batch went out


def survivors(without: int = VICTIM) -> list[int]:
    return [m for m in range(AGENTS) if m != without]


def at_round(h: Harness, agent: int, rounds: int) -> Callable[[], bool]:
    """`agent` has completed `rounds` rounds of the current view."""

    def ready() -> bool:
        session = h.nodes[agent].session
        return session is not None and session.core.round > rounds

    return ready


def held_rounds(h: Harness, view: int) -> dict[int, int]:
    """Each agent's held Progress round in `view` (the round it stopped at)."""
    return {
        msg.agent: msg.round
        for _, msg in h.decoded
        if isinstance(msg, control.Progress) and msg.held and msg.view == view
    }


def replayed(h: Harness) -> list:
    """The same plans played in memory, applying the run's recorded views."""
    return Network.build(h.conductor.plans, script=h.conductor.membership.views).play()


def assert_replay_matches(h: Harness, got: list, agents: list[int] | None = None) -> None:
    """Every model the run reported equals the replay's, to RTOL of the largest."""
    want = replayed(h)
    for mine, theirs in zip(got, want, strict=True):
        a = mine.models if agents is None else mine.models[:, agents]
        b = theirs.models if agents is None else theirs.models[:, agents]
        kept = ~np.isnan(a)
        assert kept.any() and not np.isnan(b[kept]).any()
        gap = np.max(np.abs(a[kept] - b[kept]))
        assert gap <= RTOL * np.max(np.abs(b[kept])), (mine.label, gap)


@pytest.mark.parametrize(
    "session",
    [(Strategy.ATC, scheme) for scheme in Scheme] + [(Strategy.CONSENSUS, Scheme.LOCAL_GHP)],
    ids=str,
)
def test_a_crashed_agent_is_left_out_and_the_replay_reproduces_the_run(
    session: tuple[Strategy, Scheme],
) -> None:
    """Agent 3 dies (kill -9) after 13 rounds, its first telemetry batch (rounds 1-10) in
    and rounds 11-13 still unsealed: the survivors hold, a view without it runs from round
    11 (not from the slowest survivor's round + 1: rounds 11-13 lack its report), the run
    completes, and the memory engine replaying the recorded views gives the same models."""
    h = Harness.build([session], rounds=LATE)
    h.when(at_round(h, VICTIM, 13), lambda: h.crash(VICTIM))
    (result,) = h.play()
    c = h.conductor
    first, second = c.membership.views
    assert (first.view, first.members, first.reason) == (0, EVERYONE, "start")
    assert (second.view, second.members, second.reason) == (1, tuple(survivors()), "lost")
    assert second.left == {VICTIM: "crashed"}
    assert min(held_rounds(h, 0).values()) >= 13 and second.start == TELEMETRY_BATCH + 1
    assert second.resume == {m: second.start - 1 for m in survivors()}
    assert not np.isnan(result.models[:, survivors()]).any()
    assert result.missed == {VICTIM: LATE - TELEMETRY_BATCH}  # its last batch never left it
    assert_whole_rounds(result.models, c.membership.views)
    assert sorted(result.finished) == survivors()
    assert all(result.finished[m].view == 1 for m in survivors())
    assert_replay_matches(h, [result])
    h.assert_all_counted()


@pytest.mark.parametrize("stop", [False, True], ids=["killed", "stopped"])
def test_a_lost_members_unsealed_rounds_are_redone_without_it(stop: bool) -> None:
    """Agent 3 is killed, or stopped (SIGSTOP) and left out for its silence, in round 17:
    its reports of rounds 11-16 were never sealed. On the old rule they stood under view
    0 with the survivors' reports only (metrics then held the survivors' MSD, not the
    network's); now view 1 redoes them without it, and every round equals the replay."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)], rounds=LATE)
    hit = h.stop if stop else h.crash
    h.when(at_round(h, VICTIM, 16), lambda: hit(VICTIM))
    h.start()
    h.advance(h.conductor.deadline)
    (result,) = h.finish()
    c = h.conductor
    assert [(v.start, v.reason) for v in c.membership.views] == [(1, "start"), (11, "lost")]
    assert_whole_rounds(result.models, c.membership.views)
    assert np.isnan(result.models[TELEMETRY_BATCH:, VICTIM]).all()
    assert not np.isnan(result.models[:TELEMETRY_BATCH, VICTIM]).any()
    assert c.membership.pauses[0]["rounds_redone"] >= 16 - TELEMETRY_BATCH
    assert_replay_matches(h, [result])


def test_without_telemetry_a_loss_redoes_no_round_that_every_member_completed() -> None:
    """No reports to wait for: the next view starts after the slowest survivor's round."""
    h = Harness.build(rounds=LONG, telemetry=False)
    h.when(at_round(h, VICTIM, 5), lambda: h.crash(VICTIM))
    h.play()
    (_, second) = h.conductor.membership.views
    assert second.start == min(held_rounds(h, 0).values()) + 1 > 5


def test_a_silent_agent_is_excluded_by_the_silence_rule() -> None:
    """Agent 3 stops (SIGSTOP) after 2 rounds: a deadline after its last frame the
    conductor leaves it out; the survivors complete."""
    h = Harness.build(rounds=LONG)
    h.when(at_round(h, VICTIM, 2), lambda: h.stop(VICTIM))
    h.start()
    c = h.conductor
    assert c.stage is Stage.RUNNING and f"agent-{VICTIM}" in h.stopped
    last = h.clock.now  # nothing was ticked yet: its last frame came now
    assert c.liveness.deadline_at() == last + 30.0  # its silence is the oldest (`_oldest_heard`)
    h.advance(29.0)
    assert len(c.membership.views) == 1
    h.advance(1.0)
    assert c.stage is Stage.DONE and h.clock.now == last + 30.0
    (_, view) = c.membership.views
    assert view.members == tuple(survivors()) and view.left == {VICTIM: "silent for 30 s"}
    assert not np.isnan(c.results[0].models[:, survivors()]).any()
    assert_replay_matches(h, c.results, survivors())
    h.finish()
    h.assert_all_counted()


def test_a_conductor_that_could_not_hear_gives_the_agents_a_fresh_deadline() -> None:
    """After its own broker outage (the shell says `deaf`), agent 3's silence counts from
    then: it is left out a whole deadline later, not at once; its Failed, arriving after
    it is out, changes nothing."""
    h = Harness.build(rounds=LONG)
    h.when(at_round(h, VICTIM, 2), lambda: h.stop(VICTIM))
    h.start()
    c = h.conductor
    h.advance(25.0)
    assert c.deaf(h.clock.now) == Output()
    assert c.liveness.deadline_at() == h.clock.now + 30.0  # every silence starts again now
    h.advance(29.0)
    assert len(c.membership.views) == 1
    h.advance(1.0)
    assert [v.reason for v in c.membership.views] == ["start", "lost"]
    failed = h.up(control.Failed(VICTIM, "the orchestrator has been silent"), VICTIM)
    c.receive(*failed, h.clock.now)
    assert c.stage is not Stage.FAILED
    h.finish()


def pause_from(h: Harness, view: int, round_: int) -> None:
    """Hold every model frame of `view` from `round_` on: the members stop there, running."""

    def selected(_: str, frame: Publish) -> bool:
        place = model_place(frame)
        return place is not None and place[0] == view and place[1] >= round_

    h.hold = selected


def excluded_while_stopped() -> Harness:
    """Agent 3 stopped in round 2 and left out for its silence; the others paused in round 6."""
    h = Harness.build(rounds=LONG)
    h.when(at_round(h, VICTIM, 2), lambda: h.stop(VICTIM))
    pause_from(h, 1, 6)
    h.start()
    h.advance(30.0)
    return h


def test_an_excluded_agent_that_comes_back_rejoins_at_a_later_view() -> None:
    """Agent 3 stops, is excluded (view 1); the survivors are paused in round 6; agent 3
    continues: it reads its Excluded, asks back in (Rejoin) and is a member of view 2 from
    the last round before its exclusion whose model it holds. The replay agrees."""
    h = excluded_while_stopped()
    c = h.conductor
    assert [v.reason for v in c.membership.views] == ["start", "lost"] and c.stage is Stage.RUNNING
    excluded_at = c.membership.views[1].start
    h.resume(VICTIM)
    # told once, and again if a heartbeat of its old view crossed the first
    excluded = {m for _, m in h.decoded if isinstance(m, control.Excluded)}
    (rejoin,) = [m for _, m in h.decoded if isinstance(m, control.Rejoin)]
    assert excluded == {control.Excluded(VICTIM, 0, 1)} and rejoin.session == 0
    back = c.membership.views[2]
    assert (back.view, back.reason, back.members, back.start) == (2, "returned", EVERYONE, 6)
    # it ran on past its exclusion (the frames that waited for it): that branch is void
    assert max(rejoin.rounds) >= excluded_at
    assert back.resume[VICTIM] == max(r for r in rejoin.rounds if r < excluded_at)
    assert back.resume[VICTIM] == excluded_at - 1
    assert all(back.resume[m] == 5 for m in survivors())
    h.release()
    (result,) = h.finish()
    assert not np.isnan(result.models[5:]).any()  # everyone reported rounds 6 on
    assert result.missed[VICTIM] >= 1 and set(result.missed) == {VICTIM}
    assert_replay_matches(h, [result])
    # the held frames of view 1, its view-0 telemetry past view 1's start, Hold again
    assert set(h.rejected()) <= {"stale-view", "out-of-phase"}
    h.assert_all_counted()


def is_excluded(topic: str, payload: bytes) -> bool:
    control_frame = topics.parse_peer_topic(topic) is None
    return control_frame and isinstance(wire.decode_signed(payload).msg, control.Excluded)


def test_an_excluded_agent_that_missed_its_excluded_is_told_again() -> None:
    """Agent 3's Excluded is lost while it is stopped (a broker restart drops it): when it
    continues, its heartbeats name an old view, the conductor tells it again, and it
    rejoins as if the first had arrived."""
    h = excluded_while_stopped()
    c = h.conductor
    assert [v.reason for v in c.membership.views] == ["start", "lost"]
    waiting = h.stopped[f"agent-{VICTIM}"]
    kept = [(t, p) for t, p in waiting if not is_excluded(t, p)]
    assert len(kept) < len(waiting)  # the Excluded is gone
    waiting[:] = kept
    h.resume(VICTIM)
    h.advance(c.deadline / 3 + 1.0)  # a heartbeat of view 0
    assert [v.reason for v in c.membership.views] == ["start", "lost", "returned"]
    h.release()
    (result,) = h.finish()
    assert_replay_matches(h, [result])
    h.assert_all_counted()


@pytest.mark.parametrize("checkpoint", [False, True], ids=["no-checkpoint", "checkpoint"])
def test_a_restarted_agent_registers_again_and_rejoins(checkpoint: bool) -> None:
    """Agent 3 dies after 4 rounds and is started again (new process, new identity, same
    launch token, rejoin): it says Hello, is welcomed as late, Rejoins and runs from its
    checkpoint (every 2 rounds) or, without one, from its initial model."""
    h = Harness.build(rounds=LONG, checkpoint_every=2)
    saved: list[Checkpoint] = []

    def crash() -> None:
        old = h.nodes[VICTIM].session
        assert old is not None
        kept = {r: w for r, w in old.history.items() if r % 2 == 0}
        saved.append(Checkpoint(RUN, VICTIM, 0, kept))
        h.crash(VICTIM)

    h.when(at_round(h, VICTIM, 4), crash)
    pause_from(h, 1, 7)
    h.start()
    c = h.conductor
    assert [v.reason for v in c.membership.views] == ["start", "lost"]
    excluded_at = c.membership.views[1].start
    node = h.restart(VICTIM, saved[0] if checkpoint else None)
    assert (
        node is not h.retired[0] and c.registry.registered[VICTIM].identity == node.identity.public
    )
    (welcome,) = [m for _, m in h.decoded if isinstance(m, control.Welcome) and m.rejoin]
    assert welcome.agent == VICTIM
    back = c.membership.views[2]
    assert (back.reason, back.members, back.start) == ("returned", EVERYONE, 7)
    want = max(r for r in saved[0].models if r < excluded_at) if checkpoint else 0
    assert back.resume[VICTIM] == want
    h.release()
    (result,) = h.finish()
    assert not np.isnan(result.models[6:]).any()
    assert_replay_matches(h, [result])
    h.assert_all_counted()


def lose_models_to(h: Harness, agent: int, round_: int, view: int = 0) -> None:
    inbox = topics.inbox_filter(RUN, agent)

    def selected(_: str, frame: Publish) -> bool:
        if not matches(inbox, frame.topic):
            return False
        return model_place(frame) == (view, round_)

    h.lose = selected


@pytest.mark.parametrize("scheme", [Scheme.GHP, Scheme.LOCAL_GHP], ids=str)
def test_a_stalled_round_is_redone_under_a_new_view_and_equals_a_clean_run(
    scheme: Scheme,
) -> None:
    """Round 2's models to agent 8 are lost: a deadline later, a new view with the same
    members redoes round 2 on; the models are a clean run's."""
    h = Harness.build([(Strategy.ATC, scheme)])
    lose_models_to(h, 8, 2)
    h.start()
    assert h.conductor.stage is Stage.RUNNING and h.lost
    h.advance(10.0)  # heartbeats: agent 8 completed round 1, the slowest moved
    assert len(h.conductor.membership.views) == 1
    h.advance(30.0)
    assert views(h) == [(0, 1, EVERYONE, "start"), (1, 2, EVERYONE, "stalled")]
    assert_same_models(h.finish(), clean([(Strategy.ATC, scheme)]))
    h.assert_all_counted()


def test_a_lost_telemetry_batch_is_redone_by_the_next_view() -> None:
    """Agent 5's first telemetry batch (rounds 1-10) is lost, as with a broker that goes
    down holding it; round 15 stalls at agent 8. The next view starts at round 1, the first
    round missing a member's report, not after the slowest member's last: every round that
    stands has every member's report, and the models are a clean run's."""
    h = Harness.build(rounds=25)
    lost: list[int] = []

    def selected(publisher: str, frame: Publish) -> bool:
        if frame.category == "telemetry" and frame.topic == topics.telemetry(RUN, 5) and not lost:
            lost.append(1)
            return True
        return lose_15_to_8(publisher, frame)

    lose_models_to(h, 8, 15)
    lose_15_to_8 = h.lose
    h.lose = selected
    h.start()
    h.advance(40.0)
    assert lost and views(h) == [(0, 1, EVERYONE, "start"), (1, 1, EVERYONE, "stalled")]
    (result,) = h.finish()
    assert result.missed == {}
    assert_same_models([result], Harness.build(rounds=25).play())
    h.assert_all_counted()


def test_a_finished_a_later_view_voids_gives_its_rejections_back() -> None:
    """Agent 1 drops two junk frames and finishes; agent 8 is stuck in the last round (its
    models lost), so a new view redoes it: agent 1's second Finished reports the two junk
    frames again (the first is void), and every delivery is counted once."""
    h = Harness.build()
    lose_models_to(h, 8, ROUNDS)
    junk = topics.peer_topic(RUN, 1, 7)

    def send_junk() -> None:
        for _ in range(2):
            inject(h.net.router, junk, b"\xc1")

    h.when(lambda: h.nodes[1].phase is Phase.RUNNING, send_junk)
    h.start()
    first = [m for _, m in h.decoded if isinstance(m, control.Finished) and m.agent == 1]
    assert [f.rejected for f in first] == [{"malformed": 2}]
    h.advance(40.0)
    assert views(h)[1] == (1, ROUNDS, EVERYONE, "stalled")
    (result,) = h.finish()
    assert result.finished[1].view == 1 and result.finished[1].rejected == {"malformed": 2}
    assert result.totals("rejected") == {"malformed": 2}
    assert_same_models([result], clean())
    h.assert_all_counted()


def test_a_member_lost_while_keying_is_left_out_of_the_next_view() -> None:
    """Agent 3 dies while the others agree keys (view 0 configuring): view 1 starts at
    round 1 without it, with fresh keys; the replay agrees."""
    h = Harness.build(rounds=LONG)
    h.when(
        lambda: h.conductor.stage is Stage.CONFIGURING and h.nodes[0].phase is Phase.KEYED,
        lambda: h.crash(VICTIM),
    )
    (result,) = h.play()
    assert views(h) == [(0, 1, EVERYONE, "start"), (1, 1, tuple(survivors()), "lost")]
    assert result.missed == {VICTIM: LONG}
    assert_replay_matches(h, [result], survivors())
    h.assert_all_counted()


def test_progress_and_rejoin_of_an_unregistered_agent_are_refused() -> None:
    h = Harness.build()
    c = h.conductor
    for msg in (control.Progress(TARGET, 0, 0, 0, False, ()), control.Rejoin(TARGET, -1, ())):
        assert c.receive(*h.up(msg, TARGET), 0.0) == Output()
    assert c.deliveries.rejected == Counter({"unregistered": 2}) and not c.registry.registered


def test_a_view_roundtrips_through_json_and_describes_itself() -> None:
    view = View(0, 2, 6, (0, 1, 3), "returned", {0: 5, 1: 5, 3: 3}, {2: "crashed"})
    assert View.from_json(json.loads(json.dumps(view.to_json()))) == view
    assert describe(view) == (
        "session 0 view 2 from round 6: returned; 3 members; out: 2 (crashed); "
        "back: 3 (from round 3)"
    )


def test_an_agent_lost_during_registration_fails_the_run() -> None:
    c, tokens, _ = conductor()
    c.start(0.0)
    c.receive(*signed_hello(0, tokens[0], keys.Identity.generate()), 1.0)
    assert c.lost(1, "never started", 2.0) == Output()  # not registered: not alive
    out = c.lost(0, "exited with code 1", 2.0)
    assert c.stage is Stage.FAILED and out.events[-1].kind == "failed"
    assert c.failure == "agent 0 lost during registration: exited with code 1"


def test_a_member_lost_after_the_last_round_leaves_nothing_to_redo() -> None:
    """Every round done (agent 8's Finished still on its way) when agent 3 is lost: no
    view is needed, and its Finished, already in, stands."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    h.hold = holding(control.Finished, 8)
    h.start()
    c = h.conductor
    assert c.stage is Stage.RUNNING and c.rounds_done == ROUNDS
    h.crash(VICTIM)
    h.net.router.drain()
    assert (
        c.stage is Stage.RUNNING
        and len(c.membership.views) == 1
        and VICTIM not in c.membership.members
    )
    (result,) = h.finish()
    assert sorted(result.finished) == list(EVERYONE) and not np.isnan(result.models).any()


@pytest.mark.parametrize("left", [1, 0])
def test_a_network_of_one_or_none_stops(left: int) -> None:
    """With none left (a 1000-agent run lost them all at once) no graph is drawn: the run
    waits a deadline for anyone to come back, then stops saying so."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)], rounds=LONG)

    def crash() -> None:
        for m in range(left, AGENTS):
            h.crash(m)

    h.when(at_round(h, 0, 2), crash)
    h.start()
    h.advance(60.0)
    c = h.conductor
    assert c.stage is Stage.FAILED
    assert c.failure.startswith(
        f"{left} agent(s) left in atc/none/0 (view 1): a network needs two"
    ), c.failure


def test_a_session_without_view_specs_cannot_change_membership() -> None:
    h = Harness.build([(Strategy.ATC, Scheme.NONE)], rounds=LONG)
    h.conductor.plans[0] = dataclasses.replace(h.conductor.plans[0], view_specs=None)
    h.when(at_round(h, VICTIM, 2), lambda: h.crash(VICTIM))
    h.start()
    c = h.conductor
    assert c.stage is Stage.FAILED
    assert "view 1 of atc/none/0: this session cannot change membership" in c.failure


def test_a_resumed_sessions_bytes_and_speed_cover_the_rounds_it_ran(tmp_path: Path) -> None:
    """A session `privnet run --resume` went on with from round 11 of 20: its agents' counts
    and its wall are those of rounds 11-20 (the first run's died with it), so bytes per
    round and rounds/s are over 10 rounds, not 20; the journal keeps what says so."""
    (whole,) = Harness.build(rounds=20).play()
    resumed = View(0, 0, 11, EVERYONE, "resumed", {m: 10 for m in EVERYONE})
    journal.begin(tmp_path, problem(20).config, "{}", secret_seed=False)
    journal.session_done(tmp_path, 0, dataclasses.replace(whole, views=[resumed], wall=2.0))
    _, (loaded,), _, _ = journal.load(tmp_path)
    assert loaded.views == [resumed] and loaded.counted == 10
    extra = results_curve(problem(20), "atc", "local-ghp", [loaded]).extra
    sent = sum(n for kind, n in whole.totals("bytes").items() if kind != "control")
    assert extra["rounds_counted"] == 10 and extra["bytes_per_round"] == sent / 10
    assert results_curve(problem(20), "atc", "local-ghp", [loaded]).rounds_per_s == 10 / 2.0
    assert results_curve(problem(20), "atc", "local-ghp", [whole]).extra["rounds_counted"] == 20

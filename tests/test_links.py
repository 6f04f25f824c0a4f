"""Sealed links (privnet/agent/links.py, the sealed frames of privnet/agent/wire/sealed.py): what
the wire shows, one crafted frame per rejection reason, nonces that never repeat, and a flood of
hostile frames of every kind during a run that changes nothing."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import msgpack
import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from hypothesis import given, settings
from hypothesis import strategies as st
from runs import RUN, Harness, assert_same_models, clean

from privnet.agent import keys, topics, wire
from privnet.agent.links import Links
from privnet.agent.messages import KeyPlan, KeyShare, Model, Rejected
from privnet.agent.phases import Phase
from privnet.agent.protocol import Publish
from privnet.agent.spec import STEPS, Rekey, Scheme, Strategy
from privnet.agent.wire import catalog, frames, schema
from privnet.agent.wire import sealed as sealing
from privnet.orchestrator.engines.memory import Network
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_plans

KEY, OTHER_KEY = bytes(range(32)), bytes(range(1, 33))
ME, PEER, DIM, VIEW = 5, 3, 2, 4
FUZZ = settings(derandomize=True, max_examples=100, deadline=None)


def pair(sealed: bool = True) -> tuple[Links, Links]:
    """The two ends of the link PEER <-> ME."""
    return (
        Links(RUN, PEER, DIM, VIEW, {ME: KEY}, sealed=sealed),
        Links(RUN, ME, DIM, VIEW, {PEER: KEY}, sealed=sealed),
    )


def model(round_: int = 7, step: int = 2, vector: tuple[float, ...] = (0.25, -1.5)) -> Model:
    return Model(PEER, ME, round_, step, np.array(vector), VIEW)


SHARE = KeyShare(PEER, ME, PEER, ME, 9, 2, 0, bytes(range(32)), bytes(64), VIEW)
PLAN = KeyPlan(PEER, ME, 2, -1, (1, 2), VIEW)
EMPTY_HEAD = b"\x94" + bytes([wire.VERSION]) + b"\xa5model\xc4\x00\xc4\x00"  # a model frame


def reseal(frame: bytes, **head: object) -> bytes:
    """`frame` with fields of its clear head changed, its box as it was."""
    _, name, raw, box = msgpack.unpackb(frame)
    fields = msgpack.unpackb(raw) | head
    return msgpack.packb([wire.VERSION, name, msgpack.packb(fields), box])


# ---- what goes over the wire --------------------------------------------------------------


@pytest.mark.parametrize("msg", [model(), SHARE, PLAN], ids=lambda m: type(m).__name__)
def test_every_peer_message_roundtrips_sealed(msg: wire.Peer) -> None:
    sender, receiver = pair()
    back = receiver.decode(sender.encode(msg), PEER)
    assert type(back) is type(msg)
    for field in dataclasses.fields(msg):
        a, b = getattr(back, field.name), getattr(msg, field.name)
        assert np.array_equal(a, b) if isinstance(b, np.ndarray) else a == b, field.name


@pytest.mark.parametrize("msg", [model(), SHARE, PLAN], ids=lambda m: type(m).__name__)
def test_a_sealed_frame_shows_who_when_and_no_value(msg: wire.Peer) -> None:
    """Its head: sender, receiver, view, and a model's round and step; nothing of the
    vector, the key, the signature, the plan; no one reads it without the key."""
    frame = pair()[0].encode(msg)
    _, name, raw, _ = msgpack.unpackb(frame)
    head = msgpack.unpackb(raw)
    assert name == frames.schema_of(msg, catalog.PEER, "").name
    expected = {"s", "r", "i", "j", "v"} if isinstance(msg, Model) else {"s", "r", "v", "n"}
    assert set(head) == expected
    secrets = [msg.vector.tobytes()] if isinstance(msg, Model) else []
    secrets += [msg.public, msg.signature] if isinstance(msg, KeyShare) else []
    for value in secrets:
        assert value not in frame
    with pytest.raises(Rejected) as caught:
        wire.peek_peer(frame, DIM)
    assert caught.value.reason == "sealed"


def test_the_sealed_wire_costs_what_the_visible_one_does() -> None:
    """A model frame: the AEAD tag replaces the MAC, the head and box the body."""
    sealed, visible = pair()[0].encode(model()), pair(sealed=False)[0].encode(model())
    assert abs(len(sealed) - len(visible)) <= 2


@given(
    sender=st.integers(0, 2**32 - 1),
    receiver=st.integers(0, 2**32 - 1),
    round_=st.integers(0, 2**64 - 1),
    step=st.sampled_from(STEPS),
    view=st.integers(0, 2**64 - 1),
    vector=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=40),
)
@FUZZ
def test_the_fast_model_path_builds_the_generic_paths_bytes(
    sender: int, receiver: int, round_: int, step: int, view: int, vector: list[float]
) -> None:
    """Both seal the same bytes, and the generic opener reads what the fast one does."""
    msg = Model(sender, receiver, round_, step, np.array(vector), view)
    aead = ChaCha20Poly1305(KEY)
    fast = wire.seal_peer(msg, aead, RUN)
    kind = catalog.PEER["model"]
    head_fields, secret_fields = sealing.SEALED["model"]
    fields = schema.encode_fields(msg, kind.fields)
    raw = frames.pack({f.key: fields[f.key] for f in head_fields})
    head = wire.Head(kind, {f.name: fields[f.key] for f in head_fields}, raw, b"")
    plain = frames.pack({f.key: fields[f.key] for f in secret_fields})
    box = aead.encrypt(head.nonce, plain, sealing.associated(RUN, "model", raw))
    assert fast == frames.pack([wire.VERSION, "model", raw, box])
    opened = wire.open_head(wire.read_head(fast, 1 << 20), aead, RUN, len(vector))
    assert isinstance(opened, Model) and opened.round == round_
    np.testing.assert_array_equal(opened.vector, msg.vector)


def test_read_opens_a_frame_of_either_direction() -> None:
    a, b = pair()
    assert isinstance(b.read(a.encode(model())), Model)
    back = Model(ME, PEER, 7, 2, np.array([1.0, 2.0]), VIEW)
    assert isinstance(b.read(b.encode(back)), Model)


# ---- one crafted frame per reason -----------------------------------------------------------

GOOD = pair()[0].encode(model())
WRONG_KEY = Links(RUN, PEER, DIM, VIEW, {ME: OTHER_KEY}).encode(model())
CASES: list[tuple[str, bytes, str]] = [
    ("bad-seal", WRONG_KEY, "seal failed"),
    ("bad-seal", reseal(GOOD, i=8), "seal failed"),  # round changed: nonce and AD
    ("bad-seal", reseal(GOOD, j=1), "seal failed"),  # step changed
    ("bad-seal", GOOD[:-1] + bytes([GOOD[-1] ^ 1]), "seal failed"),  # the box altered
    ("bad-seal", wire.seal_peer(model(), ChaCha20Poly1305(KEY), "other-run"), "seal failed"),
    ("spoofed", reseal(GOOD, s=4), "claims sender 4"),
    ("wrong-receiver", reseal(GOOD, r=6), "is for agent 6"),
    ("stale-view", reseal(GOOD, v=VIEW - 1), "frame of view 3"),
    ("ahead-view", reseal(GOOD, v=VIEW + 1), "frame of view 5"),
    ("unsealed", wire.encode_peer(model(), KEY), "in the clear on a sealed link"),
    ("schema", reseal(GOOD, x=1), "unknown field"),
    ("malformed", b"\xc1", "not valid msgpack"),
    ("oversized", bytes(wire.MAX_PEER_BYTES + 1), "the limit"),
]


@pytest.mark.parametrize(("reason", "frame", "detail"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_sealed_frame_is_rejected_for_its_reason(
    reason: str, frame: bytes, detail: str
) -> None:
    receiver = pair()[1]
    with pytest.raises(Rejected) as caught:
        receiver.decode(frame, PEER)
    assert caught.value.reason == reason and detail in caught.value.detail
    assert isinstance(receiver.decode(GOOD, PEER), Model)  # the genuine one still passes


def test_unknown_sender_has_no_key() -> None:
    frame = Links(RUN, 4, DIM, VIEW, {ME: KEY}).encode(Model(4, ME, 7, 2, np.zeros(DIM), VIEW))
    with pytest.raises(Rejected) as caught:
        pair()[1].decode(frame, 4)
    assert caught.value.reason == "unknown-sender"


@pytest.mark.parametrize("msg", [model(), SHARE], ids=lambda m: type(m).__name__)
def test_a_replayed_or_reused_nonce_is_a_replay(msg: wire.Peer) -> None:
    """Once a frame's place is taken, the same frame again, or another frame at that
    place (the same nonce: what a sender reusing one would send), is a replay; a frame
    before it too. Only authentic frames take a place."""
    sender, receiver = pair()
    first = sender.encode(msg)
    receiver.decode(first, PEER)
    reused = (
        sender.encode(dataclasses.replace(msg, vector=np.ones(DIM)))
        if isinstance(msg, Model)
        else wire.seal_peer(msg, ChaCha20Poly1305(KEY), RUN, seq=0)
    )
    for again in (first, reused):
        with pytest.raises(Rejected) as caught:
            receiver.decode(again, PEER)
        assert caught.value.reason == "replay"
    forged_ahead = reseal(first, **({"i": 9} if isinstance(msg, Model) else {"n": 5}))
    with pytest.raises(Rejected):
        receiver.decode(forged_ahead, PEER)  # bad-seal: it moves nothing on
    later = dataclasses.replace(msg, round=8) if isinstance(msg, Model) else msg
    assert type(receiver.decode(sender.encode(later), PEER)) is type(msg)


def test_the_seal_key_is_bound_to_link_session_and_view() -> None:
    a, b = keys.Identity.generate(), keys.Identity.generate()
    session = bytes(16)
    key = keys.link_key(a, b.public, session, 1, 2, view=0)
    assert key == keys.link_key(b, a.public, session, 2, 1, view=0)
    others = {
        keys.link_key(a, b.public, session, 1, 2, view=1),
        keys.link_key(a, b.public, bytes(15) + b"\1", 1, 2, view=0),
        keys.link_key(a, b.public, session, 1, 3, view=0),
        keys.link_key(a, b.public, session, 1, 2),  # the visible wire's MAC key
    }
    assert key not in others and len(others) == 4


# ---- a whole run ----------------------------------------------------------------------------


def recorded_run(rekey: Rekey) -> tuple[list[Publish], dict[tuple[int, int], bytes]]:
    """A local-ghp run in memory (every frame kind, with every-round re-keying a key frame
    every round), its peer frames and each link's escrowed seal key."""
    c = ExperimentConfig(agents=8, iters=6, seed=3, rekey=rekey, radius=0.6)
    frames: list[Publish] = []

    def tap(_: str, frame: Publish) -> None:
        if topics.parse_peer_topic(frame.topic) is not None:
            frames.append(frame)

    plans = session_plans(Instance.build(c), [(Strategy.ATC, Scheme.LOCAL_GHP, 0)])
    network = Network.build(plans, tap=tap, escrow=True)
    network.play()
    (escrowed,) = network.conductor.collection.link_keys.values()
    return frames, escrowed


@pytest.mark.parametrize("rekey", list(Rekey), ids=str)
def test_no_nonce_repeats_under_a_key_in_a_run(rekey: Rekey) -> None:
    frames, escrowed = recorded_run(rekey)
    used: Counter[tuple[bytes, bytes]] = Counter()
    kinds: Counter[str] = Counter()
    for frame in frames:
        head = wire.read_head(frame.payload)
        link = (min(head.sender, head.receiver), max(head.sender, head.receiver))
        used[(escrowed[link], head.nonce)] += 1
        kinds[head.schema.name] += 1
    assert set(kinds) == {"model", "keyplan", "keyshare"}
    assert max(used.values()) == 1


def test_no_model_value_or_key_is_in_any_frame() -> None:
    """Every masked model, ephemeral key and signature a run sent: none of their bytes in
    any frame (each vector entry checked as its own 8 bytes)."""
    frames, escrowed = recorded_run(Rekey.ONCE)
    secrets: set[bytes] = set()
    for frame in frames:
        head = wire.read_head(frame.payload)
        link = (min(head.sender, head.receiver), max(head.sender, head.receiver))
        msg = wire.open_head(head, ChaCha20Poly1305(escrowed[link]), "memory", DIM)
        if isinstance(msg, Model):
            secrets |= {msg.vector[k : k + 1].tobytes() for k in range(DIM)}
        elif isinstance(msg, KeyShare):
            secrets |= {msg.public, msg.signature}
    wire_bytes = b"".join(f.payload for f in frames)
    assert len(secrets) > 100
    assert not [s for s in secrets if s in wire_bytes]


def hostile_frames(h: Harness, target: int) -> Callable[[], list[tuple[str, bytes, str]]]:
    """Per genuine frame into `target` so far, one of each kind, with the reason it
    earns: replayed, its nonce reused, its head tampered with, of another view (kept for a
    Setup that never comes, then dropped), under a wrong key, unsealed, junk."""

    def build() -> list[tuple[str, bytes, str]]:
        wrong = ChaCha20Poly1305(OTHER_KEY)
        out = []
        for frame in h.peer_frames():
            peer = topics.parse_peer_topic(frame.topic)
            if peer is None or peer[1] != target or frame.category != "model":
                continue
            sender, head = peer[2], wire.read_head(frame.payload)
            msg = h.read(frame)
            assert isinstance(msg, Model)
            session = h.nodes[target].session
            assert session is not None
            genuine = ChaCha20Poly1305(session.links.keys[sender])
            other_value = dataclasses.replace(msg, vector=msg.vector + 1.0)
            out += [
                (frame.topic, frame.payload, "replay"),
                (frame.topic, wire.seal_peer(other_value, genuine, RUN), "replay"),  # nonce reused
                (frame.topic, reseal(frame.payload, i=head.fields["round"] + 9), "bad-seal"),
                (frame.topic, reseal(frame.payload, s=(sender + 1) % 10), "spoofed"),
                (frame.topic, reseal(frame.payload, v=1), "no-session"),  # kept for view 1
                (
                    frame.topic,
                    wire.seal_peer(dataclasses.replace(msg, round=99), wrong, RUN),
                    "bad-seal",
                ),
                (frame.topic, wire.encode_peer(msg, OTHER_KEY), "unsealed"),
                (frame.topic, EMPTY_HEAD, "malformed"),
            ]
        return out

    return build


def test_a_flood_of_hostile_frames_during_a_run_changes_nothing() -> None:
    """10,000 hostile frames into one agent's inbox while it runs, built from the genuine
    frames it received: each counted under its own reason, the models a clean run's."""
    h = Harness.build()
    target = 0
    node = h.nodes[target]
    build = hostile_frames(h, target)
    expected: Counter[str] = Counter()

    def flood() -> None:
        kinds = build()
        assert kinds, "no genuine frame reached the target yet"
        for n in range(10_000):
            topic, payload, reason = kinds[n % len(kinds)]
            h.deliver(node, topic, payload)
            expected[reason] += 1

    def running() -> bool:
        return (
            node.phase is Phase.RUNNING
            and node.session is not None
            and node.session.core.round >= 2
        )

    h.when(running, flood)
    results = h.play()
    assert h.fired == 1
    assert node.rejected == expected
    h.assert_all_counted()
    assert_same_models(results, clean())

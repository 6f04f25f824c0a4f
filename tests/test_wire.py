"""The wire codec: exact roundtrips, one crafted payload per rejection reason, and fuzzing."""

from __future__ import annotations

import dataclasses
import hmac
import math
import struct
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from privnet.agent import keys, wire
from privnet.agent.control import (
    Abort,
    Bye,
    Config,
    Control,
    Excluded,
    Failed,
    Finished,
    Go,
    Hello,
    Hold,
    Progress,
    Ready,
    Rejoin,
    Setup,
    Telemetry,
    Welcome,
)
from privnet.agent.messages import KeyPlan, KeyShare, Model, Rejected, Report
from privnet.agent.problems import Linear, Share
from privnet.agent.spec import AgentSpec, Rekey, Scheme, StepPlan
from privnet.agent.wire import catalog, frames, mac
from privnet.agent.wire import model as fastpath

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
ME, PEER = 5, 3  # this agent, and the neighbour whose topic a message arrives on
DIM = 2
SESSION = bytes.fromhex("00112233445566778899aabbccddeeff")
Edit = Callable[[dict[Any, Any]], None]
FUZZ = settings(derandomize=True, max_examples=150, deadline=None)
RUN = "paper-regression"
SIGNER = keys.Identity.generate()  # the run's orchestrator (or an agent's identity)
OTHER_SIGNER = keys.Identity.generate()


def decode(data: bytes, **overrides: Any) -> Any:
    args: dict[str, Any] = {
        "receiver": ME,
        "topic_sender": PEER,
        "dim": DIM,
        "link_keys": {PEER: KEY},
    }
    return wire.decode_peer(data, **(args | overrides))


def bits(obj: Any) -> Any:
    """A comparable form of `obj` in which floats are their 8 bytes (so -0.0 != 0.0)."""
    if isinstance(obj, float):
        return struct.pack("<d", obj)
    if isinstance(obj, np.ndarray):
        return (obj.dtype.str, obj.shape, obj.tobytes())
    if dataclasses.is_dataclass(obj):
        return (type(obj), *(bits(getattr(obj, f.name)) for f in dataclasses.fields(obj)))
    if isinstance(obj, dict):
        return {k: bits(v) for k, v in obj.items()}
    if isinstance(obj, tuple | list):
        return tuple(bits(v) for v in obj)
    return obj


def model(**changes: Any) -> Model:
    base = Model(sender=PEER, receiver=ME, round=7, step=0, vector=np.array([0.25, -1.5]))
    return dataclasses.replace(base, **changes)


OWNER = keys.Identity.generate()


def key_share() -> KeyShare:
    """A real signed share: owner 3 sends its ephemeral key for partner 9 to hub 5."""
    eph = keys.Ephemeral.generate()
    signature = keys.sign_share(OWNER, SESSION, PEER, ME, 9, 1, 0, eph)
    return KeyShare(PEER, ME, PEER, ME, 9, 1, 0, eph.public, signature)


def agent_spec() -> AgentSpec:
    third = 1.0 / 3.0
    return AgentSpec(
        agent=ME,
        agents=30,
        dim=DIM,
        steps=(
            StepPlan(step=1, weights_in={ME: 1.0}, weights_out={ME: 1.0}),
            StepPlan(
                step=0,
                weights_in={ME: third, PEER: third, 11: 1.0 - 2 * third},
                weights_out={ME: third, PEER: 0.2, 11: 0.1 + 1e-17, 29: 5e-324},
            ),
            StepPlan(step=2, weights_in={ME: 1.0}, weights_out={ME: 1.0}),
        ),
        scheme=Scheme.LOCAL_GHP,
        sigma_g=0.1,
        mu=0.4,
        rounds=1000,
        noise_key=(2**64 - 1, 12345678901234567890),
        session=SESSION,
        rekey=Rekey.EVERY_ROUND,
        w0=(0.1, -0.0),
        view=2,
        start=7,
    )


def problem() -> Share:
    gen = np.random.default_rng(7)
    r = gen.standard_normal((DIM, DIM))
    data = Linear(
        samples=100,
        w_star=tuple(gen.standard_normal(DIM).tolist()),
        r_u=tuple(tuple(row) for row in (r @ r.T + np.eye(DIM)).tolist()),
        noise_var=0.375,
    )
    return Share(
        problem="least-squares",
        params=(("layers", (2, (3, "x"), True)), ("rho", 0.01)),
        data=data,
        dim=DIM,
        data_key=(2**63 + 5, 19),
        batch_key=(0, 2**64 - 1),
        batch=None,
    )


def config() -> Config:
    directory = {PEER: bytes(range(64)), 11: bytes(range(64, 128))}
    return Config(
        agent_spec(),
        problem(),
        directory,
        deadline=1.7e9 + 0.125,
        telemetry=True,
        resume=6,
        checkpoint_every=25,
    )


# ---- crafting payloads ----


def frame(
    name: str,
    body: Any,
    *,
    key: bytes | None = KEY,
    version: Any = wire.VERSION,
    raw_body: bool = False,
    mac: bytes | None = None,
) -> bytes:
    """A frame with arbitrary contents, MACed with `key` (or no MAC) like a real sender would;
    `mac` puts those bytes in the MAC slot instead (a signature, right or wrong)."""
    packed = body if raw_body else msgpack.packb(body)
    if mac is None:
        mac = b"" if key is None else hmac.new(key, name.encode() + packed, "sha256").digest()[:16]
    return msgpack.packb([version, name, packed, mac])


def signed(
    name: str,
    body: Any,
    *,
    raw_body: bool = False,
    version: Any = wire.VERSION,
    signer: keys.Identity = SIGNER,
) -> bytes:
    """A control frame with arbitrary contents, validly signed as `encode_signed` signs."""
    packed = body if raw_body else msgpack.packb(body)
    statement = wire.SIGN_TAG + name.encode() + b"\0" + packed
    return frame(name, packed, raw_body=True, version=version, mac=signer.sign(statement))


def split(data: bytes) -> tuple[str, dict[Any, Any], bytes]:
    _, name, body, mac = msgpack.unpackb(data, strict_map_key=False)
    return name, msgpack.unpackb(body, strict_map_key=False), mac


def edited(data: bytes, edit: Edit, key: bytes | None = KEY) -> bytes:
    """`data` with its body changed by `edit`, re-MACed with `key`."""
    name, body, _ = split(data)
    edit(body)
    return frame(name, body, key=key)


def resigned(data: bytes, edit: Edit) -> bytes:
    """The signed control frame `data` with its body changed by `edit`, signed again."""
    name, body, _ = split(data)
    edit(body)
    return signed(name, body)


def set_in(path: tuple[Any, ...], value: Any) -> Edit:
    def edit(body: dict[Any, Any]) -> None:
        target = body
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return edit


def drop(key: str) -> Edit:
    return lambda body: body.pop(key)


def drop_in(outer: str, key: str) -> Edit:
    return lambda body: body[outer].pop(key)


GOOD = wire.encode_peer(model(), KEY)


def _ids(value: Any) -> str:
    """Readable test ids: the reason and expected detail, not the payload bytes."""
    return value if isinstance(value, str) else "-"


# ---- roundtrips ----


@pytest.mark.parametrize(
    "msg",
    [
        model(),
        model(round=2**64 - 1, step=2),
        KeyPlan(sender=PEER, receiver=ME, step=1, side=-1, partners=(2, 4, 9)),
        KeyPlan(sender=PEER, receiver=ME, step=2, side=1, partners=()),
    ],
)
def test_peer_roundtrip(msg: Model | KeyPlan) -> None:
    assert bits(decode(wire.encode_peer(msg, KEY))) == bits(msg)


def test_key_share_roundtrip_keeps_a_valid_signature() -> None:
    share = key_share()
    back = decode(wire.encode_peer(share, KEY))
    assert back == share
    keys.verify_share(OWNER.public, back, SESSION)


def test_peer_roundtrip_with_derived_link_key() -> None:
    a, b = keys.Identity.generate(), keys.Identity.generate()
    key_ab = keys.link_key(a, b.public, SESSION, PEER, ME)
    key_ba = keys.link_key(b, a.public, SESSION, ME, PEER)
    back = decode(wire.encode_peer(model(), key_ab), link_keys={PEER: key_ba})
    assert bits(back) == bits(model())


@FUZZ
@given(
    hnp.arrays(
        np.float64,
        st.integers(1, 64),
        elements=st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=True),
    )
)
@example(np.array([-0.0, 5e-324, -2.2250738585072014e-308, 1.7976931348623157e308]))
def test_vectors_roundtrip_bit_exact(vector: np.ndarray) -> None:
    dim = len(vector)
    msg = model(vector=vector)
    back = decode(wire.encode_peer(msg, KEY), dim=dim)
    assert back.vector.dtype == np.float64 and back.vector.shape == (dim,)
    assert back.vector.tobytes() == vector.tobytes()
    report = wire.decode_report(wire.encode_report(Report(ME, 3, vector)), dim)
    assert report.w.tobytes() == vector.tobytes()


def test_any_float_array_is_sent_as_little_endian_float64() -> None:
    vector = np.array([1.5, -2.0], dtype=">f4")
    back = decode(wire.encode_peer(model(vector=vector), KEY))
    assert back.vector.tolist() == [1.5, -2.0]
    assert back.vector.flags.writeable


CONTROL_MESSAGES: list[Control] = [
    Hello(agent=12, identity=bytes(range(64)), proof=bytes(range(32))),
    Welcome(agent=12),
    Welcome(agent=12, rejoin=True),
    Setup(agent=12, session=2**64 - 1, view=3, sealed=bytes(range(200))),
    Ready(agent=12, session=0, view=0),
    Go(session=3, view=1, until=20),
    Bye(),
    Abort(reason="agent 4 failed: out of memory"),
    Telemetry(agent=12, session=1, view=2, round=999, sealed=bytes(range(200))),
    Finished(
        agent=12,
        session=4,
        view=7,
        rejected={"bad-mac": 2, "stale": 0},
        bytes={"model": 123456, "keys": 789, "control": 10, "telemetry": 2**40},
        messages={"model": 3000},
        wall=12.345678901234567,
    ),
    Finished(agent=0, session=0, view=0, rejected={}, bytes={}, messages={}, wall=0.0),
    Failed(agent=12, reason="broker went away"),
    Hold(session=2, view=3),
    Excluded(agent=5, session=2, view=3),
    Progress(agent=5, session=2, view=3, round=41, held=True, waiting=(1, 7)),
    Rejoin(agent=5, session=-1, rounds=()),
    Rejoin(agent=5, session=2, rounds=(0, 10, 20)),
]


def open_signed(data: bytes, signer: keys.Identity = SIGNER) -> wire.SignedFrame:
    """Decode and verify, as the conductor and the nodes do."""
    got = wire.decode_signed(data)
    got.verify(signer.public, "the signer")
    return got


@pytest.mark.parametrize("msg", CONTROL_MESSAGES, ids=lambda m: type(m).__name__)
def test_signed_roundtrip(msg: Control) -> None:
    got = open_signed(wire.encode_signed(msg, RUN, 2**64 - 1, SIGNER))
    assert (got.run, got.seq, bits(got.msg)) == (RUN, 2**64 - 1, bits(msg))
    assert len(got.signature) == wire.SIGNATURE_BYTES


@pytest.mark.parametrize("msg", CONTROL_MESSAGES, ids=lambda m: type(m).__name__)
def test_signed_frame_signed_by_another_key_fails_verify(msg: Control) -> None:
    got = wire.decode_signed(wire.encode_signed(msg, RUN, 1, OTHER_SIGNER))
    with pytest.raises(Rejected) as caught:
        got.verify(SIGNER.public, "the run's orchestrator")
    assert caught.value.reason == "bad-signature"
    assert f"{type(msg).__name__} is not signed by the run's orchestrator" in caught.value.detail


TAMPERINGS = [
    pytest.param(set_in(("run",), "other-run"), id="run"),
    pytest.param(set_in(("seq",), 8), id="seq"),
    pytest.param(set_in(("msg", "agent"), 3), id="agent"),
    pytest.param(set_in(("msg", "reason"), "broker went away!"), id="reason"),
]


@pytest.mark.parametrize("edit", TAMPERINGS)
def test_signature_covers_run_sequence_number_and_message(edit: Edit) -> None:
    """Any edit of the signed body under the old signature: decodes, then fails verify."""
    good = wire.encode_signed(Failed(12, "broker went away"), RUN, 7, SIGNER)
    name, body, signature = split(good)
    edit(body)
    tampered = wire.decode_signed(frame(name, body, mac=signature))
    assert (tampered.run, tampered.seq, tampered.msg) != (RUN, 7, Failed(12, "broker went away"))
    with pytest.raises(Rejected, match="bad-signature"):
        tampered.verify(SIGNER.public, "agent 12")


control_ids = st.integers(0, wire.ID_LIMIT - 1)
counts = st.integers(0, wire.COUNT_LIMIT - 1)
texts = st.text(max_size=50)
blobs = st.binary(max_size=100)
tallies = st.dictionaries(st.text(max_size=12), counts, max_size=4)
finite = st.floats(allow_nan=False, allow_infinity=False)
control_messages = st.one_of(
    st.builds(
        Hello, control_ids, st.binary(min_size=64, max_size=64), st.binary(min_size=32, max_size=32)
    ),
    st.builds(Welcome, control_ids),
    st.builds(Setup, control_ids, counts, counts, blobs),
    st.builds(Ready, control_ids, counts, counts),
    st.builds(Go, counts, counts, counts),
    st.builds(Hold, counts, counts),
    st.builds(Excluded, control_ids, counts, counts),
    st.builds(
        Progress,
        control_ids,
        counts,
        counts,
        counts,
        st.booleans(),
        st.lists(control_ids, max_size=20).map(tuple),
    ),
    st.builds(
        Rejoin, control_ids, st.integers(-1, wire.COUNT_LIMIT - 1), st.lists(counts).map(tuple)
    ),
    st.just(Bye()),
    st.builds(Abort, texts),
    st.builds(Telemetry, control_ids, counts, counts, counts, blobs),
    st.builds(Finished, control_ids, counts, counts, tallies, tallies, tallies, finite),
    st.builds(Failed, control_ids, texts),
)
run_names = st.text(min_size=1, max_size=64)


@FUZZ
@given(control_messages, run_names, counts)
def test_any_signed_frame_roundtrips_bit_exact(msg: Control, run: str, seq: int) -> None:
    got = open_signed(wire.encode_signed(msg, run, seq, SIGNER))
    assert (got.run, got.seq, bits(got.msg)) == (run, seq, bits(msg))


@FUZZ
@given(control_messages, st.data())
def test_any_single_bit_flip_is_refused(msg: Control, data: st.DataObject) -> None:
    """Flip one bit anywhere in a signed frame: decoding or the signature check refuses it."""
    good = bytearray(wire.encode_signed(msg, RUN, 3, SIGNER))
    bit = data.draw(st.integers(0, 8 * len(good) - 1))
    good[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(Rejected) as caught:
        open_signed(bytes(good))
    assert caught.value.reason in REASONS


def test_config_roundtrip_is_exact() -> None:
    msg = config()
    back = wire.decode_config(wire.encode_config(msg))
    assert back == msg
    assert bits(back) == bits(msg)  # floats bit-exact, -0.0 and subnormals included
    assert isinstance(back.spec.scheme, Scheme) and isinstance(back.spec.rekey, Rekey)
    assert all(type(k) is int for plan in back.spec.steps for k in plan.weights_in)


def test_config_roundtrip_with_batch_and_defaults() -> None:
    msg = dataclasses.replace(
        config(),
        spec=dataclasses.replace(agent_spec(), w0=(), rekey=Rekey.ONCE, scheme=Scheme.GHP),
        problem=dataclasses.replace(problem(), batch=10),
        telemetry=False,
    )
    assert bits(wire.decode_config(wire.encode_config(msg))) == bits(msg)


def test_local_steps_are_elided_at_one_and_carried_otherwise() -> None:
    """AgentSpec.local_steps (--local-steps, issue 29) is left out at the paper's 1, so the
    pinned Config keeps its bytes (tests/test_pins.py), and carried and read back at 2."""
    msg = config()
    assert b"local_steps" not in wire.encode_config(msg)
    two = dataclasses.replace(msg, spec=dataclasses.replace(msg.spec, local_steps=2))
    data = wire.encode_config(two)
    assert b"local_steps" in data and wire.decode_config(data).spec.local_steps == 2
    assert wire.decode_config(wire.encode_config(msg)).spec.local_steps == 1


def test_checkpoint_roundtrip_is_exact() -> None:
    models = {0: np.array([0.0, -0.0]), 25: np.array([1.5, 5e-324]), 50: np.array([-2.0, 3.0])}
    data = wire.encode_checkpoint(RUN, ME, 4, models)
    run, agent, session, back = wire.decode_checkpoint(data, "ckpt")
    assert (run, agent, session) == (RUN, ME, 4)
    assert sorted(back) == [0, 25, 50]
    assert all(bits(back[r]) == bits(w) for r, w in models.items())
    assert wire.decode_checkpoint(wire.encode_checkpoint(RUN, ME, 0, {}), "x")[3] == {}


CHECKPOINT = wire.encode_checkpoint(RUN, ME, 4, {3: np.array([1.0, 2.0])})


def _checkpoint_with(index: int, value: Any) -> bytes:
    outer = msgpack.unpackb(CHECKPOINT)
    outer[index] = value
    return bytes(msgpack.packb(outer))


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (CHECKPOINT[:-1], "not valid msgpack"),
        (msgpack.packb([1, RUN]), "expected [version, run, agent, session, dim, reports]"),
        (_checkpoint_with(0, 99), "expected [version, run, agent, session, dim, reports]"),
        (_checkpoint_with(1, 5), "run must be text and reports bytes"),
        (_checkpoint_with(5, "x"), "run must be text and reports bytes"),
        (_checkpoint_with(3, -1), "checkpoint"),
        (_checkpoint_with(4, 3), "shape"),
        (msgpack.packb([1, "go", b"x", b"y"]), "expected [version, run, agent, session, dim,"),
    ],
    ids=range(8),
)
def test_checkpoint_rejections(data: bytes, detail: str) -> None:
    with pytest.raises(ValueError, match="ckpt is not a privnet checkpoint") as caught:
        wire.decode_checkpoint(data, "ckpt")
    assert detail in str(caught.value)


def test_checkpoint_of_another_agents_models_is_refused() -> None:
    data = _checkpoint_with(2, PEER)  # header says PEER, the reports are ME's
    with pytest.raises(ValueError, match=f"models of another agent than {PEER}"):
        wire.decode_checkpoint(data, "ckpt")


def test_setup_carries_a_sealed_config() -> None:
    """Setup seals the Config to the agent's static key: only that key and context open it."""
    agent = keys.Identity.generate()
    context = b"privnet/setup/run/5/0"
    sealed = keys.seal(agent.public.static, wire.encode_config(config()), context)
    got = open_signed(wire.encode_signed(Setup(ME, 0, 0, sealed), RUN, 1, SIGNER)).msg
    assert isinstance(got, Setup) and wire.encode_config(config()) not in got.sealed
    back = wire.decode_config(keys.open_sealed(agent.static, got.sealed, context))
    assert bits(back) == bits(config())
    for wrong_key, wrong_context in [(OTHER_SIGNER.static, context), (agent.static, b"x")]:
        with pytest.raises(keys.BadKey):
            keys.open_sealed(wrong_key, got.sealed, wrong_context)


def test_telemetry_carries_a_sealed_report() -> None:
    report = Report(sender=12, round=41, w=np.array([0.5, -0.0]))
    context = SESSION + b"telemetry/12/41"
    sealed = keys.seal(SIGNER.public.static, wire.encode_reports([report]), context)
    got = open_signed(wire.encode_signed(Telemetry(12, 0, 0, 41, sealed), RUN, 1, SIGNER)).msg
    assert isinstance(got, Telemetry)
    back = wire.decode_reports(keys.open_sealed(SIGNER.static, got.sealed, context), DIM)
    assert bits(back) == bits([report])


def test_encoders_refuse_the_wrong_kind_of_message() -> None:
    with pytest.raises(TypeError, match="peer frame cannot carry a Hello"):
        wire.encode_peer(CONTROL_MESSAGES[0], KEY)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="control frame cannot carry a Model"):
        wire.encode_signed(model(), RUN, 1, SIGNER)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="control frame cannot carry a Config"):
        wire.encode_signed(config(), RUN, 1, SIGNER)  # type: ignore[arg-type]


def test_category() -> None:
    assert wire.category(model()) == "model"
    assert wire.category(KeyPlan(PEER, ME, 1, 1, ())) == "keys"
    assert wire.category(key_share()) == "keys"
    assert wire.category(Telemetry(1, 0, 0, 2, b"")) == "telemetry"
    assert wire.category(Report(1, 2, np.zeros(2))) == "telemetry"
    controls = (Go(0, 0, 5), Ready(1, 0, 0), config(), Abort("x"))
    assert {wire.category(m) for m in controls} == {"control"}


def test_model_size_for_m_2() -> None:
    """88 bytes for 16 bytes of model: the overhead report quotes this."""
    assert len(GOOD) == 88  # round 7, view 0: every integer fits one byte
    assert len(wire.encode_peer(model(round=999), KEY)) == 90
    assert len(wire.encode_peer(model(round=999, vector=np.zeros(3)), KEY)) == 90 + 8


# ---- rejections, one crafted payload each ----


def rng_bytes(n: int) -> bytes:
    return np.random.default_rng(0).bytes(n)


REJECTIONS: list[tuple[str, bytes, dict[str, Any], str]] = [
    ("oversized", bytes(wire.MAX_PEER_BYTES + 1), {}, "limit is 65536"),
    ("oversized", GOOD, {"max_size": len(GOOD) - 1}, "88 bytes"),
    ("malformed", GOOD[:-1], {}, "not valid msgpack"),
    ("malformed", rng_bytes(100), {}, ""),
    ("malformed", b"\xc1", {}, "not valid msgpack"),
    ("malformed", GOOD + b"\x00", {}, "not valid msgpack"),
    ("malformed", msgpack.packb(7), {}, "array [version"),
    ("malformed", msgpack.packb([]), {}, "array [version"),
    ("malformed", msgpack.packb(["1", "model", b"", b""]), {}, "array [version"),
    ("malformed", msgpack.packb([wire.VERSION, "model", "body as str", b""]), {}, "body: bin"),
    ("malformed", msgpack.packb([wire.VERSION, "model", b"\x80", b"", b""]), {}, "body: bin"),
    ("malformed", frame("model", b"\xc1", raw_body=True), {}, "model body is not valid"),
    ("malformed", msgpack.packb(msgpack.ExtType(1, b"x")), {}, "max_ext_len"),
    ("version", frame("model", {}, version=1), {}, "wire version 1"),
    ("version", msgpack.packb([0]), {}, "wire version 0"),
    ("schema", frame("gradient", {}), {}, "unknown peer message type 'gradient'"),
    ("schema", frame("hello", {}), {}, "expected one of model, keyplan, keyshare"),
    ("schema", frame("model", [1, 2]), {}, "expected a map"),
    ("schema", edited(GOOD, drop("i")), {}, "missing field 'i'"),
    ("schema", edited(GOOD, set_in(("zz",), 1)), {}, "unknown field 'zz'"),
    ("schema", edited(GOOD, set_in((7,), 1)), {}, "unknown field 7"),
    ("schema", edited(GOOD, set_in(("i",), -1)), {}, "model.i: expected an integer in [0, 2**64)"),
    ("schema", edited(GOOD, set_in(("i",), "7")), {}, "model.i"),
    ("schema", edited(GOOD, set_in(("i",), 7.0)), {}, "model.i"),
    ("schema", edited(GOOD, set_in(("s",), True)), {}, "model.s: expected an agent id"),
    ("schema", edited(GOOD, set_in(("r",), 2**32)), {}, "model.r"),
    ("schema", edited(GOOD, set_in(("j",), 3)), {}, "model.j: expected a combine step"),
    ("schema", edited(GOOD, set_in(("w",), [0.25, -1.5])), {}, "model.w: expected a map"),
    ("schema", edited(GOOD, set_in(("w", "data"), "text")), {}, "model.w.data"),
    ("schema", edited(GOOD, set_in(("w", "shape"), 2)), {}, "model.w.shape"),
    ("schema", edited(GOOD, set_in(("w", "endian"), "<")), {}, "unknown field 'endian'"),
    ("shape", edited(GOOD, set_in(("w", "dtype"), "<f4")), {}, "dtype must be '<f8'"),
    ("shape", edited(GOOD, set_in(("w", "dtype"), ">f8")), {}, "got '>f8'"),
    ("shape", edited(GOOD, set_in(("w", "shape"), [3])), {}, "shape must be [2], got [3]"),
    ("shape", edited(GOOD, set_in(("w", "shape"), [1, 2])), {}, "shape must be [2]"),
    ("shape", edited(GOOD, set_in(("w", "data"), bytes(24))), {}, "data has 24"),
    ("shape", GOOD, {"dim": 3}, "shape must be [3], got [2]"),
    ("non-finite", wire.encode_peer(model(vector=np.array([0.0, np.nan])), KEY), {}, "w[1] is nan"),
    (
        "non-finite",
        wire.encode_peer(model(vector=np.array([-np.inf, 1.0])), KEY),
        {},
        "w[0] is -inf",
    ),
    ("spoofed", wire.encode_peer(model(sender=4), KEY), {}, "claims sender 4"),
    ("spoofed", GOOD, {"topic_sender": 4}, "topic of agent 4"),
    ("wrong-receiver", wire.encode_peer(model(receiver=6), KEY), {}, "is for agent 6"),
    ("unknown-sender", GOOD, {"link_keys": {4: KEY}}, "no link key"),
    ("bad-mac", GOOD, {"link_keys": {PEER: OTHER_KEY}}, "MAC check failed"),
    ("bad-mac", wire.encode_peer(model(), OTHER_KEY), {}, "MAC check failed"),
    ("bad-mac", edited(GOOD, lambda body: None, key=None), {}, "MAC check failed"),  # no MAC
    ("stale-view", GOOD, {"view": 1}, "frame of view 0, this agent is at 1"),
    ("ahead-view", wire.encode_peer(model(view=2), KEY), {}, "frame of view 2, this agent is at 0"),
]


@pytest.mark.parametrize(("reason", "data", "overrides", "detail"), REJECTIONS, ids=_ids)
def test_peer_rejections(reason: str, data: bytes, overrides: dict[str, Any], detail: str) -> None:
    with pytest.raises(Rejected) as caught:
        decode(data, **overrides)
    assert caught.value.reason == reason
    assert detail in caught.value.detail


def test_tampered_body_with_the_old_mac_is_rejected() -> None:
    name, body, mac = split(GOOD)
    body["w"]["data"] = np.array([0.25, -1.25]).tobytes()
    tampered = msgpack.packb([wire.VERSION, name, msgpack.packb(body), mac])
    with pytest.raises(Rejected) as caught:
        decode(tampered)
    assert caught.value.reason == "bad-mac"


def test_mac_runs_before_any_vector_check() -> None:
    """A bad MAC wins over bad vector contents: no unauthenticated vector is parsed."""
    nan = wire.encode_peer(model(vector=np.array([np.nan, 0.0])), OTHER_KEY)
    with pytest.raises(Rejected, match="bad-mac"):
        decode(nan)
    wrong_dtype = edited(GOOD, set_in(("w", "dtype"), "<f4"), key=OTHER_KEY)
    with pytest.raises(Rejected, match="bad-mac"):
        decode(wrong_dtype)


def test_spoofing_is_reported_before_the_mac() -> None:
    with pytest.raises(Rejected, match="spoofed"):
        decode(wire.encode_peer(model(sender=4), OTHER_KEY), link_keys={})


@pytest.mark.parametrize(
    ("edit", "reason", "detail"),
    [
        (set_in(("d",), 0), "schema", "keyplan.d: expected a side"),
        (set_in(("p",), [2, 2]), "schema", "keyplan.p: expected distinct entries"),
        (set_in(("p",), [2, -1]), "schema", "keyplan.p[1]"),
    ],
)
def test_key_plan_rejections(edit: Edit, reason: str, detail: str) -> None:
    good = wire.encode_peer(KeyPlan(PEER, ME, 1, 1, (2, 4)), KEY)
    with pytest.raises(Rejected) as caught:
        decode(edited(good, edit))
    assert (caught.value.reason, detail in caught.value.detail) == (reason, True)


@pytest.mark.parametrize(("key", "size"), [("k", 31), ("g", 65)])
def test_key_share_rejects_wrong_key_lengths(key: str, size: int) -> None:
    good = wire.encode_peer(key_share(), KEY)
    with pytest.raises(Rejected, match=rf"schema: keyshare\.{key}: expected (32|64) bytes"):
        decode(edited(good, set_in((key,), bytes(size))))


GO = wire.encode_signed(Go(1, 0, 5), RUN, 9, SIGNER)


def envelope(msg: dict[str, Any], run: Any = RUN, seq: Any = 9) -> dict[str, Any]:
    """The signed body of a control frame around message fields `msg`."""
    return {"run": run, "seq": seq, "msg": msg}


def with_signature(size: int) -> bytes:
    name, body, _ = split(GO)
    return frame(name, body, mac=bytes(size))


CONTROL_REJECTIONS: list[tuple[str, bytes, str]] = [
    ("oversized", bytes(wire.MAX_CONTROL_BYTES + 1), "limit is 1048576"),
    ("malformed", GO[:-1], "not valid msgpack"),
    (
        "malformed",
        msgpack.packb([wire.VERSION, "go", b"\x80"]),
        "[version: int, type: str, body: bin",
    ),
    ("malformed", signed("go", b"\xc1", raw_body=True), "go body is not valid msgpack"),
    (
        "version",
        signed("go", envelope({"session": 1}), version=wire.VERSION + 1),
        f"wire version {wire.VERSION + 1}",
    ),
    ("schema", signed("model", {}), "unknown control message type 'model'"),
    ("schema", signed("config", {}), "unknown control message type 'config'"),
    ("schema", signed("nope", envelope({})), "unknown control message type 'nope'"),
    ("bad-signature", with_signature(0), "a 64-byte signature, this one 0 bytes"),
    ("bad-signature", with_signature(16), "this one 16 bytes"),  # a peer MAC
    ("bad-signature", with_signature(65), "this one 65 bytes"),
    (
        "bad-signature",
        frame("go", envelope({"session": 1, "view": 0, "until": 5}), key=KEY),
        "this one 16 bytes",
    ),
    ("schema", signed("go", {"run": RUN, "msg": {"session": 1}}), "missing field 'seq'"),
    ("schema", signed("go", envelope({"session": 1}) | {"x": 1}), "unknown field 'x'"),
    ("schema", signed("go", envelope({"session": 1}, run=b"r")), "go.run: expected a string"),
    ("schema", signed("go", envelope({"session": 1}, seq=-1)), "go.seq: expected an integer"),
    ("schema", signed("go", envelope({"session": 1}, seq=1.0)), "go.seq"),
    ("schema", signed("go", envelope({})), "go.msg: missing field 'session'"),
    ("schema", signed("go", envelope({"session": -1, "view": 0, "until": 1})), "go.msg.session"),
    ("schema", signed("bye", envelope({"x": 1})), "bye.msg: unknown field 'x' (fields are none)"),
    ("schema", signed("welcome", envelope({"agent": 2**32, "rejoin": False})), "welcome.msg.agent"),
    ("schema", signed("welcome", envelope({"agent": 1, "rejoin": 1})), "welcome.msg.rejoin"),
    ("schema", signed("ready", envelope({"agent": 1, "session": 0})), "missing field 'view'"),
    (
        "schema",
        signed("ready", envelope({"agent": True, "session": 0, "view": 0})),
        "ready.msg.agent",
    ),
    ("schema", signed("hold", envelope({"session": 0, "view": -1})), "hold.msg.view"),
    (
        "schema",
        signed("excluded", envelope({"agent": 1, "session": 0, "view": 0, "x": 1})),
        "excluded.msg: unknown field 'x'",
    ),
    (
        "schema",
        signed(
            "progress",
            envelope({"agent": 1, "session": 0, "view": 0, "round": 3, "held": 1, "waiting": []}),
        ),
        "progress.msg.held",
    ),
    (
        "schema",
        signed(
            "progress",
            envelope(
                {"agent": 1, "session": 0, "view": 0, "round": -1, "held": True, "waiting": []}
            ),
        ),
        "progress.msg.round",
    ),
    (
        "schema",
        signed("rejoin", envelope({"agent": 1, "session": -2, "rounds": []})),
        "rejoin.msg.session",
    ),
    (
        "schema",
        signed("rejoin", envelope({"agent": 1, "session": 0, "rounds": [-1]})),
        "rejoin.msg.rounds[0]",
    ),
    ("schema", signed("setup", envelope({"agent": 1, "session": 0, "sealed": "x"})), "sealed"),
    ("schema", signed("abort", envelope({"reason": 7})), "abort.msg.reason: expected a string"),
    ("schema", signed("failed", envelope({"agent": 1})), "failed.msg: missing field 'reason'"),
    (
        "schema",
        resigned(wire.encode_signed(CONTROL_MESSAGES[0], RUN, 1, SIGNER), drop_in("msg", "proof")),
        "hello.msg: missing field 'proof'",
    ),
    (
        "schema",
        resigned(
            wire.encode_signed(CONTROL_MESSAGES[0], RUN, 1, SIGNER),
            set_in(("msg", "identity"), bytes(32)),
        ),
        "hello.msg.identity: expected 64 bytes",
    ),
    (
        "schema",
        resigned(
            wire.encode_signed(CONTROL_MESSAGES[0], RUN, 1, SIGNER),
            set_in(("msg", "proof"), bytes(31)),
        ),
        "hello.msg.proof: expected 32 bytes",
    ),
    (
        "schema",
        resigned(
            wire.encode_signed(Telemetry(1, 0, 0, 2, b"x"), RUN, 1, SIGNER),
            set_in(("msg", "i"), -1),
        ),
        "telemetry.msg.i",
    ),
    (
        "schema",
        resigned(
            wire.encode_signed(Finished(1, 0, 0, {"a": 1}, {}, {}, 1.0), RUN, 1, SIGNER),
            set_in(("msg", "rejected", "a"), -1),
        ),
        "finished.msg.rejected['a']",
    ),
    (
        "schema",
        resigned(
            wire.encode_signed(Finished(1, 0, 0, {}, {}, {}, 1.0), RUN, 1, SIGNER),
            set_in(("msg", "bytes"), {1: 2}),
        ),
        "finished.msg.bytes key: expected a string",
    ),
    (
        "non-finite",
        wire.encode_signed(Finished(1, 0, 0, {}, {}, {}, math.inf), RUN, 1, SIGNER),
        "finished.msg.wall is inf",
    ),
]

CONFIG = wire.encode_config(config())
CONFIG_REJECTIONS: list[tuple[Edit, str, str]] = [
    (set_in(("spec", "scheme"), "laplace"), "schema", "one of none, random, ghp, local-ghp"),
    (set_in(("spec", "rekey"), 1), "schema", "config.spec.rekey"),
    (set_in(("spec", "noise_key"), [1, 2**64 - 1, 3]), "schema", "a list of 2"),
    (set_in(("spec", "noise_key"), [-1, 2]), "schema", "config.spec.noise_key[0]"),
    (set_in(("spec", "steps", 1, "weights_in", 11), 0.5), "schema", "sum to"),
    (set_in(("spec", "steps", 1, "weights_in", "11"), 0.5), "schema", "weights_in key"),
    (set_in(("spec", "steps", 1, "weights_in", 11), 1), "schema", "expected a float64"),
    (set_in(("spec", "steps", 0, "step"), 0), "schema", "steps must be given in order"),
    (set_in(("spec", "mu"), math.nan), "non-finite", "config.spec.mu is nan"),
    (set_in(("spec", "mu"), -0.4), "schema", "mu must be a positive number"),
    (set_in(("spec", "w0"), [0.0]), "schema", "w0 has 1 entries"),
    (set_in(("spec", "local_steps"), 0), "schema", "config.spec.local_steps"),
    (set_in(("spec", "local_steps"), 2.0), "schema", "config.spec.local_steps"),
    (set_in(("spec", "session"), "abc"), "schema", "config.spec.session: expected bytes"),
    (set_in(("problem", "data", 1, "r_u", 1), [1.0]), "schema", "r_u must be 2 x 2"),
    (set_in(("problem", "data", 1, "noise_var"), -1.0), "schema", "must be >= 0"),
    (set_in(("problem", "data", 1, "noise_var"), [1.0]), "schema", "linear.noise_var: expected"),
    (set_in(("problem", "data", 0), "pickle"), "schema", "kind one of linear, rows"),
    (set_in(("problem", "data_key"), [1, -2]), "schema", "problem.data_key[1]"),
    (set_in(("problem", "batch_key"), [3]), "schema", "batch_key: expected a list of 2"),
    (set_in(("problem", "seed"), 1), "schema", "unknown field 'seed'"),
    (set_in(("problem", "batch"), 0), "schema", "config.problem.batch"),
    (set_in(("problem", "problem"), "os:system;"), "schema", "is not a plug-in name"),
    (set_in(("problem", "params", "rho"), {"code": b"x"}), "schema", "params['rho']: expected"),
    (set_in(("problem", "params", "rho"), [[[[[1]]]]]), "schema", "[0][0][0][0]: expected"),
    (set_in(("problem", "params", "rho"), math.nan), "non-finite", "params['rho'] is nan"),
    (set_in(("problem", "params", 1), 2), "schema", "a map of parameter names"),
    (
        set_in(("problem", "data", 1, "w_star", 0), math.inf),
        "non-finite",
        "config.problem.data.linear.w_star[0] is inf",
    ),
    (set_in(("directory", 11), bytes(63)), "schema", "config.directory[11]: expected 64 bytes"),
    (set_in(("deadline",), 5), "schema", "config.deadline: expected a float64"),
    (set_in(("telemetry",), 1), "schema", "config.telemetry: expected true or false"),
    (set_in(("resume",), -1), "schema", "config.resume"),
    (set_in(("checkpoint_every",), 1.0), "schema", "config.checkpoint_every"),
    (set_in(("spec", "view"), -1), "schema", "config.spec.view"),
    (set_in(("spec", "start"), 0), "schema", "config.spec.start"),
    (set_in(("spec", "start"), 10**6), "schema", "start round 1000000 is not in [1, "),
]


@pytest.mark.parametrize(("reason", "data", "detail"), CONTROL_REJECTIONS, ids=_ids)
def test_control_rejections(reason: str, data: bytes, detail: str) -> None:
    with pytest.raises(Rejected) as caught:
        wire.decode_signed(data)
    assert caught.value.reason == reason
    assert detail in caught.value.detail


def test_control_frames_may_be_held_to_a_smaller_limit() -> None:
    with pytest.raises(Rejected, match=f"oversized: control message is {len(GO)} bytes"):
        wire.decode_signed(GO, max_size=len(GO) - 1)
    assert wire.decode_signed(GO, max_size=len(GO)).msg == Go(1, 0, 5)


@pytest.mark.parametrize(("edit", "reason", "detail"), CONFIG_REJECTIONS, ids=_ids)
def test_config_rejections(edit: Edit, reason: str, detail: str) -> None:
    with pytest.raises(Rejected) as caught:
        wire.decode_config(edited(CONFIG, edit, key=None))
    assert caught.value.reason == reason
    assert detail in caught.value.detail


def test_config_problem_must_match_the_spec_dimension() -> None:
    other = dataclasses.replace(problem(), dim=3)
    data = wire.encode_config(dataclasses.replace(config(), problem=other))
    with pytest.raises(Rejected, match=r"schema: config: problem\.dim 3 differs from spec\.dim 2"):
        wire.decode_config(data)


def test_config_is_not_a_control_frame_nor_a_control_frame_a_config() -> None:
    with pytest.raises(Rejected, match="unknown control message type 'config'"):
        wire.decode_signed(CONFIG)
    with pytest.raises(Rejected, match="unknown config type 'go'"):
        wire.decode_config(GO)


def test_report_rejections() -> None:
    good = wire.encode_report(Report(ME, 1, np.array([1.0, 2.0])))
    with pytest.raises(Rejected, match=r"shape: report\.w: shape must be \[3\]"):
        wire.decode_report(good, 3)
    with pytest.raises(Rejected, match="schema: unknown report type 'model'"):
        wire.decode_report(GOOD, DIM)
    with pytest.raises(Rejected, match="non-finite"):
        wire.decode_report(wire.encode_report(Report(ME, 1, np.array([np.nan, 2.0]))), DIM)


# ---- fuzzing: nothing but Rejected ever comes out ----

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=40)
)
objects = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.one_of(st.text(max_size=3), st.integers(-3, 40), st.booleans()), inner, max_size=4
        )
    ),
    max_leaves=12,
)
NAMES = [
    "model",
    "keyplan",
    "keyshare",
    "report",
    "hello",
    "welcome",
    "setup",
    "ready",
    "go",
    "bye",
    "abort",
    "telemetry",
    "finished",
    "failed",
    "hold",
    "excluded",
    "progress",
    "rejoin",
    "config",
    "nope",
]


def decode_everywhere(data: bytes) -> None:
    """Feed `data` to every decoder: each may return a message or raise Rejected, nothing else."""
    decoders: list[Callable[[], object]] = [
        lambda: decode(data, link_keys={PEER: KEY, 4: KEY}),
        lambda: wire.decode_signed(data).verify(SIGNER.public, "the signer"),
        lambda: wire.decode_config(data),
        lambda: wire.decode_report(data, DIM),
    ]
    for run in decoders:
        try:
            run()
        except Rejected as exc:
            assert exc.reason in REASONS and exc.detail


REASONS = {
    "oversized",
    "malformed",
    "version",
    "schema",
    "shape",
    "non-finite",
    "unknown-sender",
    "spoofed",
    "wrong-receiver",
    "bad-mac",
    "bad-signature",
    "stale-view",
    "ahead-view",
}


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data: bytes) -> None:
    decode_everywhere(data)


@FUZZ
@given(objects)
def test_fuzz_random_msgpack(obj: Any) -> None:
    decode_everywhere(msgpack.packb(obj))


SEALS: dict[str, dict[str, Any]] = {
    "mac": {"key": KEY},  # peer frames
    "none": {"key": None},  # reports and configs
    "signature": {"mac": bytes(wire.SIGNATURE_BYTES)},  # control frames (a wrong signature)
}


@FUZZ
@given(st.sampled_from(NAMES), objects, st.sampled_from(sorted(SEALS)))
def test_fuzz_random_bodies_in_valid_frames(name: str, body: Any, seal: str) -> None:
    """Frames of this wire version, every type, arbitrary bodies: the fuzz reaches the schema."""
    decode_everywhere(frame(name, body, **SEALS[seal]))


@FUZZ
@given(st.sampled_from(NAMES[4:]), objects, run_names, counts)
def test_fuzz_random_messages_in_validly_signed_envelopes(
    name: str, msg: Any, run: str, seq: int
) -> None:
    """Right signature, right envelope, arbitrary message: only the message schema stands."""
    decode_everywhere(signed(name, envelope(msg, run, seq)))


VALID = [
    GOOD,
    wire.encode_peer(KeyPlan(PEER, ME, 1, 1, (2, 4)), KEY),
    wire.encode_peer(key_share(), KEY),
    CONFIG,
    wire.encode_signed(Finished(1, 0, 0, {"a": 1}, {}, {}, 1.0), RUN, 1, SIGNER),
    wire.encode_signed(CONTROL_MESSAGES[0], RUN, 2, SIGNER),
    wire.encode_signed(Setup(1, 0, 0, bytes(80)), RUN, 3, SIGNER),
    wire.encode_report(Report(PEER, 2, np.array([1.0, 2.0]))),
]


def paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into nested maps and lists, so mutations can reach deep fields."""
    found = [prefix] if prefix else []
    items = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else []
    )
    for k, v in items:
        found += paths(v, (*prefix, k))
    return found


def mutate(body: Any, path: tuple[Any, ...], value: Any, delete: bool) -> None:
    """Delete the entry at `path` in `body`, or set it to `value`."""
    target = body
    for step in path[:-1]:
        target = target[step]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value


@FUZZ
@given(st.sampled_from(VALID), st.data(), objects, st.booleans())
def test_fuzz_mutated_valid_bodies(
    good: bytes, data: st.DataObject, value: Any, delete: bool
) -> None:
    """Near-valid bodies, correctly MACed (or with a signature of the right length), so the
    fuzz reaches the deep checks too."""
    name, body, mac = split(good)
    mutate(body, data.draw(st.sampled_from(paths(body))), value, delete)
    seal = {"mac": mac} if len(mac) == wire.SIGNATURE_BYTES else {"key": KEY if mac else None}
    decode_everywhere(frame(name, body, **seal))


def test_fuzz_deep_nesting_and_huge_declared_lengths() -> None:
    decode_everywhere(b"\x91" * 5000 + b"\x00")
    decode_everywhere(b"\xdd\xff\xff\xff\xff")  # array32 claiming 4 billion items
    decode_everywhere(b"\xc6\xff\xff\xff\xff")  # bin32 claiming 4 GiB
    decode_everywhere(msgpack.packb([wire.VERSION, "model", b"\xdf\xff\xff\xff\xff", b""]))


# ---- the model frame's fast path agrees with the generic path ----


def generic_frame(msg: Model, key: bytes = KEY) -> bytes:
    return frames.frame(catalog.PEER["model"], msg, key)


def both_paths(data: bytes, **overrides: Any) -> tuple[Any, Any]:
    """(fast, generic) decodes of `data`: the fast one None or a Model, the generic one a
    message or the Rejected it raised."""
    args: dict[str, Any] = {
        "receiver": ME,
        "topic_sender": PEER,
        "dim": DIM,
        "link_keys": {PEER: KEY},
        "view": 0,
        "max_size": wire.MAX_PEER_BYTES,
    }
    args |= overrides
    got = fastpath.decode_model(data, **args)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fastpath, "decode_model", lambda *_: None)  # only the generic path
        try:
            generic: Any = wire.decode_peer(data, **args)
        except Rejected as exc:
            generic = exc
    return got, generic


def agree(data: bytes, **overrides: Any) -> Any:
    """The fast path accepts only what the generic path accepts, as the same message."""
    fast, generic = both_paths(data, **overrides)
    if fast is not None:
        assert not isinstance(generic, Rejected), generic
        assert bits(fast) == bits(generic)
    return fast


ids = st.integers(0, 2**32 - 1)
big_counts = st.integers(0, 2**64 - 1)
float_vectors = hnp.arrays(np.float64, st.integers(1, 40), elements=st.floats(width=64))


@FUZZ
@given(ids, ids, big_counts, st.sampled_from((0, 1, 2)), float_vectors, big_counts)
def test_fast_model_frames_are_the_generic_frames(
    sender: int, receiver: int, round_: int, step: int, vector: np.ndarray, view: int
) -> None:
    msg = Model(sender, receiver, round_, step, vector, view)
    data = wire.encode_peer(msg, KEY)
    assert fastpath.encode_model(msg, KEY) == data == generic_frame(msg)
    args = {
        "receiver": receiver,
        "topic_sender": sender,
        "dim": len(vector),
        "link_keys": {sender: KEY},
        "view": view,
    }
    fast = agree(data, **args)
    if np.isfinite(vector).all():
        assert fast is not None  # the ordinary frame takes the fast path
        assert bits(fast) == bits(msg)


@pytest.mark.parametrize(
    "vector",
    [
        np.array([1.0, 2.0, 3.0, 4.0])[::2],  # not contiguous
        np.array([1.0, 2.0], dtype=np.float32),
        np.array([1.0, 2.0], dtype=">f8"),
        np.array([1, 2]),
        np.array(3.0),
        [1.0, 2.0],
    ],
    ids=["strided", "float32", "big-endian", "int", "0-d", "list"],
)
def test_unusual_models_encode_as_the_generic_path_does(vector: Any) -> None:
    msg = model(vector=vector)
    assert wire.encode_peer(msg, KEY) == generic_frame(msg)


def test_unusual_field_types_take_the_generic_path() -> None:
    for msg in (model(round=np.int64(7)), model(step=True), model(view=np.uint8(0))):
        assert fastpath.encode_model(msg, KEY) is None
        assert wire.encode_peer(msg, KEY) == generic_frame(msg)


@FUZZ
@given(st.data(), objects, st.booleans())
def test_fast_decode_agrees_on_mutated_model_frames(
    data: st.DataObject, value: Any, delete: bool
) -> None:
    name, body, _ = split(GOOD)
    mutate(body, data.draw(st.sampled_from(paths(body))), value, delete)
    agree(frame(name, body, key=KEY))
    agree(frame(name, body, key=OTHER_KEY))


@FUZZ
@given(st.binary(max_size=200), st.integers(0, len(GOOD) - 1), st.integers(0, 7))
def test_fast_decode_agrees_on_damaged_model_frames(tail: bytes, at: int, bit: int) -> None:
    flipped = bytearray(GOOD)
    flipped[at] ^= 1 << bit
    for data in (bytes(flipped), GOOD[:at], GOOD + tail, GOOD[:at] + tail):
        agree(data)


@pytest.mark.parametrize(
    "overrides",
    [
        {"receiver": ME + 1},
        {"topic_sender": PEER + 1},
        {"dim": DIM + 1},
        {"link_keys": {}},
        {"link_keys": {PEER: OTHER_KEY}},
        {"view": 1},
        {"max_size": len(GOOD) - 1},
    ],
)
def test_fast_decode_leaves_every_refusal_to_the_generic_path(overrides: dict[str, Any]) -> None:
    fast, generic = both_paths(GOOD, **overrides)
    assert fast is None and isinstance(generic, Rejected)


def test_fast_decode_leaves_non_finite_and_huge_entries_to_the_generic_path() -> None:
    for vector, dim in [([math.nan, 1.0], 2), ([1.0] * 40 + [math.inf], 41)]:
        data = frame("model", {**split(GOOD)[1], "w": vector_map(vector)})
        assert agree(data, dim=dim) is None
        with pytest.raises(Rejected, match="non-finite"):
            decode(data, dim=dim)
    huge = wire.encode_peer(model(vector=np.array([1e308, -1e308])), KEY)
    assert bits(decode(huge).vector) == bits(np.array([1e308, -1e308]))


def vector_map(values: list[float]) -> dict[str, Any]:
    data = np.array(values, dtype="<f8").tobytes()
    return {"dtype": "<f8", "shape": [len(values)], "data": data}


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65_535, 65_536, 70_000])
def test_bin_head_is_msgpacks(size: int) -> None:
    blob = bytes(size)
    assert fastpath.bin_head(size) + blob == msgpack.packb(blob, use_bin_type=True)


@FUZZ
@given(st.binary(max_size=130), st.binary(max_size=300), st.sampled_from(NAMES))
def test_mac_is_hmac_sha256(key: bytes, body: bytes, name: str) -> None:
    expected = hmac.digest(key, name.encode() + body, "sha256")[: wire.MAC_BYTES]
    assert mac.mac(key, name, body) == expected
    assert mac.mac(key, name, body) == expected  # and again, from the cached keyed HMAC


@pytest.mark.parametrize("kind", [[1], {"a": 1}, b"q", 3])
def test_a_tagged_record_with_a_kind_that_is_no_name_is_a_schema_error(kind: object) -> None:
    """The fuzz found it: an unhashable kind raised TypeError instead of Rejected."""
    with pytest.raises(Rejected, match="schema"):
        catalog.DATA.decode([kind, {}], "config.problem.data")

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

from agent import keys, wire
from agent.control import (
    Abort,
    Bye,
    Failed,
    Finished,
    Go,
    Hello,
    Ready,
    Setup,
    Telemetry,
    Welcome,
)
from agent.losses import RegressionSpec
from agent.messages import KeyPlan, KeyShare, Model, Rejected, Report
from agent.spec import AgentSpec, Rekey, Scheme, StepPlan

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
ME, PEER = 5, 3  # this agent, and the neighbour whose topic a message arrives on
DIM = 2
SESSION = bytes.fromhex("00112233445566778899aabbccddeeff")
Edit = Callable[[dict[Any, Any]], None]
FUZZ = settings(derandomize=True, max_examples=150, deadline=None)


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
    )


def problem() -> RegressionSpec:
    gen = np.random.default_rng(7)
    r = gen.standard_normal((DIM, DIM))
    return RegressionSpec(
        dim=DIM,
        samples=100,
        w_star=tuple(gen.standard_normal(DIM).tolist()),
        r_u=tuple(tuple(row) for row in (r @ r.T + np.eye(DIM)).tolist()),
        noise_var=tuple(gen.uniform(0.1, 1.0, 30).tolist()),
        rho=0.01,
        seed=2**63 + 5,
        repeat=19,
        batch=None,
    )


def setup() -> Setup:
    directory = {PEER: bytes(range(64)), 11: bytes(range(64, 128))}
    return Setup(agent_spec(), problem(), directory, deadline=1.7e9 + 0.125, telemetry=True)


# ---- crafting payloads ----


def frame(
    name: str, body: Any, *, key: bytes | None = KEY, version: Any = 1, raw_body: bool = False
) -> bytes:
    """A frame with arbitrary contents, MACed with `key` (or no MAC) like a real sender would."""
    packed = body if raw_body else msgpack.packb(body)
    mac = b"" if key is None else hmac.new(key, name.encode() + packed, "sha256").digest()[:16]
    return msgpack.packb([version, name, packed, mac])


def split(data: bytes) -> tuple[str, dict[Any, Any], bytes]:
    _, name, body, mac = msgpack.unpackb(data, strict_map_key=False)
    return name, msgpack.unpackb(body, strict_map_key=False), mac


def edited(data: bytes, edit: Edit, key: bytes | None = KEY) -> bytes:
    """`data` with its body changed by `edit`, re-MACed with `key`."""
    name, body, _ = split(data)
    edit(body)
    return frame(name, body, key=key)


def set_in(path: tuple[Any, ...], value: Any) -> Edit:
    def edit(body: dict[Any, Any]) -> None:
        target = body
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return edit


def drop(key: str) -> Edit:
    return lambda body: body.pop(key)


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


@pytest.mark.parametrize(
    "msg",
    [
        Hello(nonce=bytes(16), identity=bytes(range(64)), requested_id=None),
        Hello(nonce=bytes(16), identity=bytes(range(64)), requested_id=12),
        Welcome(nonce=bytes(range(16)), agent=12, run="paper-regression", orchestrator_key=KEY),
        Ready(agent=12),
        Go(),
        Bye(),
        Abort(reason="agent 4 failed: out of memory"),
        Telemetry(agent=12, round=999, sealed=bytes(range(200))),
        Finished(
            agent=12,
            rejected={"bad-mac": 2, "stale": 0},
            bytes={"model": 123456, "keys": 789, "control": 10, "telemetry": 2**40},
            messages={"model": 3000},
            wall=12.345678901234567,
        ),
        Finished(agent=0, rejected={}, bytes={}, messages={}, wall=0.0),
        Failed(agent=12, reason="broker went away"),
    ],
)
def test_control_roundtrip(msg: Any) -> None:
    assert bits(wire.decode_control(wire.encode_control(msg))) == bits(msg)


def test_setup_roundtrip_is_exact() -> None:
    msg = setup()
    back = wire.decode_control(wire.encode_control(msg))
    assert back == msg
    assert bits(back) == bits(msg)  # floats bit-exact, -0.0 and subnormals included
    assert isinstance(back.spec.scheme, Scheme) and isinstance(back.spec.rekey, Rekey)
    assert all(type(k) is int for plan in back.spec.steps for k in plan.weights_in)


def test_setup_roundtrip_with_batch_and_defaults() -> None:
    msg = dataclasses.replace(
        setup(),
        spec=dataclasses.replace(agent_spec(), w0=(), rekey=Rekey.ONCE, scheme=Scheme.GHP),
        problem=dataclasses.replace(problem(), batch=10),
        telemetry=False,
    )
    assert bits(wire.decode_control(wire.encode_control(msg))) == bits(msg)


def test_telemetry_carries_a_sealed_report() -> None:
    orchestrator = keys.Identity.generate()
    report = Report(sender=12, round=41, w=np.array([0.5, -0.0]))
    context = SESSION + b"telemetry/12/41"
    sealed = keys.seal(orchestrator.public.static, wire.encode_report(report), context)
    got = wire.decode_control(wire.encode_control(Telemetry(12, 41, sealed)))
    assert isinstance(got, Telemetry)
    back = wire.decode_report(keys.open_sealed(orchestrator.static, got.sealed, context), DIM)
    assert bits(back) == bits(report)


def test_encoders_refuse_the_wrong_kind_of_message() -> None:
    with pytest.raises(TypeError, match="peer frame cannot carry a Hello"):
        wire.encode_peer(Hello(bytes(16), bytes(64), None), KEY)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="control frame cannot carry a Model"):
        wire.encode_control(model())  # type: ignore[arg-type]


def test_category() -> None:
    assert wire.category(model()) == "model"
    assert wire.category(KeyPlan(PEER, ME, 1, 1, ())) == "keys"
    assert wire.category(key_share()) == "keys"
    assert wire.category(Telemetry(1, 2, b"")) == "telemetry"
    assert wire.category(Report(1, 2, np.zeros(2))) == "telemetry"
    assert {wire.category(m) for m in (Go(), Ready(1), setup(), Abort("x"))} == {"control"}


def test_model_size_for_m_2() -> None:
    """85 bytes for 16 bytes of model: the overhead report quotes this."""
    assert len(GOOD) == 85  # round 7: every integer fits one byte
    assert len(wire.encode_peer(model(round=999), KEY)) == 87
    assert len(wire.encode_peer(model(round=999, vector=np.zeros(3)), KEY)) == 87 + 8


# ---- rejections, one crafted payload each ----


def rng_bytes(n: int) -> bytes:
    return np.random.default_rng(0).bytes(n)


REJECTIONS: list[tuple[str, bytes, dict[str, Any], str]] = [
    ("oversized", bytes(wire.MAX_PEER_BYTES + 1), {}, "limit is 65536"),
    ("oversized", GOOD, {"max_size": len(GOOD) - 1}, "85 bytes"),
    ("malformed", GOOD[:-1], {}, "not valid msgpack"),
    ("malformed", rng_bytes(100), {}, ""),
    ("malformed", b"\xc1", {}, "not valid msgpack"),
    ("malformed", GOOD + b"\x00", {}, "not valid msgpack"),
    ("malformed", msgpack.packb(7), {}, "array [version"),
    ("malformed", msgpack.packb([]), {}, "array [version"),
    ("malformed", msgpack.packb(["1", "model", b"", b""]), {}, "array [version"),
    ("malformed", msgpack.packb([1, "model", "body as str", b""]), {}, "body: bin"),
    ("malformed", msgpack.packb([1, "model", b"\x80", b"", b""]), {}, "body: bin"),
    ("malformed", frame("model", b"\xc1", raw_body=True), {}, "model body is not valid"),
    ("malformed", msgpack.packb(msgpack.ExtType(1, b"x")), {}, "max_ext_len"),
    ("version", frame("model", {}, version=2), {}, "wire version 2"),
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
    tampered = msgpack.packb([1, name, msgpack.packb(body), mac])
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


CONTROL_REJECTIONS: list[tuple[str, bytes, str]] = [
    ("oversized", bytes(wire.MAX_CONTROL_BYTES + 1), "limit is 1048576"),
    ("malformed", wire.encode_control(Go())[:-1], "not valid msgpack"),
    ("version", frame("go", {}, key=None, version=3), "wire version 3"),
    ("schema", frame("model", {}, key=None), "unknown control message type 'model'"),
    ("schema", frame("go", {}, key=KEY), "empty MAC"),
    ("schema", frame("go", {"x": 1}, key=None), "go: unknown field 'x' (fields are none)"),
    (
        "schema",
        edited(wire.encode_control(Hello(bytes(16), bytes(64), None)), drop("nonce"), None),
        "missing field 'nonce'",
    ),
    (
        "schema",
        edited(
            wire.encode_control(Hello(bytes(16), bytes(64), 1)),
            set_in(("identity",), bytes(32)),
            None,
        ),
        "hello.identity: expected 64 bytes",
    ),
    ("schema", edited(wire.encode_control(Ready(1)), set_in(("agent",), -2), None), "ready.agent"),
    (
        "schema",
        edited(wire.encode_control(Telemetry(1, 2, b"x")), set_in(("i",), -1), None),
        "telemetry.i",
    ),
    (
        "schema",
        edited(
            wire.encode_control(Finished(1, {"a": 1}, {}, {}, 1.0)),
            set_in(("rejected", "a"), -1),
            None,
        ),
        "finished.rejected['a']",
    ),
    (
        "schema",
        edited(wire.encode_control(Finished(1, {}, {}, {}, 1.0)), set_in(("bytes",), {1: 2}), None),
        "finished.bytes key: expected a string",
    ),
    ("non-finite", wire.encode_control(Finished(1, {}, {}, {}, math.inf)), "finished.wall is inf"),
]

SETUP = wire.encode_control(setup())
SETUP_REJECTIONS: list[tuple[Edit, str, str]] = [
    (set_in(("spec", "scheme"), "laplace"), "schema", "one of none, random, ghp, local-ghp"),
    (set_in(("spec", "rekey"), 1), "schema", "setup.spec.rekey"),
    (set_in(("spec", "noise_key"), [1, 2**64 - 1, 3]), "schema", "a list of 2"),
    (set_in(("spec", "noise_key"), [-1, 2]), "schema", "setup.spec.noise_key[0]"),
    (set_in(("spec", "steps", 1, "weights_in", 11), 0.5), "schema", "sum to"),
    (set_in(("spec", "steps", 1, "weights_in", "11"), 0.5), "schema", "weights_in key"),
    (set_in(("spec", "steps", 1, "weights_in", 11), 1), "schema", "expected a float64"),
    (set_in(("spec", "steps", 0, "step"), 0), "schema", "steps must be given in order"),
    (set_in(("spec", "mu"), math.nan), "non-finite", "setup.spec.mu is nan"),
    (set_in(("spec", "mu"), -0.4), "schema", "mu must be a positive number"),
    (set_in(("spec", "w0"), [0.0]), "schema", "w0 has 1 entries"),
    (set_in(("spec", "session"), "abc"), "schema", "setup.spec.session: expected bytes"),
    (set_in(("problem", "dim"), 3), "schema", "r_u must be 3 x 3"),
    (set_in(("problem", "r_u", 1), [1.0]), "schema", "r_u must be 2 x 2"),
    (set_in(("problem", "noise_var", 0), -1.0), "schema", "must be >= 0"),
    (set_in(("problem", "noise_var"), [1.0]), "schema", "one per agent (30)"),
    (set_in(("problem", "batch"), 0), "schema", "setup.problem.batch"),
    (set_in(("problem", "w_star", 0), math.inf), "non-finite", "setup.problem.w_star[0] is inf"),
    (set_in(("directory", 11), bytes(63)), "schema", "setup.directory[11]: expected 64 bytes"),
    (set_in(("deadline",), 5), "schema", "setup.deadline: expected a float64"),
    (set_in(("telemetry",), 1), "schema", "setup.telemetry: expected true or false"),
]


@pytest.mark.parametrize(("reason", "data", "detail"), CONTROL_REJECTIONS, ids=_ids)
def test_control_rejections(reason: str, data: bytes, detail: str) -> None:
    with pytest.raises(Rejected) as caught:
        wire.decode_control(data)
    assert caught.value.reason == reason
    assert detail in caught.value.detail


@pytest.mark.parametrize(("edit", "reason", "detail"), SETUP_REJECTIONS, ids=_ids)
def test_setup_rejections(edit: Edit, reason: str, detail: str) -> None:
    with pytest.raises(Rejected) as caught:
        wire.decode_control(edited(SETUP, edit, key=None))
    assert caught.value.reason == reason
    assert detail in caught.value.detail


def test_setup_problem_must_match_the_spec_dimension() -> None:
    other = dataclasses.replace(problem(), dim=3, w_star=(0.0,) * 3, r_u=((1.0,) * 3,) * 3)
    data = wire.encode_control(dataclasses.replace(setup(), problem=other))
    with pytest.raises(Rejected, match=r"schema: setup: problem\.dim 3 differs from spec\.dim 2"):
        wire.decode_control(data)


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
    "nope",
]


def decode_everywhere(data: bytes) -> None:
    """Feed `data` to every decoder: each may return a message or raise Rejected, nothing else."""
    decoders: list[Callable[[], object]] = [
        lambda: decode(data, link_keys={PEER: KEY, 4: KEY}),
        lambda: wire.decode_control(data),
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
}


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data: bytes) -> None:
    decode_everywhere(data)


@FUZZ
@given(objects)
def test_fuzz_random_msgpack(obj: Any) -> None:
    decode_everywhere(msgpack.packb(obj))


@FUZZ
@given(st.sampled_from(NAMES), objects, st.sampled_from([KEY, None]))
def test_fuzz_random_bodies_in_valid_frames(name: str, body: Any, key: bytes | None) -> None:
    """Version-1 frames of every type with arbitrary bodies, so the fuzz reaches the schema."""
    decode_everywhere(frame(name, body, key=key))


VALID = [
    GOOD,
    wire.encode_peer(KeyPlan(PEER, ME, 1, 1, (2, 4)), KEY),
    wire.encode_peer(key_share(), KEY),
    SETUP,
    wire.encode_control(Finished(1, {"a": 1}, {}, {}, 1.0)),
    wire.encode_control(Hello(bytes(16), bytes(64), 3)),
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


@FUZZ
@given(st.sampled_from(VALID), st.data(), objects, st.booleans())
def test_fuzz_mutated_valid_bodies(
    good: bytes, data: st.DataObject, value: Any, delete: bool
) -> None:
    """Near-valid bodies, correctly MACed, so the fuzz reaches the deep checks too."""
    name, body, mac = split(good)
    path = data.draw(st.sampled_from(paths(body)))
    target = body
    for step in path[:-1]:
        target = target[step]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    decode_everywhere(frame(name, body, key=KEY if mac else None))


def test_fuzz_deep_nesting_and_huge_declared_lengths() -> None:
    decode_everywhere(b"\x91" * 5000 + b"\x00")
    decode_everywhere(b"\xdd\xff\xff\xff\xff")  # array32 claiming 4 billion items
    decode_everywhere(b"\xc6\xff\xff\xff\xff")  # bin32 claiming 4 GiB
    decode_everywhere(msgpack.packb([1, "model", b"\xdf\xff\xff\xff\xff", b""]))

"""The msgpack wire format: versioned frames, schema-checked on decode, MACed between peers.

Frame: msgpack array `[VERSION, type, body, mac]`. `body` is the msgpack map of the
message's fields, kept as bytes so the MAC covers exactly what was sent; `mac` is
HMAC-SHA256(link_key, type + body)[:16] for peer messages, and for control frames an
Ed25519 signature over (type, body) where body wraps the message with its run name and a
sequence number (`encode_signed`); the true model inside Telemetry is sealed.
Vectors are `{"dtype": "<f8", "shape": [M], "data": <raw little-endian float64>}`.

Per-round messages use one-letter keys, because their size is the overhead we measure:
  model    s sender, r receiver, i round, j step, w vector
  keyplan  s sender, r receiver, j step, d side, p partners
  keyshare s sender, r receiver, o owner, h hub, p partner, j step, e epoch, k public, g signature
  report   s sender, i round, w vector
  telemetry a agent, n session, i round, x sealed
Other control messages use their field names.

Every decode either returns a message or raises `Rejected(reason, detail)`, checking in the
order size -> frame -> version -> type -> body schema -> sender/receiver -> MAC -> vectors,
so the cheap checks run before the MAC and no unauthenticated vector is ever parsed.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import math
import reprlib
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar, cast

import msgpack
import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from agent import datasets, keys
from agent.control import (
    Abort,
    Beat,
    Bye,
    Close,
    Config,
    Control,
    Escrow,
    Excluded,
    Failed,
    Finished,
    Go,
    Hello,
    Hold,
    Left,
    Progress,
    Ready,
    Rejoin,
    Setup,
    Telemetry,
    Welcome,
)
from agent.losses import ClassificationSpec, RegressionSpec
from agent.messages import KeyPlan, KeyShare, Model, Reason, Rejected, Report
from agent.spec import STEPS, AgentSpec, ConfigError, Rekey, Scheme, StepPlan

VERSION = 2  # 2: a Config carries the agent's own keys, never the run's seed
MAX_PEER_BYTES = 64 * 1024
MAX_CONTROL_BYTES = 1024 * 1024
MAC_BYTES = 16
SIGNATURE_BYTES = 64
SIGN_TAG = b"privnet/control/v1\0"
DTYPE = "<f8"
ID_LIMIT = 2**32  # agent ids are packed as uint32 in key derivations
COUNT_LIMIT = 2**64  # rounds and epochs are packed as uint64

Peer = Model | KeyPlan | KeyShare
T = TypeVar("T")


def _short_repr() -> reprlib.Repr:
    """A repr that stays short for hostile values (Python 3.11 Repr takes no arguments)."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = 40
    short.maxlist = short.maxdict = 4
    short.maxlevel = 2
    return short


_SHOW = _short_repr()


@dataclass(frozen=True, slots=True)
class _Limits:
    """msgpack unpack limits, so a small payload cannot make the decoder allocate a lot."""

    max_str_len: int
    max_array_len: int
    max_map_len: int


_PEER_LIMITS = _Limits(max_str_len=64, max_array_len=4096, max_map_len=16)
_CONTROL_LIMITS = _Limits(max_str_len=64 * 1024, max_array_len=1 << 16, max_map_len=1 << 16)


# ---- field kinds: how one field goes to msgpack and comes back, checked ----


@dataclass(frozen=True, slots=True)
class _Kind:
    """One field type: `encode` gives a msgpack-able value, `decode` checks and rebuilds it."""

    encode: Callable[[Any], Any]
    decode: Callable[[Any, str], Any]


def _show(value: object) -> str:
    return f"{type(value).__name__} {_SHOW.repr(value)}"


def _schema(where: str, expected: str, value: object) -> Rejected:
    return Rejected(Reason.SCHEMA, f"{where}: expected {expected}, got {_show(value)}")


def _accept(_: object) -> None:
    """The default cross-field check: nothing more to check."""


def _int(lo: int, hi: int, expected: str) -> _Kind:
    def decode(value: Any, where: str) -> int:
        if type(value) is not int or not lo <= value < hi:  # bool is not an int here
            raise _schema(where, expected, value)
        return value

    return _Kind(int, decode)


def _choice(options: tuple[int, ...], expected: str) -> _Kind:
    def decode(value: Any, where: str) -> int:
        if type(value) is not int or value not in options:
            raise _schema(where, expected, value)
        return value

    return _Kind(int, decode)


def _bytes(size: int | None = None) -> _Kind:
    expected = "bytes" if size is None else f"{size} bytes"

    def decode(value: Any, where: str) -> bytes:
        if type(value) is not bytes or (size is not None and len(value) != size):
            raise _schema(where, expected, value)
        return value

    return _Kind(bytes, decode)


def _str_decode(value: Any, where: str) -> str:
    if type(value) is not str:
        raise _schema(where, "a string", value)
    return value


def _bool_decode(value: Any, where: str) -> bool:
    if type(value) is not bool:
        raise _schema(where, "true or false", value)
    return value


def _float_decode(value: Any, where: str) -> float:
    if type(value) is not float:
        raise _schema(where, "a float64", value)
    if not math.isfinite(value):
        raise Rejected(Reason.NON_FINITE, f"{where} is {value}; only finite numbers are accepted")
    return value


def _optional(kind: _Kind) -> _Kind:
    def encode(value: Any) -> Any:
        return None if value is None else kind.encode(value)

    def decode(value: Any, where: str) -> Any:
        return None if value is None else kind.decode(value, where)

    return _Kind(encode, decode)


def _tuple(item: _Kind, length: int | None = None, *, distinct: bool = False) -> _Kind:
    expected = "a list" if length is None else f"a list of {length}"

    def encode(value: Any) -> list[Any]:
        return [item.encode(v) for v in value]

    def decode(value: Any, where: str) -> tuple[Any, ...]:
        if type(value) is not list or (length is not None and len(value) != length):
            raise _schema(where, expected, value)
        out = tuple(item.decode(v, f"{where}[{n}]") for n, v in enumerate(value))
        if distinct and len(set(out)) != len(out):
            raise _schema(where, "distinct entries", value)
        return out

    return _Kind(encode, decode)


def _mapping(key: _Kind, value: _Kind) -> _Kind:
    def encode(mapping: Mapping[Any, Any]) -> dict[Any, Any]:
        return {key.encode(k): value.encode(v) for k, v in mapping.items()}

    def decode(raw: Any, where: str) -> dict[Any, Any]:
        if type(raw) is not dict:
            raise _schema(where, "a map", raw)
        return {
            key.decode(k, f"{where} key"): value.decode(v, f"{where}[{_SHOW.repr(k)}]")
            for k, v in raw.items()
        }

    return _Kind(encode, decode)


def _enum(cls: type[StrEnum]) -> _Kind:
    values = tuple(e.value for e in cls)

    def decode(value: Any, where: str) -> StrEnum:
        if type(value) is not str or value not in values:
            raise _schema(where, f"one of {', '.join(values)}", value)
        return cls(value)

    return _Kind(lambda e: e.value, decode)


@dataclass(frozen=True, slots=True)
class _RawVector:
    """A vector whose structure is checked but whose contents wait until the MAC is."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes


def _vector_encode(vector: np.ndarray) -> dict[str, Any]:
    arr = np.ascontiguousarray(vector, dtype=DTYPE)
    return {"dtype": DTYPE, "shape": list(arr.shape), "data": arr.tobytes()}


def _vector_decode(value: Any, where: str) -> _RawVector:
    fields = _fields(value, _VECTOR_FIELDS, where)
    return _RawVector(**fields)


def _check_vector(raw: _RawVector, dim: int, where: str) -> np.ndarray:
    """The float64 array behind `raw`, if it has dtype <f8, shape [dim] and finite entries."""
    if raw.dtype != DTYPE:
        raise Rejected(
            Reason.SHAPE,
            f"{where}: dtype must be {DTYPE!r} (little-endian float64), got {raw.dtype!r}",
        )
    if raw.shape != (dim,):
        raise Rejected(Reason.SHAPE, f"{where}: shape must be [{dim}], got {list(raw.shape)}")
    if len(raw.data) != 8 * dim:
        raise Rejected(
            Reason.SHAPE, f"{where}: {dim} float64 take {8 * dim} bytes, data has {len(raw.data)}"
        )
    vector = np.frombuffer(raw.data, dtype=DTYPE).astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(vector))
    if bad.size:
        raise Rejected(
            Reason.NON_FINITE,
            f"{where}[{bad[0]}] is {vector[bad[0]]}; only finite numbers are accepted",
        )
    return vector


@dataclass(frozen=True, slots=True)
class _Field:
    """A dataclass field `name`, stored under map key `key`."""

    name: str
    key: str
    kind: _Kind


def _fields(value: Any, fields: tuple[_Field, ...], where: str) -> dict[str, Any]:
    """Decode a map that must hold exactly `fields`, as keyword arguments by field name."""
    if type(value) is not dict:
        raise _schema(where, "a map", value)
    if len(value) != len(fields) or any(f.key not in value for f in fields):
        keys = [f.key for f in fields]
        missing = [k for k in keys if k not in value]
        extra = [k for k in value if k not in keys]
        problems = [f"missing field {k!r}" for k in missing] + [
            f"unknown field {_SHOW.repr(k)}" for k in extra
        ]
        raise Rejected(
            Reason.SCHEMA,
            f"{where}: {'; '.join(problems)} (fields are {', '.join(keys) or 'none'})",
        )
    return {f.name: f.kind.decode(value[f.key], f"{where}.{f.key}") for f in fields}


def _encode_fields(obj: Any, fields: tuple[_Field, ...]) -> dict[str, Any]:
    return {f.key: f.kind.encode(getattr(obj, f.name)) for f in fields}


def _record(cls: type, fields: tuple[_Field, ...], check: Callable[[Any], None] = _accept) -> _Kind:
    """A nested dataclass; its own checks (ConfigError) and `check` become schema rejections."""

    def decode(value: Any, where: str) -> Any:
        kwargs = _fields(value, fields, where)
        try:
            obj = cls(**kwargs)
            check(obj)
        except ConfigError as exc:
            raise Rejected(Reason.SCHEMA, f"{where}: {exc}") from exc
        return obj

    return _Kind(lambda obj: _encode_fields(obj, fields), decode)


def _tagged(options: Mapping[str, tuple[type, _Kind]]) -> _Kind:
    """One of several record types, sent as [tag, record]."""
    tags = {cls: tag for tag, (cls, _) in options.items()}

    def encode(obj: Any) -> list[Any]:
        tag = tags[type(obj)]
        return [tag, options[tag][1].encode(obj)]

    def decode(value: Any, where: str) -> Any:
        if (
            type(value) is not list
            or len(value) != 2
            or type(value[0]) is not str
            or value[0] not in options
        ):
            raise _schema(where, f"[kind, record] with kind one of {', '.join(options)}", value)
        return options[value[0]][1].decode(value[1], f"{where}.{value[0]}")

    return _Kind(encode, decode)


def _named(*specs: tuple[str, _Kind]) -> tuple[_Field, ...]:
    return tuple(_Field(name, name, kind) for name, kind in specs)


_ID = _int(0, ID_LIMIT, "an agent id in [0, 2**32)")
_COUNT = _int(0, COUNT_LIMIT, "an integer in [0, 2**64)")
_POSITIVE = _int(1, ID_LIMIT, "an integer in [1, 2**32)")
_STEP = _choice(STEPS, f"a combine step in {STEPS}")
_SIDE = _choice((1, -1), "a side, +1 or -1")
_FLOAT = _Kind(float, _float_decode)
_TEXT = _Kind(str, _str_decode)
_BOOL = _Kind(bool, _bool_decode)
_BLOB = _bytes()
_VECTOR = _Kind(_vector_encode, _vector_decode)
_KEY = _tuple(_COUNT, 2)  # a 128-bit Philox key (agent.rng), as two 64-bit words

_VECTOR_FIELDS = (
    _Field("dtype", "dtype", _TEXT),
    _Field("shape", "shape", _tuple(_int(0, COUNT_LIMIT, "a dimension"))),
    _Field("data", "data", _BLOB),
)

_STEP_PLAN = _record(
    StepPlan,
    _named(
        ("step", _STEP),
        ("weights_in", _mapping(_ID, _FLOAT)),
        ("weights_out", _mapping(_ID, _FLOAT)),
    ),
)

_AGENT_SPEC = _record(
    AgentSpec,
    _named(
        ("agent", _ID),
        ("agents", _POSITIVE),
        ("dim", _POSITIVE),
        ("steps", _tuple(_STEP_PLAN, len(STEPS))),
        ("scheme", _enum(Scheme)),
        ("sigma_g", _FLOAT),
        ("mu", _FLOAT),
        ("rounds", _COUNT),
        ("noise_key", _KEY),
        ("session", _BLOB),
        ("rekey", _enum(Rekey)),
        ("w0", _tuple(_FLOAT)),
        ("view", _COUNT),
        ("start", _POSITIVE),
    ),
)


def _check_problem(problem: RegressionSpec) -> None:
    m = problem.dim
    square = len(problem.r_u) == m and all(len(row) == m for row in problem.r_u)
    if len(problem.w_star) != m or not square:
        raise ConfigError(f"w_star must have {m} entries and r_u must be {m} x {m}")
    if problem.noise_var < 0:
        raise ConfigError(f"noise_var is a variance, which must be >= 0, got {problem.noise_var}")


def _check_classification(problem: ClassificationSpec) -> None:
    if problem.dataset not in datasets.DATASETS:
        raise ConfigError(
            f"dataset {problem.dataset!r} is not shipped with this agent "
            f"({', '.join(datasets.DATASETS)}); update the agent or pick a shipped dataset"
        )
    size = len(datasets.load(problem.dataset).y_train)
    if not problem.rows or max(problem.rows) >= size:
        raise ConfigError(
            f"rows must name at least one of the {size} training rows of {problem.dataset} "
            f"(0 .. {size - 1}); got {len(problem.rows)} rows up to {max(problem.rows, default=0)}"
        )
    if problem.feature_noise < 0:
        raise ConfigError(
            f"feature_noise is a standard deviation, which must be >= 0, "
            f"got {problem.feature_noise}"
        )


_REGRESSION = _record(
    RegressionSpec,
    _named(
        ("dim", _POSITIVE),
        ("samples", _POSITIVE),
        ("w_star", _tuple(_FLOAT)),
        ("r_u", _tuple(_tuple(_FLOAT))),
        ("noise_var", _FLOAT),
        ("rho", _FLOAT),
        ("data_key", _KEY),
        ("batch_key", _KEY),
        ("batch", _optional(_POSITIVE)),
    ),
    _check_problem,
)

_CLASSIFICATION = _record(
    ClassificationSpec,
    _named(
        ("dataset", _TEXT),
        ("dim", _POSITIVE),
        ("rows", _tuple(_int(0, ID_LIMIT, "a training row index"), distinct=True)),
        ("feature_noise", _FLOAT),
        ("rho", _FLOAT),
        ("data_key", _KEY),
        ("batch_key", _KEY),
        ("batch", _optional(_POSITIVE)),
    ),
    _check_classification,
)

_PROBLEM = _tagged(
    {
        "regression": (RegressionSpec, _REGRESSION),
        "classification": (ClassificationSpec, _CLASSIFICATION),
    }
)


# ---- message schemas ----


@dataclass(frozen=True, slots=True)
class _Schema:
    """A message type: its name on the wire, class, fields, and cross-field check."""

    name: str
    cls: type
    fields: tuple[_Field, ...]
    check: Callable[[Any], None] = _accept


def _check_config(config: Config) -> None:
    spec, problem = config.spec, config.problem
    if problem.dim != spec.dim:
        raise ConfigError(f"problem.dim {problem.dim} differs from spec.dim {spec.dim}")


_PEER_SCHEMAS = (
    _Schema(
        "model",
        Model,
        (
            _Field("sender", "s", _ID),
            _Field("receiver", "r", _ID),
            _Field("round", "i", _COUNT),
            _Field("step", "j", _STEP),
            _Field("vector", "w", _VECTOR),
            _Field("view", "v", _COUNT),
        ),
    ),
    _Schema(
        "keyplan",
        KeyPlan,
        (
            _Field("sender", "s", _ID),
            _Field("receiver", "r", _ID),
            _Field("step", "j", _STEP),
            _Field("side", "d", _SIDE),
            _Field("partners", "p", _tuple(_ID, distinct=True)),
            _Field("view", "v", _COUNT),
        ),
    ),
    _Schema(
        "keyshare",
        KeyShare,
        (
            _Field("sender", "s", _ID),
            _Field("receiver", "r", _ID),
            _Field("owner", "o", _ID),
            _Field("hub", "h", _ID),
            _Field("partner", "p", _ID),
            _Field("step", "j", _STEP),
            _Field("epoch", "e", _COUNT),
            _Field("public", "k", _bytes(32)),
            _Field("signature", "g", _bytes(64)),
            _Field("view", "v", _COUNT),
        ),
    ),
)

_COUNTS = _mapping(_TEXT, _COUNT)

_SESSION = _COUNT

_CONTROL_SCHEMAS = (
    _Schema(
        "hello",
        Hello,
        _named(("agent", _ID), ("identity", _bytes(64)), ("proof", _bytes(32))),
    ),
    _Schema("welcome", Welcome, _named(("agent", _ID), ("rejoin", _BOOL))),
    _Schema(
        "setup",
        Setup,
        _named(("agent", _ID), ("session", _SESSION), ("view", _COUNT), ("sealed", _BLOB)),
    ),
    _Schema("ready", Ready, _named(("agent", _ID), ("session", _SESSION), ("view", _COUNT))),
    _Schema("go", Go, _named(("session", _SESSION), ("view", _COUNT), ("until", _COUNT))),
    _Schema("beat", Beat, ()),
    _Schema("hold", Hold, _named(("session", _SESSION), ("view", _COUNT))),
    _Schema("excluded", Excluded, _named(("agent", _ID), ("session", _SESSION), ("view", _COUNT))),
    _Schema(
        "progress",
        Progress,
        _named(
            ("agent", _ID),
            ("session", _SESSION),
            ("view", _COUNT),
            ("round", _COUNT),
            ("held", _BOOL),
            ("waiting", _tuple(_ID)),
        ),
    ),
    _Schema(
        "rejoin",
        Rejoin,
        _named(
            ("agent", _ID),
            ("session", _int(-1, COUNT_LIMIT, "a session or -1")),
            ("rounds", _tuple(_COUNT)),
        ),
    ),
    _Schema("close", Close, ()),
    _Schema("left", Left, _named(("agent", _ID), ("rejected", _COUNTS))),
    _Schema("bye", Bye, ()),
    _Schema("abort", Abort, _named(("reason", _TEXT))),
    _Schema(
        "telemetry",
        Telemetry,
        (
            _Field("agent", "a", _ID),
            _Field("session", "n", _SESSION),
            _Field("view", "v", _COUNT),
            _Field("round", "i", _COUNT),
            _Field("sealed", "x", _BLOB),
        ),
    ),
    _Schema(
        "escrow",
        Escrow,
        _named(("agent", _ID), ("session", _SESSION), ("view", _COUNT), ("sealed", _BLOB)),
    ),
    _Schema(
        "finished",
        Finished,
        _named(
            ("agent", _ID),
            ("session", _SESSION),
            ("view", _COUNT),
            ("rejected", _COUNTS),
            ("bytes", _COUNTS),
            ("messages", _COUNTS),
            ("wall", _FLOAT),
        ),
    ),
    _Schema("failed", Failed, _named(("agent", _ID), ("reason", _TEXT))),
)

_CONFIG = _Schema(
    "config",
    Config,
    _named(
        ("spec", _AGENT_SPEC),
        ("problem", _PROBLEM),
        ("directory", _mapping(_ID, _bytes(64))),
        ("deadline", _FLOAT),
        ("telemetry", _BOOL),
        ("resume", _COUNT),
        ("checkpoint_every", _COUNT),
        ("seal_links", _BOOL),
        ("escrow", _BOOL),
    ),
    _check_config,
)


def _signed(schema: _Schema) -> _Schema:
    """The envelope of a signed control frame: the run, a sequence number, the message."""
    inner = _record(schema.cls, schema.fields, schema.check)
    return _Schema(schema.name, _Envelope, _named(("run", _TEXT), ("seq", _COUNT), ("msg", inner)))


@dataclass(frozen=True, slots=True)
class _Envelope:
    run: str
    seq: int
    msg: Control


_SIGNED = {s.name: _signed(s) for s in _CONTROL_SCHEMAS}

_REPORT = _Schema(
    "report",
    Report,
    (_Field("sender", "s", _ID), _Field("round", "i", _COUNT), _Field("w", "w", _VECTOR)),
)

_PEER = {s.name: s for s in _PEER_SCHEMAS}
_CONTROL = {s.name: s for s in _CONTROL_SCHEMAS}
_BY_CLASS = {s.cls: s for s in (*_PEER_SCHEMAS, *_CONTROL_SCHEMAS, _REPORT, _CONFIG)}
_CATEGORY = {
    Model: "model",
    KeyPlan: "keys",
    KeyShare: "keys",
    Telemetry: "telemetry",
    Report: "telemetry",
    Escrow: "audit",
}


# ---- frames ----


_HMAC_BLOCK = 64  # SHA-256's block size
_HMAC_CACHE_SIZE = 4096
_hmac_pads: dict[bytes, tuple[Any, Any]] = {}


def _hmac_pad(link_key: bytes) -> tuple[Any, Any]:
    """SHA-256 states after HMAC's inner and outer key pads (RFC 2104), cached per key.

    Every frame on a link is MACed with the same key, so hashing the two padded key blocks
    once per key instead of once per frame saves about half of each MAC's time."""
    pads = _hmac_pads.get(link_key)
    if pads is None:
        key = hashlib.sha256(link_key).digest() if len(link_key) > _HMAC_BLOCK else link_key
        key = key.ljust(_HMAC_BLOCK, b"\0")
        pads = (
            hashlib.sha256(bytes(b ^ 0x36 for b in key)),
            hashlib.sha256(bytes(b ^ 0x5C for b in key)),
        )
        if len(_hmac_pads) >= _HMAC_CACHE_SIZE:  # bounded: old sessions' keys go
            _hmac_pads.clear()
        _hmac_pads[bytes(link_key)] = pads
    return pads


def _mac(link_key: bytes, name: str, body: bytes) -> bytes:
    """HMAC-SHA256(link_key, name + body), truncated to MAC_BYTES."""
    ipad, opad = _hmac_pad(link_key)
    inner = ipad.copy()
    inner.update(name.encode())
    inner.update(body)
    outer = opad.copy()
    outer.update(inner.digest())
    return cast(bytes, outer.digest()[:MAC_BYTES])


def _pack(value: object) -> bytes:
    """msgpack (untyped) always packs to bytes."""
    return cast(bytes, msgpack.packb(value, use_bin_type=True))


def _frame(schema: _Schema, msg: Any, link_key: bytes | None) -> bytes:
    body = _pack(_encode_fields(msg, schema.fields))
    mac = b"" if link_key is None else _mac(link_key, schema.name, body)
    return _pack([VERSION, schema.name, body, mac])


def _schema_of(msg: object, allowed: Mapping[str, _Schema], what: str) -> _Schema:
    schema = _BY_CLASS.get(type(msg))
    if schema is None or allowed.get(schema.name) is not schema:
        raise TypeError(
            f"{what} cannot carry a {type(msg).__name__}; it carries {', '.join(allowed)}"
        )
    return schema


def _unpack(data: bytes, max_size: int, limits: _Limits, what: str) -> object:
    """Whatever `data` decodes to: the caller checks its shape before using it."""
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            max_bin_len=max_size,
            max_str_len=limits.max_str_len,
            max_array_len=limits.max_array_len,
            max_map_len=limits.max_map_len,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack documents that "other exceptions can be raised"
        raise Rejected(Reason.MALFORMED, f"{what} is not valid msgpack: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class _Opened:
    """A frame whose version, type and body schema are checked; vectors still raw."""

    schema: _Schema
    body: bytes
    mac: bytes
    fields: dict[str, Any]


def _outer(
    data: bytes, max_size: int, limits: _Limits, what: str, parts: str = "body, mac"
) -> tuple[str, bytes, bytes]:
    """(type, and the frame's two bins) of a frame of the right shape and version."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise Rejected(Reason.MALFORMED, f"a {what} is bytes, got {type(data).__name__}")
    if len(data) > max_size:
        raise Rejected(Reason.OVERSIZED, f"{what} is {len(data)} bytes, the limit is {max_size}")
    outer = _unpack(data, max_size, limits, what)
    if type(outer) is not list or not outer or type(outer[0]) is not int:
        raise Rejected(
            Reason.MALFORMED,
            f"{what} must be a msgpack array [version, type, {parts}], got {_show(outer)}",
        )
    if outer[0] != VERSION:
        raise Rejected(
            Reason.VERSION, f"{what} has wire version {outer[0]}; this agent speaks {VERSION}"
        )
    if len(outer) != 4 or [type(x) for x in outer[1:]] != [str, bytes, bytes]:
        bins = ", ".join(f"{part}: bin" for part in parts.split(", "))
        raise Rejected(
            Reason.MALFORMED,
            f"{what} must be [version: int, type: str, {bins}], got {_show(outer)}",
        )
    return outer[1], outer[2], outer[3]


def _schema_named(name: str, schemas: Mapping[str, _Schema], what: str) -> _Schema:
    schema = schemas.get(name)
    if schema is None:
        raise Rejected(
            Reason.SCHEMA, f"unknown {what} type {name!r}; expected one of {', '.join(schemas)}"
        )
    return schema


def _open(
    data: bytes, max_size: int, limits: _Limits, schemas: Mapping[str, _Schema], what: str
) -> _Opened:
    name, body, mac = _outer(data, max_size, limits, what)
    schema = _schema_named(name, schemas, what)
    fields = _fields(_unpack(body, max_size, limits, f"{name} body"), schema.fields, name)
    return _Opened(schema, body, mac, fields)


def _build(opened: _Opened, kind: type[T], dim: int | None = None) -> T:
    """The message, once its vectors (now authenticated) and cross-field checks pass;
    `kind` is what the schemas `opened` was checked against build."""
    name, fields = opened.schema.name, dict(opened.fields)
    for field in opened.schema.fields:
        if field.kind is _VECTOR:
            assert dim is not None, f"{name} carries a vector, so decoding it needs a dim"
            fields[field.name] = _check_vector(fields[field.name], dim, f"{name}.{field.key}")
    msg = opened.schema.cls(**fields)
    try:
        opened.schema.check(msg)
    except ConfigError as exc:
        raise Rejected(Reason.SCHEMA, f"{name}: {exc}") from exc
    if not isinstance(msg, kind):
        raise TypeError(f"schema {name} builds {type(msg).__name__}, not {kind.__name__}")
    return msg


# ---- the model frame's fast path ----
# Model frames are nearly all of the traffic. These pack and check their known fields
# directly; anything they do not expect goes to the generic path (`_frame`, `_open`,
# `_build`), which builds the same bytes and gives every rejection its reason and detail.

_F8 = np.dtype(DTYPE)
_MODEL_NAME = b"model"
_MODEL_HEAD = b"\x94" + bytes([VERSION]) + b"\xa5" + _MODEL_NAME  # msgpack [VERSION, "model", ...
_MAC_HEAD = b"\xc4" + bytes([MAC_BYTES])  # ... bin8 of MAC_BYTES: the MAC]
_SHORT = 32  # vectors up to this long are checked for finiteness in Python


def _bin_head(size: int) -> bytes:
    """msgpack's header for a bin of `size` bytes (as `packb(..., use_bin_type=True)`)."""
    if size < 1 << 8:
        return b"\xc4" + size.to_bytes(1, "big")
    if size < 1 << 16:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


def _finite(vector: np.ndarray) -> bool:
    """Whether every entry is finite: in Python for short vectors, where numpy's call
    overhead dominates, with numpy for long ones."""
    if len(vector) <= _SHORT:
        return all(map(math.isfinite, vector.tolist()))
    return bool(np.isfinite(vector).all())


def _routed(s: Any, r: Any, i: Any, j: Any, v: Any, sender: int, receiver: int, view: int) -> bool:
    """Whether a model frame's fields are well typed and this link's, this view's."""
    return (
        type(s) is int
        and s == sender
        and type(r) is int
        and r == receiver
        and type(i) is int
        and 0 <= i < COUNT_LIMIT
        and type(j) is int
        and j in STEPS
        and type(v) is int
        and v == view
    )


def _encode_model(msg: Model, link_key: bytes) -> bytes | None:
    """The frame `_frame` would build for `msg`; None if a field is not of the usual type."""
    vector = msg.vector
    if not (
        type(msg.sender) is int
        and type(msg.receiver) is int
        and type(msg.round) is int
        and type(msg.step) is int
        and type(msg.view) is int
        and type(vector) is np.ndarray
        and vector.dtype == _F8
        and vector.ndim == 1
    ):
        return None
    body = _pack(
        {
            "s": msg.sender,
            "r": msg.receiver,
            "i": msg.round,
            "j": msg.step,
            "w": {"dtype": DTYPE, "shape": [len(vector)], "data": vector.tobytes()},
            "v": msg.view,
        }
    )
    mac = _mac(link_key, "model", body)
    return b"".join((_MODEL_HEAD, _bin_head(len(body)), body, _MAC_HEAD, mac))


def _decode_model(
    data: bytes,
    receiver: int,
    topic_sender: int,
    dim: int,
    link_keys: Mapping[int, bytes],
    view: int,
    max_size: int,
) -> Model | None:
    """The Model in `data` if it is a well-formed, authentic model frame for this link;
    None for anything else (the generic path then accepts it or says why not)."""
    if type(data) is not bytes or len(data) > max_size or not data.startswith(_MODEL_HEAD):
        return None
    try:
        outer = _unpack(data, max_size, _PEER_LIMITS, "peer message")
        _, name, body, mac = cast(list[Any], outer)
        fields = _unpack(body, max_size, _PEER_LIMITS, "model body")
        got = cast(dict[str, Any], fields)
        s, r, i, j, w, v = got["s"], got["r"], got["i"], got["j"], got["w"], got["v"]
        raw = w["data"]
    except (Rejected, ValueError, TypeError, KeyError):
        return None
    if not (
        type(outer) is list
        and outer[0] == VERSION
        and type(outer[0]) is int
        and name == "model"
        and type(body) is bytes
        and type(mac) is bytes
        and type(fields) is dict
        and len(fields) == 6
        and _routed(s, r, i, j, v, topic_sender, receiver, view)
        and type(w) is dict
        and len(w) == 3
        and w.get("dtype") == DTYPE
        and type(w["dtype"]) is str
        and w.get("shape") == [dim]
        and type(w["shape"][0]) is int
        and type(raw) is bytes
        and len(raw) == 8 * dim
    ):
        return None
    key = link_keys.get(s)
    if key is None or not hmac.compare_digest(_mac(key, "model", body), mac):
        return None
    vector = np.frombuffer(raw, dtype=_F8).astype(np.float64)
    if not _finite(vector):
        return None
    return Model(s, r, i, j, vector, v)


# ---- public API ----


def encode_peer(msg: Peer, link_key: bytes) -> bytes:
    """A Model, KeyPlan or KeyShare as a MACed frame for the link it travels on."""
    if type(msg) is Model:
        frame = _encode_model(msg, link_key)
        if frame is not None:
            return frame
    return _frame(_schema_of(msg, _PEER, "a peer frame"), msg, link_key)


def decode_peer(
    data: bytes,
    *,
    receiver: int,
    topic_sender: int,
    dim: int,
    link_keys: Mapping[int, bytes],
    view: int = 0,
    max_size: int = MAX_PEER_BYTES,
) -> Peer:
    """The peer message in `data`, which arrived on the topic of `topic_sender`, or Rejected.

    A frame of another membership view is refused before its MAC is checked (each view has
    its own link keys): `stale-view` for an earlier one, `ahead-view` for a later one, which
    the node keeps until its own Setup for that view arrives."""
    model = _decode_model(data, receiver, topic_sender, dim, link_keys, view, max_size)
    if model is not None:
        return model
    opened = _open(data, max_size, _PEER_LIMITS, _PEER, "peer message")
    name, sender = opened.schema.name, opened.fields["sender"]
    check_route(name, opened.fields, topic_sender=topic_sender, receiver=receiver, view=view)
    key = link_keys.get(sender)
    if key is None:
        raise Rejected(
            Reason.UNKNOWN_SENDER, f"{name} from agent {sender}, with whom there is no link key"
        )
    if not hmac.compare_digest(_mac(key, name, opened.body), opened.mac):
        raise Rejected(
            Reason.BAD_MAC,
            f"{name} from agent {sender}: MAC check failed (altered, or another link's key)",
        )
    return _build_peer(opened, dim)


def check_route(
    name: str, fields: Mapping[str, Any], *, topic_sender: int, receiver: int, view: int
) -> None:
    """Rejected unless a peer frame's view, sender and receiver are this link's: checked
    before any key is used. A frame of another view: `stale-view` for an earlier one,
    `ahead-view` for a later one, which the node keeps until its Setup for that view."""
    if fields["view"] != view:
        which = Reason.STALE_VIEW if fields["view"] < view else Reason.AHEAD_VIEW
        raise Rejected(which, f"frame of view {fields['view']}, this agent is at {view}")
    if fields["sender"] != topic_sender:
        raise Rejected(
            Reason.SPOOFED,
            f"{name} claims sender {fields['sender']} but came on the topic of agent "
            f"{topic_sender}",
        )
    if fields["receiver"] != receiver:
        raise Rejected(
            Reason.WRONG_RECEIVER,
            f"{name} is for agent {fields['receiver']}, this is agent {receiver}",
        )


def _build_peer(opened: _Opened, dim: int) -> Peer:
    msg = _build(opened, object, dim)
    if not isinstance(msg, Model | KeyPlan | KeyShare):
        raise TypeError(f"schema {opened.schema.name} builds no peer message")
    return msg


def peek_peer(data: bytes, dim: int, max_size: int = MAX_PEER_BYTES) -> Peer:
    """The peer message in `data` read WITHOUT its MAC check: what anyone on the wire sees
    of a MACed frame (`--seal-links off`), or Rejected("sealed") for a sealed one.

    The MAC authenticates, it does not encrypt, so an eavesdropper reads every body of the
    visible wire; the auditor (`privnet inspect`) uses this to show exactly that. Agents use
    `decode_peer` or `PeerCodec`."""
    try:
        opened = _open(data, max_size, _PEER_LIMITS, _PEER, "peer message")
    except Rejected as exc:
        if exc.reason is not Reason.SCHEMA or not _is_sealed(data, max_size):
            raise
        raise Rejected(
            Reason.SEALED, "a sealed peer frame: only its two ends (or an escrow) hold the key"
        ) from None
    return _build_peer(opened, dim)


# ---- sealed peer frames ----
# Frame `[VERSION, type, head, box]`: `head` is the msgpack map of the clear fields (who,
# which view, and where the frame sits in its link's order, from which both ends derive
# the nonce); `box` is ChaCha20-Poly1305 under the link's seal key of the msgpack map of
# every other field, with the run, the type and the head as associated data. The tag
# replaces the MAC: it authenticates what the MAC did and hides the rest.

SEAL_AD_TAG = b"privnet/link-frame/v1\0"
_NONCE = struct.Struct(">BBQ2x")  # kind << 1 | direction, step, round (model) or seq (keys)
MODEL_KIND, KEY_KIND = 1, 2
_SEQ = _Field("seq", "n", _COUNT)  # key frames: the sender's count of key frames on the link


def _split(schema: _Schema, clear: tuple[str, ...]) -> tuple[tuple[_Field, ...], ...]:
    head = tuple(f for f in schema.fields if f.key in clear)
    secret = tuple(f for f in schema.fields if f.key not in clear)
    return (head if schema.name == "model" else (*head, _SEQ)), secret


_SEALED = {
    s.name: _split(s, ("s", "r", "i", "j", "v") if s.name == "model" else ("s", "r", "v"))
    for s in _PEER_SCHEMAS
}


@dataclass(frozen=True, slots=True)
class Head:
    """The clear part of a sealed peer frame, schema-checked; its box still closed."""

    schema: _Schema
    fields: dict[str, Any]
    raw: bytes  # the head's bytes as sent: associated data
    box: bytes

    @property
    def sender(self) -> int:
        return int(self.fields["sender"])

    @property
    def receiver(self) -> int:
        return int(self.fields["receiver"])

    @property
    def view(self) -> int:
        return int(self.fields["view"])

    @property
    def kind(self) -> int:
        return MODEL_KIND if self.schema.name == "model" else KEY_KIND

    @property
    def at(self) -> tuple[int, int]:
        """Where the frame sits in its link's order of its kind: frames only move forward."""
        f = self.fields
        return (f["round"], STEPS.index(f["step"])) if "round" in f else (0, f["seq"])

    @property
    def nonce(self) -> bytes:
        f, direction = self.fields, int(self.sender > self.receiver)
        step, count = (f["step"], f["round"]) if "round" in f else (0, f["seq"])
        return _NONCE.pack(self.kind << 1 | direction, step, count)


def seal_peer(msg: Peer, aead: ChaCha20Poly1305, run: str, seq: int = 0) -> bytes:
    """`msg` as a sealed frame for its link (`aead` under the link's seal key); `seq`
    numbers the key frames a sender puts on one link (models are numbered by round)."""
    if type(msg) is Model:
        frame = _seal_model(msg, aead, _run_ad(run))
        if frame is not None:
            return frame
    schema = _schema_of(msg, _PEER, "a peer frame")
    head_fields, secret_fields = _SEALED[schema.name]
    fields = _encode_fields(msg, schema.fields)
    if schema.name != "model":
        fields["n"] = seq
    raw = _pack({f.key: fields[f.key] for f in head_fields})
    head = Head(schema, {f.name: fields[f.key] for f in head_fields}, raw, b"")
    plain = _pack({f.key: fields[f.key] for f in secret_fields})
    box = aead.encrypt(head.nonce, plain, _associated(run, schema.name, raw))
    return _pack([VERSION, schema.name, raw, box])


def _associated(run: str, name: str, raw: bytes) -> bytes:
    return b"".join((_run_ad(run), name.encode(), b"\0", raw))


@functools.cache
def _run_ad(run: str) -> bytes:
    return SEAL_AD_TAG + run.encode() + b"\0"


# Sealed model frames, nearly all of the traffic, have a fast path like the MACed ones: the
# same bytes as the generic path, anything unusual left to it (which says why it refuses).
_MODEL_AD = _MODEL_NAME + b"\0"


def _seal_model(msg: Model, aead: ChaCha20Poly1305, run_ad: bytes) -> bytes | None:
    vector = msg.vector
    s, r, i, j, v = msg.sender, msg.receiver, msg.round, msg.step, msg.view
    if not (
        type(s) is int
        and type(r) is int
        and type(i) is int
        and type(j) is int
        and type(v) is int
        and type(vector) is np.ndarray
        and vector.dtype == _F8
        and vector.ndim == 1
    ):
        return None
    raw = _pack({"s": s, "r": r, "i": i, "j": j, "v": v})
    plain = _box_prefix(len(vector)) + vector.tobytes()
    nonce = _NONCE.pack(MODEL_KIND << 1 | (s > r), j, i)
    box = aead.encrypt(nonce, plain, run_ad + _MODEL_AD + raw)
    return b"".join((_MODEL_HEAD, _bin_head(len(raw)), raw, _bin_head(len(box)), box))


@functools.cache
def _box_prefix(dim: int) -> bytes:
    """A sealed model's box up to its vector's bytes: {"w": {dtype, shape, data: bin}}."""
    return _pack({"w": {"dtype": DTYPE, "shape": [dim], "data": bytes(8 * dim)}})[: -8 * dim]


def open_model(
    data: bytes,
    *,
    receiver: int,
    topic_sender: int,
    dim: int,
    view: int,
    aead: ChaCha20Poly1305 | None,
    run: str,
    after: tuple[int, int] | None,
) -> Model | None:
    """The Model in `data` if it is a well-formed, authentic sealed model frame for this
    link, placed after `after`; None for anything else (`read_head`, `open_head` then
    accept it or say why not)."""
    if aead is None or type(data) is not bytes or not data.startswith(_MODEL_HEAD):
        return None
    try:
        outer = _unpack(data, MAX_PEER_BYTES, _PEER_LIMITS, "peer message")
        _, name, raw, box = cast(list[Any], outer)
        head = cast(dict[str, Any], _unpack(raw, MAX_PEER_BYTES, _PEER_LIMITS, "model head"))
        s, r, i, j, v = head["s"], head["r"], head["i"], head["j"], head["v"]
    except (Rejected, ValueError, TypeError, KeyError):
        return None
    if not (
        name == "model"
        and type(raw) is bytes
        and type(box) is bytes
        and len(head) == 5
        and _routed(s, r, i, j, v, topic_sender, receiver, view)
        and (after is None or (i, STEPS.index(j)) > after)
    ):
        return None
    try:
        nonce = _NONCE.pack(MODEL_KIND << 1 | (s > r), j, i)
        plain = aead.decrypt(nonce, box, _run_ad(run) + _MODEL_AD + raw)
    except (InvalidTag, ValueError):
        return None
    prefix = _box_prefix(dim)
    if len(plain) != len(prefix) + 8 * dim or not plain.startswith(prefix):
        return None
    vector = np.frombuffer(plain, dtype=_F8, offset=len(prefix)).astype(np.float64)
    if not _finite(vector):
        return None
    return Model(s, r, i, j, vector, v)


def read_head(data: bytes, max_size: int = MAX_PEER_BYTES) -> Head:
    """The head of a sealed frame, checked (what anyone on the wire sees), or Rejected;
    `unsealed` for a MACed frame, which a sealed link does not take."""
    name, raw, box = _outer(data, max_size, _PEER_LIMITS, "peer message", "head, box")
    schema = _schema_named(name, _PEER, "peer message")
    head_fields, secret_fields = _SEALED[name]
    got = _unpack(raw, max_size, _PEER_LIMITS, f"{name} head")
    if type(got) is dict and any(f.key in got for f in secret_fields):
        raise Rejected(
            Reason.UNSEALED,
            f"{name} with its fields in the clear on a sealed link (the sender runs "
            "--seal-links off, or is not privnet)",
        )
    return Head(schema, _fields(got, head_fields, f"{name} head"), raw, box)


def open_head(head: Head, aead: ChaCha20Poly1305, run: str, dim: int) -> Peer:
    """The message under `head`'s box, opened with the link's key, checked, or Rejected:
    `bad-seal` when the tag fails (a wrong key, or any byte of head or box altered)."""
    name = head.schema.name
    try:
        plain = aead.decrypt(head.nonce, head.box, _associated(run, name, head.raw))
    except InvalidTag:
        raise Rejected(
            Reason.BAD_SEAL,
            f"{name} from agent {head.sender}: the seal failed (another link's key, or "
            "altered on the way)",
        ) from None
    _, secret_fields = _SEALED[name]
    secret = _fields(
        _unpack(plain, MAX_PEER_BYTES, _PEER_LIMITS, f"{name} box"), secret_fields, name
    )
    fields = {k: v for k, v in head.fields.items() if k != "seq"} | secret
    return _build_peer(_Opened(head.schema, head.raw, head.box, fields), dim)


def _is_sealed(data: bytes, max_size: int) -> bool:
    try:
        read_head(data, max_size)
    except Rejected:
        return False
    return True


@dataclass(frozen=True, slots=True)
class SignedFrame:
    """A decoded control frame whose signature is not yet checked: `verify` does that."""

    run: str
    seq: int
    msg: Control
    statement: bytes  # exactly what the signer signed
    signature: bytes

    def verify(self, signer: keys.PublicIdentity, who: str) -> None:
        """Rejected("bad-signature") unless `signer` signed this frame."""
        if not signer.valid(self.signature, self.statement):
            raise Rejected(
                Reason.BAD_SIGNATURE,
                f"{type(self.msg).__name__} is not signed by {who}: forged or altered",
            )


def _statement(name: str, body: bytes) -> bytes:
    return SIGN_TAG + name.encode() + b"\0" + body


def encode_signed(msg: Control, run: str, seq: int, signer: keys.Identity) -> bytes:
    """A control or telemetry message, bound to its run and sequence number, signed."""
    schema = _SIGNED[_schema_of(msg, _CONTROL, "a control frame").name]
    body = _pack(_encode_fields(_Envelope(run, seq, msg), schema.fields))
    return _pack([VERSION, schema.name, body, signer.sign(_statement(schema.name, body))])


def decode_signed(data: bytes, max_size: int = MAX_CONTROL_BYTES) -> SignedFrame:
    """The control frame in `data`, schema-checked, or Rejected; the caller verifies it."""
    opened = _open(data, max_size, _CONTROL_LIMITS, _SIGNED, "control message")
    if len(opened.mac) != SIGNATURE_BYTES:
        raise Rejected(
            Reason.BAD_SIGNATURE,
            f"{opened.schema.name}: a control frame carries a {SIGNATURE_BYTES}-byte "
            f"signature, this one {len(opened.mac)} bytes",
        )
    envelope = _build(opened, _Envelope)
    return SignedFrame(
        envelope.run,
        envelope.seq,
        envelope.msg,
        _statement(opened.schema.name, opened.body),
        opened.mac,
    )


def encode_config(config: Config) -> bytes:
    """The plaintext that Setup seals."""
    return _frame(_CONFIG, config, None)


def decode_config(data: bytes) -> Config:
    """The Config inside an opened Setup, or Rejected."""
    opened = _open(data, MAX_CONTROL_BYTES, _CONTROL_LIMITS, {_CONFIG.name: _CONFIG}, "config")
    return _build(opened, Config)


def encode_report(report: Report) -> bytes:
    """The plaintext that Telemetry seals: the agent's true model for one round."""
    return _frame(_REPORT, report, None)


def decode_report(data: bytes, dim: int, max_size: int = MAX_CONTROL_BYTES) -> Report:
    """The Report inside an opened Telemetry blob, or Rejected."""
    opened = _open(data, max_size, _CONTROL_LIMITS, {_REPORT.name: _REPORT}, "report")
    if opened.mac:
        raise Rejected(Reason.SCHEMA, "report frames carry an empty MAC")
    return _build(opened, Report, dim)


def encode_reports(reports: list[Report]) -> bytes:
    """A batch of Reports (one sealed Telemetry carries several rounds)."""
    return _pack([encode_report(r) for r in reports])


def decode_reports(data: bytes, dim: int, max_size: int = MAX_CONTROL_BYTES) -> list[Report]:
    """The Reports of an opened Telemetry blob, or Rejected."""
    frames = _unpack(data, max_size, _CONTROL_LIMITS, "report batch")
    if not isinstance(frames, list) or not all(isinstance(f, bytes) for f in frames):
        raise Rejected(Reason.SCHEMA, "a report batch is a list of report frames")
    return [decode_report(f, dim, max_size) for f in frames]


def encode_link_keys(link_keys: Mapping[int, bytes]) -> bytes:
    """The plaintext an Escrow seals: neighbour id -> link key."""
    return _pack({int(m): bytes(k) for m, k in link_keys.items()})


_LINK_KEYS = _mapping(_ID, _bytes(keys.KEY_BYTES))


def decode_link_keys(data: bytes) -> dict[int, bytes]:
    """The link keys in an opened Escrow, or Rejected."""
    keys_: dict[int, bytes] = _LINK_KEYS.decode(
        _unpack(data, MAX_CONTROL_BYTES, _CONTROL_LIMITS, "escrow"), "escrow"
    )
    return keys_


def category(msg: object) -> str:
    """Byte-accounting bucket: model, keys, telemetry (Telemetry and its Report), audit
    (Escrow) or control."""
    return _CATEGORY.get(type(msg), "control")


def encode_checkpoint(
    run: str, agent: int, session: int, models: Mapping[int, np.ndarray]
) -> bytes:
    """An agent's own models by round (a checkpoint on disk): its Reports, with a header."""
    reports = [Report(agent, r, w) for r, w in sorted(models.items())]
    dim = len(reports[0].w) if reports else 0
    return _pack([VERSION, run, agent, session, dim, encode_reports(reports)])


def decode_checkpoint(data: bytes, where: str) -> tuple[str, int, int, dict[int, np.ndarray]]:
    """(run, agent, session, models) of a checkpoint; ValueError saying what is wrong."""
    try:
        outer = _unpack(data, MAX_CONTROL_BYTES * 64, _CONTROL_LIMITS, "checkpoint")
        if not isinstance(outer, list) or len(outer) != 6 or outer[0] != VERSION:
            raise Rejected(
                Reason.MALFORMED, "expected [version, run, agent, session, dim, reports]"
            )
        _, run, agent, session, dim, blob = outer
        if not (isinstance(run, str) and isinstance(blob, bytes)):
            raise Rejected(Reason.MALFORMED, "run must be text and reports bytes")
        agent, session, dim = (_COUNT.decode(v, "checkpoint") for v in (agent, session, dim))
        reports = decode_reports(blob, dim, MAX_CONTROL_BYTES * 64)
    except Rejected as exc:
        raise ValueError(f"{where} is not a privnet checkpoint: {exc.detail}") from None
    if any(r.sender != agent for r in reports):
        raise ValueError(f"{where} holds models of another agent than {agent}")
    return run, agent, session, {r.round: r.w for r in reports}

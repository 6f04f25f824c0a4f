"""Field kinds: how a dataclass's fields go to msgpack and come back, checked.

A message is declared once, as its dataclass: the kind of each field follows from the
field's type (`kind_of`), and the ranges and sizes the types carry (`privnet.agent.spec`'s `Bound`,
`Choice`, `Size`, `Distinct`, `Nested`) are applied here. Decoding either rebuilds the
value or raises `Rejected(reason, detail)`, the detail naming the field's path.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import reprlib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from privnet.agent.messages import Reason, Rejected
from privnet.agent.problems import Param, Params
from privnet.agent.spec import (
    COUNT_LIMIT,
    Bound,
    Choice,
    ConfigError,
    Distinct,
    Elided,
    Nested,
    Scheme,
    Size,
)

DTYPE = "<f8"
U4 = "<u4"  # a release on the noise lattice mod 2^32 (`--wire-dtype u4`, privnet.agent.lattice)
F4 = "<f4"  # a float32 problem's true model in telemetry Parts (privnet.agent.wire.telemetry)
WIDTH = {DTYPE: 8, U4: 4, F4: 4}  # bytes a parameter


def _short_repr() -> reprlib.Repr:
    """A repr that stays short for hostile values (Python 3.11 Repr takes no arguments)."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = 40
    short.maxlist = short.maxdict = 4
    short.maxlevel = 2
    return short


SHOW = _short_repr()


def show(value: object) -> str:
    return f"{type(value).__name__} {SHOW.repr(value)}"


def schema_error(where: str, expected: str, value: object) -> Rejected:
    return Rejected(Reason.SCHEMA, f"{where}: expected {expected}, got {show(value)}")


@dataclass(frozen=True, slots=True)
class Kind:
    """One field type: `encode` gives a msgpack-able value, `decode` checks and rebuilds it."""

    encode: Callable[[Any], Any]
    decode: Callable[[Any, str], Any]


# ---- scalars ----


def _int(rule: Bound | Choice) -> Kind:
    def decode(value: Any, where: str) -> int:
        if type(value) is not int or not rule.admits(value):  # bool is not an int here
            raise schema_error(where, rule.says, value)
        return value

    return Kind(int, decode)


def _bytes(rule: Size | None = None) -> Kind:
    def decode(value: Any, where: str) -> bytes:
        if type(value) is not bytes or (rule is not None and not rule.admits(value)):
            raise schema_error(where, "bytes" if rule is None else rule.says, value)
        return value

    return Kind(bytes, decode)


def _exact(cls: type, expected: str) -> Kind:
    """A str or bool: exactly that type."""

    def decode(value: Any, where: str) -> Any:
        if type(value) is not cls:
            raise schema_error(where, expected, value)
        return value

    return Kind(cls, decode)


def finite_float(value: Any, where: str) -> float:
    if type(value) is not float:
        raise schema_error(where, "a float64", value)
    if not math.isfinite(value):
        raise Rejected(Reason.NON_FINITE, f"{where} is {value}; only finite numbers are accepted")
    return value


TEXT = _exact(str, "a string")
BOOL = _exact(bool, "true or false")
FLOAT = Kind(float, finite_float)


# ---- containers ----


def _optional(kind: Kind) -> Kind:
    def encode(value: Any) -> Any:
        return None if value is None else kind.encode(value)

    def decode(value: Any, where: str) -> Any:
        return None if value is None else kind.decode(value, where)

    return Kind(encode, decode)


def _tuple(item: Kind, length: int | None = None, rule: Distinct | None = None) -> Kind:
    expected = "a list" if length is None else f"a list of {length}"

    def encode(value: Any) -> list[Any]:
        return [item.encode(v) for v in value]

    def decode(value: Any, where: str) -> tuple[Any, ...]:
        if type(value) is not list or (length is not None and len(value) != length):
            raise schema_error(where, expected, value)
        out = tuple(item.decode(v, f"{where}[{n}]") for n, v in enumerate(value))
        if rule is not None and not rule.admits(out):
            raise schema_error(where, rule.says, value)
        return out

    return Kind(encode, decode)


def mapping(key: Kind, value: Kind) -> Kind:
    def encode(items: Mapping[Any, Any]) -> dict[Any, Any]:
        return {key.encode(k): value.encode(v) for k, v in items.items()}

    def decode(raw: Any, where: str) -> dict[Any, Any]:
        if type(raw) is not dict:
            raise schema_error(where, "a map", raw)
        return {
            key.decode(k, f"{where} key"): value.decode(v, f"{where}[{SHOW.repr(k)}]")
            for k, v in raw.items()
        }

    return Kind(encode, decode)


def _enum(cls: type[StrEnum]) -> Kind:
    values = tuple(e.value for e in cls)

    def decode(value: Any, where: str) -> StrEnum:
        if type(value) is not str or value not in values:
            raise schema_error(where, f"one of {', '.join(values)}", value)
        return cls(value)

    return Kind(lambda e: e.value, decode)


def _scheme() -> Kind:
    """A scheme's name: the plain string, one of those registered when it is decoded."""

    def decode(value: Any, where: str) -> Scheme:
        try:
            if type(value) is str:
                return Scheme(value)
        except ConfigError:
            pass
        raise schema_error(where, f"one of {', '.join(Scheme)}", value)

    return Kind(str, decode)


def _params(depth: int) -> Kind:
    """Problem parameters: a map of names to numbers, strings, booleans or lists of them."""

    def plain(value: Param) -> Any:
        return [plain(v) for v in value] if isinstance(value, tuple) else value

    def one(value: Any, where: str, level: int) -> Param:
        if type(value) is float:
            return finite_float(value, where)
        if type(value) in (bool, int, str):
            return typing.cast(Param, value)
        if type(value) is list and level < depth:
            return tuple(one(v, f"{where}[{n}]", level + 1) for n, v in enumerate(value))
        raise schema_error(where, "a number, string, boolean or list of them", value)

    def decode(value: Any, where: str) -> Params:
        if type(value) is not dict or not all(type(k) is str for k in value):
            raise schema_error(where, "a map of parameter names to values", value)
        return tuple((k, one(value[k], f"{where}[{k!r}]", 0)) for k in sorted(value))

    return Kind(lambda params: {name: plain(value) for name, value in params}, decode)


# ---- vectors: structure now, contents once authenticated ----


@dataclass(frozen=True, slots=True)
class RawVector:
    """A vector whose structure is checked but whose contents wait until the MAC is."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes


def dtype_of(vector: np.ndarray) -> str:
    """The wire dtype of a vector: <u4 for lattice words (uint32), <f4 for float32, else <f8."""
    kind = getattr(vector, "dtype", None)
    return U4 if kind == np.uint32 else F4 if kind == np.float32 else DTYPE


def _vector_encode(vector: np.ndarray) -> dict[str, Any]:
    dtype = dtype_of(vector)
    arr = np.ascontiguousarray(vector, dtype=dtype)
    return {"dtype": dtype, "shape": list(arr.shape), "data": arr.tobytes()}


def _vector_decode(value: Any, where: str) -> RawVector:
    return RawVector(**decode_fields(value, _VECTOR_FIELDS, where))


VECTOR = Kind(_vector_encode, _vector_decode)


def check_vector(raw: RawVector, dim: int, where: str, dtype: str = DTYPE) -> np.ndarray:
    """The array behind `raw`, if it has the `dtype` expected (<f8, float64 with finite
    entries; <f4, float32 with finite entries, read in place; <u4, lattice words as uint32)
    and shape [dim]."""
    if raw.dtype != dtype:
        name = {DTYPE: "little-endian float64", F4: "little-endian float32"}.get(
            dtype, "lattice words mod 2^32"
        )
        raise Rejected(
            Reason.SHAPE,
            f"{where}: dtype must be {dtype!r} ({name}), got {raw.dtype!r}",
        )
    if raw.shape != (dim,):
        raise Rejected(Reason.SHAPE, f"{where}: shape must be [{dim}], got {list(raw.shape)}")
    width = WIDTH[dtype]
    if len(raw.data) != width * dim:
        raise Rejected(
            Reason.SHAPE,
            f"{where}: {dim} {dtype} take {width * dim} bytes, data has {len(raw.data)}",
        )
    if dtype == U4:
        return np.frombuffer(raw.data, dtype=U4).astype(np.uint32)
    if dtype == F4:  # a view of the frame's bytes: the reader copies it where it goes
        vector = np.frombuffer(raw.data, dtype=F4)
    else:
        vector = np.frombuffer(raw.data, dtype=DTYPE).astype(np.float64)
    finite = np.isfinite(vector)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise Rejected(
            Reason.NON_FINITE,
            f"{where}[{bad[0]}] is {vector[bad[0]]}; only finite numbers are accepted",
        )
    return vector


# ---- records: a dataclass's fields, under their names or the keys given ----


@dataclass(frozen=True, slots=True)
class Field:
    """A dataclass field `name`, stored under map key `key`."""

    name: str
    key: str
    kind: Kind
    elided: bool = False  # left out while it holds `default` (spec.Elided)
    default: Any = None


def decode_fields(value: Any, fields: tuple[Field, ...], where: str) -> dict[str, Any]:
    """Decode a map that must hold exactly `fields` (an elided one may be absent: its
    default), as keyword arguments by field name."""
    if type(value) is not dict:
        raise schema_error(where, "a map", value)
    if len(value) != len(fields) or any(f.key not in value for f in fields):
        keys = [f.key for f in fields]
        missing = [
            f"missing field {f.key!r}" for f in fields if f.key not in value and not f.elided
        ]
        extra = [f"unknown field {SHOW.repr(k)}" for k in value if k not in keys]
        if missing or extra:
            raise Rejected(
                Reason.SCHEMA,
                f"{where}: {'; '.join(missing + extra)} (fields are {', '.join(keys) or 'none'})",
            )
    return {
        f.name: f.kind.decode(value[f.key], f"{where}.{f.key}") if f.key in value else f.default
        for f in fields
    }


def encode_fields(obj: Any, fields: tuple[Field, ...]) -> dict[str, Any]:
    out = {}
    for f in fields:
        value = getattr(obj, f.name)
        if not (f.elided and value == f.default):
            out[f.key] = f.kind.encode(value)
    return out


_VECTOR_FIELDS = (
    Field("dtype", "dtype", TEXT),
    Field("shape", "shape", _tuple(_int(Bound(0, COUNT_LIMIT, "a dimension")))),
    Field("data", "data", _bytes()),
)


def record(cls: type, fields: tuple[Field, ...]) -> Kind:
    """A nested dataclass; its own checks (ConfigError) become schema rejections."""

    def decode(value: Any, where: str) -> Any:
        kwargs = decode_fields(value, fields, where)
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            raise Rejected(Reason.SCHEMA, f"{where}: {exc}") from exc

    return Kind(lambda obj: encode_fields(obj, fields), decode)


def _tagged(classes: tuple[type, ...]) -> Kind:
    """One of several dataclasses, sent as [tag, record], the tag its lowercased name."""
    options = {cls.__name__.lower(): (cls, record(cls, fields_of(cls))) for cls in classes}
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
            raise schema_error(
                where, f"[kind, record] with kind one of {', '.join(options)}", value
            )
        return options[value[0]][1].decode(value[1], f"{where}.{value[0]}")

    return Kind(encode, decode)


# ---- a field's kind, from its type ----


def _annotated(base: Any, rules: tuple[Any, ...]) -> Kind:
    """A type with the rules `privnet.agent.spec` declares on it (a range, a size, ...)."""
    rule = rules[0]
    if isinstance(rule, Bound | Choice) and base is int:
        return _int(rule)
    if isinstance(rule, Size) and base is bytes:
        return _bytes(rule)
    if isinstance(rule, Nested):
        return _params(rule.depth)
    if isinstance(rule, Distinct) and typing.get_origin(base) is tuple:
        (item, _) = typing.get_args(base)
        return _tuple(kind_of(item), rule=rule)
    raise TypeError(f"no wire form for {base} with {rule}")


def _generic(origin: Any, args: tuple[Any, ...]) -> Kind:
    """tuple, dict, and unions: an optional value, or one of several records."""
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _tuple(kind_of(args[0]))
        if len(set(args)) != 1:
            raise TypeError(f"a fixed tuple on the wire has one item type, got {args}")
        return _tuple(kind_of(args[0]), len(args))
    if origin is dict:
        return mapping(kind_of(args[0]), kind_of(args[1]))
    if origin in (types.UnionType, typing.Union):
        present = tuple(a for a in args if a is not type(None))
        if len(present) == 1:
            return _optional(kind_of(present[0]))
        return _tagged(present)
    raise TypeError(f"no wire form for {origin}[{args}]")


_PLAIN = {float: FLOAT, bool: BOOL, str: TEXT, bytes: _bytes(), np.ndarray: VECTOR}


def kind_of(hint: Any) -> Kind:
    """The kind of a field of type `hint`: a plain `int` has no kind (declare its range)."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        base, *rules = typing.get_args(hint)
        return _annotated(base, tuple(rules))
    if origin is not None:
        return _generic(origin, typing.get_args(hint))
    if hint in _PLAIN:
        return _PLAIN[hint]
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return _enum(hint)
    if hint is Scheme:
        return _scheme()
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return record(hint, fields_of(hint))
    raise TypeError(f"no wire form for {hint!r} (an int needs its range: privnet.agent.spec.Bound)")


@functools.cache
def fields_of(cls: type, keys: str = "") -> tuple[Field, ...]:
    """The fields of dataclass `cls` in order, each under its name or the key given for it
    in `keys` (space-separated, one per field: the short keys of per-round messages)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    names = [f.name for f in dataclasses.fields(cls)]
    short = keys.split() or names
    if len(short) != len(names):
        raise TypeError(f"{cls.__name__} has {len(names)} fields, {len(short)} keys given")
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    out = []
    for name, key in zip(names, short, strict=True):
        hint = hints[name]
        args = typing.get_args(hint) if typing.get_origin(hint) is typing.Annotated else ()
        if any(isinstance(rule, Elided) for rule in args[1:]):
            rules = tuple(rule for rule in args[1:] if not isinstance(rule, Elided))
            kept = typing.Annotated[(args[0], *rules)] if rules else args[0]  # e.g. a range
            out.append(Field(name, key, kind_of(kept), True, defaults[name]))
        else:
            out.append(Field(name, key, kind_of(hint)))
    return tuple(out)

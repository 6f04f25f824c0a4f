"""Frames: `[VERSION, type, body, mac]`, with `body` the msgpack map of the message's fields,
kept as bytes so the MAC or signature covers exactly what was sent.

Opening a frame checks, in order, size -> frame -> version -> type -> body schema; the
callers then check route and MAC (or signature) and only then the vectors (`build`), so no
unauthenticated vector is ever parsed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import msgpack

from privnet.agent.messages import KeyPlan, KeyShare, Model, Reason, Rejected
from privnet.agent.spec import ConfigError
from privnet.agent.wire.catalog import BY_CLASS, VERSION, Peer, Schema
from privnet.agent.wire.mac import mac as _mac
from privnet.agent.wire.schema import (
    DTYPE,
    VECTOR,
    check_vector,
    decode_fields,
    encode_fields,
    show,
)

MAX_PEER_BYTES = 64 * 1024
MAX_CONTROL_BYTES = 1024 * 1024
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Limits:
    """msgpack unpack limits, so a small payload cannot make the decoder allocate a lot."""

    max_str_len: int
    max_array_len: int
    max_map_len: int


PEER_LIMITS = Limits(max_str_len=64, max_array_len=4096, max_map_len=16)
CONTROL_LIMITS = Limits(max_str_len=64 * 1024, max_array_len=1 << 16, max_map_len=1 << 16)
SETUP_FLOATS = CONTROL_LIMITS.max_array_len  # the longest initial model a Setup carries


def pack(value: object) -> bytes:
    """msgpack (untyped) always packs to bytes."""
    return cast(bytes, msgpack.packb(value, use_bin_type=True))


def unpack(data: bytes, max_size: int, limits: Limits, what: str) -> object:
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


def frame(schema: Schema, msg: Any, link_key: bytes | None) -> bytes:
    """`msg` as a frame, MACed with `link_key` (an empty MAC without)."""
    body = pack(encode_fields(msg, schema.fields))
    mac = b"" if link_key is None else _mac(link_key, schema.name, body)
    return pack([VERSION, schema.name, body, mac])


def schema_of(msg: object, allowed: Mapping[str, Schema], what: str) -> Schema:
    schema = BY_CLASS.get(type(msg))
    if schema is None or allowed.get(schema.name) is not schema:
        raise TypeError(
            f"{what} cannot carry a {type(msg).__name__}; it carries {', '.join(allowed)}"
        )
    return schema


@dataclass(frozen=True, slots=True)
class Opened:
    """A frame whose version, type and body schema are checked; vectors still raw."""

    schema: Schema
    body: bytes
    mac: bytes
    fields: dict[str, Any]


def outer(
    data: bytes, max_size: int, limits: Limits, what: str, parts: str = "body, mac"
) -> tuple[str, bytes, bytes]:
    """(type, and the frame's two bins) of a frame of the right shape and version."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise Rejected(Reason.MALFORMED, f"a {what} is bytes, got {type(data).__name__}")
    if len(data) > max_size:
        raise Rejected(Reason.OVERSIZED, f"{what} is {len(data)} bytes, the limit is {max_size}")
    got = unpack(data, max_size, limits, what)
    if type(got) is not list or not got or type(got[0]) is not int:
        raise Rejected(
            Reason.MALFORMED,
            f"{what} must be a msgpack array [version, type, {parts}], got {show(got)}",
        )
    if got[0] != VERSION:
        raise Rejected(
            Reason.VERSION, f"{what} has wire version {got[0]}; this agent speaks {VERSION}"
        )
    if len(got) != 4 or [type(x) for x in got[1:]] != [str, bytes, bytes]:
        bins = ", ".join(f"{part}: bin" for part in parts.split(", "))
        raise Rejected(
            Reason.MALFORMED, f"{what} must be [version: int, type: str, {bins}], got {show(got)}"
        )
    return got[1], got[2], got[3]


def schema_named(name: str, schemas: Mapping[str, Schema], what: str) -> Schema:
    schema = schemas.get(name)
    if schema is None:
        raise Rejected(
            Reason.SCHEMA, f"unknown {what} type {name!r}; expected one of {', '.join(schemas)}"
        )
    return schema


def open_frame(
    data: bytes, max_size: int, limits: Limits, schemas: Mapping[str, Schema], what: str
) -> Opened:
    name, body, mac = outer(data, max_size, limits, what)
    schema = schema_named(name, schemas, what)
    fields = decode_fields(unpack(body, max_size, limits, f"{name} body"), schema.fields, name)
    return Opened(schema, body, mac, fields)


def build(opened: Opened, kind: type[T], dim: int | None = None, dtype: str = DTYPE) -> T:
    """The message, once its vectors (now authenticated, of `dtype`) and cross-field
    checks pass; `kind` is what the schemas `opened` was checked against build."""
    name, fields = opened.schema.name, dict(opened.fields)
    for field in opened.schema.fields:
        if field.kind is VECTOR:
            assert dim is not None, f"{name} carries a vector, so decoding it needs a dim"
            where = f"{name}.{field.key}"
            fields[field.name] = check_vector(fields[field.name], dim, where, dtype)
    msg = opened.schema.cls(**fields)
    try:
        opened.schema.check(msg)
    except ConfigError as exc:
        raise Rejected(Reason.SCHEMA, f"{name}: {exc}") from exc
    if not isinstance(msg, kind):
        raise TypeError(f"schema {name} builds {type(msg).__name__}, not {kind.__name__}")
    return msg


def build_peer(opened: Opened, dim: int, dtype: str = DTYPE) -> Peer:
    msg = build(opened, object, dim, dtype)
    if not isinstance(msg, Model | KeyPlan | KeyShare):
        raise TypeError(f"schema {opened.schema.name} builds no peer message")
    return msg


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

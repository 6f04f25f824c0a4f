"""The messages on the wire: each one's name, class and (for per-round messages) short keys.

The dataclasses declare the fields; this table only says which message travels in which
kind of frame, and under which name. Per-round messages use one-letter keys, because their
size is the overhead we measure:
  model    s sender, r receiver, i round, j step, w vector, v view
  keyplan  s sender, r receiver, j step, d side, p partners, v view
  keyshare s sender, r receiver, o owner, h hub, p partner, j step, e epoch, k public,
           g signature, v view
  report   s sender, i round, w vector
  metrics  s sender, i round, m values
  part     s sender, i round, o offset, w vector
  telemetry a agent, n session, v view, i round, x sealed
Other messages use their field names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from privnet.agent.control import (
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
    Recorded,
    Rejoin,
    Setup,
    Telemetry,
    Welcome,
)
from privnet.agent.messages import KeyPlan, KeyShare, Metrics, Model, Part, Report
from privnet.agent.problems import Linear, Rows
from privnet.agent.spec import Count
from privnet.agent.wire.schema import TEXT, Field, fields_of, kind_of, record

VERSION = 3  # 3: a Config carries a Share: its problem and data by name and parameters

Peer = Model | KeyPlan | KeyShare


def _accept(_: object) -> None:
    """The default cross-field check: nothing more to check."""


@dataclass(frozen=True, slots=True)
class Schema:
    """A message type: its name on the wire, class, fields, and cross-field check."""

    name: str
    cls: type
    fields: tuple[Field, ...]
    check: Callable[[Any], None] = _accept


def schema(cls: type, keys: str = "", check: Callable[[Any], None] = _accept) -> Schema:
    """The schema of dataclass `cls`, named after it (`keys`: see `fields_of`)."""
    return Schema(cls.__name__.lower(), cls, fields_of(cls, keys), check)


PEER_SCHEMAS = (
    schema(Model, "s r i j w v"),
    schema(KeyPlan, "s r j d p v"),
    schema(KeyShare, "s r o h p j e k g v"),
)
CONTROL_SCHEMAS = (
    *map(schema, (Hello, Welcome, Setup, Ready, Go, Beat, Hold, Excluded, Progress, Rejoin)),
    *map(schema, (Close, Left, Bye, Abort, Recorded)),
    schema(Telemetry, "a n v i x"),
    *map(schema, (Escrow, Finished, Failed)),
)
CONFIG = schema(Config, check=Config.check)
REPORT = schema(Report, "s i w")
METRICS = schema(Metrics, "s i m")
PART = schema(Part, "s i o w")


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a control frame's signature covers: the run, a sequence number, the message."""

    run: str
    seq: Count
    msg: Control


def _signed(inner: Schema) -> Schema:
    msg = record(inner.cls, inner.fields)
    fields = (
        Field("run", "run", TEXT),
        Field("seq", "seq", kind_of(Count)),
        Field("msg", "msg", msg),
    )
    return Schema(inner.name, Envelope, fields)


SIGNED = {s.name: _signed(s) for s in CONTROL_SCHEMAS}
PEER = {s.name: s for s in PEER_SCHEMAS}
CONTROL = {s.name: s for s in CONTROL_SCHEMAS}
BY_CLASS = {s.cls: s for s in (*PEER_SCHEMAS, *CONTROL_SCHEMAS, REPORT, METRICS, PART, CONFIG)}
DATA = kind_of(Linear | Rows)  # a Share's data, by kind

_CATEGORY = {
    Model: "model",
    KeyPlan: "keys",
    KeyShare: "keys",
    Telemetry: "telemetry",
    Report: "telemetry",
    Metrics: "telemetry",
    Part: "telemetry",
    Escrow: "audit",
}


def category(msg: object) -> str:
    """Byte-accounting bucket: model, keys, telemetry (Telemetry and its Report), audit
    (Escrow) or control."""
    return _CATEGORY.get(type(msg), "control")

"""Sealed peer frames: `[VERSION, type, head, box]`.

`head` is the msgpack map of the clear fields (who, which view, and where the frame sits in
its link's order, from which both ends derive the nonce); `box` is ChaCha20-Poly1305 under
the link's seal key of the msgpack map of every other field, with the run, the type and the
head as associated data. The tag replaces the MAC: it authenticates what the MAC did and
hides the rest. Sealed model frames have a fast path (`seal_model`, `open_model`), the same
bytes as the generic one, anything unusual left to it (which says why it refuses).
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import Any, cast

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from privnet.agent.messages import Model, Reason, Rejected
from privnet.agent.spec import STEPS, Count
from privnet.agent.wire.catalog import PEER, PEER_SCHEMAS, VERSION, Peer, Schema
from privnet.agent.wire.frames import (
    MAX_PEER_BYTES,
    PEER_LIMITS,
    Opened,
    build_peer,
    outer,
    pack,
    schema_named,
    schema_of,
    unpack,
)
from privnet.agent.wire.model import MODEL_HEAD, MODEL_NAME, bin_head, routed, usual, vector_of
from privnet.agent.wire.schema import (
    DTYPE,
    WIDTH,
    Field,
    decode_fields,
    dtype_of,
    encode_fields,
    kind_of,
)

SEAL_AD_TAG = b"privnet/link-frame/v1\0"
_NONCE = struct.Struct(">BBQ2x")  # kind << 1 | direction, step, round (model) or seq (keys)
MODEL_KIND, KEY_KIND = 1, 2
_SEQ = Field("seq", "n", kind_of(Count))  # key frames: the sender's count on the link
_MODEL_AD = MODEL_NAME + b"\0"


def link_nonce(kind: int, sender: int, receiver: int, step: int, count: int) -> bytes:
    """A frame's nonce: unique per link key, since each (kind, direction, step, count)
    is sent once on a link (models counted by round, key frames by the sender's seq)."""
    return _NONCE.pack(kind << 1 | (sender > receiver), step, count)


def _split(schema: Schema, clear: tuple[str, ...]) -> tuple[tuple[Field, ...], ...]:
    head = tuple(f for f in schema.fields if f.key in clear)
    secret = tuple(f for f in schema.fields if f.key not in clear)
    return (head if schema.name == "model" else (*head, _SEQ)), secret


SEALED = {
    s.name: _split(s, ("s", "r", "i", "j", "v") if s.name == "model" else ("s", "r", "v"))
    for s in PEER_SCHEMAS
}


@dataclass(frozen=True, slots=True)
class Head:
    """The clear part of a sealed peer frame, schema-checked; its box still closed."""

    schema: Schema
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
        f = self.fields
        step, count = (f["step"], f["round"]) if "round" in f else (0, f["seq"])
        return link_nonce(self.kind, self.sender, self.receiver, step, count)


def seal_peer(msg: Peer, aead: ChaCha20Poly1305, run: str, seq: int = 0) -> bytes:
    """`msg` as a sealed frame for its link (`aead` under the link's seal key); `seq`
    numbers the key frames a sender puts on one link (models are numbered by round)."""
    if type(msg) is Model and usual(msg):
        return _seal_model(msg, aead, run_ad(run))
    schema = schema_of(msg, PEER, "a peer frame")
    head_fields, secret_fields = SEALED[schema.name]
    fields = encode_fields(msg, schema.fields)
    if schema.name != "model":
        fields["n"] = seq
    raw = pack({f.key: fields[f.key] for f in head_fields})
    head = Head(schema, {f.name: fields[f.key] for f in head_fields}, raw, b"")
    plain = pack({f.key: fields[f.key] for f in secret_fields})
    box = aead.encrypt(head.nonce, plain, associated(run, schema.name, raw))
    return pack([VERSION, schema.name, raw, box])


def associated(run: str, name: str, raw: bytes) -> bytes:
    return b"".join((run_ad(run), name.encode(), b"\0", raw))


@functools.cache
def run_ad(run: str) -> bytes:
    return SEAL_AD_TAG + run.encode() + b"\0"


def _seal_model(msg: Model, aead: ChaCha20Poly1305, run_ad: bytes) -> bytes:
    s, r, i, j, v, vector = msg.sender, msg.receiver, msg.round, msg.step, msg.view, msg.vector
    raw = pack({"s": s, "r": r, "i": i, "j": j, "v": v})
    plain = _box_prefix(len(vector), dtype_of(vector)) + vector.tobytes()
    box = aead.encrypt(link_nonce(MODEL_KIND, s, r, j, i), plain, run_ad + _MODEL_AD + raw)
    return b"".join((MODEL_HEAD, bin_head(len(raw)), raw, bin_head(len(box)), box))


@functools.cache
def _box_prefix(dim: int, dtype: str = DTYPE) -> bytes:
    """A sealed model's box up to its vector's bytes: {"w": {dtype, shape, data: bin}}."""
    size = WIDTH[dtype] * dim
    return pack({"w": {"dtype": dtype, "shape": [dim], "data": bytes(size)}})[:-size]


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
    dtype: str = DTYPE,
) -> Model | None:
    """The Model in `data` if it is a well-formed, authentic sealed model frame for this
    link, placed after `after`; None for anything else (`read_head`, `open_head` then
    accept it or say why not)."""
    if aead is None or type(data) is not bytes or not data.startswith(MODEL_HEAD):
        return None
    parts = _bins(data)
    if parts is None:
        return None
    raw, box = parts
    try:
        head = cast(dict[str, Any], unpack(raw, MAX_PEER_BYTES, PEER_LIMITS, "model head"))
        s, r, i, j, v = head["s"], head["r"], head["i"], head["j"], head["v"]
    except (Rejected, ValueError, TypeError, KeyError):
        return None
    if not (
        len(head) == 5
        and routed(s, r, i, j, v, topic_sender, receiver, view)
        and (after is None or (i, STEPS.index(j)) > after)
    ):
        return None
    try:
        plain = aead.decrypt(link_nonce(MODEL_KIND, s, r, j, i), box, run_ad(run) + _MODEL_AD + raw)
    except (InvalidTag, ValueError):
        return None
    prefix = _box_prefix(dim, dtype)
    if len(plain) != len(prefix) + WIDTH[dtype] * dim or not plain.startswith(prefix):
        return None
    vector = vector_of(plain, dtype, len(prefix))
    return None if vector is None else Model(s, r, i, j, vector, v)


def _bins(data: bytes) -> tuple[bytes, bytes] | None:
    """(head, box) of `MODEL_HEAD` + bin8 head + bin box, read by hand: what msgpack would
    give for those bytes, at a fraction of the cost of a call to it. None for any other
    layout (a longer header, bytes left over): the generic path reads those."""
    at, end = len(MODEL_HEAD), len(data)
    if end < at + 2 or data[at] != 0xC4:
        return None
    box_at = at + 2 + data[at + 1]
    if box_at + 2 > end:
        return None
    kind = data[box_at]
    width = 1 if kind == 0xC4 else 2 if kind == 0xC5 else 4 if kind == 0xC6 else 0
    size = int.from_bytes(data[box_at + 1 : box_at + 1 + width], "big")
    if not width or size > MAX_PEER_BYTES or box_at + 1 + width + size != end:
        return None
    return data[at + 2 : box_at], data[box_at + 1 + width :]


def read_head(data: bytes, max_size: int = MAX_PEER_BYTES) -> Head:
    """The head of a sealed frame, checked (what anyone on the wire sees), or Rejected;
    `unsealed` for a MACed frame, which a sealed link does not take."""
    name, raw, box = outer(data, max_size, PEER_LIMITS, "peer message", "head, box")
    schema = schema_named(name, PEER, "peer message")
    head_fields, secret_fields = SEALED[name]
    got = unpack(raw, max_size, PEER_LIMITS, f"{name} head")
    if type(got) is dict and any(f.key in got for f in secret_fields):
        raise Rejected(
            Reason.UNSEALED,
            f"{name} with its fields in the clear on a sealed link (the sender runs "
            "--seal-links off, or is not privnet)",
        )
    return Head(schema, decode_fields(got, head_fields, f"{name} head"), raw, box)


def open_head(head: Head, aead: ChaCha20Poly1305, run: str, dim: int, dtype: str = DTYPE) -> Peer:
    """The message under `head`'s box, opened with the link's key, checked, or Rejected:
    `bad-seal` when the tag fails (a wrong key, or any byte of head or box altered)."""
    name = head.schema.name
    try:
        plain = aead.decrypt(head.nonce, head.box, associated(run, name, head.raw))
    except InvalidTag:
        raise Rejected(
            Reason.BAD_SEAL,
            f"{name} from agent {head.sender}: the seal failed (another link's key, or "
            "altered on the way)",
        ) from None
    _, secret_fields = SEALED[name]
    box = unpack(plain, MAX_PEER_BYTES, PEER_LIMITS, f"{name} box")
    fields = {k: v for k, v in head.fields.items() if k != "seq"}
    fields |= decode_fields(box, secret_fields, name)
    return build_peer(Opened(head.schema, head.raw, head.box, fields), dim, dtype)


def is_sealed(data: bytes, max_size: int) -> bool:
    try:
        read_head(data, max_size)
    except Rejected:
        return False
    return True

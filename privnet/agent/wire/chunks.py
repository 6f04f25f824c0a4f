"""A model too big for one peer frame, as a sequence of chunk frames, and its reassembly.

A chunk frame is `[VERSION, "chunk", head, box]`: `head` the msgpack map
`{s, r, i, j, v, c, n}` (sender, receiver, round, step, view, the chunk's index, the count),
with `d: "<u4"` besides for lattice words (`--wire-dtype u4`; float64 has no `d`), in the
clear; sealed, `box` is ChaCha20-Poly1305 under the link's key of the vector's bytes
from `c * CHUNK_BYTES`, with the nonce `(kind 3, direction, step, round, index)` and the run,
the type and the head as associated data, so a chunk opens only at its own place (index,
round, step, view, link, count). With `--seal-links off`, `box` is those bytes in the clear
and a MAC over type, head and bytes. Models whose one frame fits `MAX_PEER_BYTES` never
come here: their frame is the single `model` frame, unchanged.

`Assembly` is what a receiver holds for one in-link: at most one model in flight, its
buffer allocated once, chunks taken strictly in order (one topic and one connection per
link keep MQTT's order, so anything else was lost or tampered with).
"""

from __future__ import annotations

import functools
import hmac
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from privnet.agent.messages import Model, Reason, Rejected
from privnet.agent.spec import COUNT_LIMIT, ID_LIMIT, STEPS
from privnet.agent.wire.catalog import VERSION
from privnet.agent.wire.frames import MAX_PEER_BYTES, PEER_LIMITS, outer, pack, unpack
from privnet.agent.wire.mac import MAC_BYTES, mac
from privnet.agent.wire.model import all_finite, bin_head
from privnet.agent.wire.peer import model_frame_bytes
from privnet.agent.wire.schema import DTYPE, U4, WIDTH, dtype_of
from privnet.agent.wire.sealed import run_ad

CHUNK_NAME = "chunk"
CHUNK_KIND = 3  # beside sealed.MODEL_KIND and KEY_KIND: a nonce space of its own
CHUNK_BYTES = 65_280  # a chunk's data: 8,160 float64s; its frame stays within MAX_PEER_BYTES
MAX_CHUNKS = 4096  # per model: 33.4M float64 parameters, 267 MB a model (see max_chunked_dim)
TAG_BYTES = 16  # ChaCha20-Poly1305's tag, and the MAC of a visible chunk (MAC_BYTES)
CHUNK_HEAD = b"\x94" + bytes([VERSION]) + b"\xa5" + CHUNK_NAME.encode()
_NONCE = struct.Struct(">BBQH")  # kind << 1 | direction, step, round, index
_AD = CHUNK_NAME.encode() + b"\0"
_KEYS = ("s", "r", "i", "j", "v", "c", "n")
_WORDS_KEYS = sorted((*_KEYS, "d"))  # a chunk of lattice words: its dtype in the head
assert MAC_BYTES == TAG_BYTES


def chunk_nonce(sender: int, receiver: int, step: int, round_: int, index: int) -> bytes:
    """Unique per link key: each (direction, step, round, index) is sent once on a link."""
    return _NONCE.pack(CHUNK_KIND << 1 | (sender > receiver), step, round_, index)


def chunk_count(dim: int, dtype: str = DTYPE) -> int:
    """How many chunks a model of `dim` parameters of `dtype` travels in."""
    return max(1, -(-WIDTH[dtype] * dim // CHUNK_BYTES))


def max_chunked_dim(dtype: str = DTYPE) -> int:
    """The most parameters a model may have on the peer plane: MAX_CHUNKS full chunks."""
    return MAX_CHUNKS * CHUNK_BYTES // WIDTH[dtype]


@dataclass(frozen=True, slots=True)
class ChunkHead:
    """A chunk frame's clear part, checked for shape; its box not yet opened."""

    sender: int
    receiver: int
    round: int
    step: int
    view: int
    index: int
    count: int
    raw: bytes  # the head's bytes as sent: associated data (sealed), MACed (visible)
    box: bytes
    dtype: str = DTYPE  # the vector's: <f8, or <u4 (a `d` in the head)

    @property
    def place(self) -> tuple[int, int]:
        """The model's place in its link's order (as a model frame's `Head.at`)."""
        return self.round, STEPS.index(self.step)

    @property
    def fields(self) -> dict[str, int]:
        """For `frames.check_route`."""
        return {"sender": self.sender, "receiver": self.receiver, "view": self.view}

    @property
    def nonce(self) -> bytes:
        return chunk_nonce(self.sender, self.receiver, self.step, self.round, self.index)


def _frame(raw: bytes, box: bytes) -> bytes:
    return b"".join((CHUNK_HEAD, bin_head(len(raw)), raw, bin_head(len(box)), box))


def _pieces(msg: Model) -> list[tuple[bytes, memoryview]]:
    """Each chunk's head and data, in order."""
    dtype = dtype_of(msg.vector)
    data = np.ascontiguousarray(msg.vector, dtype=dtype).data.cast("B")
    n = chunk_count(len(msg.vector), dtype)
    if n > MAX_CHUNKS:
        raise ValueError(f"a model of {len(msg.vector):,} parameters is over {MAX_CHUNKS} chunks")
    fixed: dict[str, int | str] = {
        "s": msg.sender,
        "r": msg.receiver,
        "i": msg.round,
        "j": msg.step,
        "v": msg.view,
    }
    if dtype == U4:
        fixed["d"] = U4
    return [
        (pack({**fixed, "c": c, "n": n}), data[c * CHUNK_BYTES : (c + 1) * CHUNK_BYTES])
        for c in range(n)
    ]


def seal_chunks(msg: Model, aead: ChaCha20Poly1305, run: str) -> list[bytes]:
    """`msg` as its sealed chunk frames, in order."""
    ad = run_ad(run) + _AD
    s, r, i, j = msg.sender, msg.receiver, msg.round, msg.step
    return [
        _frame(raw, aead.encrypt(chunk_nonce(s, r, j, i, c), data, ad + raw))
        for c, (raw, data) in enumerate(_pieces(msg))
    ]


def mac_chunks(msg: Model, link_key: bytes) -> list[bytes]:
    """`msg` as its visible chunk frames (`--seal-links off`): the bytes and their MAC."""
    out = []
    for raw, data in _pieces(msg):
        body = raw + data
        out.append(_frame(raw, bytes(data) + mac(link_key, CHUNK_NAME, body)))
    return out


def is_chunk(data: bytes) -> bool:
    return type(data) is bytes and data.startswith(CHUNK_HEAD)


def read_chunk(data: bytes) -> ChunkHead:
    """The head of a chunk frame, checked for shape (not yet authentic), or Rejected."""
    name, raw, box = outer(data, MAX_PEER_BYTES, PEER_LIMITS, "peer message", "head, box")
    head: Any = unpack(raw, MAX_PEER_BYTES, PEER_LIMITS, "chunk head")
    if (
        name != CHUNK_NAME
        or type(head) is not dict
        or sorted(head) not in (sorted(_KEYS), _WORDS_KEYS)
        or any(type(head[k]) is not int for k in _KEYS)
        or head.get("d", U4) != U4
    ):
        raise Rejected(
            Reason.SCHEMA,
            f"a chunk's head is the map of ints {{{', '.join(_KEYS)}}} (and d: {U4!r} for "
            f"lattice words): {head!r}",
        )
    s, r, i, j, v, c, n = (head[k] for k in _KEYS)
    if not (
        0 <= s < ID_LIMIT
        and 0 <= r < ID_LIMIT
        and 0 <= i < COUNT_LIMIT
        and j in STEPS
        and 0 <= v < COUNT_LIMIT
        and 1 <= n <= MAX_CHUNKS
        and 0 <= c < n
    ):
        raise Rejected(Reason.SCHEMA, f"a chunk's head out of range: {head!r}")
    return ChunkHead(s, r, i, j, v, c, n, raw, box, U4 if "d" in head else DTYPE)


def _span(dim: int, index: int, dtype: str = DTYPE) -> int:
    """The data bytes of chunk `index` of a model of `dim` parameters."""
    return min(CHUNK_BYTES, WIDTH[dtype] * dim - index * CHUNK_BYTES)


@dataclass
class Assembly:
    """One in-link's model in flight: its place, the chunks seen, the buffer they fill."""

    place: tuple[int, int]
    count: int
    buffer: np.ndarray | None  # the model's bytes (float64 or words); None once it is lost
    next: int = 0  # the index the model needs next
    high: int = -1  # the highest index seen
    seen: bytearray = field(default_factory=bytearray)

    def __post_init__(self) -> None:
        self.seen = bytearray(self.count)


class Reassembler:
    """What one receiver holds of its in-links' chunked models: at most one each.

    `take` refuses, without touching what it holds, anything not authentic or behind the
    link; an authentic chunk out of order loses its model (the round then waits for it, as
    for any lost frame: the orchestrator's deadline decides)."""

    def __init__(self, run: str, me: int, dim: int, dtype: str = DTYPE) -> None:
        self.run, self.me, self.dim, self.dtype = run, me, dim, dtype
        self.count = chunk_count(dim, dtype)
        self._ad = run_ad(run) + _AD
        self._held: dict[int, Assembly] = {}  # sender -> its model in flight

    @property
    def held_bytes(self) -> int:
        """Buffer bytes held now: at most one model's (width * dim) per in-link."""
        return sum(a.buffer.nbytes for a in self._held.values() if a.buffer is not None)

    def take(
        self,
        head: ChunkHead,
        secret: ChaCha20Poly1305 | bytes,
        last: tuple[int, int] | None,
    ) -> Model | None:
        """The model `head` completes, None while it is incomplete, or Rejected; `secret` is
        the link's AEAD (sealed) or MAC key (visible), `last` the place of the link's last
        whole model."""
        if head.count != self.count or head.dtype != self.dtype:
            raise Rejected(
                Reason.SHAPE,
                f"chunk of a {head.count}-chunk model of {head.dtype}; a model here has "
                f"{self.count} chunks of {self.dtype}",
            )
        span = _span(self.dim, head.index, self.dtype)
        if len(head.box) != span + TAG_BYTES:
            raise Rejected(Reason.SHAPE, f"chunk {head.index} of {len(head.box)} bytes")
        held = self._held.get(head.sender)
        if (last is not None and head.place <= last) or (
            held is not None
            and (head.place < held.place or (head.place == held.place and held.seen[head.index]))
        ):
            raise Rejected(
                Reason.REPLAY,
                f"chunk {head.index} of round {head.round} step {head.step} from agent "
                f"{head.sender}: taken before, or its model is past",
            )
        if held is None or head.place > held.place:  # authentic first: then a new model
            plain = self._open(head, secret, None)
            held = self._held[head.sender] = Assembly(head.place, self.count, None)
            if head.index == 0:
                held.buffer = np.empty(
                    self.dim, dtype=np.uint32 if self.dtype == U4 else np.float64
                )
        elif held.buffer is not None and head.index == held.next:
            plain = self._open(head, secret, held.buffer, head.index * CHUNK_BYTES)
        else:
            plain = self._open(head, secret, None)
        return self._place(head, held, plain)

    def _place(self, head: ChunkHead, held: Assembly, plain: bytes | None) -> Model | None:
        c = head.index
        held.seen[c] = 1
        if held.buffer is None or c != held.next:
            behind = c < held.high
            held.buffer, held.high = None, max(held.high, c)
            raise Rejected(
                Reason.CHUNK_ORDER if behind else Reason.CHUNK_GAP,
                f"chunk {c} of round {head.round} step {head.step} from agent {head.sender} "
                + ("after a later one" if behind else f"where chunk {held.next} was due")
                + ": its model is lost",
            )
        if plain is not None:  # opened aside (a model's first chunk): into the buffer
            at = c * CHUNK_BYTES
            held.buffer.data.cast("B")[at : at + len(plain)] = plain
        held.next, held.high = c + 1, c
        if held.next < held.count:
            return None
        vector = held.buffer
        del self._held[head.sender]
        if self.dtype == DTYPE and not all_finite(vector):
            raise Rejected(Reason.NON_FINITE, f"model from {head.sender} has NaN or inf")
        return Model(head.sender, head.receiver, head.round, head.step, vector, head.view)

    def _open(
        self,
        head: ChunkHead,
        secret: ChaCha20Poly1305 | bytes,
        buffer: np.ndarray | None,
        at: int = 0,
    ) -> bytes | None:
        """The chunk's bytes (into `buffer` at `at` when given: then None), or Rejected."""
        span = len(head.box) - TAG_BYTES
        if isinstance(secret, bytes):
            data = head.box[:span]
            if not hmac.compare_digest(mac(secret, CHUNK_NAME, head.raw + data), head.box[span:]):
                raise Rejected(Reason.BAD_MAC, f"chunk from agent {head.sender}: MAC check failed")
            plain: bytes | None = data
        else:
            plain = None
            if buffer is None:
                plain = _decrypted(head, secret, self._ad)
            else:
                out = buffer.data.cast("B")[at : at + span]
                try:
                    secret.decrypt_into(head.nonce, head.box, self._ad + head.raw, out)
                except InvalidTag:
                    raise _seal_failed(head) from None
        if buffer is not None and plain is not None:
            buffer.data.cast("B")[at : at + span] = plain
            return None
        return plain


def chunk_data(head: ChunkHead, aead: ChaCha20Poly1305 | None, run: str) -> bytes:
    """A chunk's data as the auditor reads it: a visible chunk's (`aead` None) without its
    MAC check, as anyone on the wire reads it; a sealed one opened with its link's key (the
    escrow's), or Rejected (bad-seal)."""
    if aead is None:
        return head.box[: len(head.box) - TAG_BYTES]
    return _decrypted(head, aead, run_ad(run) + _AD)


def _decrypted(head: ChunkHead, aead: ChaCha20Poly1305, ad: bytes) -> bytes:
    """The chunk opened under `ad` (the run's and the chunks' associated data), or Rejected."""
    try:
        return aead.decrypt(head.nonce, head.box, ad + head.raw)
    except InvalidTag:
        raise _seal_failed(head) from None


def _seal_failed(head: ChunkHead) -> Rejected:
    return Rejected(
        Reason.BAD_SEAL,
        f"chunk {head.index} from agent {head.sender}: the seal failed (another link's key, "
        "another place, or altered on the way)",
    )


@functools.cache
def needs_chunks(dim: int, dtype: str = DTYPE) -> bool:
    """Whether a model of `dim` parameters is over one peer frame (so goes in chunks)."""
    return model_frame_bytes(dim, dtype) > MAX_PEER_BYTES

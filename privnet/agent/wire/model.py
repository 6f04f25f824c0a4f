"""The model frame's fast path: model frames are nearly all of the traffic.

These pack and check a MACed model frame's known fields directly, the same bytes as the
generic path (`frames`); anything they do not expect goes to the generic path, which builds
the same bytes and gives every refusal its reason and detail. `sealed` has the sealed twin.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Mapping
from typing import Any, cast

import numpy as np

from privnet.agent.messages import Model, Rejected
from privnet.agent.spec import COUNT_LIMIT, STEPS
from privnet.agent.wire.catalog import VERSION
from privnet.agent.wire.frames import PEER_LIMITS, pack, unpack
from privnet.agent.wire.mac import MAC_BYTES, mac
from privnet.agent.wire.schema import DTYPE, U4, WIDTH, dtype_of

F8 = np.dtype(DTYPE)
WORDS = np.dtype(U4)  # the u4 wire's lattice words
MODEL_NAME = b"model"
MODEL_HEAD = b"\x94" + bytes([VERSION]) + b"\xa5" + MODEL_NAME  # msgpack [VERSION, "model", ...
_MAC_HEAD = b"\xc4" + bytes([MAC_BYTES])  # ... bin8 of MAC_BYTES: the MAC]
_SHORT = 32  # vectors up to this long are checked for finiteness in Python


def bin_head(size: int) -> bytes:
    """msgpack's header for a bin of `size` bytes (as `packb(..., use_bin_type=True)`)."""
    if size < 1 << 8:
        return b"\xc4" + size.to_bytes(1, "big")
    if size < 1 << 16:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


def all_finite(vector: np.ndarray) -> bool:
    """Whether every entry is finite: in Python for short vectors, where numpy's call
    overhead dominates, with numpy for long ones."""
    if len(vector) <= _SHORT:
        return all(map(math.isfinite, vector.tolist()))
    return bool(np.isfinite(vector).all())


def usual(msg: Model) -> bool:
    """Whether `msg`'s fields have the types the fast paths pack (else: the generic path)."""
    vector = msg.vector
    return (
        type(msg.sender) is int
        and type(msg.receiver) is int
        and type(msg.round) is int
        and type(msg.step) is int
        and type(msg.view) is int
        and type(vector) is np.ndarray
        and (vector.dtype == F8 or vector.dtype == WORDS)
        and vector.ndim == 1
    )


def routed(s: Any, r: Any, i: Any, j: Any, v: Any, sender: int, receiver: int, view: int) -> bool:
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


def encode_model(msg: Model, link_key: bytes) -> bytes | None:
    """The frame the generic path would build for `msg`; None if a field is unusual."""
    if not usual(msg):
        return None
    vector = msg.vector
    body = pack(
        {
            "s": msg.sender,
            "r": msg.receiver,
            "i": msg.round,
            "j": msg.step,
            "w": {"dtype": dtype_of(vector), "shape": [len(vector)], "data": vector.tobytes()},
            "v": msg.view,
        }
    )
    tag = mac(link_key, "model", body)
    return b"".join((MODEL_HEAD, bin_head(len(body)), body, _MAC_HEAD, tag))


def _vector_ok(w: Any, raw: Any, dim: int, dtype: str) -> bool:
    return (
        type(w) is dict
        and len(w) == 3
        and w.get("dtype") == dtype
        and type(w["dtype"]) is str
        and w.get("shape") == [dim]
        and type(w["shape"][0]) is int
        and type(raw) is bytes
        and len(raw) == WIDTH[dtype] * dim
    )


def vector_of(data: bytes, dtype: str, offset: int = 0) -> np.ndarray | None:
    """A received vector as the core takes it (float64, or uint32 words); None for a
    float64 one with NaN or inf."""
    if dtype == U4:
        return np.frombuffer(data, dtype=WORDS, offset=offset).astype(np.uint32)
    vector = np.frombuffer(data, dtype=F8, offset=offset).astype(np.float64)
    return vector if all_finite(vector) else None


def decode_model(
    data: bytes,
    receiver: int,
    topic_sender: int,
    dim: int,
    link_keys: Mapping[int, bytes],
    view: int,
    max_size: int,
    dtype: str = DTYPE,
) -> Model | None:
    """The Model in `data` if it is a well-formed, authentic model frame for this link;
    None for anything else (the generic path then accepts it or says why not)."""
    if type(data) is not bytes or len(data) > max_size or not data.startswith(MODEL_HEAD):
        return None
    try:
        outer = unpack(data, max_size, PEER_LIMITS, "peer message")
        _, name, body, tag = cast(list[Any], outer)
        fields = unpack(body, max_size, PEER_LIMITS, "model body")
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
        and type(tag) is bytes
        and type(fields) is dict
        and len(fields) == 6
        and routed(s, r, i, j, v, topic_sender, receiver, view)
        and _vector_ok(w, raw, dim, dtype)
    ):
        return None
    key = link_keys.get(s)
    if key is None or not hmac.compare_digest(mac(key, "model", body), tag):
        return None
    vector = vector_of(raw, dtype)
    return None if vector is None else Model(s, r, i, j, vector, v)

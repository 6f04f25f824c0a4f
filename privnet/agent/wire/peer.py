"""Visible peer frames (`--seal-links off`): MACed, read by anyone; and the size of a model
frame, sealed or not.

`mac` is HMAC-SHA256(link_key, type + body)[:16]. A decode checks size -> frame -> version
-> type -> body schema -> sender/receiver/view -> MAC -> vectors.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Mapping

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from privnet.agent.messages import Model, Reason, Rejected
from privnet.agent.spec import COUNT_LIMIT, ID_LIMIT, STEPS
from privnet.agent.wire import model
from privnet.agent.wire.catalog import PEER, Peer
from privnet.agent.wire.frames import (
    MAX_PEER_BYTES,
    PEER_LIMITS,
    build_peer,
    check_route,
    frame,
    open_frame,
    schema_of,
)
from privnet.agent.wire.mac import mac
from privnet.agent.wire.schema import DTYPE, U4, WIDTH
from privnet.agent.wire.sealed import is_sealed, seal_peer


def encode_peer(msg: Peer, link_key: bytes) -> bytes:
    """A Model, KeyPlan or KeyShare as a MACed frame for the link it travels on."""
    if type(msg) is Model:
        data = model.encode_model(msg, link_key)
        if data is not None:
            return data
    return frame(schema_of(msg, PEER, "a peer frame"), msg, link_key)


def decode_peer(
    data: bytes,
    *,
    receiver: int,
    topic_sender: int,
    dim: int,
    link_keys: Mapping[int, bytes],
    view: int = 0,
    max_size: int = MAX_PEER_BYTES,
    dtype: str = DTYPE,
) -> Peer:
    """The peer message in `data`, which arrived on the topic of `topic_sender`, or Rejected.

    A frame of another membership view is refused before its MAC is checked (each view has
    its own link keys): `stale-view` for an earlier one, `ahead-view` for a later one, which
    the node keeps until its own Setup for that view arrives. A model's vector is of
    `dtype` (the run's wire form), anything else `shape`."""
    fast = model.decode_model(data, receiver, topic_sender, dim, link_keys, view, max_size, dtype)
    if fast is not None:
        return fast
    opened = open_frame(data, max_size, PEER_LIMITS, PEER, "peer message")
    name, sender = opened.schema.name, opened.fields["sender"]
    check_route(name, opened.fields, topic_sender=topic_sender, receiver=receiver, view=view)
    key = link_keys.get(sender)
    if key is None:
        raise Rejected(
            Reason.UNKNOWN_SENDER, f"{name} from agent {sender}, with whom there is no link key"
        )
    if not hmac.compare_digest(mac(key, name, opened.body), opened.mac):
        raise Rejected(
            Reason.BAD_MAC,
            f"{name} from agent {sender}: MAC check failed (altered, or another link's key)",
        )
    return build_peer(opened, dim, dtype)


def peek_peer(data: bytes, dim: int, max_size: int = MAX_PEER_BYTES, dtype: str = DTYPE) -> Peer:
    """The peer message in `data` read WITHOUT its MAC check: what anyone on the wire sees
    of a MACed frame (`--seal-links off`), or Rejected("sealed") for a sealed one.

    The MAC authenticates, it does not encrypt, so an eavesdropper reads every body of the
    visible wire; the auditor (`privnet inspect`) uses this to show exactly that. Agents use
    `decode_peer` or `Links`."""
    try:
        opened = open_frame(data, max_size, PEER_LIMITS, PEER, "peer message")
    except Rejected as exc:
        if exc.reason is not Reason.SCHEMA or not is_sealed(data, max_size):
            raise
        raise Rejected(
            Reason.SEALED, "a sealed peer frame: only its two ends (or an escrow) hold the key"
        ) from None
    return build_peer(opened, dim, dtype)


def model_frame_bytes(dim: int, dtype: str = DTYPE) -> int:
    """The largest peer frame a model of `dim` parameters makes (sealed or MACed, every
    count at its widest), which must stay within MAX_PEER_BYTES."""
    big = ID_LIMIT - 1
    zeros = np.zeros(dim, dtype=np.uint32 if dtype == U4 else np.float64)
    msg = Model(big, big - 1, COUNT_LIMIT - 1, STEPS[0], zeros, COUNT_LIMIT - 1)
    aead = ChaCha20Poly1305(bytes(32))
    return max(len(seal_peer(msg, aead, "")), len(encode_peer(msg, bytes(32))))


@functools.cache
def max_model_dim(dtype: str = DTYPE) -> int:
    """The most parameters a model may have and still fit one peer frame."""
    low, high = 0, MAX_PEER_BYTES // WIDTH[dtype]  # fits, does not fit
    while high - low > 1:
        mid = (low + high) // 2
        fits = model_frame_bytes(mid, dtype) <= MAX_PEER_BYTES
        low, high = (mid, high) if fits else (low, mid)
    return low

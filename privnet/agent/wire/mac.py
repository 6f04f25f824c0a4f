"""The MAC of a visible peer frame: HMAC-SHA256(link_key, type + body), truncated.

Every frame on a link is MACed under the same key, so each key's HMAC object, its key pads
already hashed, is kept and copied per frame (RFC 2104's pads are hashed once per key)."""

from __future__ import annotations

import hashlib
import hmac

MAC_BYTES = 16
_CACHE_SIZE = 4096
_keyed: dict[bytes, hmac.HMAC] = {}


def mac(link_key: bytes, name: str, body: bytes) -> bytes:
    """HMAC-SHA256(link_key, name + body), truncated to MAC_BYTES."""
    keyed = _keyed.get(link_key)
    if keyed is None:
        keyed = hmac.new(link_key, digestmod=hashlib.sha256)
        if len(_keyed) >= _CACHE_SIZE:  # bounded: old sessions' keys go
            _keyed.clear()
        _keyed[bytes(link_key)] = keyed
    h = keyed.copy()
    h.update(name.encode())
    h.update(body)
    return h.digest()[:MAC_BYTES]

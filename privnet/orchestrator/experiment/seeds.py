"""Each agent's own keys, derived one way from the run's master seed, which stays here.

An agent is sent only the keys of its own streams (data, minibatches, noise) and its own
rows, never the seed: each key is HKDF-SHA256 of the seed with purpose, repeat and agent in
its info (16 bytes, read as two big-endian 64-bit words), so one agent's keys tell nothing
of another's or of the seed, short of guessing the seed (a drawn one has 63 bits). Every
engine derives through here, so a run is reproducible from the seed alone. Not numpy's
SeedSequence: its hash is invertible, so a key spawned from it gives the seed back.
"""

from __future__ import annotations

import hmac
import struct
from enum import StrEnum

SALT = b"privnet/agent-keys/v1"
_REPEAT = struct.Struct(">Q")
_AGENT = struct.Struct(">I")


class Purpose(StrEnum):
    """What a key draws; part of the HKDF info, so no two purposes share a stream."""

    PROBLEM = "problem"  # the data model's public parameters: w*, R_u, noise levels
    ROWS = "rows"  # classification: the training rows' order, cut into agents' blocks
    DATA = "data"  # an agent's samples (regression) or its feature noise (classification)
    TWIN_DATA = "twin-data"  # the same for the agent whose data D' replaces
    TWIN_ROWS = "twin-rows"  # classification: that agent's fresh sample of training rows
    BATCH = "batch"  # an agent's minibatch indices
    NOISE = "noise"  # an agent's random/ghp draws (AgentSpec.noise_key)
    SCHEDULE = "schedule"  # random-matching's public draws (spec.Schedule.seed)


def keys(seed: int, purpose: Purpose, repeat: int, agents: int) -> list[tuple[int, int]]:
    """The 128-bit Philox keys of agents 0 .. agents-1 for `purpose` in `repeat`."""
    prk = _extract(seed)
    head = _info(purpose, repeat)
    return [_expand(prk, head + _AGENT.pack(p)) for p in range(agents)]


def key(seed: int, purpose: Purpose, repeat: int, agent: int | None = None) -> tuple[int, int]:
    """One agent's key for `purpose`, or with no agent the network-wide one (the data
    model, the row order), which the orchestrator alone draws from."""
    tail = b"" if agent is None else _AGENT.pack(agent)
    return _expand(_extract(seed), _info(purpose, repeat) + tail)


def _extract(seed: int) -> bytes:
    return hmac.digest(SALT, b"%d" % seed, "sha256")


def _info(purpose: Purpose, repeat: int) -> bytes:
    return purpose.value.encode() + b"\0" + _REPEAT.pack(repeat)


def _expand(prk: bytes, info: bytes) -> tuple[int, int]:
    """RFC 5869's first expand block; its first 16 bytes as two 64-bit words."""
    okm = hmac.digest(prk, info + b"\x01", "sha256")
    return int.from_bytes(okm[:8], "big"), int.from_bytes(okm[8:16], "big")

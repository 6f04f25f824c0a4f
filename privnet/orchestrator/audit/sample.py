"""The audit's sample of a big model: a seeded subset of whole chunks, the same for every
frame of the run.

Recording every frame whole costs as many bytes as the peer plane carries (at 1M
parameters and 16 agents, hundreds of MB a round). A chunked model's chunks are sealed one
by one (`privnet.agent.wire.chunks`), so a chunk opens on its own: the tap keeps the chunk
frames of a seeded set of indices, byte for byte as the broker carried them, and drops the
rest. Every model's chunk c holds the same coordinates, and masks cancel coordinate by
coordinate (a hub adds its terms entry-wise), so the clear-model check, the noise laws,
the cancellation residual and the attacks hold on the kept coordinates as on the whole.

The seed is drawn afresh for each run (`secrets`) and recorded beside the wire: no agent
can know which coordinates are audited. A model that fits one frame, or no bigger than the
sample, is recorded whole.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from privnet.agent import topics, wire
from privnet.agent.messages import Rejected
from privnet.agent.wire.chunks import is_chunk, read_chunk
from privnet.agent.wire.schema import WIDTH
from privnet.orchestrator.audit.recording import WireRecord


@dataclass(frozen=True)
class Sample:
    """Which coordinates of a model of `dim` parameters of `dtype` the audit keeps: those
    of the chunks `chunks` (sorted), drawn by `seed` for `size` coordinates asked for."""

    dim: int
    dtype: str
    size: int
    seed: int
    chunks: tuple[int, ...]

    @property
    def per_chunk(self) -> int:
        """Coordinates a full chunk holds."""
        return wire.CHUNK_BYTES // WIDTH[self.dtype]

    @functools.cached_property
    def coordinates(self) -> np.ndarray:
        """The kept coordinates, ascending: each kept chunk's whole range."""
        n = self.per_chunk
        spans = [np.arange(c * n, min((c + 1) * n, self.dim)) for c in self.chunks]
        return np.concatenate(spans)

    @functools.cached_property
    def kept(self) -> frozenset[int]:
        return frozenset(self.chunks)

    def keeps(self, index: int) -> bool:
        return index in self.kept

    def to_dict(self) -> dict[str, Any]:
        """What the recording and audit.json state of the sample."""
        return {
            "dim": self.dim,
            "dtype": self.dtype,
            "size": self.size,
            "seed": self.seed,
            "chunks": list(self.chunks),
            "chunk_count": wire.chunk_count(self.dim, self.dtype),
            "coordinates": int(self.coordinates.size),
        }

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Sample:
        return cls(
            int(doc["dim"]),
            str(doc["dtype"]),
            int(doc["size"]),
            int(doc["seed"]),
            tuple(int(c) for c in doc["chunks"]),
        )


def draw(dim: int, dtype: str, size: int, seed: int | None = None) -> Sample | None:
    """The sample of a model of `dim` parameters: enough whole chunks, drawn by `seed` (a
    fresh one when None), for at least `size` coordinates; None when the model is recorded
    whole (one frame, or no more than `size` coordinates)."""
    if size < 1:
        raise ValueError(f"an audit sample has at least 1 coordinate, got {size}")
    if not wire.needs_chunks(dim, dtype) or dim <= size:
        return None
    seed = secrets.randbits(32) if seed is None else seed
    count = wire.chunk_count(dim, dtype)
    per_chunk = wire.CHUNK_BYTES // WIDTH[dtype]
    k = min(count, -(-size // per_chunk))
    picked = np.random.default_rng(seed).choice(count, size=k, replace=False)
    return Sample(dim, dtype, size, seed, tuple(sorted(int(c) for c in picked)))


def recorded(payload: bytes, topic: str, sample: Sample | None) -> bool:
    """Whether the tap keeps this PUBLISH: anything but a chunk frame the sample drops (a
    chunk whose head does not read is kept: the audit counts it), and with a sample no
    telemetry (sealed to the orchestrator: the true models it carries, a big model's in
    pieces, are in telemetry.npz as the orchestrator opened them)."""
    if sample is None:
        return True
    if topic.rsplit("/", 2)[-2:-1] == ["telemetry"]:
        return False
    if not is_chunk(payload) or topics.parse_peer_topic(topic) is None:
        return True
    try:
        return sample.keeps(read_chunk(payload).index)
    except Rejected:
        return True


def kept(records: Iterable[WireRecord], sample: Sample | None) -> Iterator[WireRecord]:
    """The records the tap would have kept (a pcap's, which holds every chunk)."""
    return (r for r in records if recorded(r.payload, r.topic, sample))

"""What a Telemetry seals: a batch of an agent's Metrics (every round), Reports (its true
model, every K rounds) and Parts (a model too big for one message, in pieces).

A batch of Reports alone encodes byte for byte as `encode_reports` (tests/test_pins.py).
A model of more than `max_report_dim()` parameters goes as `part_count(dim)` Parts of at
most that many, each sealed in a Telemetry of its own, so no message exceeds
MAX_CONTROL_BYTES whatever the model's size; the orchestrator writes them in place. A float32
problem's model in Parts travels as float32 (`telemetry_dtype`): half the bytes the
orchestrator verifies, opens and copies, and the values it stores are the agent's model
rounded to float32 (a float64 problem's, and any model of one Report, stay exact).
"""

from __future__ import annotations

import math

import numpy as np

from privnet.agent.messages import (
    METRIC_COUNT,
    Metrics,
    Part,
    Reason,
    Rejected,
    Report,
    Telemetered,
)
from privnet.agent.wire.catalog import METRICS, PART, REPORT
from privnet.agent.wire.frames import (
    CONTROL_LIMITS,
    MAX_CONTROL_BYTES,
    build,
    frame,
    open_frame,
    pack,
    unpack,
)
from privnet.agent.wire.schema import DTYPE, F4, WIDTH
from privnet.agent.wire.signed import REPORT_OVERHEAD, TELEMETRY_OVERHEAD, max_report_dim

METRICS_BYTES = 64  # a metrics frame's bytes, at most (widest counts: 49)
PART_OVERHEAD = REPORT_OVERHEAD + 16  # a part frame's bytes besides its vector's (its offset)
BUDGET = MAX_CONTROL_BYTES - TELEMETRY_OVERHEAD  # a Telemetry's sealed items' bytes


def part_dim(dtype: str = DTYPE) -> int:
    """Parameters of one Part of `dtype`: what one Telemetry holds beside a batch of Metrics."""
    return (BUDGET - PART_OVERHEAD - 2 * METRICS_BYTES) // WIDTH[dtype]


def part_count(dim: int, dtype: str = DTYPE) -> int:
    """Telemetry messages a model of `dim` parameters takes (1: one Report)."""
    return 1 if dim <= max_report_dim() else math.ceil(dim / part_dim(dtype))


def telemetry_dtype(dim: int, float32: bool) -> str:
    """How a model of `dim` parameters travels to the orchestrator: in Parts as float32 when
    the problem is (`float32`; Config.models_f4), else float64. A model of one Report stays
    float64 whatever the problem: its telemetry is small, and its stored models exact."""
    return F4 if float32 and part_count(dim) > 1 else DTYPE


def as_telemetered(w: np.ndarray, dtype: str) -> np.ndarray:
    """A float64 model as the orchestrator stores it after telemetry of `dtype`: what a
    comparison against the run's models takes (the same array for <f8)."""
    return w if dtype == DTYPE else np.asarray(w, dtype=np.float32).astype(np.float64)


def default_models_every(dim: int) -> int:
    """K of `--models-every` when none is given: the messages a model takes, so an agent's
    telemetry averages at most about one message (MAX_CONTROL_BYTES) a round whatever the
    model's size. 1 up to `max_report_dim()` parameters: every model every round, as before.
    Counted in float64 Parts whatever the model's dtype: a float32 model's telemetry is half
    a message a round on average, not its models twice as often."""
    return part_count(dim)


def split(report: Report, dtype: str = DTYPE) -> list[Report | Part]:
    """A model as it travels: one Report, or Parts of `part_dim(dtype)` parameters each
    (`dtype`: `telemetry_dtype`, <f4 casting each Part's slice of the model)."""
    dim = len(report.w)
    if part_count(dim) == 1:
        return [report]
    size, w = part_dim(dtype), report.w
    return [
        Part(report.sender, report.round, start, _cast(w[start : start + size], dtype))
        for start in range(0, dim, size)
    ]


def _cast(piece: np.ndarray, dtype: str) -> np.ndarray:
    return piece.astype(np.float32) if dtype == F4 else piece


def size_of(item: Telemetered) -> int:
    """An item's bytes in a Telemetry, at most: what batching counts."""
    if isinstance(item, Metrics):
        return METRICS_BYTES
    overhead = PART_OVERHEAD if isinstance(item, Part) else REPORT_OVERHEAD
    return overhead + item.w.itemsize * len(item.w)


def pack_items(items: list[Telemetered]) -> list[list[Telemetered]]:
    """Items in order, in batches whose bytes fit one Telemetry."""
    batches: list[list[Telemetered]] = []
    used = BUDGET
    for item in items:
        size = size_of(item)
        if used + size > BUDGET:
            batches.append([])
            used = 0
        batches[-1].append(item)
        used += size
    return batches


def metrics(sender: int, round_: int, values: tuple[float, ...]) -> Metrics:
    """An agent's scalars as they travel (NaN for one it has not)."""
    if len(values) != METRIC_COUNT:
        raise ValueError(f"{len(values)} metric values, a Metrics carries {METRIC_COUNT}")
    return Metrics(sender, round_, np.asarray(values, dtype="<f8").tobytes())


def metric_values(msg: Metrics) -> np.ndarray:
    """The scalars of a Metrics (NaN: none; inf: a diverged loss)."""
    return np.frombuffer(msg.values, dtype="<f8").astype(np.float64)


def encode_telemetry(items: list[Telemetered]) -> bytes:
    """A batch of telemetry items (one sealed Telemetry)."""
    schemas = {Report: REPORT, Metrics: METRICS, Part: PART}
    return pack([frame(schemas[type(item)], item, None) for item in items])


def decode_telemetry(data: bytes, dim: int, dtype: str = DTYPE) -> list[Telemetered]:
    """The items of an opened Telemetry blob, or Rejected (a part must lie in the model and
    be of `dtype`, `telemetry_dtype`'s: a <f4 Part's vector is a read-only view of `data`)."""
    frames = unpack(data, MAX_CONTROL_BYTES, CONTROL_LIMITS, "telemetry batch")
    if not isinstance(frames, list) or not all(isinstance(f, bytes) for f in frames):
        raise Rejected(Reason.SCHEMA, "a telemetry batch is a list of frames")
    schemas = {s.name: s for s in (REPORT, METRICS, PART)}
    items: list[Telemetered] = []
    for raw in frames:
        opened = open_frame(raw, MAX_CONTROL_BYTES, CONTROL_LIMITS, schemas, "telemetry")
        if opened.mac:
            raise Rejected(Reason.SCHEMA, "telemetry frames carry an empty MAC")
        if opened.schema is METRICS:
            items.append(build(opened, Metrics))
            continue
        if opened.schema is REPORT:
            items.append(build(opened, Report, dim))
            continue
        offset, size = int(opened.fields["offset"]), part_dim(dtype)
        if part_count(dim) == 1 or offset >= dim or offset % size:
            raise Rejected(Reason.SCHEMA, f"a part at {offset} of a model of {dim} parameters")
        items.append(build(opened, Part, min(size, dim - offset), dtype))
    return items

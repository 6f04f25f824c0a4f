"""What the page shows, as one bounded state object: pushed into by the shells, read as JSON.

Nothing here does I/O or keeps time itself: `live` (a run) and `files` (a finished run's
directory) push facts in, the server asks for a `snapshot` when a page connects and for a
`delta` (what changed since that page's `Cursor`) twice a second. Every series is capped:
past `MAX_POINTS` it keeps every other point (its generation changes, and a page that had
the old points gets the series whole again), so a long run costs bounded memory and bytes.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_POINTS = 4000  # per series, before it is thinned to every other point
TIMELINE = 500  # entries kept
CATEGORIES = ("model", "keys", "telemetry", "control")

# What an agent is doing, as the page colours it.
PHASES = (
    "registering",  # not registered yet
    "keying",  # a member of a view being configured (Setup, key agreement)
    "running",
    "held",  # a member, stopped at a round boundary for a view change
    "finished",  # done with the session (or the run)
    "excluded",  # registered, not a member of the current view
    "failed",  # said it failed, or the run failed
    "left",  # answered Close: gone for good
)


def finite(value: float | None) -> float | None:
    """JSON has no NaN or infinity: they become null (a gap in a curve)."""
    return value if value is not None and math.isfinite(value) else None


def db(value: float) -> float | None:
    return 10.0 * math.log10(value) if value > 0 and math.isfinite(value) else None


class Series:
    """Named columns of equal length, appended to in step; thinned past `cap` points."""

    def __init__(self, *columns: str, cap: int = MAX_POINTS) -> None:
        self.columns = columns
        self.data: dict[str, list[float | None]] = {c: [] for c in columns}
        self.cap = cap
        self.generation = 0

    def __len__(self) -> int:
        return len(self.data[self.columns[0]])

    def add(self, *values: float | None) -> None:
        if len(values) != len(self.columns):
            raise ValueError(f"{len(values)} values for columns {self.columns}")
        if len(self) >= self.cap:
            for column in self.columns:
                self.data[column] = self.data[column][::2]
            self.generation += 1
        for column, value in zip(self.columns, values, strict=True):
            self.data[column].append(finite(value))

    def since(self, seen: tuple[int, int] | None) -> tuple[dict[str, Any] | None, tuple[int, int]]:
        """What a page that has `seen` (generation, length) lacks: None when nothing, else
        {"reset": bool, column: points}; and what it has then."""
        now = (self.generation, len(self))
        if seen == now:
            return None, now
        start = seen[1] if seen is not None and seen[0] == self.generation else 0
        part: dict[str, Any] = {"reset": start == 0}
        part.update({c: values[start:] for c, values in self.data.items()})
        return part, now


@dataclass
class AgentRow:
    """One line of the per-agent table."""

    phase: str = "registering"
    round: int = 0
    rss_mb: float | None = None
    cpu_pct: float | None = None
    cpu_s: float | None = None
    rejected: dict[str, int] = field(default_factory=dict)
    view: int | None = None  # the last view it is a member of
    why: str = ""  # why it is out, when it is

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "round": self.round,
            "rss_mb": finite(self.rss_mb),
            "cpu_pct": finite(self.cpu_pct),
            "cpu_s": finite(self.cpu_s),
            "rejected": self.rejected,
            "view": self.view,
            "why": self.why,
        }


@dataclass
class Cursor:
    """What one page has been sent of the append-only parts."""

    series: dict[str, tuple[int, int]] = field(default_factory=dict)
    timeline: int = 0
    version: int = -1


class ViewState:
    """Everything the page shows; see the module docstring."""

    def __init__(self, meta: Mapping[str, Any], nodes: Sequence[tuple[float, float]]) -> None:
        self.meta = dict(meta)
        self.nodes = [(round(float(x), 4), round(float(y), 4)) for x, y in nodes]
        self.edges: list[tuple[int, int]] = []
        self.edge_bytes: list[float] = []  # per edge: bytes per round, both directions
        self.agents = [AgentRow() for _ in nodes]
        self.curves: dict[str, Series] = {}  # session label -> round, centroid, average
        self.rates = Series("t", "rate")  # seconds since start, rounds/s
        self.bytes = Series("t", *CATEGORIES)  # bytes per round over the last interval
        self.timeline: deque[tuple[float, str, str, str]] = deque(maxlen=TIMELINE)
        self.logged = 0  # timeline entries ever added
        self.live: dict[str, Any] = {"stage": "starting"}
        self.epsilon: dict[str, Any] | None = None
        self.audit: dict[str, Any] | None = None
        self.results: list[dict[str, Any]] = []  # per session, when done
        self.version = 0
        # The run pushes in on its loop, the server reads on its own thread: both hold this.
        self.lock = threading.RLock()

    # ---- pushed in ---------------------------------------------------------------------

    def touch(self) -> None:
        self.version += 1

    def set_edges(self, edges: Iterable[tuple[int, int]]) -> None:
        self.edges = sorted((min(u, v), max(u, v)) for u, v in edges if u != v)
        self.edge_bytes = [0.0] * len(self.edges)
        self.touch()

    def curve(self, label: str) -> Series:
        if label not in self.curves:
            # centroid, average: at the rounds with models; agents: their own, every round
            self.curves[label] = Series("round", "centroid", "average", "agents")
        return self.curves[label]

    def note(self, t: float, label: str, kind: str, text: str) -> None:
        """A timeline entry: when (s since start), in which session, what kind, what."""
        self.timeline.append((round(t, 2), label, kind, text))
        self.logged += 1
        self.touch()

    def update(self, **live: Any) -> None:
        self.live.update(live)
        self.touch()

    # ---- read out ----------------------------------------------------------------------

    def snapshot(self, cursor: Cursor) -> dict[str, Any]:
        """Everything, for a page that just connected (the cursor is reset)."""
        cursor.series, cursor.timeline = {}, 0
        out = {
            "meta": self.meta,
            "nodes": self.nodes,
            "edges": self.edges,
        }
        return out | self.delta(cursor)

    def delta(self, cursor: Cursor) -> dict[str, Any]:
        """What changed since the cursor: the small parts whole, the series' new points."""
        cursor.version = self.version
        out: dict[str, Any] = {
            "live": self.live,
            "agents": [a.to_json() for a in self.agents],
            "edge_bytes": self.edge_bytes,
            "epsilon": self.epsilon,
            "audit": self.audit,
            "results": self.results,
        }
        series: dict[str, Any] = {}
        named = {f"curve:{k}": s for k, s in self.curves.items()}
        named |= {"rates": self.rates, "bytes": self.bytes}
        for name, s in named.items():
            part, cursor.series[name] = s.since(cursor.series.get(name))
            if part is not None:
                series[name] = part
        out["series"] = series
        first = self.logged - len(self.timeline)  # index of the oldest entry kept
        start = max(cursor.timeline, first)
        out["timeline"] = list(self.timeline)[start - first :]
        cursor.timeline = self.logged
        return out

"""What the conductor is given and what it records: stages and the moves between them,
session plans, membership views, session results, a resume point. Plain data, shared by
the conductor's parts and read by the engines, the live view, the audit and the journal."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from privnet.agent import control, wire
from privnet.agent.problems import Share
from privnet.agent.spec import AgentSpec, Scheme, Strategy

REGISTER_DEADLINE = 120.0  # seconds from start for every agent to register


class Stage(StrEnum):
    REGISTERING = "registering"
    CONFIGURING = "configuring"
    RUNNING = "running"
    HOLDING = "holding"
    CLOSING = "closing"
    DONE = "done"
    FAILED = "failed"
    CLOSED = "closed"


# Every stage change the conductor may make (`Conductor.to` refuses any other): a run
# registers, then per session configures, runs and holds (a view change: configured again,
# or, every member finished, running on to the next session), closes, is done and closed;
# it fails from any stage before it is closed. A replay switches views from RUNNING at the
# recorded rounds, without holding.
TRANSITIONS: Mapping[Stage, frozenset[Stage]] = {
    Stage.REGISTERING: frozenset({Stage.CONFIGURING, Stage.FAILED}),
    Stage.CONFIGURING: frozenset({Stage.RUNNING, Stage.HOLDING, Stage.FAILED}),
    Stage.RUNNING: frozenset({Stage.HOLDING, Stage.CONFIGURING, Stage.CLOSING, Stage.FAILED}),
    Stage.HOLDING: frozenset({Stage.CONFIGURING, Stage.RUNNING, Stage.FAILED}),
    Stage.CLOSING: frozenset({Stage.DONE, Stage.FAILED}),
    Stage.DONE: frozenset({Stage.CLOSED, Stage.FAILED}),
    Stage.FAILED: frozenset(),
    Stage.CLOSED: frozenset(),
}
# The stages the conductor sends Beats in (the agents' proof it lives); not the node's
# `privnet.agent.phases.BEATING`, which are phases an agent sends heartbeats in.
BEAT_STAGES = (Stage.CONFIGURING, Stage.RUNNING, Stage.HOLDING, Stage.CLOSING)
IN_SESSION = (Stage.CONFIGURING, Stage.RUNNING, Stage.HOLDING)
STALLS = 3  # views in a row that bring no round forward: then the run fails, saying why
# Views a session may add at its end to redo rounds whose reports never came (a broker
# that went down with them while every member was held): then they count as missed.
REPORT_REDOS = 1


ViewSpecs = Callable[[frozenset[int]], list[AgentSpec]]


def session_label(strategy: Strategy, scheme: Scheme, repeat: int) -> str:
    """A session's name in every output (`strategy/scheme/repeat`): the key of its models
    and curves, its row in metrics.csv, its line in the journal."""
    return f"{strategy}/{scheme}/{repeat}"


@dataclass(frozen=True)
class SessionPlan:
    """One session: its strategy, scheme and repeat, every agent's spec and its own
    problem spec (by agent id: the data model and that agent's keys); `view_specs` gives
    the specs of a membership view (weights on its graph)."""

    strategy: Strategy
    scheme: Scheme
    repeat: int
    specs: list[AgentSpec]
    problems: tuple[Share, ...]
    view_specs: ViewSpecs | None = None
    models_f4: bool = False  # a float32 problem: its models in Parts travel as float32

    @property
    def label(self) -> str:
        return session_label(self.strategy, self.scheme, self.repeat)

    @property
    def rounds(self) -> int:
        return self.specs[0].rounds

    @property
    def dim(self) -> int:
        return self.specs[0].dim

    @property
    def telemetry_dtype(self) -> str:
        """How its agents' true models travel to the orchestrator (wire.telemetry_dtype)."""
        return wire.telemetry_dtype(self.dim, self.models_f4)


@dataclass(frozen=True)
class View:
    """One membership view: who runs `session` from round `start` on, and why it changed.

    `resume[m]` is the round after which member m's own model is where it starts: start - 1
    for members that carry on, an earlier round for one that comes back."""

    session: int
    view: int
    start: int
    members: tuple[int, ...]
    reason: str
    resume: dict[int, int] = field(default_factory=dict)
    left: dict[int, str] = field(default_factory=dict)  # agent -> why it is out

    def to_json(self) -> dict[str, object]:
        return {
            "session": self.session,
            "view": self.view,
            "start": self.start,
            "members": list(self.members),
            "reason": self.reason,
            "resume": {str(m): r for m, r in self.resume.items()},
            "left": {str(m): why for m, why in self.left.items()},
        }

    @classmethod
    def from_json(cls, item: Mapping[str, Any]) -> View:
        return cls(
            int(item["session"]),
            int(item["view"]),
            int(item["start"]),
            tuple(int(m) for m in item["members"]),
            str(item["reason"]),
            {int(m): int(r) for m, r in item.get("resume", {}).items()},
            {int(m): str(w) for m, w in item.get("left", {}).items()},
        )


def add_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Count maps added key by key (zeros kept, unlike Counter's `+`)."""
    total: Counter[str] = Counter()
    for count in counts:
        total.update(count)
    return dict(total)


@dataclass
class SessionResult:
    label: str
    models: np.ndarray  # (rounds, P, M): every agent's true model after every round (NaN: missed)
    finished: dict[int, control.Finished]
    wall: float  # Go to last Finished
    views: list[View] = field(default_factory=list)  # the session's membership views
    # the agents' own scalars every round, (rounds, P, METRIC_COUNT): loss, score (NaN: none)
    metrics: np.ndarray | None = None
    models_every: int = 1  # `models` holds rounds K, 2K, ... and the last (NaN between)

    def totals(self, field_name: str) -> dict[str, int]:
        """One of Finished's count maps (rejected, bytes, messages), summed over agents."""
        return add_counts(getattr(done, field_name) for done in self.finished.values())

    @property
    def counted(self) -> int:
        """Rounds its counts (bytes, messages, `wall`) cover: every round, or of a session
        `privnet run --resume` went on with, those from where it went on (the counts of the
        rounds before died with the first run's agents)."""
        resumed = self.views and self.views[0].reason == "resumed"
        rounds: int = self.models.shape[0]
        return rounds - (self.views[0].start - 1 if resumed else 0)

    @property
    def missed(self) -> dict[int, int]:
        """Rounds each agent did not report (out of the view, or lost): its metrics, or
        without them (--no-telemetry, an old journal) its model."""
        if self.models_every > 1 and self.metrics is not None and self.metrics.size:
            counts = np.isnan(self.metrics).all(axis=2).sum(axis=0)
        else:
            counts = np.isnan(self.models[..., 0]).sum(axis=0) if self.models.size else []
        return {m: int(n) for m, n in enumerate(counts) if n}


@dataclass(frozen=True)
class Resume:
    """Where a run started again goes on: the session it was in, the models of it the first
    run received (rounds x P x M, NaN where none) and how many of its rounds it recorded
    (every member's report in). The agents say which of their own models they hold
    (checkpoints); the session goes on after the latest round all do and that the first run
    recorded: agents that outlived their orchestrator ran on unrecorded, and are rewound."""

    session: int
    models: np.ndarray
    recorded: int
    metrics: np.ndarray | None = None  # (rounds, P, METRIC_COUNT) as recorded (None: none)


def view_session(token: bytes, view: int) -> bytes:
    """The 16-byte session token of a view (`AgentSpec.session`) from the session's own:
    every key, MAC and mask of the view is bound to it, so nothing of an earlier view is
    ever reused. View 0 keeps the session's own."""
    if view == 0:
        return token
    return hashlib.sha256(b"privnet/view\0" + token + view.to_bytes(8, "big")).digest()[:16]


def describe(view: View) -> str:
    left = ", ".join(f"{m} ({why})" for m, why in view.left.items())
    back = [m for m, r in view.resume.items() if r != view.start - 1]
    parts = [f"session {view.session} view {view.view} from round {view.start}: {view.reason}"]
    parts.append(f"{len(view.members)} members")
    if left:
        parts.append(f"out: {left}")
    if back:
        parts.append("back: " + ", ".join(f"{m} (from round {view.resume[m]})" for m in back))
    return "; ".join(parts)

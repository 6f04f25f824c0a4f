"""What the deciding parts (`Steward`, `Liveness`) read and call of the conductor that
holds them: its settings, its state, its other parts and the one way its stage changes.
A protocol, so they need not import the conductor (which imports them)."""

from __future__ import annotations

from typing import Literal, Protocol

from privnet.agent import control
from privnet.agent.protocol import Output, Publish
from privnet.orchestrator.conductor.blame import Blame
from privnet.orchestrator.conductor.collection import Collection, Outbox
from privnet.orchestrator.conductor.membership import Membership
from privnet.orchestrator.conductor.pacing import Pacing
from privnet.orchestrator.conductor.records import (
    Resume,
    SessionPlan,
    SessionResult,
    Stage,
    View,
)
from privnet.orchestrator.conductor.registry import Registry
from privnet.orchestrator.conductor.setups import Terms


class Owner(Protocol):
    run: str
    agents: int
    deadline: float
    telemetry: bool
    register_deadline: float
    models_every: int
    terms: Terms
    plans: list[SessionPlan]
    script: dict[tuple[int, int], View] | None
    resume: Resume | None
    session: int
    results: list[SessionResult]
    since: float
    registry: Registry
    membership: Membership
    collection: Collection
    outbox: Outbox
    blame: Blame
    pacing: Pacing

    @property
    def stage(self) -> Stage: ...

    @property
    def rounds_done(self) -> int: ...

    @property
    def label(self) -> str: ...

    def to(self, stage: Stage, now: float | None = None) -> None: ...

    def fail(self, reason: str) -> Output: ...

    def down(self, to: int | Literal["all"], msg: control.Control) -> Publish: ...

    def lost(self, agent: int, reason: str, now: float) -> Output: ...

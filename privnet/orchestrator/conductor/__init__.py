"""The orchestrator's side of a run's life cycle, as a sans-IO state machine (`Conductor`),
in parts: `registry` (registration and pinned identities, who is alive), `membership`
(views, stalls, splits, resume points), `collection` (telemetry, escrow, what is sent and
counted), `setups` (each member's sealed Setup). `state` composes them and reads them out,
`sessions` moves a session through its views, `machine` reads deliveries and time;
`records` holds the plain data they share with the engines and the views."""

from privnet.orchestrator.conductor.machine import Conductor
from privnet.orchestrator.conductor.records import (
    BEATING,
    IN_SESSION,
    REGISTER_DEADLINE,
    STALLS,
    Resume,
    SessionPlan,
    SessionResult,
    Stage,
    View,
    ViewSpecs,
    add_counts,
    describe,
    view_session,
)

__all__ = [
    "BEATING",
    "IN_SESSION",
    "REGISTER_DEADLINE",
    "STALLS",
    "Conductor",
    "Resume",
    "SessionPlan",
    "SessionResult",
    "Stage",
    "View",
    "ViewSpecs",
    "add_counts",
    "describe",
    "view_session",
]

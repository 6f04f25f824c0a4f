"""The orchestrator's side of a run's life cycle, as a sans-IO state machine (`Conductor`,
in `machine`), composed of parts that each own their state: `registry` (registration,
pinned identities, silences), `membership` (who is alive, views, stalls, splits, resume
points), `collection` (telemetry, escrow, the agents' Left; the `Outbox` of what is sent),
`blame` (who stalls the network), `pacing` (grants and Beats), `setups` (each member's
sealed Setup) and `steward` (the decisions that move a session through its views).
`records` holds the plain data they share with the engines and the views, the stage
transition table among it."""

from privnet.orchestrator.conductor.machine import Conductor
from privnet.orchestrator.conductor.records import (
    BEAT_STAGES,
    IN_SESSION,
    REGISTER_DEADLINE,
    STALLS,
    TRANSITIONS,
    Resume,
    SessionPlan,
    SessionResult,
    Stage,
    View,
    ViewSpecs,
    add_counts,
    describe,
    session_label,
    view_session,
)

__all__ = [
    "BEAT_STAGES",
    "IN_SESSION",
    "REGISTER_DEADLINE",
    "STALLS",
    "TRANSITIONS",
    "Conductor",
    "Resume",
    "SessionPlan",
    "SessionResult",
    "Stage",
    "View",
    "ViewSpecs",
    "add_counts",
    "describe",
    "session_label",
    "view_session",
]

"""Where an agent is in its life cycle (`Phase`), what moves it on (`Trigger`), and the
table of every move (`TRANSITIONS`): the vocabulary of privnet.agent.node's machine.

As h11 keeps its EVENT_TRIGGERED_TRANSITIONS, the node keeps its moves as data: every phase
change goes through `next_phase`, so a move the table lacks is a bug that raises at once
(`IllegalTransition`), the node's rules ask the table whether a frame fits the phase
(`allows`), tests/test_phases.py finds every move the node makes in the table and every
entry made by some scenario, and scripts/docs_hooks.py draws the table in
docs/design/control-plane.md.
"""

from __future__ import annotations

from enum import StrEnum
from types import MappingProxyType
from typing import Final


class Phase(StrEnum):
    """Where an agent is (DESIGN: Membership and faults); `TRANSITIONS` says what moves it."""

    REGISTERING = "registering"  # Hellos until Welcome
    REGISTERED = "registered"  # no session yet: Setup, or Close
    CONFIGURED = "configured"  # keys being agreed with the neighbours
    KEYED = "keyed"  # Ready sent: Go starts the rounds
    RUNNING = "running"
    HELD = "held"  # at Go's `until`, or held for a view change: Setup of a later view
    EXCLUDED = "excluded"  # left out of the view, Rejoin sent: Setup of a later one
    FINISHED = "finished"  # the session's last round: the next session's Setup, or Close
    LEAVING = "leaving"  # the shell unsubscribes the inbox, then `unsubscribed`
    LEFT = "left"  # Left sent: Bye
    FAILED = "failed"
    CLOSED = "closed"


class Trigger(StrEnum):
    """What moves an agent: a control frame obeyed, or what the agent itself reaches. The
    values are the labels the docs draw."""

    WELCOME = "Welcome"
    SETUP = "Setup"
    KEYED = "keys agreed"
    GO = "Go"
    EXTEND = "Go with a later until"  # the orchestrator paces a view a window at a time
    UNTIL = "until reached"
    LAST_ROUND = "last round"
    HOLD = "Hold"
    EXCLUDED = "Excluded"
    CLOSE = "Close"
    UNSUBSCRIBED = "inbox unsubscribed"
    BYE = "Bye"
    FAILURE = "failure"  # a deadline passed, Abort, or a Setup the agent cannot use


class IllegalTransition(RuntimeError):
    """The node tried a move its table lacks: a bug in privnet.agent.node, not bad input
    (bad frames are rejected before any move)."""


INITIAL: Final = Phase.REGISTERING
FINAL: Final = (Phase.CLOSED, Phase.FAILED)  # nothing moves an agent on from these
_P, _T = Phase, Trigger
_MOVES: dict[Phase, dict[Trigger, Phase]] = {
    _P.REGISTERING: {_T.WELCOME: _P.REGISTERED},
    _P.REGISTERED: {_T.SETUP: _P.CONFIGURED, _T.CLOSE: _P.LEAVING},
    _P.CONFIGURED: {_T.KEYED: _P.KEYED, _T.HOLD: _P.HELD, _T.EXCLUDED: _P.EXCLUDED},
    _P.KEYED: {_T.GO: _P.RUNNING, _T.HOLD: _P.HELD, _T.EXCLUDED: _P.EXCLUDED},
    _P.RUNNING: {
        _T.EXTEND: _P.RUNNING,
        _T.UNTIL: _P.HELD,
        _T.LAST_ROUND: _P.FINISHED,
        _T.HOLD: _P.HELD,
        _T.EXCLUDED: _P.EXCLUDED,
    },
    _P.HELD: {
        _T.SETUP: _P.CONFIGURED,
        _T.EXTEND: _P.RUNNING,
        _T.HOLD: _P.HELD,  # the view ends: no later Go extends it
        _T.EXCLUDED: _P.EXCLUDED,
    },
    _P.EXCLUDED: {_T.SETUP: _P.CONFIGURED, _T.CLOSE: _P.LEAVING},
    _P.FINISHED: {
        _T.SETUP: _P.CONFIGURED,
        _T.HOLD: _P.FINISHED,  # a member still: it flushes its telemetry and says so
        _T.EXCLUDED: _P.EXCLUDED,
        _T.CLOSE: _P.LEAVING,
    },
    _P.LEAVING: {_T.UNSUBSCRIBED: _P.LEFT},
    _P.LEFT: {_T.BYE: _P.CLOSED},
    _P.FAILED: {},
    _P.CLOSED: {},
}
# Any phase but a final one can fail.
TRANSITIONS: Final = MappingProxyType(
    {
        phase: MappingProxyType(moves if phase in FINAL else {**moves, _T.FAILURE: _P.FAILED})
        for phase, moves in _MOVES.items()
    }
)


def allows(phase: Phase, trigger: Trigger) -> bool:
    """Whether `trigger` moves an agent in `phase` (a frame that does not is out of phase)."""
    return trigger in TRANSITIONS[phase]


def next_phase(phase: Phase, trigger: Trigger) -> Phase:
    """Where `trigger` moves an agent in `phase`; IllegalTransition if the table has no such
    move."""
    moves = TRANSITIONS[phase]
    if trigger not in moves:
        allowed = ", ".join(f"{t.name} -> {p}" for t, p in moves.items()) or "none"
        raise IllegalTransition(
            f"agent phase {phase} has no move on {trigger.name} ({trigger.value!r}); from "
            f"{phase} the table allows: {allowed}. A bug in privnet.agent.node, or a move "
            "missing from privnet.agent.phases.TRANSITIONS"
        )
    return moves[trigger]


ACTIVE = (Phase.CONFIGURED, Phase.KEYED, Phase.RUNNING)  # a view is configured
PAUSED = (Phase.HELD, Phase.EXCLUDED, Phase.FINISHED)  # in a session, waiting for a Setup
# No view to use peer frames in: they wait (bounded) for the next Setup.
WAITING = (Phase.REGISTERING, Phase.REGISTERED, *PAUSED)
BEATING = (*ACTIVE, Phase.HELD, Phase.FINISHED)  # members: Progress is their heartbeat
IDLE = (Phase.REGISTERED, Phase.LEAVING, Phase.LEFT)  # no session: the orchestrator's turn

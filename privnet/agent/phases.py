"""Where an agent is in its life cycle (`Phase`), and the groups of phases the node's
rules ask about: the vocabulary of privnet.agent.node's machine."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """Where an agent is; [Frame] is the control frame that moves it on (DESIGN: Membership
    and faults). Besides: [Hold] moves a configured, keyed or running agent to HELD,
    [Excluded] one in a session to EXCLUDED, and FAILED can follow any phase."""

    REGISTERING = "registering"  # Hellos until [Welcome]
    REGISTERED = "registered"  # [Setup] -> CONFIGURED; [Close] -> LEAVING
    CONFIGURED = "configured"  # keys agreed with the neighbours -> KEYED
    KEYED = "keyed"  # [Go] -> RUNNING
    RUNNING = "running"  # the last round -> FINISHED; Go's `until` -> HELD
    HELD = "held"  # [Setup] of a later view, from the model it names -> CONFIGURED
    EXCLUDED = "excluded"  # Rejoin sent; [Setup] -> CONFIGURED; [Close] -> LEAVING
    FINISHED = "finished"  # [Setup] -> CONFIGURED; [Close] -> LEAVING
    LEAVING = "leaving"  # the shell unsubscribes the inbox, then `unsubscribed` -> LEFT
    LEFT = "left"  # [Bye] -> CLOSED
    FAILED = "failed"
    CLOSED = "closed"


ACTIVE = (Phase.CONFIGURED, Phase.KEYED, Phase.RUNNING)  # a view is configured
PAUSED = (Phase.HELD, Phase.EXCLUDED, Phase.FINISHED)  # in a session, waiting for a Setup
# No view to use peer frames in: they wait (bounded) for the next Setup.
WAITING = (Phase.REGISTERING, Phase.REGISTERED, *PAUSED)
BEATING = (*ACTIVE, Phase.HELD, Phase.FINISHED)  # members: Progress is their heartbeat
IDLE = (Phase.REGISTERED, Phase.LEAVING, Phase.LEFT)  # no session: the orchestrator's turn

"""What agents say to each other and to the orchestrator: plain dataclasses, no I/O.

The core consumes and emits these; `privnet.agent.wire` turns them into bytes and back, from the
field types declared here (ranges and sizes from `privnet.agent.spec`).
`ORCHESTRATOR` is the receiver id of everything meant for the orchestrator.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

import numpy as np

from privnet.agent.spec import AgentId, Count, Distinct, Side, Size, Step

ORCHESTRATOR = -1
METRIC_COUNT = 2  # an agent's scalars each round: loss on its minibatch, score
METRIC_BYTES = 8 * METRIC_COUNT


@dataclass(frozen=True, slots=True)
class Model:
    """A (possibly masked) model for one combine step: sender -> receiver."""

    sender: AgentId
    receiver: AgentId
    round: Count
    step: Step  # the paper's j: 1 pre-combine, 0 adapt-combine, 2 post-combine
    vector: np.ndarray
    view: Count = 0  # the membership view it belongs to: another view's frames are not used


@dataclass(frozen=True, slots=True)
class KeyPlan:
    """Masked schemes: hub `sender` tells `receiver` its side at this hub and its partners."""

    sender: AgentId  # the hub
    receiver: AgentId
    step: Step
    side: Side  # +1 (N+) or -1 (N-)
    partners: Annotated[tuple[AgentId, ...], Distinct()]
    view: Count = 0


@dataclass(frozen=True, slots=True)
class KeyShare:
    """Masked schemes: `owner`'s signed ephemeral X25519 key for `partner`, relayed by `hub`.

    Sent owner -> hub (sender=owner), then forwarded hub -> partner (sender=hub) unchanged.
    The signature covers everything but sender/receiver, so the hub cannot swap the key.
    """

    sender: AgentId
    receiver: AgentId
    owner: AgentId
    hub: AgentId
    partner: AgentId
    step: Step
    epoch: Count  # 0 with re-key `once`, the round with `every-round`
    public: Annotated[bytes, Size(32)]
    signature: Annotated[bytes, Size(64)]
    view: Count = 0


@dataclass(frozen=True, slots=True)
class Report:
    """Per-round telemetry for the orchestrator; carries the true model (sealed on the wire)."""

    sender: AgentId
    round: Count
    w: np.ndarray


@dataclass(frozen=True, slots=True)
class Metrics:
    """An agent's own scalars of one round, for the orchestrator (sealed on the wire): the
    loss on its minibatch and its score (`privnet.agent.losses.Local.metrics`), little-endian
    float64, NaN where it has none. They travel every round; the model only every K."""

    sender: AgentId
    round: Count
    values: Annotated[bytes, Size(METRIC_BYTES)]


@dataclass(frozen=True, slots=True)
class Part:
    """A piece of an agent's true model too big for one telemetry message: its parameters
    `[offset, offset + len(w))`; the orchestrator writes the pieces in place."""

    sender: AgentId
    round: Count
    offset: Count
    w: np.ndarray


Message = Model | KeyPlan | KeyShare | Report
Telemetered = Report | Metrics | Part  # what a Telemetry seals


class Reason(StrEnum):
    """Why a frame was dropped: the label it is counted under, by both machines, in a
    Finished's and a Left's counts, and in summary.json. Every reason is listed here."""

    # the bytes
    MALFORMED = "malformed"  # not msgpack, or not the frame's outer array
    OVERSIZED = "oversized"  # over the size limit of its kind
    VERSION = "version"  # another wire version
    SCHEMA = "schema"  # an unknown type, a field missing or of the wrong type or range
    SHAPE = "shape"  # a model vector of another dimension
    NON_FINITE = "non-finite"  # NaN or inf
    WIRE_RANGE = "wire-range"  # a release outside the u4 wire's 2^32 lattice steps (lattice.py)
    # who sent it
    BAD_MAC = "bad-mac"  # a MACed peer frame whose MAC fails
    BAD_SEAL = "bad-seal"  # a sealed frame (peer, Setup, telemetry, escrow) that does not open
    BAD_SIGNATURE = "bad-signature"  # a control frame or key share not signed by its signer
    BAD_PROOF = "bad-proof"  # a Hello without its launch token's proof
    BAD_KEY = "bad-key"  # a public key that is not one, or a key directory that does not fit
    SEALED = "sealed"  # a sealed peer frame read without its link key (the audit's eye)
    UNSEALED = "unsealed"  # a peer frame in the clear on a sealed link
    SPOOFED = "spoofed"  # claims a sender other than the topic it came on
    UNKNOWN_SENDER = "unknown-sender"  # no link or identity for the sender
    IDENTITY_CHANGE = "identity-change"  # a registered agent with another identity
    UNREGISTERED = "unregistered"  # from an agent that has not registered
    # where it went
    WRONG_RECEIVER = "wrong-receiver"  # for another agent
    WRONG_RUN = "wrong-run"  # for another run
    WRONG_TOPIC = "wrong-topic"  # on a topic this party does not read
    RETAINED = "retained"  # a retained message: old news from the broker
    NOT_NEIGHBOUR = "not-neighbour"  # from an agent that is no neighbour, hub or partner here
    # when it came
    STALE = "stale"  # for an earlier round or epoch
    AHEAD = "ahead"  # for a later round or epoch
    STALE_VIEW = "stale-view"  # of an earlier membership view
    AHEAD_VIEW = "ahead-view"  # of a later view: a node keeps it until that view's Setup
    DUPLICATE = "duplicate"  # a second one of what counts once
    REPLAY = "replay"  # a sequence number or link counter already used
    CHUNK_GAP = "chunk-gap"  # a model's chunk where an earlier one is missing: the model is lost
    CHUNK_ORDER = "chunk-order"  # a model's chunk after a later one of it (reordered)
    OUT_OF_PHASE = "out-of-phase"  # a message that does not fit the phase
    CLOSED = "closed"  # after the party closed
    NO_SESSION = "no-session"  # kept for a session (a view) that never came
    OVERFLOW = "overflow"  # beyond what a party keeps while waiting for its session


class Rejected(Exception):
    """A message the agent refuses; `reason` is the label it is counted under."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

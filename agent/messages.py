"""What agents say to each other and to the orchestrator: plain dataclasses, no I/O.

The core consumes and emits these; `wire.py` turns them into bytes and back.
`ORCHESTRATOR` is the receiver id of everything meant for the orchestrator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ORCHESTRATOR = -1


@dataclass(frozen=True, slots=True)
class Model:
    """A (possibly masked) model for one combine step: sender -> receiver."""

    sender: int
    receiver: int
    round: int
    step: int  # the paper's j: 1 pre-combine, 0 adapt-combine, 2 post-combine
    vector: np.ndarray
    view: int = 0  # the membership view it belongs to: another view's frames are not used


@dataclass(frozen=True, slots=True)
class KeyPlan:
    """Masked schemes: hub `sender` tells `receiver` its side at this hub and its partners."""

    sender: int  # the hub
    receiver: int
    step: int
    side: int  # +1 (N+) or -1 (N-)
    partners: tuple[int, ...]
    view: int = 0


@dataclass(frozen=True, slots=True)
class KeyShare:
    """Masked schemes: `owner`'s signed ephemeral X25519 key for `partner`, relayed by `hub`.

    Sent owner -> hub (sender=owner), then forwarded hub -> partner (sender=hub) unchanged.
    The signature covers everything but sender/receiver, so the hub cannot swap the key.
    """

    sender: int
    receiver: int
    owner: int
    hub: int
    partner: int
    step: int
    epoch: int  # 0 with re-key `once`, the round with `every-round`
    public: bytes
    signature: bytes
    view: int = 0


@dataclass(frozen=True, slots=True)
class Report:
    """Per-round telemetry for the orchestrator; carries the true model (sealed on the wire)."""

    sender: int
    round: int
    w: np.ndarray


Message = Model | KeyPlan | KeyShare | Report


class Rejected(Exception):
    """A message the agent refuses; `reason` is a short fixed label used as a counter key.

    Reasons: malformed, oversized, version, schema, shape, non-finite, bad-mac, spoofed,
    unknown-sender, wrong-receiver, not-neighbour, stale, duplicate, ahead, bad-key,
    stale-view, ahead-view (a frame of another membership view).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

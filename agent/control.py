"""What the orchestrator and an agent say to each other: plain dataclasses, no I/O.

A run goes Hello -> Welcome -> Setup -> Ready -> Go, then per-round Telemetry (the true
model, sealed to the orchestrator's key) and finally Finished or Failed; Abort stops it early.
`wire.py` turns these into bytes and back.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.losses import RegressionSpec
from agent.spec import AgentSpec


@dataclass(frozen=True, slots=True)
class Hello:
    """agent -> orchestrator on registration: its public identity (64 bytes) and a fresh nonce."""

    nonce: bytes  # 16 random bytes, echoed in Welcome
    identity: bytes  # keys.PublicIdentity.to_bytes()
    requested_id: int | None


@dataclass(frozen=True, slots=True)
class Welcome:
    """orchestrator -> agent: the id it gets and the X25519 key that telemetry is sealed to."""

    nonce: bytes  # the Hello's nonce
    agent: int
    run: str
    orchestrator_key: bytes  # 32-byte X25519 public key


@dataclass(frozen=True, slots=True)
class Setup:
    """orchestrator -> agent: its configuration and the identities of the agents it talks to."""

    spec: AgentSpec
    problem: RegressionSpec
    directory: dict[int, bytes]  # agent id -> PublicIdentity.to_bytes()
    deadline: float
    telemetry: bool


@dataclass(frozen=True, slots=True)
class Ready:
    """agent -> orchestrator: configured, keys agreed, waiting for Go."""

    agent: int


@dataclass(frozen=True, slots=True)
class Go:
    """orchestrator -> all agents: start round 0."""


@dataclass(frozen=True, slots=True)
class Bye:
    """orchestrator -> all agents: no more sessions; exit cleanly."""


@dataclass(frozen=True, slots=True)
class Abort:
    """orchestrator -> all agents: stop now."""

    reason: str


@dataclass(frozen=True, slots=True)
class Telemetry:
    """agent -> orchestrator, once per round: a Report sealed to the orchestrator's key."""

    agent: int
    round: int
    sealed: bytes


@dataclass(frozen=True, slots=True)
class Finished:
    """agent -> orchestrator: done; what it rejected (by reason) and sent (by category)."""

    agent: int
    rejected: dict[str, int]
    bytes: dict[str, int]
    messages: dict[str, int]
    wall: float


@dataclass(frozen=True, slots=True)
class Failed:
    """agent -> orchestrator: it cannot go on, and why."""

    agent: int
    reason: str


Control = Hello | Welcome | Setup | Ready | Go | Bye | Abort | Telemetry | Finished | Failed

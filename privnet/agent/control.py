"""What the orchestrator and an agent say to each other: plain dataclasses, no I/O.

Hello -> Welcome, then per session Setup -> Ready -> Go -> Telemetry... -> Finished, then
Close -> Left -> Bye; Progress is the agents' heartbeat, Abort and Failed end early, and a
membership change is Hold, then a new view's Setup (Excluded and Rejoin for an agent left
out; DESIGN: Membership and faults). Every frame travels signed and numbered, naming the
run (`wire.encode_signed`); what determines a model (`Config`) is sealed to its agent, true
models (`Telemetry`) to the orchestrator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from privnet.agent.problems import Share
from privnet.agent.spec import (
    COUNT_LIMIT,
    AgentId,
    AgentSpec,
    Bound,
    ConfigError,
    Count,
    Elided,
    Positive,
    Size,
)

Session = Count  # a run's session number
IdentityBytes = Annotated[bytes, Size(64)]  # keys.PublicIdentity.to_bytes()

# ---- upward: agent -> orchestrator, signed with the agent's identity key ---------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """Registration: the agent's public identity, and proof it holds its launch token.

    proof = HMAC-SHA256(token, run, agent, identity): the token reached the agent out of
    band at launch, so broker credentials alone cannot register a sybil identity.
    """

    agent: AgentId
    identity: IdentityBytes
    proof: Annotated[bytes, Size(32)]


@dataclass(frozen=True, slots=True)
class Ready:
    """Configured and keyed for `session`'s `view`: waiting for Go."""

    agent: AgentId
    session: Session
    view: Count


@dataclass(frozen=True, slots=True)
class Progress:
    """Heartbeat: rounds completed in `view`; `held` once the agent has stopped for a view
    change (or at Go's `until`), so `round` is final for the view; whom it waits for."""

    agent: AgentId
    session: Session
    view: Count
    round: Count
    held: bool
    waiting: tuple[AgentId, ...]


@dataclass(frozen=True, slots=True)
class Rejoin:
    """An agent left out of the current view (or restarted) asks to come back; `rounds` are
    those of `session` whose model it still holds (in memory or in a checkpoint)."""

    agent: AgentId
    session: Annotated[int, Bound(-1, COUNT_LIMIT, "a session or -1")]  # -1: no model
    rounds: tuple[Count, ...]


@dataclass(frozen=True, slots=True)
class Telemetry:
    """A batch of Reports ending at `round`, sealed to the orchestrator's key."""

    agent: AgentId
    session: Session
    view: Count
    round: Count
    sealed: bytes


@dataclass(frozen=True, slots=True)
class Escrow:
    """Under `--audit` only: the agent's link keys of `view`, sealed to the orchestrator's
    key, so `privnet inspect` can open the sealed frames it recorded (and no one else can)."""

    agent: AgentId
    session: Session
    view: Count
    sealed: bytes


@dataclass(frozen=True, slots=True)
class Finished:
    """Done with `session`: what it dropped (by reason), what it sent (by category)."""

    agent: AgentId
    session: Session
    view: Count
    rejected: dict[str, Count]
    bytes: dict[str, Count]
    messages: dict[str, Count]
    wall: float


@dataclass(frozen=True, slots=True)
class Left:
    """Answer to Close: the agent reads its inbox no more; what it dropped since its last
    Finished (so every delivery it ever got is in the run's report)."""

    agent: AgentId
    rejected: dict[str, Count]


@dataclass(frozen=True, slots=True)
class Failed:
    """The agent cannot go on, and why."""

    agent: AgentId
    reason: str


# ---- downward: orchestrator -> agents, signed with the run's orchestrator key ----------------


@dataclass(frozen=True, slots=True)
class Welcome:
    """Registration accepted: stop sending Hello. `rejoin`: the run is under way (this agent
    was started again), so it answers with Rejoin, saying which models it holds."""

    agent: AgentId
    rejoin: bool = False


@dataclass(frozen=True, slots=True)
class Setup:
    """The agent's `Config` for `session`'s `view`, sealed to its identity's X25519 key."""

    agent: AgentId
    session: Session
    view: Count
    sealed: bytes


@dataclass(frozen=True, slots=True)
class Go:
    """Run `view` from its start round through round `until`, then hold."""

    session: Session
    view: Count
    until: Count


@dataclass(frozen=True, slots=True)
class Hold:
    """Stop at the current round boundary: view `view` is being prepared."""

    session: Session
    view: Count


@dataclass(frozen=True, slots=True)
class Excluded:
    """`agent` is not a member of `view` (missed its deadline): it may Rejoin."""

    agent: AgentId
    session: Session
    view: Count


@dataclass(frozen=True, slots=True)
class Beat:
    """The orchestrator is alive (every deadline / 3 while sessions run): an agent that hears
    nothing from it for a deadline stops, so a lost orchestrator leaves nothing running."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """The orchestrator holds every member's reports of `view` through `round`: no view
    starts before it, so an agent's models of earlier rounds are never asked for again."""

    session: Session
    view: Count
    round: Count


@dataclass(frozen=True, slots=True)
class Close:
    """Every session is done: stop reading peers and report what is left to report."""


@dataclass(frozen=True, slots=True)
class Abort:
    """Stop now."""

    reason: str


@dataclass(frozen=True, slots=True)
class Bye:
    """No more sessions: exit cleanly."""


@dataclass(frozen=True, slots=True)
class Config:
    """What Setup seals: everything that determines this agent's models, and nothing that
    determines another's (its own keys and rows, derived by the orchestrator; never the
    run's seed)."""

    spec: AgentSpec
    problem: Share  # the problem and data by name, and this agent's own keys and rows
    directory: dict[AgentId, IdentityBytes]  # agent id -> PublicIdentity.to_bytes()
    deadline: float
    telemetry: bool
    resume: Count = 0  # start from the agent's own model after this round (0: spec.w0)
    checkpoint_every: Count = 0  # rounds between checkpoints (0: none)
    seal_links: bool = True  # peer frames sealed (False: the paper's visible wire, MACed)
    escrow: bool = False  # send the view's link keys to the orchestrator (`--audit`)
    models_every: Positive = 1  # telemetry: the true model every K rounds (and the last)
    # a float32 problem's model in Parts travels as float32 (wire.telemetry_dtype); elided
    # while False, so a Config of before keeps its bytes
    models_f4: Annotated[bool, Elided()] = False

    def check(self) -> None:
        """ConfigError unless the parts fit each other (each checks itself when built)."""
        if self.problem.dim != self.spec.dim:
            raise ConfigError(
                f"problem.dim {self.problem.dim} differs from spec.dim {self.spec.dim}"
            )


Up = Hello | Ready | Progress | Rejoin | Telemetry | Escrow | Finished | Left | Failed
Down = Welcome | Setup | Go | Beat | Recorded | Hold | Excluded | Close | Abort | Bye
Control = Up | Down

"""What one agent is told before it starts: its neighbourhoods, weights and hyperparameters.

The orchestrator builds an AgentSpec per agent from the global matrices; the agent never
sees the whole graph. Everything here is plain data and checks itself on construction.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated

from privnet.agent.errors import ConfigError as ConfigError
from privnet.agent.schemes.registry import Scheme as Scheme

STEPS = (1, 0, 2)  # the paper's combine steps in the order a round runs them
WEIGHT_TOL = 1e-9
ID_LIMIT = 2**32  # agent ids are packed as uint32 in key derivations
COUNT_LIMIT = 2**64  # rounds and epochs are packed as uint64
PARAM_DEPTH = 4  # how deep a problem parameter's lists may nest
LOCAL_STEPS = 1  # local gradient steps a round (`--local-steps E`): the paper's one


# ---- the ranges of the fields that travel: declared on the types, applied by the wire ----


@dataclass(frozen=True, slots=True)
class Bound:
    """An integer field's range [lo, hi); `says` names it in a refusal."""

    lo: int
    hi: int
    says: str

    def admits(self, value: int) -> bool:
        return self.lo <= value < self.hi


@dataclass(frozen=True, slots=True)
class Choice:
    """An integer field that takes one of `options`."""

    options: tuple[int, ...]
    says: str

    def admits(self, value: int) -> bool:
        return value in self.options


@dataclass(frozen=True, slots=True)
class Size:
    """A bytes field of exactly `size` bytes (a key, a signature, a proof)."""

    size: int

    @property
    def says(self) -> str:
        return f"{self.size} bytes"

    def admits(self, value: bytes) -> bool:
        return len(value) == self.size


@dataclass(frozen=True, slots=True)
class Distinct:
    """A tuple whose entries differ (a set, sent in order)."""

    says = "distinct entries"

    def admits(self, value: tuple[object, ...]) -> bool:
        return len(set(value)) == len(value)


@dataclass(frozen=True, slots=True)
class Nested:
    """Problem parameters: names to numbers, strings, booleans or lists of them, `depth`
    deep (a Setup carries values, never code)."""

    depth: int


@dataclass(frozen=True, slots=True)
class Elided:
    """A field left out of its map while it holds its default: a field added to a message
    that is pinned (tests/test_pins.py) keeps the older frames byte for byte."""


AgentId = Annotated[int, Bound(0, ID_LIMIT, "an agent id in [0, 2**32)")]
Count = Annotated[int, Bound(0, COUNT_LIMIT, "an integer in [0, 2**64)")]
Positive = Annotated[int, Bound(1, ID_LIMIT, "an integer in [1, 2**32)")]
Step = Annotated[int, Choice(STEPS, f"a combine step in {STEPS}")]
Side = Annotated[int, Choice((1, -1), "a side, +1 or -1")]
RngKey = tuple[Count, Count]  # a 128-bit Philox key (privnet.agent.rng), as two 64-bit words


class Strategy(StrEnum):
    CONSENSUS = "consensus"
    CTA = "cta"
    ATC = "atc"


class WireDtype(StrEnum):
    """How a release travels (`--wire-dtype`): f8, the float64 itself (8 bytes a
    parameter); u4, its integer on the noise lattice mod 2^32 (4 bytes; privnet.agent.lattice)."""

    F8 = "f8"
    U4 = "u4"

    @property
    def code(self) -> str:
        """The numpy (and wire) dtype of a vector of this form."""
        return "<f8" if self is WireDtype.F8 else "<u4"


class Rekey(StrEnum):
    ONCE = "once"
    EVERY_ROUND = "every-round"


# Which combine step carries the matrix A for each strategy (the others are identity).
STRATEGY_STEP = {Strategy.CONSENSUS: 0, Strategy.CTA: 1, Strategy.ATC: 2}


@dataclass(frozen=True)
class StepPlan:
    """One combine step j as one agent p sees it.

    weights_in[m] = a_j,mp for m in N_p (p included): how p weighs what m sends.
    weights_out[k] = a_j,pk for every k that listens to p (p included): public weights
    that the masked schemes need to put masks on the lattice and ghp for the self-term (a_pp).
    """

    step: Step
    weights_in: dict[AgentId, float]
    weights_out: dict[AgentId, float]

    @property
    def communicates(self) -> bool:
        return len(self.weights_in) > 1 or len(self.weights_out) > 1

    def senders(self, me: int) -> list[int]:
        return sorted(m for m in self.weights_in if m != me)

    def receivers(self, me: int) -> list[int]:
        return sorted(k for k in self.weights_out if k != me)


SCHEDULES = ("one-peer-exponential", "random-matching", "matrices")  # time-varying kinds
SCHEDULE_RULES = ("metropolis", "averaging")


@dataclass(frozen=True)
class Schedule:
    """A time-varying topology: round i's graph and weights, which every agent expands
    itself from these public inputs (privnet.agent.schedule), so no round needs control
    traffic. `members` is the view's (empty: every agent); `matrices` are user-given A's,
    each flattened row-major, used in turn (kind `matrices`)."""

    kind: str
    agents: Positive
    strategy: Strategy
    rule: str = "metropolis"
    peers: Count = 0  # random-matching: each agent's peers a round (S)
    seed: Count = 0  # random-matching: the public seed of the draws
    members: tuple[AgentId, ...] = ()
    matrices: tuple[tuple[float, ...], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", Strategy(self.strategy))
        if self.kind not in SCHEDULES:
            raise ConfigError(f"unknown schedule {self.kind!r}; choose one of {SCHEDULES}")
        if self.rule not in SCHEDULE_RULES:
            raise ConfigError(f"unknown rule {self.rule!r}; choose one of {SCHEDULE_RULES}")
        if self.kind == "random-matching" and not 1 <= self.peers < self.agents:
            raise ConfigError(
                f"random-matching:{self.peers} on {self.agents} agents: write "
                f"random-matching:S with 1 <= S < {self.agents}"
            )
        if (self.kind == "matrices") != bool(self.matrices):
            raise ConfigError("a schedule of kind 'matrices' (and only it) carries matrices")
        if any(len(a) != self.agents**2 for a in self.matrices):
            raise ConfigError(f"every scheduled matrix must be {self.agents} x {self.agents}")
        if any(not 0 <= m < self.agents for m in self.members):
            raise ConfigError(f"schedule members must be agent ids in [0, {self.agents})")


@dataclass(frozen=True)
class AgentSpec:
    """Everything agent `agent` needs to run its rounds (the loss comes separately)."""

    agent: AgentId
    agents: Positive  # P: the noise row holds one draw per agent id
    dim: Positive  # M
    steps: tuple[StepPlan, StepPlan, StepPlan]  # in STEPS order
    scheme: Scheme
    sigma_g: float
    mu: float
    rounds: Count
    noise_key: RngKey  # this agent's own random/ghp stream (seeds.Purpose.NOISE)
    session: bytes  # random per run; bound into every signature, MAC and mask
    rekey: Rekey = Rekey.ONCE
    w0: tuple[float, ...] = field(default=())  # initial model; zeros when empty
    view: Count = 0  # the membership view these weights are for (DESIGN: Membership and faults)
    start: Positive = 1  # the first round this spec runs: a later view redoes from here
    # A time-varying topology: round i's plans come from it, and `steps` is then the union
    # of the view's rounds (whom this agent may meet: links and keys), its weights unused.
    schedule: Schedule | None = None
    # Issue 34: this agent's attack, NAME[:PARAMS] (privnet.agent.attacks; "": honest), and
    # the defense its hub runs (privnet.agent.defenses; "": none). Parsed by the core.
    attack: str = ""
    defense: str = ""
    wire: Annotated[WireDtype, Elided()] = WireDtype.F8  # how releases travel (lattice.py)
    # Issue 29: E local gradient steps in the adapt step (core._descent); elided at the
    # paper's 1, so a Config of before keeps its bytes
    local_steps: Annotated[Positive, Elided()] = LOCAL_STEPS

    def __post_init__(self) -> None:
        # The registered name (ConfigError listing them else): its part is what runs.
        object.__setattr__(self, "scheme", Scheme(self.scheme))
        for name, kind in (("rekey", Rekey), ("wire", WireDtype)):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, kind(value))
            except ValueError:
                valid = ", ".join(k.value for k in kind)
                raise ConfigError(f"unknown {name} {value!r}; choose one of {valid}") from None
        if tuple(s.step for s in self.steps) != STEPS:
            raise ConfigError(f"steps must be given in order {STEPS}")
        if not (self.mu > 0 and math.isfinite(self.mu)):
            raise ConfigError(f"mu must be a positive number, got {self.mu}")
        if not (self.sigma_g >= 0 and math.isfinite(self.sigma_g)):
            raise ConfigError(f"sigma_g must be >= 0, got {self.sigma_g}")
        check_local_steps(self.local_steps)
        if self.rounds < 1:
            raise ConfigError(f"rounds must be >= 1, got {self.rounds}")
        if not 1 <= self.start <= self.rounds:
            raise ConfigError(f"start round {self.start} is not in [1, {self.rounds}]")
        if self.w0 and len(self.w0) != self.dim:
            raise ConfigError(f"w0 has {len(self.w0)} entries, the model has dim {self.dim}")
        for plan in self.steps:
            _check_plan(self, plan)
        if self.schedule is not None and self.schedule.agents != self.agents:
            raise ConfigError(
                f"the schedule is for {self.schedule.agents} agents, the spec for {self.agents}"
            )

    def plan(self, step: int) -> StepPlan:
        return self.steps[STEPS.index(step)]

    @functools.cached_property
    def neighbours(self) -> frozenset[int]:
        """Everyone this agent exchanges peer frames with at some step (itself excluded)."""
        linked = {m for plan in self.steps for m in (*plan.weights_in, *plan.weights_out)}
        return frozenset(linked - {self.agent})


def check_local_steps(steps: object) -> None:
    """E of `--local-steps`: a whole number of gradient steps a round, at least one."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ConfigError(
            f"--local-steps (local_steps) must be an integer >= 1 (local gradient steps an "
            f"agent takes each round before it combines; 1 is the paper's), got {steps!r}"
        )


def _check_plan(spec: AgentSpec, plan: StepPlan) -> None:
    me = spec.agent
    for name, weights in (("weights_in", plan.weights_in), ("weights_out", plan.weights_out)):
        if me not in weights:
            raise ConfigError(
                f"agent {me}, step {plan.step}: {name} lacks the self weight a_pp; "
                "every agent must keep part of its own model (a_pp > 0)"
            )
        for m, a in weights.items():
            if not (0 < a <= 1 and math.isfinite(a)) or not 0 <= m < spec.agents:
                raise ConfigError(
                    f"agent {me}, step {plan.step}: {name}[{m}] = {a} must be in (0, 1] "
                    f"for an agent id in [0, {spec.agents})"
                )
    total = sum(plan.weights_in.values())
    if abs(total - 1.0) > WEIGHT_TOL:
        raise ConfigError(
            f"agent {me}, step {plan.step}: incoming weights sum to {total:.12g}, not 1; "
            "the combination matrix must be left-stochastic (columns sum to 1)"
        )
    if spec.scheme.homomorphic and plan.communicates and plan.weights_out[me] <= 0:
        raise ConfigError(f"agent {me}: {spec.scheme} needs a_pp > 0")

"""The conductor's construction and read-only face: its settings, its parts (`registry`,
`group`, `collection`, `outbox`) and the properties that read them, so the engines, the
live view and the tests keep reading `conductor.models`, `.members`, `.traffic` and the
rest while the state lives in the part it belongs to."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import numpy as np

from privnet.agent import control, keys, topics, wire
from privnet.agent.protocol import Deliveries, Publish, Traffic
from privnet.agent.spec import ConfigError
from privnet.orchestrator.conductor.blame import Blame
from privnet.orchestrator.conductor.collection import BeatGaps, Collection, Link, Outbox
from privnet.orchestrator.conductor.membership import Membership
from privnet.orchestrator.conductor.records import (
    REGISTER_DEADLINE,
    Resume,
    SessionPlan,
    SessionResult,
    Stage,
    View,
)
from privnet.orchestrator.conductor.registry import Pinned, Registry


class Parts:
    """The conductor's settings and parts, and what it reads of them: the read-only face
    the engines, the live view and the tests use. `Conductor` adds the decisions."""

    def __init__(
        self,
        run: str,
        identity: keys.Identity,
        tokens: dict[int, bytes],
        plans: list[SessionPlan],
        *,
        deadline: float = 30.0,
        telemetry: bool = True,
        register_deadline: float = REGISTER_DEADLINE,
        checkpoint_every: int = 0,
        script: Iterable[View] | None = None,
        resume: Resume | None = None,
        seal_links: bool = True,
        escrow: bool = False,
        models_every: int | None = None,
    ) -> None:
        if not plans:
            raise ValueError("a run needs at least one session")
        agents = len(tokens)
        for plan in plans:
            if sorted(s.agent for s in plan.specs) != list(range(agents)):
                raise ValueError(f"session {plan.label}: one spec per agent 0..{agents - 1}")
        _check_size(plans[0].dim, escrow=escrow)
        self.run, self.identity, self.tokens = run, identity, tokens
        self.plans, self.deadline, self.telemetry = plans, deadline, telemetry
        self.register_deadline = register_deadline
        self.checkpoint_every = checkpoint_every
        self.seal_links, self.escrow = seal_links, escrow
        # telemetry: agents' metrics every round, their models every K (None: by the size)
        self.models_every = models_every or wire.default_models_every(plans[0].dim)
        # A replay applies recorded views at their rounds and decides nothing itself.
        self.script = {(v.session, v.view): v for v in script} if script is not None else None
        self.agents = agents
        self.stage = Stage.REGISTERING
        self.deliveries = Deliveries()
        self.registry = Registry(run, tokens)
        self.group = Membership(agents)
        self.blame = Blame(deadline)  # who stalls the network, and its quarantine
        self.collection = Collection(run, identity)
        self.outbox = Outbox(run, identity, agents)
        self.beats = BeatGaps()  # measured as `tick` and `receive` send them
        self.results: list[SessionResult] = []
        self.failure = ""
        self.resume = resume  # a run started again (`privnet run --resume`)
        self.session = (resume.session if resume is not None else 0) - 1  # index into plans
        self._since = 0.0  # start of the current wait (registration: of the run)
        self._go_at = 0.0
        self._next_beat = 0.0
        self._granted = 0  # the last round the members may run in this view (Go's `until`)
        self._final = 0  # the view's own last round: Go's `until` once fully granted

    # ---- the parts' state, as the engines, the live view and the tests read it ---------

    @property
    def registered(self) -> dict[int, Pinned]:
        return self.registry.registered

    @property
    def alive(self) -> set[int]:
        return self.registry.alive

    @property
    def membership(self) -> list[View]:
        """Every view of every session, in order."""
        return self.group.views

    @property
    def members(self) -> frozenset[int]:
        return self.group.members

    @property
    def pauses(self) -> list[dict[str, Any]]:
        return self.group.pauses

    @property
    def models(self) -> np.ndarray:
        return self.collection.models

    @property
    def counts(self) -> np.ndarray:
        return self.collection.counts

    @property
    def link_keys(self) -> dict[tuple[int, int], dict[Link, bytes]]:
        return self.collection.link_keys

    @property
    def left(self) -> dict[int, dict[str, int]]:
        return self.collection.left

    @property
    def left_traffic(self) -> Traffic:
        return self.collection.left_traffic

    @property
    def traffic(self) -> Traffic:
        return self.outbox.traffic

    @property
    def recipients(self) -> int:
        return self.outbox.recipients

    # ---- public API -------------------------------------------------------------------

    @property
    def subscriptions(self) -> list[str]:
        return topics.up_filters(self.run)

    @property
    def view(self) -> View | None:
        return self.group.view

    @property
    def member_ids(self) -> np.ndarray:
        """The current view's members as indices (in no order), for numpy."""
        return self.group.ids

    @property
    def rounds_done(self) -> int:
        """Rounds every member has completed in the current session (by its heartbeats,
        or by its telemetry, which comes more often)."""
        return self.group.rounds_done(self.collection.counts)

    @property
    def completed(self) -> np.ndarray:
        """Rounds each agent has completed in the current session as far as the conductor
        knows (heartbeats or telemetry, whichever says more): read-only, for the live view."""
        completed, counts = self.group.completed, self.collection.counts
        if counts.size != completed.size:  # no session yet
            return completed.copy()
        most: np.ndarray = np.maximum(completed, counts)
        return most

    @property
    def current(self) -> SessionPlan | None:
        return self.plans[self.session] if 0 <= self.session < len(self.plans) else None

    # ---- shared by the decisions ----------------------------------------------------

    def _at(self, stage: Stage, session: int, view: int) -> bool:
        return self.stage is stage and session == self.session and view == self._view_number

    @property
    def _view_number(self) -> int:
        return self.group.number(self.session)

    def _expects(self, agent: int) -> bool:
        return self.group.expects(agent, self.registry.alive)

    @property
    def _may_stall(self) -> bool:
        """Keying or running, not replaying, and rounds left to run."""
        return (
            self.stage in (Stage.CONFIGURING, Stage.RUNNING)
            and self.script is None
            and self.rounds_done < self.plans[self.session].rounds
        )

    @property
    def _label(self) -> str:
        plan = self.current
        return plan.label if plan is not None else ""

    def _down(self, to: int | Literal["all"], msg: control.Control) -> Publish:
        return self.outbox.down(to, msg)


def _check_size(dim: int, *, escrow: bool) -> None:
    """Refuse a model the run's other planes cannot carry yet (the peer plane chunks it)."""
    if escrow and wire.needs_chunks(dim):
        raise ConfigError(
            f"--audit reads models that travel in one peer frame (at most "
            f"{wire.max_model_dim():,} parameters), and this one of {dim:,} travels in "
            f"{wire.chunk_count(dim)} chunks: run it without --audit"
        )

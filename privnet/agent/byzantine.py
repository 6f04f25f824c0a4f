"""A Byzantine agent inside the core (issue 34): what it remembers and what it releases.

The core asks an `Attacker` for its release instead of releasing its value: the crafted
value for each out-neighbour (privnet.agent.attacks.craft), then the scheme's own release
of it, exactly as an honest agent's (rounded to the noise grid, its noise row added; the
masked schemes then mask it on the lattice in the core, so the masks still cancel). Its
own term stays honest: its model is not reported with the honest agents'. It remembers,
per step, what it saw as a hub in the last round (`attacks.observe`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from privnet.agent import attacks, rng
from privnet.agent.schemes.base import Source
from privnet.agent.spec import AgentSpec, StepPlan, WireDtype


@dataclass
class Attacker:
    attack: attacks.Attack
    spec: AgentSpec
    seen: dict[int, attacks.Seen] = field(default_factory=dict)  # step -> last round's view
    own: dict[int, np.ndarray] = field(default_factory=dict)  # step -> its release to itself

    @classmethod
    def of(cls, spec: AgentSpec) -> Attacker | None:
        """The attacker `spec.attack` names (None: honest, or only its data is flipped)."""
        if not spec.attack:
            return None
        attack = attacks.parse(spec.attack)
        return cls(attack, spec) if attack.crafts else None

    def saw(
        self,
        plan: StepPlan,
        inbox: Mapping[int, np.ndarray],
        combined: np.ndarray,
    ) -> None:
        """Note a combine this agent ran as a hub (what its scheme let it see)."""
        spec = self.spec
        own = self.own.get(plan.step) if spec.scheme.masked else None
        if spec.scheme.masked and own is None:
            return
        view = attacks.observe(plan.weights_in, inbox, spec.agent, combined, own)
        if view is not None:
            self.seen[plan.step] = view

    def release(self, plan: StepPlan, value: np.ndarray, round_: int) -> dict[int, np.ndarray]:
        """The scheme's release (before any mask) of the crafted value to each target,
        its own term honest."""
        spec, me = self.spec, self.spec.agent
        normals = None
        if self.attack.kind is attacks.Kind.GAUSSIAN:
            normals = attacks.normals(spec.noise_key, plan.step, round_, spec.agents, spec.dim)
        crafted = attacks.craft(
            self.attack, value, self.seen.get(plan.step), plan.weights_out, me, normals
        )
        crafted[me] = value
        released = self._release(plan, crafted, round_)
        self.own[plan.step] = released[me]
        return released

    def _release(
        self, plan: StepPlan, crafted: dict[int, np.ndarray], round_: int
    ) -> dict[int, np.ndarray]:
        spec = self.spec
        source = Source(spec.noise_key, plan.step, round_, spec.agents, spec.dim, spec.sigma_g,
            rng.grid(spec.sigma_g), spec.wire is WireDtype.U4)  # fmt: skip
        return spec.scheme.part.release_each(crafted, plan.weights_out, spec.agent, source)

"""What a privacy scheme is: the base class every scheme's part derives from.

A part says four things, and the rest of privnet asks it instead of naming the scheme:
- what it adds to a release: `release` (the core's hot path, once per step and agent),
  `release_each` (a Byzantine agent's crafted value per target), and as facts `draws` and
  `broadcast`;
- what it needs agreed: `masked` (pairwise mask seeds from key agreements, the masks put
  on the lattice and cancelled at each hub by the core) and `homomorphic` (one draw per
  sender that the Perron-weighted sum cancels: a_pp > 0 and Perron weights);
- how it is accounted: the accountant and dp-audit read `draws` and `masked` (charges and
  attackers), `holds_against` says against whom its epsilon holds;
- how it is audited: `law` (what wire - true follows), `hub_sees` (what a hub learns);
and how it is shown (`style`) and whether the oracle's recursion models it (`oracle`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np

from privnet.agent import rng


class Draws(StrEnum):
    """What noise a release draws before any mask."""

    NONE = "none"  # the value itself
    PER_LINK = "per-link"  # an independent Laplace draw on every directed link
    PER_SENDER = "per-sender"  # one draw g per sender and round on all its links


@dataclass(frozen=True, slots=True)
class Source:
    """Where a release's randomness comes from: the sender's own noise stream at one step
    and round (seeds.Purpose.NOISE; row k of its table is what receiver k gets), and the
    lattice a release is rounded to."""

    key: tuple[int, int]
    step: int
    round: int
    agents: int
    dim: int
    sigma_g: float
    grid: float  # the noise grid (privnet.agent.lattice.grid: 2^-24 for u4 without noise)
    words: bool  # releases travel as lattice words (u4): a noiseless one is rounded too

    def table(self) -> np.ndarray:
        """(agents, dim) Laplace draws, one row per agent id."""
        width = self.agents * self.dim
        raw = rng.raw_row(self.key, rng.Domain.NOISE, self.step, self.round, width)
        table: np.ndarray = rng.laplace(rng.uniforms(raw), self.sigma_g)
        return table.reshape(self.agents, self.dim)


class SchemePart:
    """One privacy scheme. Subclass it, set `name` and the facts, write `release`, and
    register an instance (privnet.agent.schemes.registry.register)."""

    name: ClassVar[str]
    # what it adds to a release
    draws: ClassVar[Draws] = Draws.NONE
    broadcast: ClassVar[bool] = False  # releases the value itself, uncopied, to every target
    # what it needs agreed
    masked: ClassVar[bool] = False
    homomorphic: ClassVar[bool] = False
    # what the oracle, the accountant, the audit and the report say of it
    oracle: ClassVar[bool] = False  # the oracle's recursion is exact from the facts above
    holds_against: ClassVar[str] = "not stated (a scheme registered outside privnet)"
    hub_sees: ClassVar[str] = "not stated (a scheme registered outside privnet)"
    law: ClassVar[str] = "not stated (a scheme registered outside privnet)"
    style: ClassVar[Mapping[str, Any]] = {}  # matplotlib line style: label, color, ...

    @property
    def perturbs(self) -> bool:
        """Whether a release draws noise (and so is rounded to the noise grid first)."""
        return self.draws is not Draws.NONE

    @property
    def hides(self) -> bool:
        """Whether anything but the value crosses the wire (noise or masks)."""
        return self.masked or self.perturbs

    def release(
        self, x: np.ndarray, out: Mapping[int, float], me: int, source: Source
    ) -> dict[int, np.ndarray]:
        """What each target k of `out` (k -> a_mk, `me` included: the self-term the core
        keeps) gets of value x, before the core's masks. Must not change x."""
        raise NotImplementedError(f"scheme {self.name!r} has no release")

    def release_each(
        self, values: Mapping[int, np.ndarray], out: Mapping[int, float], me: int, source: Source
    ) -> dict[int, np.ndarray]:
        """A Byzantine agent's release: value values[k] to each target k. By default each
        as `release` would send it to k alone (privnet's own do it in one pass)."""
        return {k: self.release(values[k], out, me, source)[k] for k in out}

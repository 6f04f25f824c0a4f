"""The u4 wire's words as the audit reads them: floats in the f8 wire's convention.

On the u4 wire (`privnet.agent.lattice`) an unmasked scheme sends rint(x / step) mod 2^32,
a masked one rint(a x / step) plus its pair masks. The audit reads each word as the float
it stands for, divided by the link's weight a under a masked scheme, so a frame means what
the f8 wire's frame of the same release means (the release, plus its masks / a), and every
check written for f8 holds. What differs is stated here: a u4 release is rounded to the
lattice (a frame in the clear is within a step a coordinate of the true value, not equal to
it), the masks are uniform words (not Laplace draws), and a hub's sum is taken mod 2^32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from privnet.agent import lattice
from privnet.agent.spec import Scheme, WireDtype
from privnet.orchestrator.audit.views import Part
from privnet.orchestrator.replay import SessionWire

SPAN = 2.0**32  # a mask word's range


@dataclass(frozen=True)
class Reading:
    """How a session's model frames are read: the lattice `step` its releases sit on, and
    whether they travel as words (u4)."""

    step: float
    words: bool

    @classmethod
    def of(cls, sigma_g: float, wire: WireDtype) -> Reading:
        return cls(lattice.grid(sigma_g, wire), wire is WireDtype.U4)

    def wrap(self, x: np.ndarray) -> np.ndarray:
        """A sum of terms as the hub takes it: mod 2^32 on the u4 wire, as is on f8."""
        return lattice.wrapped(x, self.step) if self.words else x

    def slack(self, size: int, a: float) -> float:
        """How far a frame in the clear may lie from the true value: the u4 lattice's
        rounding of a x (half a step a coordinate, / a); 0 on f8, which sends x itself."""
        return math.sqrt(size) * self.step / a if self.words and a > 0 else 0.0


def as_floats(
    seen: SessionWire, scheme: Scheme, found: Sequence[Part], reading: Reading
) -> SessionWire:
    """`seen` with every u4 vector read as the float it stands for (/ a_sr under a masked
    scheme, with the weight of its view's matrix in its round); f8 vectors as they are."""
    if not reading.words:
        return seen
    by_view = {part.view.view: part for part in found}

    def read(v: int, s: int, r: int, i: int, vector: np.ndarray) -> np.ndarray:
        if vector.dtype != np.uint32:
            return vector
        out = lattice.values(vector, reading.step)
        part = by_view.get(v)
        a = float(part.at(i)[s, r]) if scheme.masked and part is not None else 1.0
        return out / a if a > 0 else out

    views = {key: read(key[0], key[1], key[2], key[3], x) for key, x in seen.views.items()}
    models = {slot: views[(seen.latest[slot], *slot)] for slot in seen.models}
    return replace(seen, views=views, models=models)


def mask_units(scaled: np.ndarray, reading: Reading) -> np.ndarray:
    """A u4 frame's a (wire - release), its mask, in units of the word's range: uniform on
    [-1/2, 1/2) for a uniform 32-bit word read signed (up to the half-step rounding)."""
    out: np.ndarray = scaled / (reading.step * SPAN)
    return out

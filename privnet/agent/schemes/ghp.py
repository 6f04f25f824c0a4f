"""ghp, graph-homomorphic: one Laplace draw g per sender and round on all its links, and
-(1 - a_pp)/a_pp g on its own term, so the Perron-weighted network sum cancels it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from privnet.agent import rng
from privnet.agent.schemes.base import Draws, SchemePart, Source


class Ghp(SchemePart):
    name = "ghp"
    draws = Draws.PER_SENDER
    homomorphic = True
    oracle = True
    holds_against = (
        "an eavesdropper on the links out of the agent, a hub, the whole wire "
        "(epsilon_network); the sender's one draw per round is the same on all its links"
    )
    hub_sees = "each neighbour's model plus that neighbour's g_m (the same on all its links)"
    law = "Laplace(0, b) per coordinate, one g_m per sender and round"
    style: ClassVar[Mapping[str, Any]] = {
        "label": "graph-homomorphic", "color": "tab:red", "linestyle": "-", "linewidth": 1.4,
    }  # fmt: skip

    def release(
        self, x: np.ndarray, out: Mapping[int, float], me: int, source: Source
    ) -> dict[int, np.ndarray]:
        """x + g to every target, x - (1 - a_pp)/a_pp g to itself (x on the grid)."""
        x = rng.on_lattice(x, 1.0, source.grid)  # on the noise grid, own term included (snap)
        g = source.table()[me]  # one draw per sender, cancelled in the q-weighted network sum
        a_mm = out[me]
        return {k: x - (1 - a_mm) / a_mm * g if k == me else x + g for k in out}

    def release_each(
        self, values: Mapping[int, np.ndarray], out: Mapping[int, float], me: int, source: Source
    ) -> dict[int, np.ndarray]:
        g, a_mm = source.table()[me], out[me]
        snapped = {k: rng.snap(values[k], source.sigma_g) for k in out}
        return {k: v - (1 - a_mm) / a_mm * g if k == me else v + g for k, v in snapped.items()}

"""random: x on the noise grid plus an independent Laplace draw on every directed link."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from privnet.agent import rng
from privnet.agent.schemes.base import Draws, SchemePart, Source


class Random(SchemePart):
    name = "random"
    draws = Draws.PER_LINK
    oracle = True
    holds_against = (
        "an eavesdropper on the links out of the agent, a hub (it sees one of those links), "
        "the whole wire (epsilon_network); colluders pool their links' releases"
    )
    hub_sees = "each neighbour's model plus independent Laplace noise (per link)"
    law = "Laplace(0, b) per coordinate, every directed link"
    style: ClassVar[Mapping[str, Any]] = {
        "label": "random (Laplace)", "color": "orange", "linestyle": "-", "linewidth": 1.4,
    }  # fmt: skip

    def release(
        self, x: np.ndarray, out: Mapping[int, float], me: int, source: Source
    ) -> dict[int, np.ndarray]:
        """Row k of the sender's table to each target k; its own term x (on the grid)."""
        x = rng.on_lattice(x, 1.0, source.grid)  # on the noise grid, own term included (snap)
        table = source.table()
        return {k: x.copy() if k == me else x + table[k] for k in out}

    def release_each(
        self, values: Mapping[int, np.ndarray], out: Mapping[int, float], me: int, source: Source
    ) -> dict[int, np.ndarray]:
        table = source.table()
        snapped = {k: rng.snap(values[k], source.sigma_g) for k in out}
        return {k: v if k == me else v + table[k] for k, v in snapped.items()}

"""none: every model crosses the wire in the clear (the paper's baseline)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from privnet.agent import rng
from privnet.agent.schemes.base import SchemePart, Source


class Clear(SchemePart):
    name = "none"
    oracle = True
    holds_against = "no one: every model crosses the wire in the clear (epsilon is infinite)"
    hub_sees = "every neighbour's model, in the clear"
    law = "no noise"
    style: ClassVar[Mapping[str, Any]] = {
        "label": "no privacy", "color": "tab:blue", "linestyle": "-", "linewidth": 1.6,
    }  # fmt: skip

    def release(
        self, x: np.ndarray, out: Mapping[int, float], me: int, source: Source
    ) -> dict[int, np.ndarray]:
        """One copy of x for every target (u4: on the lattice), shared: releases are read,
        never changed, so a 1M-parameter model is not copied once a neighbour."""
        shared = rng.on_lattice(x, 1.0, source.grid) if source.words else x.copy()
        return dict.fromkeys(out, shared)

    def release_each(
        self, values: Mapping[int, np.ndarray], out: Mapping[int, float], me: int, source: Source
    ) -> dict[int, np.ndarray]:
        return {k: np.array(values[k]) for k in out}

"""local-ghp: no noise of its own; the value goes out under pairwise masks (agreed with
the partners the hub seats it with) that cancel in the hub's weighted sum, on the lattice."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from privnet.agent.schemes.base import SchemePart, Source


class LocalGhp(SchemePart):
    name = "local-ghp"
    masked = True
    broadcast = True
    oracle = True
    holds_against = (
        "an eavesdropper on the links out of the agent only; not a hub (it learns its "
        "weighted sum exactly), not the whole wire (it can form the hub sums), not two "
        "colluding partners (they know the pair's mask)"
    )
    hub_sees = "only its weighted aggregate sum_m a_mk w_m: single masks do not cancel"
    law = "(wire - true) * a_mk ~ Laplace(0, b) for N+ senders with one partner"
    style: ClassVar[Mapping[str, Any]] = {
        "label": "local graph-homomorphic",
        "color": "tab:green",
        "linestyle": (0, (5, 3)),
        "linewidth": 1.8,
    }

    def release(
        self, x: np.ndarray, out: Mapping[int, float], me: int, source: Source
    ) -> dict[int, np.ndarray]:
        """x itself to every target: the core masks it before it is sent (no copies)."""
        return dict.fromkeys(out, x)

    def release_each(
        self, values: Mapping[int, np.ndarray], out: Mapping[int, float], me: int, source: Source
    ) -> dict[int, np.ndarray]:
        return {k: np.array(values[k]) for k in out}

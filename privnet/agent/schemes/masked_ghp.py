"""masked-ghp: ghp's release (one draw per sender), then local-ghp's pairwise masks on it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from privnet.agent.schemes.ghp import Ghp


class MaskedGhp(Ghp):
    name = "masked-ghp"
    masked = True
    holds_against = (
        "an eavesdropper on the links out of the agent, a hub, colluders and the whole wire "
        "(epsilon_network): under the masks, which cancel at each hub, is ghp's release, "
        "one draw per sender and round"
    )
    hub_sees = (
        "only its weighted aggregate of its neighbours' ghp releases, sum_m a_mk (w_m + g_m):"
        " single masks do not cancel, and each w_m carries its own Laplace draw (a hub "
        "with one other neighbour pairs with it and learns that neighbour's w_m + g_m)"
    )
    law = (
        "(wire - release) * a_mk ~ Laplace(0, b) for N+ senders with one partner, and "
        "release - true ~ Laplace(0, b), one g_m per sender and round"
    )
    style: ClassVar[Mapping[str, Any]] = {
        "label": "masked graph-homomorphic",
        "color": "tab:purple",
        "linestyle": (0, (1, 2)),
        "linewidth": 1.8,
    }

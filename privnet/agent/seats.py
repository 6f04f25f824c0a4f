"""Where an agent sits at a hub under the masked schemes: the hub's N+/N- split of its
senders, and what a time-varying topology (privnet.agent.schedule) needs on top of it.

Static: each hub splits its senders once (`split_senders`) and tells them (KeyPlan).
Scheduled: a hub's senders change every round, so the pairs keyed once per view are every
pair that some round's split of its senders uses (`union_seats`), and each round's masks
use that round's split (`round_seats`): keys agreed once, masks cancelling at each round's
hubs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from privnet.agent import keys
from privnet.agent import schedule as expand
from privnet.agent.schedule import RoundGraph
from privnet.agent.spec import Schedule, StepPlan


@dataclass(frozen=True, slots=True)
class StepMasks:
    """A masked scheme's masks at one step for one epoch: every target (the self-term
    included), its public weight a_pk as a column, and the bank whose rows of a round are
    each target's sum of side * g_pair (on the grid)."""

    targets: list[int]
    weights: np.ndarray  # (targets, 1)
    bank: (
        keys.MaskBank | keys.WordBank | None
    )  # None under a schedule: its masks are made round by round


@dataclass(frozen=True, slots=True)
class Seat:
    """Masked schemes: where this agent sits at one hub for one step."""

    side: int  # +1 for N+, -1 for N-
    partners: tuple[int, ...]


def split_senders(senders: list[int], hub: int) -> dict[int, Seat]:
    """The hub's N+/N- split of its other neighbours, and each one's partners.

    Alternating over sorted ids, as in the paper's example. A hub with a single other
    neighbour l cannot hide l behind a partner, so it joins the pair itself (seat N-):
    the wire still carries no model in the clear, and the hub learns only w_l, which
    its own combination a_hh w_h + a_lh w_l reveals to it anyway.
    """
    if len(senders) == 1:
        (sole,) = senders
        return {sole: Seat(+1, (hub,)), hub: Seat(-1, (sole,))}
    plus, minus = tuple(senders[0::2]), tuple(senders[1::2])
    seats = {m: Seat(+1, minus) for m in plus}
    seats.update({m: Seat(-1, plus) for m in minus})
    return seats


@functools.lru_cache(maxsize=4096)
def union_seats(made: Schedule, hub: int, first: int, last: int) -> dict[int, Seat]:
    """The hub's seats keyed once per view: each sender of any round of first..last (and
    the hub, where a round has a sole sender) with every partner some round's split gives
    it. The side is unused (+1): each round's masks take it from that round's split."""
    partners: dict[int, set[int]] = {}
    for round_ in expand.rounds_of(made, first, last):
        senders = expand.graph(made, round_).senders(hub)
        for m, seat in (split_senders(senders, hub) if senders else {}).items():
            partners.setdefault(m, set()).update(seat.partners)
    return {m: Seat(+1, tuple(sorted(p))) for m, p in sorted(partners.items())}


def round_seats(graph: RoundGraph, targets: list[int], me: int) -> list[tuple[int, int, int, int]]:
    """My pairs this round at each of `targets` (the hubs I send to, me included), as
    (index of the target, hub, partner, side): my seat in the hub's split of its senders
    in `graph`; none where I have no seat (my own term at a hub with 2+ other senders)."""
    out = []
    for row, hub in enumerate(targets):
        senders = graph.senders(hub)
        seat = split_senders(senders, hub).get(me) if senders else None
        if seat is not None:
            out += [(row, hub, m, seat.side) for m in seat.partners]
    return out


def round_masks(
    graph: RoundGraph,
    plan: StepPlan,
    me: int,
    round_: int,
    dim: int,
    sigma_g: float,
    stream: Callable[[int, int], keys.PairStream],
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The targets of `plan`, their public weights a_pk as a column, and my mask to each
    this round: sum over my round partners m at hub k of side * g (stream(k, m), read at
    `round_`), on the grid; they cancel at k once each term is on the lattice."""
    targets = list(plan.weights_out)
    seats = round_seats(graph, targets, me)
    rows = np.zeros((len(targets), dim))
    if seats:
        raw = b"".join(stream(hub, m).read(round_) for _, hub, m, _ in seats)
        noise = keys.stream_laplace(raw, dim, sigma_g)
        for (row, _, _, side), g in zip(seats, noise, strict=True):
            rows[row] += side * g
    return targets, np.array([plan.weights_out[k] for k in targets])[:, None], rows

"""What the masks and the noise did on the wire: the law `wire - true` should follow, and
that the pairwise masks cancel at every hub.

The noise check is statistical (a KS test against the scheme's Laplace law); the
cancellation check is exact, because every term is taken on the noise lattice as the hub
takes it (`rng.on_lattice`), so a residual other than 0 is a bug, not rounding.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from privnet.agent import rng
from privnet.agent.schemes.base import Draws
from privnet.agent.seats import Seat, split_senders
from privnet.agent.spec import Scheme
from privnet.orchestrator.audit.views import Part, senders
from privnet.orchestrator.audit.words import Reading, mask_units
from privnet.orchestrator.replay import Replay, SessionWire


@dataclass
class Noise:
    """wire - true as the scheme's law predicts it: KS samples, and the masks' power check."""

    samples: np.ndarray
    uniform: np.ndarray = field(default_factory=lambda: np.zeros(0))  # u4: masks / 2^32
    power: float = 0.0  # masked: sum over every seat of ||(wire - release) a_mk||^2
    expected_power: float = 0.0  # ... and its expectation, partners * sigma_g^2 per coordinate


def _seats(A: np.ndarray, hub: int) -> dict[int, Seat]:
    sending = senders(A, hub)
    return split_senders(sending, hub) if sending else {}


def noise_samples(
    scheme: Scheme,
    parts: Sequence[Part],
    seen: SessionWire,
    truth: Replay,
    sigma_g: float,
    reading: Reading | None = None,
) -> Noise:
    """random: every link's wire - true; ghp: one per sender and round (g_m is the same on
    all links); masked schemes: (wire - release) * a_mk of N+ senders with a single partner,
    so each pair's mask counts once, and for masked-ghp its release - true as ghp's. A
    redone round counts once more only for the masks: random and ghp draw the same seeded
    noise again, masks are fresh in every view. On the u4 wire (`reading.words`) the masks
    are uniform words: their samples go to `uniform`, in units of the word's range."""
    samples: list[np.ndarray] = []
    uniform: list[np.ndarray] = []
    words = reading is not None and reading.words
    noise, scheme_part = Noise(np.zeros(0)), scheme.part
    once: set[tuple[int, ...]] = set()
    by_view = {part.view.view: part for part in parts}
    seats: dict[tuple[int, int], tuple[np.ndarray, dict[int, dict[int, Seat]]]] = {}
    for (v, s, r, i, j), vector in sorted(seen.views.items()):
        true = truth.views.get((v, s, i, j))
        if true is None or not scheme_part.hides or v not in by_view:
            continue
        release = truth.released[(v, s, r, i, j)] if scheme.masked else vector
        if scheme_part.perturbs:
            draw = (s, r, i, j) if scheme_part.draws is Draws.PER_LINK else (s, i)
            if draw not in once:
                once.add(draw)
                samples.append(release - rng.snap(true, sigma_g))
        if not scheme.masked:
            continue
        part = by_view[v]
        if part.key(i) not in seats:  # the round's matrix (a schedule's varies) and seats
            a = part.at(i)
            seats[part.key(i)] = (a, {hub: _seats(a, hub) for hub in range(a.shape[0])})
        A, at = seats[part.key(i)]
        seat = at[r].get(s)
        if seat is None:  # no link of this view's matrix: unmatched
            continue
        scaled = (vector - release) * A[s, r]
        if words and reading is not None:  # the mask mod 2^32, read signed
            if seat.side == 1 and len(seat.partners) == 1:
                uniform.append(mask_units(reading.wrap(scaled), reading))
            continue
        noise.power += float(scaled @ scaled)
        noise.expected_power += len(seat.partners) * sigma_g**2 * scaled.size
        if seat.side == 1 and len(seat.partners) == 1:
            samples.append(scaled)
    noise.samples = np.concatenate(samples) if samples else np.zeros(0)
    noise.uniform = np.concatenate(uniform) if uniform else np.zeros(0)
    return noise


def noise_report(
    scheme: Scheme, noise: Noise, sigma_g: float, reading: Reading | None = None
) -> dict[str, Any]:
    """KS test of the samples against Laplace(0, b), b = sigma_g / sqrt(2); on the u4
    wire, of the masks against the uniform law of a 32-bit word (`masks`)."""
    b = sigma_g / math.sqrt(2)
    result: dict[str, Any] = {
        "expected": f"{scheme.part.law}; b = sigma_g/sqrt(2) = {b:.6g}",
        "samples": int(noise.samples.size),
        "ks_statistic": None,
        "p_value": None,
        "variance_ratio": None,
    }
    if noise.samples.size and b > 0:
        test = stats.kstest(noise.samples, "laplace", args=(0.0, b))
        result.update(
            ks_statistic=float(test.statistic),
            p_value=float(test.pvalue),
            variance_ratio=float(np.mean(noise.samples**2) / sigma_g**2),
        )
    if noise.expected_power > 0:
        result["variance_ratio_all_seats"] = noise.power / noise.expected_power
    if reading is not None and reading.words and scheme.masked:
        masks: dict[str, Any] = {
            "expected": "uniform 32-bit words: a mask read signed / 2^32 ~ U[-1/2, 1/2)",
            "samples": int(noise.uniform.size),
            "ks_statistic": None,
            "p_value": None,
        }
        if noise.uniform.size:
            test = stats.kstest(noise.uniform, "uniform", args=(-0.5, 1.0))
            masks.update(ks_statistic=float(test.statistic), p_value=float(test.pvalue))
        result["masks"] = masks
    return result


def cancellation(
    part: Part, seen: SessionWire, truth: Replay, step: int, reading: Reading
) -> tuple[dict[str, Any], int]:
    """Max over hubs and rounds of one view of |wire combination - true combination| /
    |true combination|, with the view's matrix, each term on the lattice as the hub takes
    it (so this is 0); and how many hub-rounds the next view redid before they were
    complete (never combined, nothing to check).

    The hub's own term is not on the wire; it is its release (from the truth), except at a
    fallback hub (one other neighbour), whose own term carries the pair's mask: there the
    cancellation happens inside the hub and is not observable on the wire. On the u4 wire
    the terms are added mod 2^32, as the hub adds them (`reading`).
    """
    worst, checked, missing, not_combined = 0.0, 0, 0, 0
    fallback: set[int] = set()
    for i in range(part.view.start, part.last + 1):
        A = part.at(i)
        for hub in range(A.shape[0]):
            sending = senders(A, hub)
            if len(sending) == 1:
                fallback.add(hub)
            if len(sending) < 2:
                continue
            try:
                gap = _residual(part, A, seen, truth, (hub, i, step), sending, reading)
            except KeyError:
                if i <= part.end:
                    missing += 1
                else:
                    not_combined += 1
                continue
            worst, checked = max(worst, gap), checked + 1
    report = {
        "max": worst,
        "hub_rounds_checked": checked,
        "hub_rounds_missing_messages": missing,
        "not_observable_fallback_hubs": sorted(fallback),
    }
    return report, not_combined


def _residual(
    part: Part,
    A: np.ndarray,
    seen: SessionWire,
    truth: Replay,
    at: tuple[int, int, int],
    sending: list[int],
    reading: Reading,
) -> float:
    """One hub-round (hub, round, step): the wire's combination against the true one,
    relative; KeyError when a term of it is missing."""
    (hub, i, step), v, grid = at, part.view.view, reading.step
    own = rng.on_lattice(truth.released[(v, hub, hub, i, step)], A[hub, hub], grid)
    on_wire = sum(
        rng.on_lattice(seen.views[(v, m, hub, i, step)], A[m, hub], grid) for m in sending
    )
    true = sum(
        rng.on_lattice(truth.released[(v, m, hub, i, step)], A[m, hub], grid) for m in sending
    )
    combined = own + true
    scale = max(float(np.linalg.norm(combined)), 1e-300)
    return float(np.linalg.norm(reading.wrap(own + on_wire) - combined)) / scale


def merge(reports: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The cancellation reports of a session's views as one."""
    done = list(reports)
    return {
        "max": max(r["max"] for r in done),
        "hub_rounds_checked": sum(r["hub_rounds_checked"] for r in done),
        "hub_rounds_missing_messages": sum(r["hub_rounds_missing_messages"] for r in done),
        "not_observable_fallback_hubs": sorted(
            {h for r in done for h in r["not_observable_fallback_hubs"]}
        ),
    }

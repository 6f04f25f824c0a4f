"""What the audit states about one session: every model frame held against the clear value
behind it, from the ground truth.

The ground truth is a replay of the same config on the memory engine
(`privnet.orchestrator.replay`): the same cores, seed and public noise draw the same trajectories
(the masked schemes' masks come from fresh DH secrets but cancel exactly on the lattice, so their
trajectories agree too). It is validated against the run's own sealed telemetry to TRUTH_TOL, so a
finding is about this run's wire, not about a replay that drifted.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privnet.agent import wire
from privnet.agent.spec import STRATEGY_STEP, Scheme, Strategy
from privnet.orchestrator.audit.masks import Noise, cancellation, merge, noise_report, noise_samples
from privnet.orchestrator.audit.views import PLAIN_REL, Part, parts, redo, round_messages, senders
from privnet.orchestrator.audit.words import Reading, as_floats
from privnet.orchestrator.conductor import View
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.replay import AuditError, Replay, SessionWire

TRUTH_TOL = 1e-9  # replay vs sealed telemetry


@dataclass
class Link:
    """One directed link's model frames: how many, how many in the clear, and how far each
    lay from its true value (|wire - true| / |true|, the masking strength)."""

    messages: int = 0
    plaintext: int = 0
    strengths: list[float] = field(default_factory=list)


@dataclass
class Frames:
    """A session's model frames against the truth: per link, and per view the frames in
    the clear and those of rounds that stand (the next view redid the rest)."""

    links: defaultdict[tuple[int, int], Link] = field(default_factory=lambda: defaultdict(Link))
    plain: Counter[int] = field(default_factory=Counter)
    standing: Counter[int] = field(default_factory=Counter)
    unmatched: int = 0


@dataclass(frozen=True)
class ViewCheck:
    """One view's checks: the model frames its standing rounds send, the cancellation of
    its masks (and its hub-rounds the next view redid before they were combined), and what
    its hubs learn."""

    part: Part
    expected: int
    cancel: dict[str, Any]
    not_combined: int
    learns: dict[str, Any]


def audit_session(
    problem: Instance,
    strategy: Strategy,
    scheme: Scheme,
    repeat: int,
    seen: SessionWire,
    truth: Replay,
    telemetry: np.ndarray | None,
    views: Sequence[View] | None = None,
) -> tuple[dict[str, Any], Noise]:
    """Everything the audit states about one session; with `views` (the session's
    membership views, the replay played them), per view as well: each view's frames
    against its own clear values and matrix."""
    c = problem.config
    step = STRATEGY_STEP[strategy]
    found = parts(problem, strategy, views, seen)
    reading = Reading.of(c.sigma_g, problem.wire)
    seen = as_floats(seen, scheme, found, reading)
    noise = noise_samples(scheme, found, seen, truth, c.sigma_g, reading)
    frames = _frames(seen, truth, found, c.iters, reading, scheme.masked)
    checks = [_view_check(scheme, part, seen, truth, step, reading) for part in found]
    result: dict[str, Any] = {
        "strategy": str(strategy),
        "scheme": str(scheme),
        "repeat": repeat,
        "step": step,
        **_counts(seen, frames, checks),
        "masking_strength": _summary([x for link in frames.links.values() for x in link.strengths]),
        "truth_vs_telemetry": _truth_check(
            wire.as_telemetered(truth.models, wire.telemetry_dtype(c.dim, problem.float32)),
            telemetry,
        ),
        # rounds whose true models the run's telemetry carried (--models-every K: every K
        # and the last); between them the replay is checked against the wire alone
        "truth_rounds": _truth_rounds(telemetry, c.iters),
        "noise": noise_report(scheme, noise, c.sigma_g, reading),
        "max_cancellation_residual": merge(v.cancel for v in checks) if scheme.masked else None,
        "clear_links": _clear_links(scheme, frames.links),
        "hub_learns": {
            "everyone": checks[0].learns["everyone"],
            "fallback_hubs": _unique(h for v in checks for h in v.learns["fallback_hubs"]),
        },
        "links": _link_rows(frames.links),
    }
    if views is None:
        return result, noise
    result["views"] = [_view_row(scheme, check, seen, frames) for check in checks]
    result["redo"] = redo(found, seen, truth, step)
    return result, noise


def _frames(
    seen: SessionWire,
    truth: Replay,
    found: Sequence[Part],
    iters: int,
    reading: Reading,
    masked: bool,
) -> Frames:
    """Each model frame on the wire against the clear value behind it; a u4 frame is in
    the clear within the lattice's rounding (`Reading.slack`: of x, or of a x under a
    masked scheme), whether it carries a x's words unmasked or x's own."""
    by_view = {part.view.view: part for part in found}
    ends = {part.view.view: part.end for part in found}
    frames = Frames()
    for (v, s, r, i, j), vector in seen.views.items():
        frames.standing[v] += i <= ends.get(v, iters)
        true = truth.views.get((v, s, i, j))
        if true is None:
            frames.unmatched += 1
            continue
        link = frames.links[(s, r)]
        link.messages += 1
        gap, size = float(np.linalg.norm(vector - true)), float(np.linalg.norm(true))
        a = float(by_view[v].at(i)[s, r]) if masked and v in by_view else 1.0
        clear = gap <= PLAIN_REL * size + reading.slack(true.size, a)
        if reading.words and a != 1.0 and not clear:  # x's own words, not a x's: read as x / a
            unscaled = float(np.linalg.norm(vector * a - true))
            clear = unscaled <= PLAIN_REL * size + reading.slack(true.size, 1.0)
        link.plaintext += clear
        frames.plain[v] += clear
        if size > 0:
            link.strengths.append(gap / size)
    return frames


def _view_check(
    scheme: Scheme, part: Part, seen: SessionWire, truth: Replay, step: int, reading: Reading
) -> ViewCheck:
    rounds = range(part.view.start, part.end + 1)
    expected = sum(round_messages(part.at(i)) for i in rounds)
    cancel, not_combined = cancellation(part, seen, truth, step, reading)
    return ViewCheck(part, expected, cancel, not_combined, _hub_learns(scheme, part.A))


def _counts(seen: SessionWire, frames: Frames, checks: Sequence[ViewCheck]) -> dict[str, int]:
    """How many frames of each kind the session put on the wire."""
    return {
        "model_messages": sum(frames.standing.values()),
        "expected_model_messages": sum(v.expected for v in checks),
        "key_messages": seen.keys,
        "undecodable": seen.undecodable,
        "sealed_unopened": seen.sealed,
        "duplicates": seen.duplicates,
        "unmatched": frames.unmatched,
        "plaintext_messages": sum(link.plaintext for link in frames.links.values()),
    }


def _link_rows(links: dict[tuple[int, int], Link]) -> list[dict[str, Any]]:
    return [
        {
            "from": s,
            "to": r,
            "messages": link.messages,
            "plaintext": link.plaintext,
            **{f"{k}_strength": v for k, v in _summary(link.strengths).items()},
        }
        for (s, r), link in sorted(links.items())
    ]


def _view_row(
    scheme: Scheme, check: ViewCheck, seen: SessionWire, frames: Frames
) -> dict[str, Any]:
    part, v = check.part, check.part.view.view
    return {
        "view": v,
        "start": part.view.start,
        "end": part.end,  # its last round that stands; the next view redid the rest
        "members": list(part.view.members),
        "reason": part.view.reason,
        "left": part.view.left,
        "model_messages": frames.standing[v],
        "expected_model_messages": check.expected,
        "redone_model_messages": sum(1 for u, *_, i, _j in seen.views if u == v and i > part.end),
        "key_messages": seen.view_keys[v],
        "plaintext_messages": frames.plain[v],
        "max_cancellation_residual": check.cancel if scheme.masked else None,
        "hub_rounds_not_combined": check.not_combined,
        "fallback_hubs": check.learns["fallback_hubs"],
    }


def sealed_session(
    strategy: Strategy, scheme: Scheme, repeat: int, seen: SessionWire
) -> dict[str, Any]:
    """What a sealed wire shows without the link keys: frames, and no model to read."""
    return {
        "strategy": str(strategy),
        "scheme": str(scheme),
        "repeat": repeat,
        "sealed": True,
        "sealed_unopened": seen.sealed,
        "undecodable": seen.undecodable,
        "model_messages": 0,
        "plaintext_messages": 0,
        "max_cancellation_residual": None,
        "truth_vs_telemetry": None,
        "hub_learns": {"everyone": None, "fallback_hubs": []},
        "finding": (
            f"{seen.sealed} peer frames, every one sealed end to end: none decodable without "
            "its link's key (record the run with --audit to escrow the keys and audit the "
            "masking underneath)"
        ),
    }


def _unique(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return seen


def _summary(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"min": None, "median": None}
    return {"min": float(np.min(values)), "median": float(np.median(values))}


def _truth_rounds(telemetry: np.ndarray | None, iters: int) -> list[int]:
    """[rounds with the run's models, rounds]: what the truth check covered."""
    if telemetry is None:
        return [0, iters]
    return [int((~np.isnan(telemetry[..., 0])).any(axis=1).sum()), iters]


def _truth_check(models: np.ndarray, telemetry: np.ndarray | None) -> float | None:
    """Max |replay w - sealed telemetry w| over the cells the run has (NaN: a round an
    agent did not report, out of its view), the replay's `models` rounded as the telemetry
    carried them (wire.as_telemetered: float32 for a float32 problem's Parts); AuditError
    beyond TRUTH_TOL."""
    if telemetry is None or np.isnan(telemetry).all():  # run with --no-telemetry
        return None
    if telemetry.shape != models.shape:
        raise AuditError(f"telemetry has shape {telemetry.shape}, the replay {models.shape}")
    have = ~np.isnan(telemetry[..., 0])  # rows: a round an agent sent its model for
    gap = float(np.max(np.abs(models[have] - telemetry[have])))
    if not gap <= TRUTH_TOL:  # NaN too: the run reported a model the replay has not
        raise AuditError(
            f"the memory-engine replay differs from the run's sealed telemetry by {gap:.3g} "
            f"(> {TRUTH_TOL}): the recording is not of this config, or the engines diverged"
        )
    return gap


def _clear_links(scheme: Scheme, links: dict[tuple[int, int], Link]) -> list[dict[str, Any]]:
    why = (
        f"scheme {scheme} sends models unmasked"
        if not scheme.part.hides
        else "the wire vector equals the sender's true value (mask zero: is sigma_g 0?)"
    )
    return [
        {"from": s, "to": r, "messages": link.plaintext, "why": why}
        for (s, r), link in sorted(links.items())
        if link.plaintext
    ]


def _hub_learns(scheme: Scheme, A: np.ndarray) -> dict[str, Any]:
    """What a hub learns of its neighbours' models under `scheme`, and under a masked
    scheme without noise of its own (local-ghp) the hubs with a single other neighbour,
    which pair with it and learn its model."""
    fallback = []
    if scheme.masked and not scheme.part.perturbs:
        for hub in range(A.shape[0]):
            sending = senders(A, hub)
            if len(sending) == 1:
                fallback.append({"hub": hub, "learns_model_of": sending[0]})
    return {"everyone": scheme.part.hub_sees, "fallback_hubs": fallback}

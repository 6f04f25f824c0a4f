"""The audit of a whole recorded run: every session found on its wire checked against the
ground truth, and, with `inspect --attack`, every adversary's reconstruction from it and
the epsilon that holds against each.

The replay plays the run's membership views (membership.json) as the conductor's script,
session by session, so each view's frames are held against that view's clear values and
weights. A session whose frames no escrowed key opens is reported as sealed, nothing more.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.attack import adversaries, attack_session, insider_knowledge
from privnet.orchestrator.audit.checks import TRUTH_TOL, audit_session, sealed_session
from privnet.orchestrator.audit.playback import split_sessions, view_reach
from privnet.orchestrator.audit.presentation import noise_panel
from privnet.orchestrator.audit.recording import Recording
from privnet.orchestrator.audit.sample import Sample
from privnet.orchestrator.audit.views import parts
from privnet.orchestrator.audit.words import Reading, as_floats
from privnet.orchestrator.conductor import View
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_list
from privnet.orchestrator.privacy.accountant import account, finite
from privnet.orchestrator.replay import AuditError, Replay, SessionWire, replay, session_views

Session = tuple[Strategy, Scheme, int]  # strategy, scheme, repeat: as session_list plans it


@dataclass
class Audit:
    report: dict[str, Any]  # what audit.json holds
    noise: dict[str, np.ndarray]  # per private session, the KS samples / b (for the plot)


@dataclass(frozen=True)
class AttackPlan:
    """`inspect --attack`: whose data the epsilons are for, and the coalition (default:
    attack.adversaries')."""

    agent: int = 0
    coalition: tuple[int, ...] | None = None


@dataclass
class Findings:
    """The run's audit as it goes, session by session: what each session states, the noise
    panels of the plot, and with an attack plan its reconstructions and adversary rows;
    `keyless` is the wire as anyone without a key reads it (for the outsiders)."""

    problem: Instance
    telemetry: list[np.ndarray] | None
    membership: Sequence[View] | None
    attack: AttackPlan | None
    keyless: list[SessionWire]
    sample: Sample | None = None  # a big model's: every vector holds its coordinates only
    sessions: list[dict[str, Any]] = field(default_factory=list)
    noise: dict[str, np.ndarray] = field(default_factory=dict)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    changed: bool = False  # a session replayed the run's membership views

    def add(self, s: int, session: Session, seen: SessionWire) -> None:
        """Audit session `s` as `seen` on the wire (opened with the escrowed keys)."""
        (strategy, scheme, repeat), c = session, self.problem.config
        if seen.sealed and not (seen.views or seen.keys):
            self.sessions.append(sealed_session(strategy, scheme, repeat, seen))
            return
        views = session_views(self.membership, s, seen, c.agents)
        self.changed |= views is not None
        reach = view_reach(seen) if views is not None else None
        pick = None if self.sample is None else self.sample.coordinates
        truth = replay(self.problem, strategy, scheme, repeat, views=views, reach=reach, pick=pick)
        told = self.telemetry[s] if self.telemetry is not None and s < len(self.telemetry) else None
        if told is not None and pick is not None:  # a row without a model: NaN at 0 only
            told = np.where(np.isnan(told[..., :1]), np.nan, told[..., pick])
        result, noise = audit_session(
            self.problem, strategy, scheme, repeat, seen, truth, told, views
        )
        self.sessions.append(result)
        if self.attack is not None:
            reading = Reading.of(c.sigma_g, self.problem.wire)
            found = parts(self.problem, strategy, views, seen)
            seen = as_floats(seen, scheme, found, reading)
            self.attempts.append(
                attack_session(
                    self.problem, strategy, scheme, repeat, seen.models, truth.clear, pick=pick
                )
            )
            keyless = as_floats(self.keyless[s], scheme, found, reading)
            self.rows += self._adversary_rows(
                self.attack, session, seen, keyless, truth, views, reach
            )
        b = c.sigma_g / math.sqrt(2)
        if noise.samples.size and b > 0:
            p_value = result["noise"]["p_value"]
            self.noise[noise_panel(session, c.repeats, p_value)] = noise.samples / b

    def _adversary_rows(
        self,
        plan: AttackPlan,
        session: Session,
        seen: SessionWire,
        keyless: SessionWire,
        truth: Replay,
        views: Sequence[View] | None,
        reach: Mapping[int, int] | None,
    ) -> list[dict[str, Any]]:
        """One session's rows of the adversary table: what each rebuilds, and its epsilon;
        `seen` is the session's wire opened with the escrowed link keys, `keyless` as
        anyone without a key reads it."""
        problem, (strategy, scheme, repeat) = self.problem, session
        pick = None if self.sample is None else self.sample.coordinates
        accounted = None
        if pick is None:  # the accountant's twins hold whole models: not on a sample
            accounted = account(
                problem, strategy, scheme, plan.agent, repeat, views=views, reach=reach, ours=truth
            )
        released = {
            slot: truth.released[(view, *slot)]
            for slot, view in seen.latest.items()
            if (view, *slot) in truth.released
        }
        sealed = keyless.sealed > 0  # how this run's peer frames went
        rows = []
        for adversary in adversaries(problem, plan.agent, plan.coalition):
            known = insider_knowledge(problem, strategy, scheme, adversary, released)
            # What it opens: an insider its own frames (the escrow stands in for its link
            # keys); an outsider what this wire shows without a key, or, for the other
            # setting of --seal-links, nothing (sealed) or every frame as opened (visible).
            measured = adversary.insider or adversary.sealed == sealed
            if adversary.insider:
                frames = seen.models
            elif measured:
                frames = keyless.models
            else:
                frames = {} if adversary.sealed else seen.models
            row = attack_session(
                problem,
                strategy,
                scheme,
                repeat,
                frames,
                truth.clear,
                adversary,
                known,
                plan.agent,
                pick=pick,
            )
            row["wire"] = (
                "this run's"
                if measured
                else "modelled: --seal-links " + ("on" if adversary.sealed else "off")
            )
            row["epsilon"] = (
                finite(accounted.against(adversary)[-1])
                if accounted is not None
                else "not on a sample (privnet simulate --account)"
            )
            rows.append(row)
        return rows


def audit(
    recording: Recording,
    telemetry: list[np.ndarray] | None,
    source: str,
    attack: AttackPlan | None = None,
    membership: Sequence[View] | None = None,
) -> Audit:
    """Audit every session found on the wire of a recorded run; with `attack`, also try to
    reconstruct every agent's trajectory and local minimizer from it, as the whole wire
    and as each adversary of the table (privnet.orchestrator.attack), with the epsilon that holds
    against each (privacy.accountant). `membership`: the run's views (membership.json).
    The recording's escrowed link keys open a sealed wire."""
    problem = Instance.build(recording.config)
    c = problem.config  # the model's size and wire resolved
    planned = session_list(c)
    sample = None if recording.sample is None else Sample.of(recording.sample)
    split = partial(
        split_sessions,
        recording.records,
        recording.run,
        c.dim,
        dtype=problem.wire.code,
        sample=sample,
        sealed=c.seal_links,
    )
    found = split(recording.link_keys)
    if not found:
        raise AuditError(f"no session of run {recording.run!r} on the wire ({source})")
    if len(found) > len(planned):
        raise AuditError(f"{len(found)} sessions on the wire, the config plans {len(planned)}")
    keyless = split() if attack else []
    findings = Findings(problem, telemetry, membership, attack, keyless, sample)
    for s, (session, seen) in enumerate(zip(planned, found, strict=False)):
        findings.add(s, session, seen)
    report = _report(recording.run, source, c.sigma_g, findings)
    report["sample"] = sampled(recording.sample, c.dim)
    if attack is not None:
        report["adversaries"] = _adversaries(attack, findings.rows)
        report["reconstruction"] = _reconstruction(findings.attempts)
    return Audit(report, findings.noise)


def _report(run: str, source: str, sigma_g: float, findings: Findings) -> dict[str, Any]:
    """audit.json without the attack: the run, where its wire came from, its sessions."""
    return {
        "run": run,
        "source": source,
        "ground_truth": (
            "memory-engine replay of the same config (same cores and seed), validated against "
            f"the run's sealed telemetry to {TRUTH_TOL}"
            + (
                "; sessions whose membership changed replay the run's views (membership.json)"
                " as the conductor's script, each view's frames against that view's clear "
                "values and weights"
                if findings.changed
                else ""
            )
        ),
        "sigma_g": sigma_g,
        "sessions": findings.sessions,
    }


def sampled(sample: dict[str, Any] | None, dim: int) -> dict[str, Any]:
    """audit.json's `sample`: whether the audit read every coordinate of every model, or
    a big model's seeded sample (audit.sample), and of how many."""
    if sample is None:
        return {"sampled": False, "dim": dim, "coordinates": dim}
    return {
        "sampled": True,
        **sample,
        "finding": (
            f"a sample: every model frame audited on {sample['coordinates']:,} of its {dim:,} "
            f"coordinates ({len(sample['chunks'])} of {sample['chunk_count']} chunks, drawn "
            f"by seed {sample['seed']}); masks cancel coordinate by coordinate, so every "
            "check holds on them as on the whole"
        ),
    }


def _adversaries(attack: AttackPlan, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "agent": attack.agent,
        "epsilon": (
            f"for agent {attack.agent}'s data replaced (the accountant's twin replay), at the"
            " last round, every frame of every view charged, redone rounds included"
        ),
        "sealing": (
            "an outsider (one link, the broker or the whole wire) reads what the recorded "
            "wire shows without a key (`wire`: this run's) and, for the other setting of "
            "--seal-links, nothing when sealed or every frame as the escrow opens it when "
            "visible (`wire`: modelled); an insider reads the frames addressed to it"
        ),
        "rows": rows,
    }


def _reconstruction(attempts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "wire": (
            "every model frame as the escrowed link keys open it: what anyone on the wire "
            "reads with --seal-links off (sealed, it reads none: see `adversaries`)"
        ),
        "sessions": attempts,
        "breaks": sorted({a["scheme"] for a in attempts if a["broken"]}),
        "breaks_partly": sorted(
            {a["scheme"] for a in attempts if not a["broken"] and a["agents_recovered"]}
        ),
        "does_not_break": sorted({a["scheme"] for a in attempts if not a["agents_recovered"]}),
    }

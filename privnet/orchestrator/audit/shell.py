"""`privnet inspect`: audit a recorded run from its directory, write audit[-pcap].json and
.png beside it, print the tables and say what to look at. The only part of the audit that
touches the run directory's outputs and the terminal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from privnet.agent.access import BrokerAddress
from privnet.orchestrator.attack import adversary_table, attack_table
from privnet.orchestrator.audit.playback import read_pcap
from privnet.orchestrator.audit.presentation import audit_table, plot_noise, redo_line
from privnet.orchestrator.audit.recording import load_membership, load_recording, load_telemetry
from privnet.orchestrator.audit.sample import Sample, kept
from privnet.orchestrator.audit.verdict import AttackPlan, audit
from privnet.orchestrator.replay import AuditError
from privnet.orchestrator.terminal import table_console


def inspect(
    run_dir: Path,
    pcap: Path | None = None,
    port: int | None = None,
    attack: AttackPlan | None = None,
) -> dict[str, Any]:
    """Audit a recorded run (live tap, or a pcap); write audit[-pcap].json and .png."""
    recording = load_recording(run_dir)
    source = "live MQTT tap"
    if pcap is not None:
        port = port or BrokerAddress.parse(recording.broker).port
        sample = None if recording.sample is None else Sample.of(recording.sample)
        recording.records = list(kept(read_pcap(pcap, port), sample))  # the tap's sample
        source = f"pcap {pcap.name}, port {port}"
    result = audit(recording, load_telemetry(run_dir), source, attack, load_membership(run_dir))
    stem = _stem(pcap)
    (run_dir / f"{stem}.json").write_text(json.dumps(result.report, indent=2) + "\n")
    plot_noise(result.noise, run_dir / f"{stem}.png")
    return result.report


def show_audit(
    run_dir: Path,
    pcap: Path | None = None,
    port: int | None = None,
    attack: AttackPlan | None = None,
) -> int:
    """`privnet inspect`: audit, print the table, say where the files are; exit code (1:
    the audit failed, or a private scheme put a model on the wire in the clear)."""
    err = Console(stderr=True)
    try:
        report = inspect(run_dir, pcap, port, attack)
    except AuditError as exc:
        err.print(f"[red]audit failed:[/red] {exc}")
        return 1
    table_console().print(audit_table(report))
    if attack is not None:
        table_console().print(attack_table(report["reconstruction"]["sessions"]))
        table_console().print(adversary_table(report["adversaries"]["rows"], attack.agent))
    _print_notes(err, report["sessions"])
    if report["sample"]["sampled"]:
        err.print(f"[yellow]{report['sample']['finding']}")
    leaks = [s for s in report["sessions"] if s["scheme"] != "none" and s["plaintext_messages"]]
    stem = _stem(pcap)
    err.print(f"wrote {run_dir}/{stem}.json and {stem}.png")
    return 1 if leaks else 0


def _stem(pcap: Path | None) -> str:
    """The name of the audit's files: a pcap's audit beside the live tap's, not over it."""
    return "audit" if pcap is None else "audit-pcap"


def _print_notes(err: Console, sessions: list[dict[str, Any]]) -> None:
    """What the table does not show: fallback hubs, sealed or incomplete sessions, redone
    rounds, and how far the ground truth is from the run's own telemetry."""
    for s in sessions:
        for hub in s["hub_learns"]["fallback_hubs"]:
            err.print(
                f"{s['strategy']}/{s['scheme']}: hub {hub['hub']} has one other neighbour and "
                f"learns agent {hub['learns_model_of']}'s model (no model is clear on the wire)"
            )
    for s in sessions:
        if s.get("sealed"):
            err.print(f"{s['strategy']}/{s['scheme']}: {s['finding']}")
        elif s["model_messages"] != s["expected_model_messages"]:
            err.print(
                f"[yellow]{s['strategy']}/{s['scheme']}: {s['model_messages']} of "
                f"{s['expected_model_messages']} models recorded; the rest was not audited"
            )
    for s in sessions:
        if "redo" in s:
            err.print(redo_line(s))
    gaps = [s["truth_vs_telemetry"] for s in sessions if s["truth_vs_telemetry"] is not None]
    covered = [s["truth_rounds"] for s in sessions if "truth_rounds" in s]
    sparse = [f"{n} of {t}" for n, t in covered if n < t]
    err.print(
        f"ground truth: memory-engine replay, max gap to the sealed telemetry {max(gaps):.3g}"
        + (f" (at the rounds with models: {', '.join(sparse)})" if sparse else "")
        if gaps
        else "ground truth: memory-engine replay (no telemetry to validate it against)"
    )

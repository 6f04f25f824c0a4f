"""The auditor: see the wire of a run, and prove what it does and does not reveal.

`recording` is the file format; `capture` the live tap of `privnet run --audit`; `playback`
reads a recording or a pcap back into each session's frames; `views`, `masks` and `checks`
hold them against the ground truth (a memory-engine replay) per session, and `verdict`
per run, with the attacks; `presentation` draws the table and figure; `shell` is
`privnet inspect`. This face hands on the names the rest of privnet and its tests use.
"""

from privnet.orchestrator.audit.capture import WireTap
from privnet.orchestrator.audit.checks import TRUTH_TOL
from privnet.orchestrator.audit.playback import (
    Opener,
    reach_of,
    read_pcap,
    split_sessions,
    view_reach,
)
from privnet.orchestrator.audit.presentation import noise_figure
from privnet.orchestrator.audit.recording import (
    LINK_KEYS_FILE,
    TELEMETRY_FILE,
    Escrowed,
    Recording,
    WireRecord,
    load_recording,
    load_telemetry,
    save_recording,
)
from privnet.orchestrator.audit.shell import show_audit
from privnet.orchestrator.audit.verdict import AttackPlan, Audit, audit
from privnet.orchestrator.replay import AuditError

__all__ = [
    "LINK_KEYS_FILE", "TELEMETRY_FILE", "TRUTH_TOL", "AttackPlan", "Audit", "AuditError",
    "Escrowed", "Opener", "Recording", "WireRecord", "WireTap", "audit", "load_recording",
    "load_telemetry", "noise_figure", "reach_of", "read_pcap", "save_recording",
    "show_audit", "split_sessions", "view_reach",
]  # fmt: skip

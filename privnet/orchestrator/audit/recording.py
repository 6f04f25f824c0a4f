"""The recording of an audited run, on disk: what the capture writes and the audit reads.

One place knows the file format (`privnet-wire/1`) and the run directory's file names, so
the writer and the readers cannot drift apart. The wire and the escrowed link keys are
written 0600 from creation: the wire holds the seed, the keys open every frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from privnet.agent.private import private_file, write_private
from privnet.orchestrator.conductor import View
from privnet.orchestrator.experiment import config as configuration
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.replay import AuditError

WIRE_FILE = "wire.msgpack"
TELEMETRY_FILE = "telemetry.npz"
LINK_KEYS_FILE = "link_keys.msgpack"
MEMBERSHIP_FILE = "membership.json"
FORMAT = "privnet-wire/1"
# (session, view) -> {(a, b): link key}, a < b: what the agents escrowed under --audit
Escrowed = dict[tuple[int, int], dict[tuple[int, int], bytes]]


@dataclass(frozen=True, slots=True)
class WireRecord:
    """One PUBLISH as the broker saw it: when, on which topic, which bytes."""

    t: float
    topic: str
    payload: bytes


@dataclass
class Recording:
    """What `privnet run --audit` keeps: the run's identity, its config, its wire, and the
    link keys the agents escrowed (in their own 0600 file: they open every frame)."""

    run: str
    broker: str
    config: ExperimentConfig
    records: list[WireRecord]
    link_keys: Escrowed = field(default_factory=dict)
    # a big model's sample (audit.sample.Sample.to_dict) and the peer bytes the tap saw and
    # kept; None: every frame recorded whole
    sample: dict[str, Any] | None = None


def save_recording(out: Path, rec: Recording) -> None:
    doc = {
        "format": FORMAT,
        "run": rec.run,
        "broker": rec.broker,
        "config": rec.config.to_dict(),
        "records": [[r.t, r.topic, r.payload] for r in rec.records],
    }
    if rec.sample is not None:
        doc["sample"] = rec.sample
    write_private(out / WIRE_FILE, msgpack.packb(doc, use_bin_type=True))  # the seed
    if rec.link_keys:
        save_link_keys(out, rec.link_keys)


def load_recording(run_dir: Path) -> Recording:
    path = run_dir / WIRE_FILE
    if not path.is_file():
        raise AuditError(
            f"{path} not found: record a run with `privnet run --audit --out {run_dir}`"
        )
    doc = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise AuditError(f"{path} is not a {FORMAT} recording")
    config = configuration.with_overrides(ExperimentConfig(), doc["config"])
    records = [WireRecord(float(t), str(topic), bytes(p)) for t, topic, p in doc["records"]]
    keys = load_link_keys(run_dir)
    return Recording(doc["run"], doc["broker"], config, records, keys, doc.get("sample"))


def save_link_keys(out: Path, escrowed: Escrowed) -> None:
    """The escrowed link keys, 0600 from creation: they open every frame of the run."""
    doc = [[s, v, a, b, key] for (s, v), links in escrowed.items() for (a, b), key in links.items()]
    write_private(out / LINK_KEYS_FILE, msgpack.packb(doc, use_bin_type=True))


def load_link_keys(run_dir: Path) -> Escrowed:
    """The run's escrowed link keys; empty when it was not audited (nothing opens)."""
    path = run_dir / LINK_KEYS_FILE
    if not path.is_file():
        return {}
    escrowed: Escrowed = {}
    for s, v, a, b, key in msgpack.unpackb(path.read_bytes(), raw=False):
        escrowed.setdefault((int(s), int(v)), {})[(int(a), int(b))] = bytes(key)
    return escrowed


def save_telemetry(out: Path, telemetry: list[np.ndarray]) -> None:
    """telemetry.npz, one array per session: the true models, 0600 from creation."""
    # Any: numpy types **kwds as if a name could be its allow_pickle flag
    arrays: dict[str, Any] = {f"session_{s}": m for s, m in enumerate(telemetry)}
    with private_file(out / TELEMETRY_FILE) as fh:
        np.savez_compressed(fh, **arrays)


def load_telemetry(run_dir: Path) -> list[np.ndarray] | None:
    path = run_dir / TELEMETRY_FILE
    if not path.is_file():
        return None
    with np.load(path) as data:
        return [data[f"session_{s}"] for s in range(len(data.files))]


def load_membership(run_dir: Path) -> list[View] | None:
    """The run's views (membership.json, written when its membership changed), or None."""
    # The shell's module loads the broker launcher and its credentials: not for an audit.
    from privnet.orchestrator.engines.watch import read_membership

    path = run_dir / MEMBERSHIP_FILE
    if not path.is_file():
        return None
    try:
        return read_membership(path)
    except ValueError as exc:
        raise AuditError(str(exc)) from None

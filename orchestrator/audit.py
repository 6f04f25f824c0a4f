"""The auditor: see the wire of a run, and prove what it does and does not reveal.

Two sources of wire: the live tap (`privnet run --audit`: a passive MQTT subscriber to
everything of the run, beside it) and a pcap of the broker port (`privnet inspect --pcap`),
decoded with tshark. The MAC on a peer frame authenticates, it does not encrypt, so the
auditor, like any eavesdropper, reads every model body without any key (`wire.peek_peer`).

Ground truth is a replay of the same config on the in-process memory engine: the same cores,
seed and public noise draw the same trajectories (local-ghp's masks come from fresh DH secrets
but cancel, so its trajectory agrees to float precision). A witness core records the clear
value behind every model it sends. The replay is validated against the run's own sealed
telemetry (the true w after each round, opened with the orchestrator's key) to TRUTH_TOL.

Capture commands. Local run: `tcpdump -i lo -w run.pcap port <broker port>` (the port is
printed by `privnet run` and stored in wire.msgpack). Docker: `tcpdump -i <bridge> -w run.pcap
port 1883` on the host, where <bridge> is the compose network's bridge (`br-` + the first 12
characters of `docker network inspect -f {{.Id}} <project>_default`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import msgpack
import numpy as np
import paho.mqtt.client as mqtt
from rich.table import Table
from scipy import stats

from agent import control, topics, wire
from agent.access import ClientAccess
from agent.core import AgentCore, split_senders
from agent.losses import Loss
from agent.messages import KeyPlan, KeyShare, Message, Rejected
from agent.mqtt import BrokerAddress
from agent.node import Publish
from agent.spec import STRATEGY_STEP, AgentSpec, Scheme, StepPlan, Strategy
from orchestrator.engines.memory import Network
from orchestrator.experiment import config as configuration
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.problem import Problem
from orchestrator.experiment.specs import session_list, session_plans
from orchestrator.report import table_console

WIRE_FILE = "wire.msgpack"
TELEMETRY_FILE = "telemetry.npz"
FORMAT = "privnet-wire/1"
PLAIN_REL = 1e-12  # a model within this relative distance of the truth is in the clear
TRUTH_TOL = 1e-9  # replay vs sealed telemetry
QUIET = 0.3  # the tap stops after this long without a message...
DRAIN = 5.0  # ...or after this long at most
SUBSCRIBE_TIMEOUT = 10.0


class AuditError(Exception):
    """The audit cannot proceed; the message says what is missing and how to get it."""


@dataclass(frozen=True, slots=True)
class WireRecord:
    """One PUBLISH as the broker saw it: when, on which topic, which bytes."""

    t: float
    topic: str
    payload: bytes


@dataclass
class Recording:
    """What `privnet run --audit` keeps: the run's identity, its config and its wire."""

    run: str
    broker: str
    config: ExperimentConfig
    records: list[WireRecord]


# ---- the live tap -------------------------------------------------------------------------


class WireTap:
    """A passive subscriber to every topic of one run, started before the agents.

    It runs on paho's own network thread, not on the orchestrator's event loop, so recording
    thousands of messages a round does not slow down (or starve) the run it watches.
    """

    def __init__(self, address: BrokerAddress, run: str, access: ClientAccess) -> None:
        """`access`: the run's read-only inspector (the ACL lets it read the whole run)."""
        self.address, self.run = address, run
        self.records: list[WireRecord] = []
        self.telemetry: list[np.ndarray] = []  # per session: the opened true models (iters, P, M)
        self._subscribed = threading.Event()
        self._lost: str | None = None
        self._client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        self._client.on_message = self._on_message
        self._client.on_subscribe = lambda *_: self._subscribed.set()
        self._client.on_disconnect = self._on_disconnect
        if access.username is not None:
            self._client.username_pw_set(access.username, access.password)
        if access.tls:
            self._client.tls_set(ca_certs=access.ca_file)

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        self.records.append(WireRecord(time.time(), message.topic, bytes(message.payload)))

    def _on_disconnect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, *_: Any
    ) -> None:
        if self._subscribed.is_set() and self._lost is None:
            self._lost = str(reason)

    async def __aenter__(self) -> WireTap:
        self._client.connect(self.address.host, self.address.port, keepalive=60)
        self._client.loop_start()
        self._client.subscribe(topics.run_filter(self.run), qos=1)
        if not await asyncio.to_thread(self._subscribed.wait, SUBSCRIBE_TIMEOUT):
            self._client.loop_stop()
            raise AuditError(f"the wire tap could not subscribe at {self.address}")
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        deadline, seen = time.monotonic() + DRAIN, -1
        while et is None and len(self.records) != seen and time.monotonic() < deadline:
            seen = len(self.records)
            await asyncio.sleep(QUIET)
        lost, self._lost = self._lost, "stopped"
        self._client.disconnect()
        self._client.loop_stop()
        if lost is not None and et is None:
            raise AuditError(f"the wire tap lost the broker ({lost}): the recording is incomplete")

    def save(self, out: Path, config: ExperimentConfig) -> None:
        """wire.msgpack (header + records) and telemetry.npz (one array per session)."""
        save_recording(out, Recording(self.run, str(self.address), config, self.records))
        # Any: numpy types **kwds as if a name could be its allow_pickle flag
        arrays: dict[str, Any] = {f"session_{s}": m for s, m in enumerate(self.telemetry)}
        np.savez_compressed(out / TELEMETRY_FILE, **arrays)


def save_recording(out: Path, rec: Recording) -> None:
    doc = {
        "format": FORMAT,
        "run": rec.run,
        "broker": rec.broker,
        "config": rec.config.to_dict(),
        "records": [[r.t, r.topic, r.payload] for r in rec.records],
    }
    (out / WIRE_FILE).write_bytes(msgpack.packb(doc, use_bin_type=True))


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
    return Recording(doc["run"], doc["broker"], config, records)


def load_telemetry(run_dir: Path) -> list[np.ndarray] | None:
    path = run_dir / TELEMETRY_FILE
    if not path.is_file():
        return None
    with np.load(path) as data:
        return [data[f"session_{s}"] for s in range(len(data.files))]


# ---- pcap ---------------------------------------------------------------------------------


def read_pcap(path: Path, port: int) -> list[WireRecord]:
    """Every MQTT PUBLISH sent TO the broker port in a pcap (so each message counts once)."""
    tshark = shutil.which("tshark")
    if tshark is None:
        raise AuditError(
            "tshark is not installed: apt-get install tshark (or brew install wireshark)"
        )
    if not Path(path).is_file():
        raise AuditError(f"pcap {path} not found")
    cmd = [
        tshark, "-r", str(path), "-n",
        "-d", f"tcp.port=={port},mqtt",
        "-Y", f"mqtt.msgtype == 3 && tcp.dstport == {port}",
        "-T", "fields", "-E", "separator=/t", "-E", "aggregator=,",
        "-e", "frame.time_epoch", "-e", "mqtt.topic", "-e", "mqtt.msg",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise AuditError(f"tshark could not read {path}: {proc.stderr.strip()}")
    records = []
    for line in proc.stdout.splitlines():
        stamp, names, payloads = [*line.split("\t"), "", ""][:3]
        names_list, payload_list = names.split(","), payloads.split(",")
        if len(names_list) != len(payload_list):
            raise AuditError(f"{path}: a frame at {stamp} has topics and payloads that do not pair")
        for topic, hexed in zip(names_list, payload_list, strict=True):
            records.append(WireRecord(float(stamp), topic, bytes.fromhex(hexed.replace(":", ""))))
    return records


# ---- ground truth: replay on the memory engine ------------------------------------------------


class _Witness(AgentCore):
    """An AgentCore that notes the clear value behind every model it is about to send;
    given `losses`, agent p runs losses[p] instead of the one its Config describes."""

    def __init__(
        self,
        spec: AgentSpec,
        loss: Loss,
        *args: Any,
        clear: dict[tuple[int, int, int], np.ndarray],
        losses: Sequence[Loss] | None = None,
    ) -> None:
        super().__init__(spec, loss if losses is None else losses[spec.agent], *args)
        self.clear = clear

    def _send(self, plan: StepPlan) -> list[Message]:
        self.clear[(self.me, self.round, plan.step)] = self.value.copy()
        return super()._send(plan)


@dataclass
class Replay:
    """A memory-engine run: clear values (sender, round, step), the true models and the
    model messages on its wire, as an eavesdropper decodes them."""

    clear: dict[tuple[int, int, int], np.ndarray]
    models: np.ndarray  # (iters, P, M)
    wire: SessionWire


def replay(
    problem: Problem,
    strategy: Strategy,
    scheme: Scheme,
    repeat: int = 0,
    *,
    losses: Sequence[Loss] | None = None,
    noise_key: tuple[int, int] | None = None,
) -> Replay:
    """The session on the memory engine (the whole protocol), witnesses for cores;
    `losses` (one per agent) replace the problem's, e.g. losses written by hand, and
    `noise_key` the run's (same data, fresh noise: the dp-audit's trials)."""
    clear: dict[tuple[int, int, int], np.ndarray] = {}
    (plan,) = session_plans(problem, [(strategy, scheme, repeat)])
    if noise_key is not None:
        plan = replace(plan, specs=[replace(s, noise_key=noise_key) for s in plan.specs])
    seen = SessionWire()

    def tap(_publisher: str, frame: Publish) -> None:
        if topics.parse_peer_topic(frame.topic) is not None:
            _add(seen, frame.payload, problem.config.dim)

    network = Network.build([plan], core=partial(_Witness, clear=clear, losses=losses), tap=tap)
    return Replay(clear, network.play()[0].models, seen)


# ---- sessions on the wire ---------------------------------------------------------------------


@dataclass
class SessionWire:
    """The peer messages of one session, as an eavesdropper decodes them."""

    models: dict[tuple[int, int, int, int], np.ndarray] = field(default_factory=dict)
    keys: int = 0
    undecodable: int = 0
    duplicates: int = 0


def split_sessions(records: Iterable[WireRecord], run: str, dim: int) -> list[SessionWire]:
    """Peer traffic of each session, decoded without any key. A session begins with its
    first Setup, not its Go: local-ghp agents agree their keys in between."""
    down = topics.ctl_down(run, "all").removesuffix("all")
    sessions: list[SessionWire] = []
    for rec in records:
        if rec.topic.startswith(down):
            with contextlib.suppress(Rejected):  # signed, not secret: anyone can read it
                msg = wire.decode_signed(rec.payload).msg
                if isinstance(msg, control.Setup) and msg.session >= len(sessions):
                    sessions.append(SessionWire())
            continue
        peer = topics.parse_peer_topic(rec.topic)
        if peer is None or peer[0] != run or not sessions:
            continue
        _add(sessions[-1], rec.payload, dim)
    return sessions


def _add(session: SessionWire, payload: bytes, dim: int) -> None:
    try:
        msg = wire.peek_peer(payload, dim)
    except Rejected:
        session.undecodable += 1
        return
    if isinstance(msg, KeyPlan | KeyShare):
        session.keys += 1
        return
    slot = (msg.sender, msg.receiver, msg.round, msg.step)
    if slot in session.models:
        session.duplicates += 1
    session.models[slot] = np.asarray(msg.vector)


# ---- the analysis -------------------------------------------------------------------------


@dataclass
class Link:
    messages: int = 0
    plaintext: int = 0
    strengths: list[float] = field(default_factory=list)


def audit_session(
    problem: Problem,
    strategy: Strategy,
    scheme: Scheme,
    repeat: int,
    seen: SessionWire,
    truth: Replay,
    telemetry: np.ndarray | None,
) -> tuple[dict[str, Any], Noise]:
    """Everything the audit states about one session (see the module docstring)."""
    c = problem.config
    step = STRATEGY_STEP[strategy]
    A = problem.matrices(strategy)[(0, 1, 2).index(step)]
    noise = noise_samples(scheme, A, seen, truth, c.sigma_g)
    links: dict[tuple[int, int], Link] = defaultdict(Link)
    unmatched = 0
    for (s, r, i, j), vector in seen.models.items():
        true = truth.clear.get((s, i, j))
        if true is None:
            unmatched += 1
            continue
        link = links[(s, r)]
        link.messages += 1
        gap, size = float(np.linalg.norm(vector - true)), float(np.linalg.norm(true))
        link.plaintext += gap <= PLAIN_REL * size
        if size > 0:
            link.strengths.append(gap / size)
    strengths = [x for link in links.values() for x in link.strengths]
    expected = c.iters * int(np.count_nonzero(A) - A.shape[0])
    result: dict[str, Any] = {
        "strategy": str(strategy),
        "scheme": str(scheme),
        "repeat": repeat,
        "step": step,
        "model_messages": len(seen.models),
        "expected_model_messages": expected,
        "key_messages": seen.keys,
        "undecodable": seen.undecodable,
        "duplicates": seen.duplicates,
        "unmatched": unmatched,
        "plaintext_messages": sum(link.plaintext for link in links.values()),
        "masking_strength": _summary(strengths),
        "truth_vs_telemetry": _truth_check(truth.models, telemetry),
        "noise": _noise_report(scheme, noise, c.sigma_g),
        "max_cancellation_residual": None,
        "clear_links": _clear_links(scheme, links),
        "hub_learns": _hub_learns(scheme, A),
        "links": [
            {
                "from": s,
                "to": r,
                "messages": link.messages,
                "plaintext": link.plaintext,
                **{f"{k}_strength": v for k, v in _summary(link.strengths).items()},
            }
            for (s, r), link in sorted(links.items())
        ],
    }
    if scheme is Scheme.LOCAL_GHP:
        result["max_cancellation_residual"] = _cancellation(A, seen, truth, c.iters, step)
    return result, noise


def _summary(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"min": None, "median": None}
    return {"min": float(np.min(values)), "median": float(np.median(values))}


def _truth_check(models: np.ndarray, telemetry: np.ndarray | None) -> float | None:
    """Max |replay w - sealed telemetry w|; AuditError beyond TRUTH_TOL."""
    if telemetry is None or np.isnan(telemetry).all():  # run with --no-telemetry
        return None
    if telemetry.shape != models.shape:
        raise AuditError(f"telemetry has shape {telemetry.shape}, the replay {models.shape}")
    gap = float(np.nanmax(np.abs(models - telemetry)))
    if not gap <= TRUTH_TOL:
        raise AuditError(
            f"the memory-engine replay differs from the run's sealed telemetry by {gap:.3g} "
            f"(> {TRUTH_TOL}): the recording is not of this config, or the engines diverged"
        )
    return gap


def _seats(A: np.ndarray, hub: int) -> dict:
    senders = [int(m) for m in np.flatnonzero(A[:, hub]) if m != hub]
    return split_senders(senders, hub) if senders else {}


@dataclass
class Noise:
    """wire - true as the scheme's law predicts it: KS samples, and local-ghp's power check."""

    samples: np.ndarray
    power: float = 0.0  # local-ghp: sum over every seat of ||(wire - true) a_mk||^2
    expected_power: float = 0.0  # ... and its expectation, partners * sigma_g^2 per coordinate


def noise_samples(
    scheme: Scheme, A: np.ndarray, seen: SessionWire, truth: Replay, sigma_g: float
) -> Noise:
    """random: every link's wire - true; ghp: one per sender and round (g_m is the same on
    all links); local-ghp: (wire - true) * a_mk of N+ senders with a single partner, so each
    pair's mask counts once."""
    samples: list[np.ndarray] = []
    noise = Noise(np.zeros(0))
    once: set[tuple[int, int]] = set()
    seats = {hub: _seats(A, hub) for hub in range(A.shape[0])}
    for (s, r, i, j), vector in sorted(seen.models.items()):
        true = truth.clear.get((s, i, j))
        if true is None or scheme is Scheme.NONE:
            continue
        diff = vector - true
        if scheme is Scheme.RANDOM:
            samples.append(diff)
        elif scheme is Scheme.GHP:
            if (s, i) not in once:
                once.add((s, i))
                samples.append(diff)
        else:
            seat = seats[r][s]
            scaled = diff * A[s, r]
            noise.power += float(scaled @ scaled)
            noise.expected_power += len(seat.partners) * sigma_g**2 * diff.size
            if seat.side == 1 and len(seat.partners) == 1:
                samples.append(scaled)
    noise.samples = np.concatenate(samples) if samples else np.zeros(0)
    return noise


_LAW = {
    Scheme.NONE: "no noise",
    Scheme.RANDOM: "Laplace(0, b) per coordinate, every directed link",
    Scheme.GHP: "Laplace(0, b) per coordinate, one g_m per sender and round",
    Scheme.LOCAL_GHP: "(wire - true) * a_mk ~ Laplace(0, b) for N+ senders with one partner",
}


def _noise_report(scheme: Scheme, noise: Noise, sigma_g: float) -> dict[str, Any]:
    """KS test of the samples against Laplace(0, b), b = sigma_g / sqrt(2)."""
    b = sigma_g / math.sqrt(2)
    result: dict[str, Any] = {
        "expected": f"{_LAW[scheme]}; b = sigma_g/sqrt(2) = {b:.6g}",
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
    return result


def _cancellation(
    A: np.ndarray, seen: SessionWire, truth: Replay, iters: int, step: int
) -> dict[str, Any]:
    """Max over hubs and rounds of |wire combination - true combination| / |true combination|.

    The hub's own term is not on the wire; it is its clear value (from the truth), except at
    a fallback hub (one other neighbour), whose own term carries the pair's mask: there the
    cancellation happens inside the hub and is not observable on the wire.
    """
    worst, checked, fallback, missing = 0.0, 0, [], 0
    for hub in range(A.shape[0]):
        senders = [int(m) for m in np.flatnonzero(A[:, hub]) if m != hub]
        if len(senders) == 1:
            fallback.append(hub)
        if len(senders) < 2:
            continue
        for i in range(1, iters + 1):
            try:
                own = A[hub, hub] * truth.clear[(hub, i, step)]
                on_wire = sum(A[m, hub] * seen.models[(m, hub, i, step)] for m in senders)
                true = sum(A[m, hub] * truth.clear[(m, i, step)] for m in senders)
            except KeyError:
                missing += 1
                continue
            combined = own + true
            scale = max(float(np.linalg.norm(combined)), 1e-300)
            gap = float(np.linalg.norm(own + on_wire - combined)) / scale
            worst, checked = max(worst, gap), checked + 1
    return {
        "max": worst,
        "hub_rounds_checked": checked,
        "hub_rounds_missing_messages": missing,
        "not_observable_fallback_hubs": fallback,
    }


def _clear_links(scheme: Scheme, links: dict[tuple[int, int], Link]) -> list[dict[str, Any]]:
    why = (
        "scheme none sends models unmasked"
        if scheme is Scheme.NONE
        else "the wire vector equals the sender's true value (mask zero: is sigma_g 0?)"
    )
    return [
        {"from": s, "to": r, "messages": link.plaintext, "why": why}
        for (s, r), link in sorted(links.items())
        if link.plaintext
    ]


def _hub_learns(scheme: Scheme, A: np.ndarray) -> dict[str, Any]:
    everyone = {
        Scheme.NONE: "every neighbour's model, in the clear",
        Scheme.RANDOM: "each neighbour's model plus independent Laplace noise (per link)",
        Scheme.GHP: "each neighbour's model plus that neighbour's g_m (the same on all its links)",
        Scheme.LOCAL_GHP: "only its weighted aggregate sum_m a_mk w_m: single masks do not cancel",
    }[scheme]
    fallback = []
    if scheme is Scheme.LOCAL_GHP:
        for hub in range(A.shape[0]):
            senders = [int(m) for m in np.flatnonzero(A[:, hub]) if m != hub]
            if len(senders) == 1:
                fallback.append({"hub": hub, "learns_model_of": senders[0]})
    return {"everyone": everyone, "fallback_hubs": fallback}


# ---- the whole run ------------------------------------------------------------------------


@dataclass
class Audit:
    report: dict[str, Any]  # what audit.json holds
    noise: dict[str, np.ndarray]  # per private session, the KS samples / b (for the plot)


def audit(
    recording: Recording, telemetry: list[np.ndarray] | None, source: str, attack: bool = False
) -> Audit:
    """Audit every session found on the wire of a recorded run; with `attack`, also try to
    reconstruct every agent's trajectory and local minimizer from it (orchestrator.attack)."""
    c = recording.config
    problem = Problem.build(c)
    planned = session_list(c)
    found = split_sessions(recording.records, recording.run, c.dim)
    if not found:
        raise AuditError(f"no session of run {recording.run!r} on the wire ({source})")
    if len(found) > len(planned):
        raise AuditError(f"{len(found)} sessions on the wire, the config plans {len(planned)}")
    sessions, plotted, attempts = [], {}, []
    b = c.sigma_g / math.sqrt(2)
    for s, ((strategy, scheme, repeat), seen) in enumerate(zip(planned, found, strict=False)):
        truth = replay(problem, strategy, scheme, repeat)
        told = telemetry[s] if telemetry is not None and s < len(telemetry) else None
        result, noise = audit_session(problem, strategy, scheme, repeat, seen, truth, told)
        sessions.append(result)
        if attack:
            from orchestrator.attack import attack_session

            attempts.append(
                attack_session(problem, strategy, scheme, repeat, seen.models, truth.clear)
            )
        if noise.samples.size and b > 0:
            plotted[f"{strategy}/{scheme} r{repeat}: p = {_fmt(result['noise']['p_value'])}"] = (
                noise.samples / b
            )
    report = {
        "run": recording.run,
        "source": source,
        "ground_truth": (
            "memory-engine replay of the same config (same cores and seed), validated against "
            f"the run's sealed telemetry to {TRUTH_TOL}"
        ),
        "sigma_g": c.sigma_g,
        "sessions": sessions,
    }
    if attack:
        report["reconstruction"] = {
            "sessions": attempts,
            "breaks": sorted({a["scheme"] for a in attempts if a["broken"]}),
            "breaks_partly": sorted(
                {a["scheme"] for a in attempts if not a["broken"] and a["agents_recovered"]}
            ),
            "does_not_break": sorted({a["scheme"] for a in attempts if not a["agents_recovered"]}),
        }
    return Audit(report, plotted)


def audit_table(report: dict[str, Any]) -> Table:
    """One row per session; the full per-link detail is in audit.json."""
    table = Table(title=f"wire audit of {report['run']} ({report['source']})")
    for name in ("session", "models", "clear", "mask min", "mask med", "KS p", "var", "cancel"):
        table.add_column(name, justify="right")
    for s in report["sessions"]:
        resid = s["max_cancellation_residual"]
        leak = s["plaintext_messages"] and s["scheme"] != "none"
        seen, expected = s["model_messages"], s["expected_model_messages"]
        table.add_row(
            f"{s['strategy']}/{s['scheme']}" + (f" r{s['repeat']}" if s["repeat"] else ""),
            f"{seen}" if seen == expected else f"[red]{seen}/{expected}",
            f"[red]{s['plaintext_messages']}" if leak else str(s["plaintext_messages"]),
            _fmt(s["masking_strength"]["min"]),
            _fmt(s["masking_strength"]["median"]),
            _fmt(s["noise"]["p_value"]),
            _fmt(s["noise"]["variance_ratio"]),
            _fmt(resid["max"] if resid else None),
        )
    table.caption = (
        "models: seen on the wire; clear: equal to the sender's true value; mask: "
        "|wire - true| / |true|; KS p, var: wire - true against the scheme's Laplace law; "
        "cancel: max local-ghp residual at a hub"
    )
    return table


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def plot_noise(noise: dict[str, np.ndarray], path: Path) -> None:
    """Histogram of (wire - true) / b per private session, against the Laplace(0, 1) density."""
    from matplotlib.figure import Figure

    panels = max(1, len(noise))
    fig = Figure(figsize=(4 * panels, 3.4))
    axes = fig.subplots(1, panels, squeeze=False)[0]
    grid = np.linspace(-6, 6, 400)
    for ax, (name, samples) in zip(axes, noise.items(), strict=False):
        density, edges = np.histogram(samples, bins=60, range=(-6, 6), density=True)
        ax.stairs(density, edges, fill=True, alpha=0.6, label="wire - true")
        ax.plot(grid, 0.5 * np.exp(-np.abs(grid)), "k", lw=1.2, label="Laplace(0, 1)")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("(wire - true) / b")
        ax.legend(fontsize=7)
    if not noise:
        axes[0].text(0.5, 0.5, "no private scheme with noise in this run", ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def inspect(
    run_dir: Path, pcap: Path | None = None, port: int | None = None, attack: bool = False
) -> dict[str, Any]:
    """Audit a recorded run (live tap, or a pcap); write audit[-pcap].json and .png."""
    recording = load_recording(run_dir)
    source = "live MQTT tap"
    if pcap is not None:
        port = port or BrokerAddress.parse(recording.broker).port
        recording.records = read_pcap(pcap, port)
        source = f"pcap {pcap.name}, port {port}"
    result = audit(recording, load_telemetry(run_dir), source, attack)
    stem = "audit" if pcap is None else "audit-pcap"
    (run_dir / f"{stem}.json").write_text(json.dumps(result.report, indent=2) + "\n")
    plot_noise(result.noise, run_dir / f"{stem}.png")
    return result.report


def show_audit(
    run_dir: Path, pcap: Path | None = None, port: int | None = None, attack: bool = False
) -> int:
    """`privnet inspect`: audit, print the table, say where the files are; exit code."""
    from rich.console import Console

    err = Console(stderr=True)
    try:
        report = inspect(run_dir, pcap, port, attack)
    except AuditError as exc:
        err.print(f"[red]audit failed:[/red] {exc}")
        return 1
    table_console().print(audit_table(report))
    if attack:
        from orchestrator.attack import attack_table

        table_console().print(attack_table(report["reconstruction"]["sessions"]))
    for s in report["sessions"]:
        for hub in s["hub_learns"]["fallback_hubs"]:
            err.print(
                f"{s['strategy']}/{s['scheme']}: hub {hub['hub']} has one other neighbour and "
                f"learns agent {hub['learns_model_of']}'s model (no model is clear on the wire)"
            )
    for s in report["sessions"]:
        if s["model_messages"] != s["expected_model_messages"]:
            err.print(
                f"[yellow]{s['strategy']}/{s['scheme']}: {s['model_messages']} of "
                f"{s['expected_model_messages']} models recorded; the rest was not audited"
            )
    gaps = [
        s["truth_vs_telemetry"] for s in report["sessions"] if s["truth_vs_telemetry"] is not None
    ]
    err.print(
        f"ground truth: memory-engine replay, max gap to the sealed telemetry {max(gaps):.3g}"
        if gaps
        else "ground truth: memory-engine replay (no telemetry to validate it against)"
    )
    leaks = [s for s in report["sessions"] if s["scheme"] != "none" and s["plaintext_messages"]]
    stem = "audit" if pcap is None else "audit-pcap"
    err.print(f"wrote {run_dir}/{stem}.json and {stem}.png")
    return 1 if leaks else 0

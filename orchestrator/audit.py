"""The auditor: see the wire of a run, and prove what it does and does not reveal.

Two sources of wire: the live tap (`privnet run --audit`: a passive MQTT subscriber to
everything of the run, beside it) and a pcap of the broker port (`privnet inspect --pcap`),
decoded with tshark. Peer frames are sealed end to end (`agent.links`): under `--audit` the
agents escrow their link keys to the orchestrator (link_keys.msgpack, 0600), and the auditor
opens every frame with them, to prove the masking underneath. Without the escrow a sealed
wire shows nothing to audit, and the report says so. On the visible wire (`--seal-links
off`) the MAC authenticates without encrypting, so the auditor, like any eavesdropper, reads
every model body without any key (`wire.peek_peer`).

Ground truth is a replay of the same config on the in-process memory engine: the same cores,
seed and public noise draw the same trajectories (the masked schemes' masks come from fresh DH
secrets but cancel exactly on the lattice, so their trajectories agree too). A witness core
records the clear value behind every model it sends. The replay is validated against the
run's own sealed telemetry (the true w after each round, opened with the orchestrator's key)
to TRUTH_TOL.

Capture commands. Local run: `tcpdump -i lo -w run.pcap port <broker port>` (the port is
printed by `privnet run` and stored in wire.msgpack). Docker: `tcpdump -i <bridge> -w run.pcap
port 1883` on the host, where <bridge> is the compose network's bridge (`br-` + the first 12
characters of `docker network inspect -f {{.Id}} <project>_default`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import shutil
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import paho.mqtt.client as mqtt
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from rich.table import Table
from scipy import stats

from agent import control, rng, topics, wire
from agent.access import ClientAccess
from agent.core import split_senders
from agent.messages import Reason, Rejected
from agent.mqtt import BrokerAddress
from agent.private import private_file, write_private
from agent.spec import STRATEGY_STEP, Scheme, Strategy
from orchestrator.attack import (
    adversaries,
    adversary_table,
    attack_session,
    attack_table,
    insider_knowledge,
)
from orchestrator.conductor import View
from orchestrator.experiment import config as configuration
from orchestrator.experiment import topology
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.problem import Problem
from orchestrator.experiment.specs import session_list, view_matrix
from orchestrator.privacy.accountant import account, finite
from orchestrator.replay import (
    AuditError,
    Replay,
    SessionWire,
    add_frame,
    replay,
    session_views,
)
from orchestrator.terminal import table_console

if TYPE_CHECKING:
    from matplotlib.figure import Figure

WIRE_FILE = "wire.msgpack"
TELEMETRY_FILE = "telemetry.npz"
LINK_KEYS_FILE = "link_keys.msgpack"
MEMBERSHIP_FILE = "membership.json"
FORMAT = "privnet-wire/1"
PLAIN_REL = 1e-12  # a model within this relative distance of the truth is in the clear
TRUTH_TOL = 1e-9  # replay vs sealed telemetry
# (session, view) -> {(a, b): link key}, a < b: what the agents escrowed under --audit
Escrowed = dict[tuple[int, int], dict[tuple[int, int], bytes]]
QUIET = 0.3  # the tap stops after this long without a message...
DRAIN = 5.0  # ...or after this long at most
SUBSCRIBE_TIMEOUT = 10.0


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
        self.link_keys: Escrowed = {}  # the agents' escrow (the conductor's `link_keys`)
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
        recording = Recording(self.run, str(self.address), config, self.records, self.link_keys)
        save_recording(out, recording)
        # Any: numpy types **kwds as if a name could be its allow_pickle flag
        arrays: dict[str, Any] = {f"session_{s}": m for s, m in enumerate(self.telemetry)}
        with private_file(out / TELEMETRY_FILE) as fh:  # true models
            np.savez_compressed(fh, **arrays)


def save_recording(out: Path, rec: Recording) -> None:
    doc = {
        "format": FORMAT,
        "run": rec.run,
        "broker": rec.broker,
        "config": rec.config.to_dict(),
        "records": [[r.t, r.topic, r.payload] for r in rec.records],
    }
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
    return Recording(doc["run"], doc["broker"], config, records, load_link_keys(run_dir))


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


def load_telemetry(run_dir: Path) -> list[np.ndarray] | None:
    path = run_dir / TELEMETRY_FILE
    if not path.is_file():
        return None
    with np.load(path) as data:
        return [data[f"session_{s}"] for s in range(len(data.files))]


def load_membership(run_dir: Path) -> list[View] | None:
    """The run's views (membership.json, written when its membership changed), or None."""
    # The shell's module loads the broker launcher and its credentials: not for an audit.
    from orchestrator.engines.watch import read_membership

    path = run_dir / MEMBERSHIP_FILE
    if not path.is_file():
        return None
    try:
        return read_membership(path)
    except ValueError as exc:
        raise AuditError(str(exc)) from None


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


# ---- sessions on the wire ---------------------------------------------------------------------


def split_sessions(
    records: Iterable[WireRecord], run: str, dim: int, escrowed: Escrowed | None = None
) -> list[SessionWire]:
    """Peer traffic of each session: the visible wire's read without any key, sealed frames
    opened with the `escrowed` link keys where there are some. A session begins with its
    first Setup, not its Go: local-ghp agents agree their keys in between."""
    down = topics.ctl_down(run, "all").removesuffix("all")
    sessions: list[SessionWire] = []
    opener = Opener(run, dim, escrowed or {})
    for rec in records:
        if rec.topic.startswith(down):
            with contextlib.suppress(Rejected):  # signed, not secret: anyone can read it
                msg = wire.decode_signed(rec.payload).msg
                if isinstance(msg, control.Setup):
                    if msg.session >= len(sessions):
                        sessions.append(SessionWire())
                    at = sessions[min(msg.session, len(sessions) - 1)]
                    at.setups.setdefault(msg.view, set()).add(msg.agent)
            continue
        peer = topics.parse_peer_topic(rec.topic)
        if peer is None or peer[0] != run or not sessions:
            continue
        add_frame(sessions[-1], rec.payload, partial(opener.read, len(sessions) - 1))
    return sessions


@dataclass
class Opener:
    """Reads a peer frame as the audit can: the visible wire's as anyone, a sealed one
    with its link's escrowed key, if the agents escrowed it."""

    run: str
    dim: int
    escrowed: Escrowed
    _aeads: dict[bytes, ChaCha20Poly1305] = field(default_factory=dict)

    def read(self, session: int, payload: bytes) -> wire.Peer:
        try:
            return wire.peek_peer(payload, self.dim)
        except Rejected as exc:
            if exc.reason is not Reason.SEALED:
                raise
        head = wire.read_head(payload)
        link = (min(head.sender, head.receiver), max(head.sender, head.receiver))
        key = self.escrowed.get((session, head.view), {}).get(link)
        if key is None:
            raise Rejected(Reason.SEALED, f"no escrowed key for link {link} of view {head.view}")
        aead = self._aeads.get(key) or self._aeads.setdefault(key, ChaCha20Poly1305(key))
        return wire.open_head(head, aead, self.run, self.dim)


# ---- the analysis -------------------------------------------------------------------------


@dataclass
class Link:
    messages: int = 0
    plaintext: int = 0
    strengths: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Part:
    """One membership view of a session as the audit sees it: the matrix of the strategy's
    combine step on its members' graph (`view_matrix`), the last round of it that stands
    (the next view redid the rest) and the last round of it on the wire."""

    view: View
    A: np.ndarray
    end: int
    reach: int

    @property
    def last(self) -> int:
        return max(self.end, self.reach)


def reach_of(records: Iterable[WireRecord], run: str, dim: int) -> dict[int, dict[int, int]]:
    """Per session of a recorded wire, how far each view ran (`_reach`)."""
    return {s: _reach(seen) for s, seen in enumerate(split_sessions(records, run, dim))}


def _reach(seen: SessionWire) -> dict[int, int]:
    """view -> the last round of it a model on the wire belongs to."""
    reach: dict[int, int] = {}
    for view, _s, _r, i, _j in seen.views:
        reach[view] = max(reach.get(view, 0), i)
    return reach


def _parts(
    problem: Problem, strategy: Strategy, views: Sequence[View] | None, seen: SessionWire
) -> list[Part]:
    c = problem.config
    index = (0, 1, 2).index(STRATEGY_STEP[strategy])
    if views is None:
        everyone = View(0, 0, 1, tuple(range(c.agents)), "start")
        return [Part(everyone, problem.matrices(strategy)[index], c.iters, c.iters)]
    reach, parts = _reach(seen), []
    for k, view in enumerate(views):
        end = views[k + 1].start - 1 if k + 1 < len(views) else c.iters
        members = frozenset(view.members)
        a = problem.A if len(members) == c.agents else view_matrix(problem, members)
        A = topology.strategy_matrices(strategy, a)[index]
        parts.append(Part(view, A, end, reach.get(view.view, 0)))
    return parts


def audit_session(
    problem: Problem,
    strategy: Strategy,
    scheme: Scheme,
    repeat: int,
    seen: SessionWire,
    truth: Replay,
    telemetry: np.ndarray | None,
    views: Sequence[View] | None = None,
) -> tuple[dict[str, Any], Noise]:
    """Everything the audit states about one session (see the module docstring); with
    `views` (the session's membership views, the replay played them), per view as well:
    each view's frames against its own clear values and matrix."""
    c = problem.config
    step = STRATEGY_STEP[strategy]
    parts = _parts(problem, strategy, views, seen)
    ends = {part.view.view: part.end for part in parts}
    noise = noise_samples(scheme, parts, seen, truth, c.sigma_g)
    links: dict[tuple[int, int], Link] = defaultdict(Link)
    plain: Counter[int] = Counter()
    standing: Counter[int] = Counter()  # per view: models of rounds that stand
    unmatched = 0
    for (v, s, r, i, j), vector in seen.views.items():
        standing[v] += i <= ends.get(v, c.iters)
        true = truth.views.get((v, s, i, j))
        if true is None:
            unmatched += 1
            continue
        link = links[(s, r)]
        link.messages += 1
        gap, size = float(np.linalg.norm(vector - true)), float(np.linalg.norm(true))
        clear = gap <= PLAIN_REL * size
        link.plaintext += clear
        plain[v] += clear
        if size > 0:
            link.strengths.append(gap / size)
    strengths = [x for link in links.values() for x in link.strengths]
    expected = {part.view.view: (part.end - part.view.start + 1) * _links(part.A) for part in parts}
    cancel = [_cancellation(part, seen, truth, step, c.sigma_g) for part in parts]
    learns = [_hub_learns(scheme, part.A) for part in parts]
    result: dict[str, Any] = {
        "strategy": str(strategy),
        "scheme": str(scheme),
        "repeat": repeat,
        "step": step,
        "model_messages": sum(standing.values()),
        "expected_model_messages": sum(expected.values()),
        "key_messages": seen.keys,
        "undecodable": seen.undecodable,
        "sealed_unopened": seen.sealed,
        "duplicates": seen.duplicates,
        "unmatched": unmatched,
        "plaintext_messages": sum(link.plaintext for link in links.values()),
        "masking_strength": _summary(strengths),
        "truth_vs_telemetry": _truth_check(truth.models, telemetry),
        "noise": _noise_report(scheme, noise, c.sigma_g),
        "max_cancellation_residual": None,
        "clear_links": _clear_links(scheme, links),
        "hub_learns": {
            "everyone": learns[0]["everyone"],
            "fallback_hubs": _unique(h for one in learns for h in one["fallback_hubs"]),
        },
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
    if scheme.masked:
        result["max_cancellation_residual"] = _merge(checked for checked, _ in cancel)
    if views is None:
        return result, noise
    result["views"] = [
        {
            "view": part.view.view,
            "start": part.view.start,
            "end": part.end,  # its last round that stands; the next view redid the rest
            "members": list(part.view.members),
            "reason": part.view.reason,
            "left": part.view.left,
            "model_messages": standing[part.view.view],
            "expected_model_messages": expected[part.view.view],
            "redone_model_messages": sum(
                1 for v, *_, i, _j in seen.views if v == part.view.view and i > part.end
            ),
            "key_messages": seen.view_keys[part.view.view],
            "plaintext_messages": plain[part.view.view],
            "max_cancellation_residual": checked if scheme.masked else None,
            "hub_rounds_not_combined": not_combined,
            "fallback_hubs": one["fallback_hubs"],
        }
        for part, (checked, not_combined), one in zip(parts, cancel, learns, strict=True)
    ]
    result["redo"] = _redo(parts, seen, truth, step)
    return result, noise


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


def _links(A: np.ndarray) -> int:
    """Messages a round of the step with matrix A sends: its off-diagonal weights."""
    return int(np.count_nonzero(A) - A.shape[0])


def _unique(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return seen


def _redo(parts: Sequence[Part], seen: SessionWire, truth: Replay, step: int) -> dict[str, Any]:
    """What the rounds a later view redid put on the wire, and who learns what from them.

    The round a view starts from re-sends each member's value of the round before: the
    same clear value (unless the member came back from an older model), masked again,
    under the masked schemes with a fresh mask (the view is in the masks' HKDF info), under
    random and ghp with the same seeded noise, so the very same vector. Rounds begun after it
    under the old view, on its weights, carried other values than the redo sends. Per
    agent, from the wire: `same_value` (round and step whose value it sent once more, the
    same value: a re-release), `another_value` (sent again, the value differs), `frames`
    (the frames sending them again) and `fresh_masks` (those unlike every earlier frame
    on the same link)."""
    sent: dict[tuple[int, int, int], dict[int, dict[int, np.ndarray]]] = defaultdict(dict)
    for (v, s, r, i, j), vector in seen.views.items():
        sent[(s, i, j)].setdefault(v, {})[r] = vector
    counts: dict[int, Counter[str]] = defaultdict(Counter)
    for (s, i, j), by_view in sent.items():
        first, *later = sorted(by_view)
        for v in later:
            tally = counts[s]
            before, now = truth.views.get((first, s, i, j)), truth.views.get((v, s, i, j))
            same = before is None or now is None or _same(before, now)  # unknown: assume so
            tally["same_value" if same else "another_value"] += 1
            for r, vector in by_view[v].items():
                earlier = [by_view[u][r] for u in by_view if u < v and r in by_view[u]]
                tally["frames"] += 1
                tally["fresh_masks"] += not any(np.array_equal(e, vector) for e in earlier)
    twice = _combined_twice(parts, seen, step)
    fresh = sum(t["fresh_masks"] for t in counts.values())
    again = sum(t["frames"] for t in counts.values())
    return {
        "rounds_redone": [
            {
                "view": nxt.view.view,
                "from_round": nxt.view.start,
                "rounds_begun_before": max(0, part.reach - part.end),
            }
            for part, nxt in itertools.pairwise(parts)
        ],
        "re_releases": {
            s: {k: tally[k] for k in ("same_value", "another_value", "frames", "fresh_masks")}
            for s, tally in sorted(counts.items())
        },
        "hubs_combining_a_round_twice": dict(sorted(twice.items())),
        "learns": {
            "eavesdropper": (
                f"redone rounds sent {again} frames again, {fresh} under a fresh mask: "
                "one of a same_value re-release is an independent noisy look at a value "
                "it saw before (privacy accounting must count it as another release); a "
                "frame identical to the earlier one adds nothing; under random and ghp an "
                "another_value frame carries the same noise draw as the first sending, so "
                "the two differ by the values' difference; none is in the clear"
            ),
            "hub": (
                "of a round it did not complete, the masked messages that arrived, whose "
                "masks do not cancel: nothing more; of a round complete under two views, "
                "two aggregates, with each view's weights (of the same values in the "
                f"round a view starts from): {sum(twice.values())} hub-rounds"
            ),
        },
    }


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return float(np.linalg.norm(a - b)) <= PLAIN_REL * float(np.linalg.norm(a))


def _combined_twice(parts: Sequence[Part], seen: SessionWire, step: int) -> Counter[int]:
    """Per hub: rounds whose every message reached it under more than one view."""
    views: dict[tuple[int, int], int] = defaultdict(int)
    for part in parts:
        v = part.view.view
        for hub in part.view.members:
            senders = [int(m) for m in np.flatnonzero(part.A[:, hub]) if m != hub]
            for i in range(part.view.start, part.last + 1):
                if senders and all((v, m, hub, i, step) in seen.views for m in senders):
                    views[(hub, i)] += 1
    return Counter(hub for (hub, _), n in views.items() if n > 1)


def _summary(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"min": None, "median": None}
    return {"min": float(np.min(values)), "median": float(np.median(values))}


def _truth_check(models: np.ndarray, telemetry: np.ndarray | None) -> float | None:
    """Max |replay w - sealed telemetry w| over the cells the run has (NaN: a round an
    agent did not report, out of its view); AuditError beyond TRUTH_TOL."""
    if telemetry is None or np.isnan(telemetry).all():  # run with --no-telemetry
        return None
    if telemetry.shape != models.shape:
        raise AuditError(f"telemetry has shape {telemetry.shape}, the replay {models.shape}")
    have = ~np.isnan(telemetry)
    gap = float(np.max(np.abs(models[have] - telemetry[have])))
    if not gap <= TRUTH_TOL:  # NaN too: the run reported a model the replay has not
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
    """wire - true as the scheme's law predicts it: KS samples, and the masks' power check."""

    samples: np.ndarray
    power: float = 0.0  # masked: sum over every seat of ||(wire - release) a_mk||^2
    expected_power: float = 0.0  # ... and its expectation, partners * sigma_g^2 per coordinate


def noise_samples(
    scheme: Scheme, parts: Sequence[Part], seen: SessionWire, truth: Replay, sigma_g: float
) -> Noise:
    """random: every link's wire - true; ghp: one per sender and round (g_m is the same on
    all links); masked schemes: (wire - release) * a_mk of N+ senders with a single partner,
    so each pair's mask counts once, and for masked-ghp its release - true as ghp's. A
    redone round counts once more only for the masks: random and ghp draw the same seeded
    noise again, masks are fresh in every view."""
    samples: list[np.ndarray] = []
    noise = Noise(np.zeros(0))
    once: set[tuple[int, ...]] = set()
    seats = {
        part.view.view: (part.A, {hub: _seats(part.A, hub) for hub in range(part.A.shape[0])})
        for part in parts
    }
    for (v, s, r, i, j), vector in sorted(seen.views.items()):
        true = truth.views.get((v, s, i, j))
        if true is None or scheme is Scheme.NONE or v not in seats:
            continue
        release = truth.released[(v, s, r, i, j)] if scheme.masked else vector
        if scheme is not Scheme.LOCAL_GHP:
            draw = (s, r, i, j) if scheme is Scheme.RANDOM else (s, i)
            if draw not in once:
                once.add(draw)
                samples.append(release - rng.snap(true, sigma_g))
        if not scheme.masked:
            continue
        A, at = seats[v]
        seat = at[r].get(s)
        if seat is None:  # no link of this view's matrix: unmatched
            continue
        scaled = (vector - release) * A[s, r]
        noise.power += float(scaled @ scaled)
        noise.expected_power += len(seat.partners) * sigma_g**2 * scaled.size
        if seat.side == 1 and len(seat.partners) == 1:
            samples.append(scaled)
    noise.samples = np.concatenate(samples) if samples else np.zeros(0)
    return noise


_LAW = {
    Scheme.NONE: "no noise",
    Scheme.RANDOM: "Laplace(0, b) per coordinate, every directed link",
    Scheme.GHP: "Laplace(0, b) per coordinate, one g_m per sender and round",
    Scheme.LOCAL_GHP: "(wire - true) * a_mk ~ Laplace(0, b) for N+ senders with one partner",
    Scheme.MASKED_GHP: (
        "(wire - release) * a_mk ~ Laplace(0, b) for N+ senders with one partner, and "
        "release - true ~ Laplace(0, b), one g_m per sender and round"
    ),
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
    part: Part, seen: SessionWire, truth: Replay, step: int, sigma_g: float
) -> tuple[dict[str, Any], int]:
    """Max over hubs and rounds of one view of |wire combination - true combination| /
    |true combination|, with the view's matrix, each term on the lattice as the hub takes
    it (rng.on_lattice: the masks cancel exactly, so this is 0); and how many hub-rounds
    the next view redid before they were complete (never combined, nothing to check).

    The hub's own term is not on the wire; it is its release (from the truth), except at a
    fallback hub (one other neighbour), whose own term carries the pair's mask: there the
    cancellation happens inside the hub and is not observable on the wire.
    """
    A, v = part.A, part.view.view
    grid = rng.grid(sigma_g)
    worst, checked, fallback, missing, not_combined = 0.0, 0, [], 0, 0
    for hub in range(A.shape[0]):
        senders = [int(m) for m in np.flatnonzero(A[:, hub]) if m != hub]
        if len(senders) == 1:
            fallback.append(hub)
        if len(senders) < 2:
            continue
        for i in range(part.view.start, part.last + 1):
            try:
                own = rng.on_lattice(truth.released[(v, hub, hub, i, step)], A[hub, hub], grid)
                on_wire = sum(
                    rng.on_lattice(seen.views[(v, m, hub, i, step)], A[m, hub], grid)
                    for m in senders
                )
                true = sum(
                    rng.on_lattice(truth.released[(v, m, hub, i, step)], A[m, hub], grid)
                    for m in senders
                )
            except KeyError:
                if i <= part.end:
                    missing += 1
                else:
                    not_combined += 1
                continue
            combined = own + true
            scale = max(float(np.linalg.norm(combined)), 1e-300)
            gap = float(np.linalg.norm(own + on_wire - combined)) / scale
            worst, checked = max(worst, gap), checked + 1
    report = {
        "max": worst,
        "hub_rounds_checked": checked,
        "hub_rounds_missing_messages": missing,
        "not_observable_fallback_hubs": fallback,
    }
    return report, not_combined


def _merge(reports: Iterable[dict[str, Any]]) -> dict[str, Any]:
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
        Scheme.MASKED_GHP: (
            "only its weighted aggregate of its neighbours' ghp releases, sum_m a_mk (w_m + g_m):"
            " single masks do not cancel, and each w_m carries its own Laplace draw (a hub "
            "with one other neighbour pairs with it and learns that neighbour's w_m + g_m)"
        ),
    }[scheme]
    fallback = []
    if scheme is Scheme.LOCAL_GHP:
        for hub in range(A.shape[0]):
            senders = [int(m) for m in np.flatnonzero(A[:, hub]) if m != hub]
            if len(senders) == 1:
                fallback.append({"hub": hub, "learns_model_of": senders[0]})
    return {"everyone": everyone, "fallback_hubs": fallback}


# ---- the whole run ------------------------------------------------------------------------


def _adversary_rows(
    problem: Problem,
    session: tuple[Strategy, Scheme, int],
    seen: SessionWire,
    keyless: SessionWire,
    truth: Replay,
    plan: AttackPlan,
    views: Sequence[View] | None,
    reach: Mapping[int, int] | None,
) -> list[dict[str, Any]]:
    """One session's rows of the adversary table: what each rebuilds, and its epsilon;
    `seen` is the session's wire opened with the escrowed link keys, `keyless` as anyone
    without a key reads it."""
    strategy, scheme, repeat = session
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
            problem, strategy, scheme, repeat, frames, truth.clear, adversary, known, plan.agent
        )
        row["wire"] = (
            "this run's"
            if measured
            else "modelled: --seal-links " + ("on" if adversary.sealed else "off")
        )
        row["epsilon"] = finite(accounted.against(adversary)[-1])
        rows.append(row)
    return rows


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


def audit(
    recording: Recording,
    telemetry: list[np.ndarray] | None,
    source: str,
    attack: AttackPlan | None = None,
    membership: Sequence[View] | None = None,
) -> Audit:
    """Audit every session found on the wire of a recorded run; with `attack`, also try to
    reconstruct every agent's trajectory and local minimizer from it, as the whole wire
    and as each adversary of the table (orchestrator.attack), with the epsilon that holds
    against each (privacy.accountant). `membership`: the run's views (membership.json),
    which the replay plays as the conductor's script, session by session. The recording's
    escrowed link keys open a sealed wire; a session whose frames none opens is reported
    as sealed, nothing more."""
    c = recording.config
    problem = Problem.build(c)
    planned = session_list(c)
    found = split_sessions(recording.records, recording.run, c.dim, recording.link_keys)
    if not found:
        raise AuditError(f"no session of run {recording.run!r} on the wire ({source})")
    if len(found) > len(planned):
        raise AuditError(f"{len(found)} sessions on the wire, the config plans {len(planned)}")
    sessions, plotted, attempts, rows = [], {}, [], []
    keyless = split_sessions(recording.records, recording.run, c.dim) if attack else []
    b = c.sigma_g / math.sqrt(2)
    changed = False
    for s, ((strategy, scheme, repeat), seen) in enumerate(zip(planned, found, strict=False)):
        if seen.sealed and not (seen.views or seen.keys):
            sessions.append(sealed_session(strategy, scheme, repeat, seen))
            continue
        views = session_views(membership, s, seen, c.agents)
        changed |= views is not None
        reach = _reach(seen) if views is not None else None
        truth = replay(problem, strategy, scheme, repeat, views=views, reach=reach)
        told = telemetry[s] if telemetry is not None and s < len(telemetry) else None
        result, noise = audit_session(problem, strategy, scheme, repeat, seen, truth, told, views)
        sessions.append(result)
        if attack is not None:
            attempts.append(
                attack_session(problem, strategy, scheme, repeat, seen.models, truth.clear)
            )
            session = (strategy, scheme, repeat)
            rows += _adversary_rows(problem, session, seen, keyless[s], truth, attack, views, reach)
        if noise.samples.size and b > 0:
            which = f"{strategy}/{scheme}" + (f", repeat {repeat}" if c.repeats > 1 else "")
            p_value = _fmt(result["noise"]["p_value"])
            plotted[f"{which}\nKS test against Laplace(0, b): p = {p_value}"] = noise.samples / b
    report = {
        "run": recording.run,
        "source": source,
        "ground_truth": (
            "memory-engine replay of the same config (same cores and seed), validated against "
            f"the run's sealed telemetry to {TRUTH_TOL}"
            + (
                "; sessions whose membership changed replay the run's views (membership.json)"
                " as the conductor's script, each view's frames against that view's clear "
                "values and weights"
                if changed
                else ""
            )
        ),
        "sigma_g": c.sigma_g,
        "sessions": sessions,
    }
    if attack is not None:
        report["adversaries"] = {
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
        report["reconstruction"] = {
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
    return Audit(report, plotted)


def audit_table(report: dict[str, Any]) -> Table:
    """One row per session; the full per-link detail is in audit.json."""
    table = Table(title=f"wire audit of {report['run']} ({report['source']})")
    for name in ("session", "models", "clear", "mask min", "mask med", "KS p", "var", "cancel"):
        table.add_column(name, justify="right")
    for s in report["sessions"]:
        if s.get("sealed"):
            table.add_row(_session_name(s), f"sealed ({s['sealed_unopened']})", "0", *"-----")
            continue
        resid = s["max_cancellation_residual"]
        leak = s["plaintext_messages"] and s["scheme"] != "none"
        seen, expected = s["model_messages"], s["expected_model_messages"]
        table.add_row(
            _session_name(s),
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
        "cancel: max residual of a masked scheme at a hub, each term on the lattice"
    )
    return table


def _session_name(s: dict[str, Any]) -> str:
    return (
        f"{s['strategy']}/{s['scheme']}"
        + (f" r{s['repeat']}" if s["repeat"] else "")
        + (f" ({len(s['views'])} views)" if "views" in s else "")
    )


def _redo_line(s: dict[str, Any]) -> str:
    """A session with membership changes: its views and what redone rounds re-released."""
    redo = s["redo"]
    changes = ", ".join(
        f"view {r['view']} from round {r['from_round']} ({r['rounds_begun_before']} begun before)"
        for r in redo["rounds_redone"]
    )
    again = {a: t["same_value"] for a, t in redo["re_releases"].items() if t["same_value"]}
    fresh = sum(t["fresh_masks"] for t in redo["re_releases"].values())
    return (
        f"{s['strategy']}/{s['scheme']}: {len(s['views'])} views ({changes}), each audited "
        f"with its own weights; same values re-released by redone rounds, per agent: {again}"
        f" ({fresh} frames sent again under a fresh mask)"
    )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def plot_noise(noise: dict[str, np.ndarray], path: Path) -> None:
    noise_figure(noise).savefig(path, dpi=110)


def noise_figure(noise: dict[str, np.ndarray]) -> Figure:
    """Histogram of (wire - true) / b per private session, against the Laplace(0, 1) density:
    what masking added to each model on the wire, in units of the noise scale b."""
    from matplotlib.figure import Figure

    panels = max(1, len(noise))
    fig = Figure(figsize=(4 * panels, 3.6))
    axes = fig.subplots(1, panels, squeeze=False)[0]
    grid = np.linspace(-6, 6, 400)
    for ax, (name, samples) in zip(axes, noise.items(), strict=False):
        density, edges = np.histogram(samples, bins=60, range=(-6, 6), density=True)
        ax.stairs(density, edges, fill=True, alpha=0.6, label="wire - true")
        ax.plot(grid, 0.5 * np.exp(-np.abs(grid)), "k", lw=1.2, label="Laplace(0, 1)")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("(model on the wire - true model) / b")
        ax.set_ylabel("probability density")
        ax.legend(fontsize=7)
    if not noise:
        axes[0].text(0.5, 0.5, "no private scheme with noise in this run", ha="center")
    fig.tight_layout()
    return fig


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
        recording.records = read_pcap(pcap, port)
        source = f"pcap {pcap.name}, port {port}"
    result = audit(recording, load_telemetry(run_dir), source, attack, load_membership(run_dir))
    stem = "audit" if pcap is None else "audit-pcap"
    (run_dir / f"{stem}.json").write_text(json.dumps(result.report, indent=2) + "\n")
    plot_noise(result.noise, run_dir / f"{stem}.png")
    return result.report


def show_audit(
    run_dir: Path,
    pcap: Path | None = None,
    port: int | None = None,
    attack: AttackPlan | None = None,
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
    if attack is not None:
        table_console().print(attack_table(report["reconstruction"]["sessions"]))
        table_console().print(adversary_table(report["adversaries"]["rows"], attack.agent))
    for s in report["sessions"]:
        for hub in s["hub_learns"]["fallback_hubs"]:
            err.print(
                f"{s['strategy']}/{s['scheme']}: hub {hub['hub']} has one other neighbour and "
                f"learns agent {hub['learns_model_of']}'s model (no model is clear on the wire)"
            )
    for s in report["sessions"]:
        if s.get("sealed"):
            err.print(f"{s['strategy']}/{s['scheme']}: {s['finding']}")
        elif s["model_messages"] != s["expected_model_messages"]:
            err.print(
                f"[yellow]{s['strategy']}/{s['scheme']}: {s['model_messages']} of "
                f"{s['expected_model_messages']} models recorded; the rest was not audited"
            )
    for s in report["sessions"]:
        if "redo" in s:
            err.print(_redo_line(s))
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

"""A recorded wire back into frames: the live tap's records or a pcap's, split into the
run's sessions, each peer frame read as the audit can.

Peer frames are sealed end to end (`privnet.agent.links`): under `--audit` the agents escrow their
link keys to the orchestrator, and the `Opener` opens every frame with them, to prove the
masking underneath. Without the escrow a sealed wire shows nothing to audit. On the visible
wire (`--seal-links off`) the MAC authenticates without encrypting, so the audit, like any
eavesdropper, reads every model body without a key (`wire.peek_peer`).

A chunked model's chunks open one by one; the `Opener` puts a model together from the
chunks the recording kept (every one, or a big model's sample: `audit.sample`), so its
vector holds the sampled coordinates only.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from privnet.agent import control, topics, wire
from privnet.agent.messages import Model, Reason, Rejected
from privnet.agent.wire.chunks import ChunkHead, chunk_data, is_chunk, read_chunk
from privnet.orchestrator.audit.recording import Escrowed, WireRecord
from privnet.orchestrator.audit.sample import Sample
from privnet.orchestrator.replay import AuditError, SessionWire, add_frame


def read_pcap(path: Path, port: int) -> list[WireRecord]:
    """Every MQTT PUBLISH sent TO the broker port in a pcap (so each message counts once),
    decoded with tshark."""
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


def split_sessions(
    records: Iterable[WireRecord],
    run: str,
    dim: int,
    escrowed: Escrowed | None = None,
    *,
    dtype: str = wire.DTYPE,
    sample: Sample | None = None,
    sealed: bool = True,
) -> list[SessionWire]:
    """Peer traffic of each session: the visible wire's read without any key, sealed frames
    opened with the `escrowed` link keys where there are some; models of `dtype` (lattice
    words for u4), chunked ones on `sample`'s coordinates when given (`sealed`: whether the
    run sealed its links, which a chunk's frame does not say). A session begins with its
    first Setup, not its Go: local-ghp agents agree their keys in between."""
    down = topics.ctl_down(run, "all").removesuffix("all")
    sessions: list[SessionWire] = []
    opener = Opener(run, dim, escrowed or {}, dtype, sample, sealed)
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
    dtype: str = wire.DTYPE
    sample: Sample | None = None
    sealed: bool = True  # how the run's chunks went: sealed, or visible (MACed)
    _aeads: dict[bytes, ChaCha20Poly1305] = field(default_factory=dict)
    # a chunked model's chunks read so far: (session, view, sender, receiver, round, step)
    _chunks: dict[tuple[int, ...], dict[int, bytes]] = field(default_factory=dict)

    def read(self, session: int, payload: bytes) -> wire.Peer | None:
        """The message in `payload`; None for a chunk whose model is not whole yet."""
        if is_chunk(payload):
            return self._chunk(session, read_chunk(payload))
        try:
            return wire.peek_peer(payload, self.dim, dtype=self.dtype)
        except Rejected as exc:
            if exc.reason is not Reason.SEALED:
                raise
        head = wire.read_head(payload)
        aead = self._aead(session, head.view, head.sender, head.receiver)
        return wire.open_head(head, aead, self.run, self.dim, self.dtype)

    def _aead(self, session: int, view: int, sender: int, receiver: int) -> ChaCha20Poly1305:
        link = (min(sender, receiver), max(sender, receiver))
        key = self.escrowed.get((session, view), {}).get(link)
        if key is None:
            raise Rejected(Reason.SEALED, f"no escrowed key for link {link} of view {view}")
        return self._aeads.get(key) or self._aeads.setdefault(key, ChaCha20Poly1305(key))

    def _chunk(self, session: int, head: ChunkHead) -> Model | None:
        """A chunk's data, kept until every chunk of its model the audit reads is in: then
        the model, on the sampled coordinates (a chunk the sample drops: None)."""
        count = wire.chunk_count(self.dim, self.dtype)
        if head.count != count or head.dtype != self.dtype:
            raise Rejected(
                Reason.SHAPE,
                f"chunk of a {head.count}-chunk model of {head.dtype}; a model of this run "
                f"has {count} chunks of {self.dtype}",
            )
        wanted = self.sample.chunks if self.sample is not None else range(count)
        if self.sample is not None and not self.sample.keeps(head.index):
            return None
        aead = None
        if self.sealed:
            aead = self._aead(session, head.view, head.sender, head.receiver)
        data = chunk_data(head, aead, self.run)
        at = (session, head.view, head.sender, head.receiver, head.round, head.step)
        got = self._chunks.setdefault(at, {})
        got[head.index] = data
        if len(got) < len(wanted):
            return None
        del self._chunks[at]
        words = np.uint32 if self.dtype == wire.U4 else np.float64
        vector = np.frombuffer(b"".join(got[c] for c in wanted), dtype=words).copy()
        return Model(head.sender, head.receiver, head.round, head.step, vector, head.view)


def reach_of(records: Iterable[WireRecord], run: str, dim: int) -> dict[int, dict[int, int]]:
    """Per session of a recorded wire, how far each view ran (`view_reach`)."""
    return {s: view_reach(seen) for s, seen in enumerate(split_sessions(records, run, dim))}


def view_reach(seen: SessionWire) -> dict[int, int]:
    """view -> the last round of it a model on the wire belongs to."""
    reach: dict[int, int] = {}
    for view, _s, _r, i, _j in seen.views:
        reach[view] = max(reach.get(view, 0), i)
    return reach

"""The live tap: `privnet run --audit` records the run's wire beside it.

A passive MQTT subscriber to everything of the run, started before the agents, on paho's own
network thread rather than the orchestrator's event loop, so recording thousands of
messages a round neither slows nor starves the run it watches.

A pcap is the other source (`privnet inspect --pcap`, read back by `playback.read_pcap`).
Local run: `tcpdump -i lo -w run.pcap port <broker port>` (the port is printed by `privnet
run` and stored in wire.msgpack). Docker: `tcpdump -i <bridge> -w run.pcap port 1883` on the
host, where <bridge> is the compose network's bridge (`br-` + the first 12 characters of
`docker network inspect -f {{.Id}} <project>_default`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt

from privnet.agent import topics
from privnet.agent.access import BrokerAddress, ClientAccess
from privnet.orchestrator.audit.recording import (
    Escrowed,
    Recording,
    WireRecord,
    save_recording,
    save_telemetry,
)
from privnet.orchestrator.audit.sample import Sample, recorded
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.replay import AuditError

QUIET = 0.3  # the tap stops after this long without a message...
DRAIN = 5.0  # ...or after this long at most
SUBSCRIBE_TIMEOUT = 10.0


class WireTap:
    """A passive subscriber to every topic of one run, started before the agents."""

    def __init__(
        self, address: BrokerAddress, run: str, access: ClientAccess, sample: Sample | None = None
    ) -> None:
        """`access`: the run's read-only inspector (the ACL lets it read the whole run);
        `sample`: a big model's chunks to keep (audit.sample), None to keep every frame."""
        self.address, self.run, self.sample = address, run, sample
        self.records: list[WireRecord] = []
        self.seen_bytes = self.kept_bytes = 0  # every payload the tap got, and those it kept
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
        payload = bytes(message.payload)
        self.seen_bytes += len(payload)
        if recorded(payload, message.topic, self.sample):
            self.kept_bytes += len(payload)
            self.records.append(WireRecord(time.time(), message.topic, payload))

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

    def sampled(self) -> dict[str, Any] | None:
        """The sample the recording holds (None: every frame whole), and its bytes: every
        payload the tap got and those it kept."""
        if self.sample is None:
            return None
        kept = {"payload_bytes": self.seen_bytes, "recorded_bytes": self.kept_bytes}
        return {"sampled": True, **self.sample.to_dict(), **kept}

    def sample_summary(self) -> dict[str, Any]:
        """summary.json's `audit_sample`: the sample, or that the wire was recorded whole."""
        return self.sampled() or {
            "sampled": False,
            "payload_bytes": self.seen_bytes,
            "recorded_bytes": self.kept_bytes,
        }

    def save(self, out: Path, config: ExperimentConfig) -> None:
        """wire.msgpack (header + records) and telemetry.npz (one array per session)."""
        recording = Recording(
            self.run, str(self.address), config, self.records, self.link_keys, self.sampled()
        )
        save_recording(out, recording)
        save_telemetry(out, self.telemetry)

"""The agent's MQTT shell: moves bytes between aiomqtt and the node, and time into it.

Every rule lives in `agent.node.AgentNode`; `pump` only delivers what arrives, calls
`tick` when the node asks, and publishes what it returns. The orchestrator's shell runs
its conductor through the same `pump`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import aiomqtt

from agent import keys, topics
from agent.access import ClientAccess
from agent.inbox import Inbox
from agent.node import QOS, AgentNode, Launch, Output, Phase, Unsubscribe

log = logging.getLogger("privnet.agent")
PENDING_CALLS = 1000  # a round publishes to every neighbour at once; aiomqtt warns past 10


@dataclass(frozen=True)
class BrokerAddress:
    """Where clients connect."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> BrokerAddress:
        """'HOST:PORT' or '[IPv6]:PORT'."""
        host, sep, port = text.strip().rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65_536:
            raise ValueError(
                f"bad broker address {text!r}: write HOST:PORT with a port in 1-65535, "
                "e.g. 127.0.0.1:1883 or [::1]:1883"
            )
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def client(broker: BrokerAddress, access: ClientAccess, **extra: Any) -> aiomqtt.Client:
    """An aiomqtt client as every privnet party connects: low latency, many in flight."""
    made = aiomqtt.Client(
        broker.host,
        broker.port,
        max_inflight_messages=200,
        socket_options=topics.NODELAY,
        keepalive=30,
        **access.client_kwargs(),
        **extra,
    )
    made.pending_calls_threshold = PENDING_CALLS
    return made


@dataclass(frozen=True)
class AgentLaunch:
    """Everything an agent process is started with, as environment variables or a file.

    The token and password are secrets: they travel in the process environment or a
    0600 file, never on a command line (which every local user can read).
    """

    broker: str
    run: str
    agent: int
    orchestrator: str  # hex of the orchestrator's PublicIdentity (64 bytes)
    token: str  # hex, 32 bytes
    username: str | None = None
    password: str | None = None
    tls: bool = False
    ca_file: str | None = None  # the run's CA certificate (PEM): the broker is verified

    ENV = "PRIVNET_LAUNCH"  # the whole launch as JSON, in one variable

    def to_env(self) -> dict[str, str]:
        return {self.ENV: json.dumps(asdict(self))}

    @classmethod
    def from_json(cls, text: str, where: str) -> AgentLaunch:
        try:
            data = json.loads(text)
            launch = cls(**data)
            launch.parts()
        except (ValueError, TypeError, keys.BadKey) as exc:
            raise ValueError(f"{where} is not a privnet agent launch: {exc}") from None
        return launch

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> AgentLaunch | None:
        text = env.get(cls.ENV)
        return None if text is None else cls.from_json(text, f"${cls.ENV}")

    @classmethod
    def from_file(cls, path: Path) -> AgentLaunch:
        return cls.from_json(path.read_text(), str(path))

    def parts(self) -> tuple[BrokerAddress, Launch, ClientAccess]:
        identity = keys.PublicIdentity.from_bytes(bytes.fromhex(self.orchestrator))
        token = bytes.fromhex(self.token)
        if len(token) != 32:
            raise ValueError(f"token must be 32 bytes, got {len(token)}")
        launch = Launch(self.run, int(self.agent), identity, token)
        access = ClientAccess(self.username, self.password, self.tls, self.ca_file)
        return BrokerAddress.parse(self.broker), launch, access


class Machine(Protocol):
    """A sans-IO party: the agent node or the orchestrator's conductor."""

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output: ...
    def tick(self, now: float) -> Output: ...
    def next_tick(self) -> float | None: ...
    def unsubscribed(self, topic: str, now: float) -> Output: ...


PROBE = b"privnet/probe\0"  # never a frame: frames are msgpack arrays
PROBE_TIMEOUT = 30.0


async def publish(client: aiomqtt.Client, out: Output) -> None:
    """Everything a machine returned, pipelined (QoS 1: each waits for its PUBACK)."""
    if out.publish:
        await asyncio.gather(*(client.publish(p.topic, p.payload, qos=QOS) for p in out.publish))


async def pump(
    client: aiomqtt.Client,
    inbox: Inbox,
    machine: Machine,
    until: Callable[[], bool],
    on_output: Callable[[Output], None] | None = None,
    every: float | None = None,
) -> None:
    """Feed `machine` deliveries and time until `until()`; publish what it says.

    `every` bounds the wait, so the caller's `until` (a child process check, say) runs at
    least that often.
    """
    clock = time.monotonic
    while not until():
        wake = machine.next_tick()
        waits = [w for w in (None if wake is None else wake - clock(), every) if w is not None]
        try:
            message = await inbox.get(max(0.0, min(waits)) if waits else None)
        except TimeoutError:
            out = Output()
        else:
            out = _deliver(machine, message)
        wake = machine.next_tick()
        if wake is not None and clock() >= wake:
            out += machine.tick(clock())
        await _apply(client, inbox, machine, out, on_output)


async def _apply(
    client: aiomqtt.Client,
    inbox: Inbox,
    machine: Machine,
    out: Output,
    on_output: Callable[[Output], None] | None,
) -> None:
    """Publish, unsubscribe and report what a machine returned."""
    await publish(client, out)
    if on_output is not None:
        on_output(out)
    for stop in out.unsubscribe:
        await _drain_and_stop(client, inbox, machine, stop, on_output)


async def _drain_and_stop(
    client: aiomqtt.Client,
    inbox: Inbox,
    machine: Machine,
    stop: Unsubscribe,
    on_output: Callable[[Output], None] | None,
) -> None:
    """Stop reading `stop.pattern` only once every frame the broker queued for it is in.

    A broker may deliver queued frames after its UNSUBACK, so: subscribe to the probe topic
    alone, drop the pattern, publish a probe there, and deliver everything until the probe
    comes back: the broker's queue for this client is first in, first out."""
    nonce = PROBE + secrets.token_bytes(16)
    await client.subscribe(stop.probe, qos=QOS)
    await client.unsubscribe(stop.pattern)
    await client.publish(stop.probe, nonce, qos=QOS)
    while True:
        try:
            message = await inbox.get(PROBE_TIMEOUT)
        except TimeoutError:
            log.warning("no probe back on %s in %.0f s; stopping anyway", stop.probe, PROBE_TIMEOUT)
            break
        if message.topic.value == stop.probe and message.payload == nonce:
            break
        await _apply(client, inbox, machine, _deliver(machine, message), on_output)
    await client.unsubscribe(stop.probe)
    await _apply(
        client, inbox, machine, machine.unsubscribed(stop.pattern, time.monotonic()), on_output
    )


def _deliver(machine: Machine, message: aiomqtt.Message) -> Output:
    payload = message.payload if isinstance(message.payload, bytes) else b""
    return machine.receive(message.topic.value, payload, time.monotonic(), message.retain)


def _log(out: Output, me: int) -> None:
    for event in out.events:
        level = logging.ERROR if event.kind == "failed" else logging.INFO
        log.log(level, "agent %s %s %s", me, event.kind, event.detail)


async def run_agent(broker: BrokerAddress, launch: Launch, access: ClientAccess) -> int:
    """Register, serve sessions until Bye (0), a failure (2) or a lost broker (3)."""
    node = AgentNode(launch, keys.Identity.generate())
    try:
        async with client(broker, access) as mqtt, Inbox(mqtt) as inbox:
            for topic in node.subscriptions:
                await mqtt.subscribe(topic, qos=QOS)
            start = node.start(time.monotonic())
            await publish(mqtt, start)
            await pump(mqtt, inbox, node, lambda: node.done, lambda out: _log(out, node.me))
    except aiomqtt.MqttError as exc:
        log.error("agent %s: lost the broker at %s: %s", launch.agent, broker, exc)
        return 3
    return 0 if node.phase is Phase.CLOSED else 2

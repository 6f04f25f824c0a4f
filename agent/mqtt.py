"""The agent's MQTT shell: moves bytes between gmqtt and the node, and time into it.

Every rule lives in `agent.node.AgentNode`; `pump` only delivers what arrives, calls
`tick` when the node asks, and publishes what it returns. The orchestrator's shell runs
its conductor through the same `pump`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

import gmqtt
import gmqtt.mqtt.handler
from gmqtt.mqtt.constants import MQTTv311

from agent import keys
from agent.access import ClientAccess
from agent.node import PEER_QOS, QOS, AgentNode, Launch, Output, Phase, Unsubscribe

log = logging.getLogger("privnet.agent")
_GMQTT_LOG = logging.getLogger("privnet.gmqtt")
T = TypeVar("T")
_GMQTT_LOG.setLevel(logging.ERROR)  # gmqtt logs every connect and disconnect at INFO


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


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on uvloop where it is installed (not on Windows): the same shells,
    about a third less CPU per message on the bench's raw load."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


class MqttError(Exception):
    """The broker refused us, or the connection to it ended."""


class Connection:
    """One MQTT 3.1.1 client on gmqtt: subscribe, publish, and `get` what arrives.

    gmqtt speaks MQTT straight from an asyncio protocol, where aiomqtt drives paho's
    blocking-socket loop from the event loop: on the bench's raw load (30 clients, two
    processes, mosquitto, QoS 0) it moves 5 to 8 times the messages per CPU second.
    Deliveries go to a plain queue (cancellation-safe, like `agent.inbox.Inbox`); a lost
    connection is not resumed (no reconnects): `get` raises MqttError and the party ends.
    No client identifier: the broker picks one, so nobody can take over a session by name.
    """

    def __init__(self, broker: BrokerAddress, access: ClientAccess, keepalive: int = 30) -> None:
        self.broker, self.access, self.keepalive = broker, access, keepalive
        self._client = gmqtt.Client("", clean_session=True, logger=_GMQTT_LOG)
        self._client.set_config({"reconnect_retries": 0})
        self._client.on_message = self._on_message
        self._client.on_disconnect = self._on_disconnect
        self._client.on_subscribe = self._on_ack
        self._client.on_unsubscribe = self._on_ack
        if access.username is not None:
            self._client.set_auth_credentials(access.username, access.password)
        self._queue: asyncio.Queue[tuple[str, bytes, bool] | None] = asyncio.Queue()
        self._acks: dict[int, asyncio.Future[None]] = {}  # SUBACKs and UNSUBACKs by mid
        self._lost: str | None = None
        self._closing = False

    async def __aenter__(self) -> Self:
        ssl: Any = False
        if self.access.tls:
            import ssl as ssl_module

            ssl = ssl_module.create_default_context(cafile=self.access.ca_file)
        try:
            await self._client.connect(
                self.broker.host,
                self.broker.port,
                ssl=ssl,
                keepalive=self.keepalive,
                version=MQTTv311,
            )
        except (OSError, gmqtt.mqtt.handler.MQTTConnectError) as exc:
            await self._close()
            raise MqttError(f"cannot connect to the broker at {self.broker}: {exc}") from None
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._close()

    async def _close(self) -> None:
        self._closing = True
        with contextlib.suppress(Exception):
            await self._client.disconnect()

    def _on_message(self, _c: Any, topic: str, payload: bytes, _qos: int, props: Any) -> int:
        self._queue.put_nowait((topic, payload, bool(props.get("retain"))))
        return 0  # PUBACK: success

    def _on_disconnect(self, _c: Any, _packet: Any, exc: BaseException | None = None) -> None:
        if not self._closing and self._lost is None:
            self._lost = f"connection to the broker at {self.broker} ended ({exc or 'closed'})"
            self._queue.put_nowait(None)
        for waiter in self._acks.values():
            if not waiter.done():
                waiter.set_exception(MqttError("connection lost before an acknowledgement"))

    def _on_ack(self, _c: Any, mid: int, *_rest: Any) -> None:
        waiter = self._acks.pop(mid, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def subscribe(self, topic: str, qos: int = QOS, timeout: float = 10.0) -> None:
        """Subscribe and wait for the SUBACK."""
        self._check()
        waiter = asyncio.get_running_loop().create_future()
        self._acks[self._client.subscribe(topic, qos=qos)] = waiter
        async with asyncio.timeout(timeout):
            await waiter

    async def unsubscribe(self, topic: str, timeout: float = 10.0) -> None:
        """Unsubscribe and wait for the UNSUBACK."""
        self._check()
        waiter = asyncio.get_running_loop().create_future()
        self._acks[self._client.unsubscribe(topic)] = waiter
        async with asyncio.timeout(timeout):
            await waiter

    def publish(self, topic: str, payload: bytes, qos: int = QOS) -> None:
        """Queue one PUBLISH on the socket (QoS 1: gmqtt keeps it until its PUBACK)."""
        self._check()
        self._client.publish(topic, payload, qos=qos)

    def _check(self) -> None:
        if self._lost is not None or not self._client.is_connected:
            raise MqttError(self._lost or f"not connected to the broker at {self.broker}")

    async def get(self, timeout: float | None = None) -> tuple[str, bytes, bool]:
        """The next (topic, payload, retained); TimeoutError after `timeout` s; MqttError if the
        connection died."""
        if self._queue.empty():
            async with asyncio.timeout(timeout):
                item = await self._queue.get()
        else:
            item = self._queue.get_nowait()
        if item is None:
            self._queue.put_nowait(None)  # every later get sees it too
            raise MqttError(self._lost or "connection to the broker ended")
        return item


def client(broker: BrokerAddress, access: ClientAccess) -> Connection:
    """A connection as every privnet party makes it (use with `async with`)."""
    return Connection(broker, access)


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
    GROUP_ENV = "PRIVNET_LAUNCHES"  # several agents in one process: a JSON list of launches

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def to_env(self) -> dict[str, str]:
        return {self.ENV: self.to_json()}

    @classmethod
    def group_env(cls, launches: list[AgentLaunch]) -> dict[str, str]:
        return {cls.GROUP_ENV: json.dumps([asdict(a) for a in launches])}

    @classmethod
    def group_from_env(cls, env: Mapping[str, str] = os.environ) -> list[AgentLaunch] | None:
        text = env.get(cls.GROUP_ENV)
        if text is None:
            return None
        try:
            items = json.loads(text)
            if not isinstance(items, list) or not items:
                raise ValueError("not a non-empty list")
        except ValueError as exc:
            raise ValueError(f"${cls.GROUP_ENV} is not a list of launches: {exc}") from None
        return [
            cls.from_json(json.dumps(item), f"${cls.GROUP_ENV}[{n}]")
            for n, item in enumerate(items)
        ]

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


def publish(client: Connection, out: Output) -> None:
    """Everything a machine returned, each at its category's QoS (`QOS_OF`)."""
    for p in out.publish:
        client.publish(p.topic, p.payload, p.qos)


async def pump(
    client: Connection,
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
            topic, payload, retained = await client.get(max(0.0, min(waits)) if waits else None)
        except TimeoutError:
            out = Output()
        else:
            out = machine.receive(topic, payload, clock(), retained)
        wake = machine.next_tick()
        if wake is not None and clock() >= wake:
            out += machine.tick(clock())
        await _apply(client, machine, out, on_output)


async def _apply(
    client: Connection,
    machine: Machine,
    out: Output,
    on_output: Callable[[Output], None] | None,
) -> None:
    """Publish, unsubscribe and report what a machine returned."""
    publish(client, out)
    if on_output is not None:
        on_output(out)
    for stop in out.unsubscribe:
        await _drain_and_stop(client, machine, stop, on_output)


async def _drain_and_stop(
    client: Connection,
    machine: Machine,
    stop: Unsubscribe,
    on_output: Callable[[Output], None] | None,
) -> None:
    """Stop reading `stop.pattern` only once every frame the broker queued for it is in.

    A broker may deliver queued frames after its UNSUBACK, so: subscribe to the probe topic
    alone, drop the pattern, publish a probe there, and deliver everything until the probe
    comes back: the broker's queue for this client is first in, first out. The probe takes
    the peer plane's QoS, the very path of the frames it flushes."""
    nonce = PROBE + secrets.token_bytes(16)
    await client.subscribe(stop.probe, PEER_QOS)
    await client.unsubscribe(stop.pattern)
    client.publish(stop.probe, nonce, PEER_QOS)
    while True:
        try:
            topic, payload, retained = await client.get(PROBE_TIMEOUT)
        except TimeoutError:
            log.warning("no probe back on %s in %.0f s; stopping anyway", stop.probe, PROBE_TIMEOUT)
            break
        if topic == stop.probe and payload == nonce:
            break
        await _apply(
            client, machine, machine.receive(topic, payload, time.monotonic(), retained), on_output
        )
    await client.unsubscribe(stop.probe)
    await _apply(client, machine, machine.unsubscribed(stop.pattern, time.monotonic()), on_output)


def _log(out: Output, me: int) -> None:
    for event in out.events:
        level = logging.ERROR if event.kind == "failed" else logging.INFO
        log.log(level, "agent %s %s %s", me, event.kind, event.detail)


async def run_agents(launches: list[AgentLaunch]) -> int:
    """Several agents in one process and one event loop, each with its own connection,
    credentials, identity and node; the worst exit code."""
    codes = await asyncio.gather(*(run_agent(*launch.parts()) for launch in launches))
    return max(codes)


async def run_agent(broker: BrokerAddress, launch: Launch, access: ClientAccess) -> int:
    """Register, serve sessions until Bye (0), a failure (2) or a lost broker (3)."""
    node = AgentNode(launch, keys.Identity.generate())
    try:
        async with client(broker, access) as mqtt:
            for topic, qos in node.subscription_qos.items():
                await mqtt.subscribe(topic, qos)
            publish(mqtt, node.start(time.monotonic()))
            await pump(mqtt, node, lambda: node.done, lambda out: _log(out, node.me))
    except (MqttError, TimeoutError) as exc:
        log.error("agent %s: lost the broker at %s: %s", launch.agent, broker, exc)
        return 3
    return 0 if node.phase is Phase.CLOSED else 2

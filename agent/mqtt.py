"""The agent's asyncio shell: binds the pure core to an MQTT broker through aiomqtt.

Everything protocol-related happens in `core.AgentCore`; this module only registers,
decodes, counts bytes, seals telemetry and publishes what the core returns.

Life of an agent: Hello -> Welcome + Setup (on its registration topic) -> subscribe to
its inbox -> Ready -> Go -> rounds -> Finished; then either another Setup (next session)
or Bye. A neighbour silent past the deadline ends the agent with a message naming it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field

import aiomqtt

from agent import control, keys, topics, wire
from agent.core import AgentCore
from agent.inbox import Inbox
from agent.losses import LeastSquares
from agent.messages import Message, Rejected, Report

log = logging.getLogger("privnet.agent")


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


QOS = 1  # at-least-once: a lost model would stall the round; the core drops duplicates
REGISTER_TIMEOUT = 120.0
HELLO_EVERY = 2.0  # seconds between Hellos until Welcome: the orchestrator may subscribe late
IDLE_TIMEOUT = 600.0  # between sessions: an orchestrator gone this long is not coming back
TELEMETRY_BATCH = 10  # rounds per sealed telemetry message


class AgentFailure(Exception):
    """The agent cannot go on (silent neighbour, forged key, bad setup)."""


@dataclass
class Traffic:
    """MQTT bytes and messages this agent published, by category (PUBLISH packet sizes)."""

    bytes: Counter[str] = field(default_factory=Counter)
    messages: Counter[str] = field(default_factory=Counter)

    def add(self, category: str, topic: str, payload: bytes) -> None:
        self.bytes[category] += topics.mqtt_publish_size(topic, len(payload), QOS)
        self.messages[category] += 1


@dataclass
class Session:
    """One run of the rounds: the core plus what the shell needs around it."""

    setup: control.Setup
    core: AgentCore
    link_keys: dict[int, bytes]
    orchestrator_key: bytes
    started: float = field(default_factory=time.perf_counter)
    reports: list[Report] = field(default_factory=list)  # telemetry not yet sent


class AgentShell:
    def __init__(
        self, client: aiomqtt.Client, inbox: Inbox, run: str, requested_id: int | None
    ) -> None:
        self.client, self.inbox, self.run = client, inbox, run
        self.requested_id = requested_id
        self.identity = keys.Identity.generate()
        self.nonce = secrets.token_bytes(16)
        self.me: int | None = None
        self.orchestrator_key = b""
        self.session: Session | None = None
        self.early: list[aiomqtt.Message] = []  # peer messages that beat our Go
        self.running = False
        self.traffic = Traffic()
        self.rejected: Counter[str] = Counter()

    # ---- publishing -------------------------------------------------------------------

    async def _publish(self, topic: str, payload: bytes, category: str) -> None:
        self.traffic.add(category, topic, payload)
        await self.client.publish(topic, payload, qos=QOS)

    async def _control(self, msg: control.Control) -> None:
        assert self.me is not None
        await self._publish(
            topics.ctl_up(self.run, self.me), wire.encode_control(msg), wire.category(msg)
        )

    async def _emit(self, messages: list[Message]) -> None:
        """Publish what the core produced: peer messages MACed, reports sealed."""
        assert self.session is not None and self.me is not None
        sends = []
        for msg in messages:
            if isinstance(msg, Report):
                if self.session.setup.telemetry:
                    self.session.reports.append(msg)
            else:
                payload = wire.encode_peer(msg, self.session.link_keys[msg.receiver])
                topic = topics.peer_topic(self.run, msg.receiver, self.me)
                sends.append(self._publish(topic, payload, wire.category(msg)))
        reports = self.session.reports
        if reports and (len(reports) >= TELEMETRY_BATCH or self.session.core.done):
            sends.append(self._telemetry(reports))
            self.session.reports = []
        await asyncio.gather(*sends)

    async def _telemetry(self, reports: list[Report]) -> None:
        """Seal a batch of true models to the orchestrator: no plaintext model on the wire."""
        assert self.session is not None and self.me is not None
        last = reports[-1].round
        sealed = keys.seal(
            self.session.orchestrator_key,
            wire.encode_reports(reports),
            telemetry_context(self.run, self.me, last),
        )
        payload = wire.encode_control(control.Telemetry(self.me, last, sealed))
        await self._publish(topics.telemetry(self.run, self.me), payload, "telemetry")

    # ---- lifecycle --------------------------------------------------------------------

    async def register(self) -> None:
        nonce = self.nonce.hex()
        await self.client.subscribe(topics.register_down(self.run, nonce), qos=QOS)
        await self._hello()

    async def _hello(self) -> None:
        """Ask for an id. Repeated until Welcome, since a Hello published before the
        orchestrator subscribed is lost (containers start in any order); it drops repeats."""
        nonce = self.nonce.hex()
        hello = control.Hello(self.nonce, self.identity.public.to_bytes(), self.requested_id)
        payload = wire.encode_control(hello)
        self.traffic.add("control", topics.register_up(self.run, nonce), payload)
        await self.client.publish(topics.register_up(self.run, nonce), payload, qos=QOS)

    async def serve(self) -> int:
        """Handle messages until Bye (0) or a failure; returns the process exit code."""
        unanswered = 0.0  # seconds of Hellos without a Welcome
        while True:
            timeout = self._timeout()
            try:
                message = await self.inbox.get(timeout)
            except TimeoutError:
                if self.me is None and (unanswered := unanswered + HELLO_EVERY) < REGISTER_TIMEOUT:
                    await self._hello()
                    continue
                silent = unanswered if self.me is None else timeout
                raise AgentFailure(self._silence(silent)) from None
            done = await self._dispatch(message)
            if done:
                return 0

    def _timeout(self) -> float:
        if self.me is None:
            return HELLO_EVERY
        return self.session.setup.deadline if self.session and self.running else IDLE_TIMEOUT

    def _silence(self, timeout: float | None) -> str:
        if self.me is None:
            return f"no answer to registration within {timeout:.0f} s: is the orchestrator running?"
        if self.session is None or not self.running:
            return f"agent {self.me}: no word from the orchestrator for {timeout:.0f} s; leaving"
        core = self.session.core
        return (
            f"agent {self.me}: nothing received for {timeout:.0f} s in round {core.round}; "
            f"waiting for agents {core.waiting_for()} (crashed or disconnected?)"
        )

    async def _dispatch(self, message: aiomqtt.Message) -> bool:
        topic = message.topic.value
        payload = bytes(message.payload) if isinstance(message.payload, bytes | bytearray) else b""
        peer = topics.parse_peer_topic(topic)
        if peer is not None:
            if self.running:
                await self._on_peer(peer[2], payload)
            else:
                self.early.append(message)
            return False
        try:
            msg = wire.decode_control(payload)
        except Rejected as exc:
            self._count(exc, topic)
            return False
        return await self._on_control(msg)

    async def _on_control(self, msg: control.Control) -> bool:
        match msg:
            case control.Welcome(nonce=nonce) if nonce == self.nonce:
                self.me, self.orchestrator_key = msg.agent, msg.orchestrator_key
            case control.Setup():
                await self._on_setup(msg)
            case control.Go() if self.session is not None and not self.running:
                await self._start()
            case control.Abort(reason=reason):
                raise AgentFailure(f"aborted by the orchestrator: {reason}")
            case control.Bye():
                return True
            case _:
                log.debug("ignoring %s", type(msg).__name__)
        return False

    async def _on_setup(self, setup: control.Setup) -> None:
        if self.me is None or setup.spec.agent != self.me:
            raise AgentFailure(f"setup for agent {setup.spec.agent} reached agent {self.me}")
        directory = {m: keys.PublicIdentity.from_bytes(b) for m, b in setup.directory.items()}
        spec = setup.spec
        loss = LeastSquares.from_spec(setup.problem, spec.agent, spec.agents)
        core = AgentCore(spec, loss, self.identity, directory)
        link_keys = {
            m: keys.link_key(self.identity, pub, spec.session, self.me, m)
            for m, pub in directory.items()
            if m != self.me
        }
        first = self.session is None
        self.session = Session(setup, core, link_keys, self.orchestrator_key)
        self.rejected.clear()
        self.traffic = Traffic()
        if first:
            await self.client.subscribe(topics.inbox_filter(self.run, self.me), qos=QOS)
            await self.client.subscribe(topics.ctl_down(self.run, self.me), qos=QOS)
            await self.client.subscribe(topics.ctl_down(self.run, "all"), qos=QOS)
        await self._control(control.Ready(self.me))

    async def _start(self) -> None:
        assert self.session is not None
        self.running = True
        self.session.started = time.perf_counter()
        await self._emit(self.session.core.start())
        early, self.early = self.early, []
        for message in early:
            await self._dispatch(message)
        await self._maybe_finish()

    async def _on_peer(self, sender: int, payload: bytes) -> None:
        assert self.session is not None and self.me is not None
        core = self.session.core
        try:
            msg = wire.decode_peer(
                payload,
                receiver=self.me,
                topic_sender=sender,
                dim=core.spec.dim,
                link_keys=self.session.link_keys,
            )
        except Rejected as exc:
            self._count(exc, f"from agent {sender}")
            return
        try:
            out = core.receive(msg)  # counts its own rejections
        except Rejected as exc:
            log.warning("rejected message from agent %s: %s", sender, exc)
            return
        except keys.BadKey as exc:
            raise AgentFailure(f"agent {self.me}: {exc}") from exc
        await self._emit(out)
        await self._maybe_finish()

    async def _maybe_finish(self) -> None:
        assert self.session is not None and self.me is not None
        if not self.session.core.done:
            return
        self.running = False
        rejected = dict(Counter(self.session.core.counters.rejected) + self.rejected)
        wall = time.perf_counter() - self.session.started
        topic = topics.ctl_up(self.run, self.me)
        own, size = -1, 0  # Finished counts its own PUBLISH, whose size depends on that count:
        while size != own:  # iterate to the fixed point (sizes only grow, so it comes fast)
            own = size
            sent = self.traffic.bytes + Counter(control=own)
            messages = self.traffic.messages + Counter(control=1)
            finished = control.Finished(self.me, rejected, dict(sent), dict(messages), wall)
            payload = wire.encode_control(finished)
            size = topics.mqtt_publish_size(topic, len(payload), QOS)
        await self._publish(topic, payload, "control")

    def _count(self, exc: Rejected, where: str) -> None:
        self.rejected[exc.reason] += 1
        log.warning("rejected message %s: %s", where, exc)


def telemetry_context(run: str, agent: int, round_: int) -> bytes:
    """Associated data of a sealed report: binds it to its run, agent and round."""
    return f"privnet/telemetry/{run}/{agent}/{round_}".encode()


async def run_agent(broker: BrokerAddress, run: str, requested_id: int | None = None) -> int:
    """Connect, register, serve sessions until Bye. Returns the exit code."""
    try:
        async with (
            aiomqtt.Client(
                broker.host,
                broker.port,
                max_inflight_messages=200,
                socket_options=topics.NODELAY,
                keepalive=30,
            ) as client,
            Inbox(client) as inbox,
        ):
            # A round publishes to every neighbour at once; aiomqtt warns past 10 pending.
            client.pending_calls_threshold = 200
            shell = AgentShell(client, inbox, run, requested_id)
            await shell.register()
            try:
                return await shell.serve()
            except AgentFailure as exc:
                log.error("%s", exc)
                if shell.me is not None:  # tell the orchestrator why before leaving
                    failed = control.Failed(shell.me, str(exc))
                    await client.publish(
                        topics.ctl_up(run, shell.me),
                        wire.encode_control(failed),
                        qos=QOS,
                        timeout=5,
                    )
                return 2
    except aiomqtt.MqttError as exc:
        log.error("agent %s: lost the broker at %s: %s", requested_id, broker, exc)
        return 3

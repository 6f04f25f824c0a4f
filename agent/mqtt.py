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
import random
import secrets
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

import gmqtt
import gmqtt.mqtt.handler
import gmqtt.storage
from gmqtt.mqtt.connection import MQTTConnection
from gmqtt.mqtt.constants import MQTTv311
from gmqtt.mqtt.package import Package
from gmqtt.mqtt.protocol import BaseMQTTProtocol, MQTTProtocol

from agent import keys, topics
from agent.access import ClientAccess
from agent.node import AgentNode, Launch, Phase
from agent.private import private_dir, write_private
from agent.protocol import PEER_QOS, QOS, Checkpoint, Output, Unsubscribe
from agent.spec import ConfigError

log = logging.getLogger("privnet.agent")
PAUSED = 1.0  # seconds a wait overran: this process itself was not running
BACKLOG_READ = 0.2  # seconds to let the socket's backlog in after such a pause
_GMQTT_LOG = logging.getLogger("privnet.gmqtt")
T = TypeVar("T")
_GMQTT_LOG.setLevel(logging.ERROR)  # gmqtt logs every connect and disconnect at INFO
# ... and a lost connection with a traceback, from its module loggers: `Connection` says it
logging.getLogger("gmqtt").setLevel(logging.ERROR)


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
            raise ConfigError(
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
    """The broker refused us, or the connection to it ended for good (the reconnect budget
    was spent, or the broker refused the credentials)."""


class CouldNotConnect(MqttError):
    """The first connection was never made: nothing there, no answer, or no MQTT."""


RECONNECT_FIRST = 0.1  # s: the first pause after a loss, doubled per failed attempt ...
RECONNECT_MAX = 2.0  # ... up to this
RECONNECT_BUDGET = 60.0  # s of outage before a Connection gives up (`give_up`)
ATTEMPT_TIMEOUT = 5.0  # s for one reconnect attempt (TCP, TLS, CONNACK)
OUTAGE_BUFFER = 1000  # QoS-1 publishes kept while disconnected, sent after the reconnect
_REFUSED_FOR_GOOD = frozenset({1, 2, 4, 5})  # CONNACK codes a retry cannot fix (3.1.1)


@dataclass
class Outages:
    """What losing the broker cost one connection (see `Connection`)."""

    losses: int = 0  # connections lost
    reconnects: int = 0  # ... and made again
    attempts: int = 0  # connection attempts that failed
    seconds: float = 0.0  # time without a connection (ended outages)
    dropped: int = 0  # publishes not sent: QoS 0 while disconnected, or QoS 1 beyond the buffer
    buffered: int = 0  # QoS-1 publishes made while disconnected and sent after the reconnect
    resent: int = 0  # QoS-1 publishes unacknowledged at a loss, sent again after it


Deliver = Callable[[str, bytes, bool], None]  # (topic, payload, retained)
Taker = Callable[[str, bytes, bool], bool]  # ... True: taken, False: queue it
_PUBLISH_QOS0 = 0x30  # fixed-header byte of a QoS-0 PUBLISH, flags DUP and RETAIN masked out
# Fixed-header bytes a broker may send (3.1.1; PUBLISH with any flags): a server whose first
# byte is none of them speaks another protocol (an HTTP server's "HTTP/1.1 ...", say).
_FROM_BROKER = frozenset([0x20, 0x40, 0x50, 0x62, 0x70, 0x90, 0xB0, 0xD0, 0xE0, *range(0x30, 0x40)])
NOT_MQTT_SHOWN = 40  # bytes of a non-MQTT server's answer quoted in the error


class _Protocol(MQTTProtocol):  # type: ignore[misc,unused-ignore]
    """gmqtt's MQTT protocol, reading where the bytes arrive and writing in batches.

    gmqtt feeds what the socket gives to a StreamReader, and a read task of its own wakes to
    parse it: one more event-loop turn per read, and amqtt sends every message alone. Here
    `data_received` parses at once. A QoS-0 PUBLISH (every peer frame: MQTT 3.1.1, no
    properties) goes straight to `deliver`; gmqtt's handler would unpack it twice, parse
    properties and ask `inspect` whether our callback is a coroutine, per message. Every
    other packet takes gmqtt's own path, in order. A QoS-0 PUBLISH is also built here
    (`publish_qos0`): gmqtt's Message and packet builder cost as much as the rest of a send.

    Within `corked()` the packets written are joined into one transport write when it ends:
    a step's publishes leave in one syscall, and the broker reads them in one."""

    def __init__(self, *args: Any, deliver: Deliver, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deliver = deliver
        self._unparsed = b""
        self._corked: list[bytes] | None = None
        self._heard = False  # any byte from the server yet
        self.not_mqtt: bytes | None = None  # what a server that is no MQTT broker answered

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        BaseMQTTProtocol.connection_made(self, transport)  # not gmqtt's: no read task

    def data_received(self, data: bytes) -> None:
        if not self._heard:
            self._heard = True
            if data[0] not in _FROM_BROKER:  # an HTTP server, say: its words, not a packet
                self.not_mqtt = data[:NOT_MQTT_SHOWN]
                self._transport.close()
                return
        data = self._unparsed + data if self._unparsed else data
        parsed = self._read_packet(data)
        if parsed < 0:  # a malformed length: gmqtt stops reading, the keepalive ends it
            self._unparsed = b""
            self._transport.close()
            return
        self._unparsed = data[parsed:]

    def eof_received(self) -> bool:
        return False  # close the transport: `connection_lost` tells gmqtt

    def _read_packet(self, data: bytes) -> int:
        """Handle every whole packet in `data`; how many bytes they took (-1: malformed)."""
        connection = self._connection
        connection._last_data_in = time.monotonic()
        at, end = 0, len(data)
        while end - at >= 2:
            size, shift, body = 0, 0, at + 1
            while True:  # the remaining length: up to 4 bytes, 7 bits each
                if body >= end:
                    return at
                byte = data[body]
                size |= (byte & 0x7F) << shift
                body += 1
                if not byte & 0x80:
                    break
                shift += 7
                if shift > 21:
                    return -1
            if body + size > end:
                break
            command, at = data[at], body + size
            if command & 0xF6 == _PUBLISH_QOS0 and self._deliver_publish(
                command, data[body:at], connection
            ):
                continue
            connection.put_package(Package(command, data[body:at]))
        return at

    def _deliver_publish(self, command: int, packet: bytes, connection: MQTTConnection) -> bool:
        """Deliver a QoS-0 PUBLISH; False leaves it to gmqtt (an unusual topic, an old
        connection)."""
        length = int.from_bytes(packet[:2], "big")
        try:
            topic = packet[2 : 2 + length].decode()
        except UnicodeDecodeError:
            return False
        if not topic or connection._handler.current_connection is not connection:
            return False
        self._deliver(topic, packet[2 + length :], bool(command & 0x01))
        return True

    def publish_qos0(self, topic: str, payload: bytes) -> None:
        """The PUBLISH gmqtt would build for it (MQTT 3.1.1: no properties)."""
        self.write_data(topics.publish_packet(topic, payload))

    def write_data(self, data: bytes) -> None:
        if self._corked is None:
            super().write_data(data)
        else:
            self._corked.append(data)

    @contextlib.contextmanager
    def corked(self) -> Iterator[None]:
        """Hold what is written meanwhile, and write it as one."""
        if self._corked is not None:  # already corked: the outer block writes
            yield
            return
        held: list[bytes] = []
        self._corked = held
        try:
            yield
        finally:
            self._corked = None
            if held:
                super().write_data(b"".join(held))


class _Client(gmqtt.Client):  # type: ignore[misc,unused-ignore]
    """gmqtt's client without its own reconnect (`Connection` reconnects), on `_Protocol`.

    gmqtt's `reconnect` waits a fixed `reconnect_delay`, always asks for a persistent session
    (clean_session=False, whatever the client was made with: the broker would keep a session
    for our random id forever), never resubscribes and gives up silently; `reconnect_retries`
    0 still allows one attempt. Its handler calls `reconnect` on every loss and on refused
    CONNACKs: here that does nothing.

    `_create_connection` is gmqtt's with `_Protocol` in place of its own (gmqtt takes no
    protocol class as a parameter)."""

    def __init__(self, *args: Any, deliver: Deliver, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deliver = deliver
        self.protocol: _Protocol | None = None  # of the latest connection

    async def reconnect(self, delay: bool = False) -> None:
        return None

    async def _create_connection(
        self, host: str, port: int, ssl: Any, clean_session: bool, keepalive: int
    ) -> MQTTConnection:
        self._exit_reconnecting_state()
        self._package_handler.clear_topics_aliases()
        self._connack_received.clear()
        self._connection_lost.clear()
        factory = partial(
            _Protocol,
            deliver=self._deliver,
            connection_state=self._connection_state,
            id_generator=self._package_handler.id_generator,
        )
        transport, self.protocol = await asyncio.get_running_loop().create_connection(
            factory, host, port, ssl=ssl
        )
        return MQTTConnection(
            transport,
            self.protocol,
            clean_session,
            keepalive,
            package_handler=self._package_handler,
            logger=self._logger,
        )

    def corked(self) -> contextlib.AbstractContextManager[None]:
        """Publishes made within it leave in one write (`_Protocol.corked`)."""
        return contextlib.nullcontext() if self.protocol is None else self.protocol.corked()


class _Inflight(gmqtt.storage.PersistentStorage):  # type: ignore[misc,unused-ignore]
    """gmqtt's store of unacknowledged outgoing QoS-1 PUBLISHes, remembering what each
    carried. gmqtt replays the store itself when the broker kept our session; when it did not
    (a clean session, or a restarted broker) gmqtt `clear`s it, and those messages would be
    lost: they go to `orphans` instead, and `Connection` publishes them again."""

    def __init__(self) -> None:
        super().__init__()
        self.next: tuple[str, bytes, int] | None = None  # what `Connection.publish` is sending
        self.sent: dict[int, tuple[str, bytes, int]] = {}
        self.orphans: list[tuple[str, bytes, int]] = []

    def push_message(self, mid: int, raw_package: bytes) -> None:
        super().push_message(mid, raw_package)
        if self.next is not None:
            self.sent[mid], self.next = self.next, None

    def remove_message_by_mid(self, mid: int) -> None:
        self.sent.pop(mid, None)
        super().remove_message_by_mid(mid)

    def clear(self) -> None:
        self.orphans += self.sent.values()
        self.sent.clear()
        super().clear()


class _Lost(MqttError):
    """The connection dropped before an acknowledgement: wait for the reconnect."""


class Connection:
    """One MQTT 3.1.1 client on gmqtt: subscribe, publish, and `get` what arrives, across
    broker restarts.

    gmqtt speaks MQTT straight from an asyncio protocol, where aiomqtt drives paho's
    blocking-socket loop from the event loop: on the bench's raw load (30 clients, two
    processes, mosquitto, QoS 0) it moves 5 to 8 times the messages per CPU second.
    Deliveries go to a plain queue (cancellation-safe, like `agent.inbox.Inbox`), or while
    a `get` waits within `taking`, straight to a taker (`pump`'s fast path).

    A lost connection is made again: after RECONNECT_FIRST s, doubling to RECONNECT_MAX
    (with jitter, so a restarted broker is not hit by every client at once), for `give_up`
    seconds; then `get`, `publish` and `(un)subscribe` raise MqttError. A refusal of our
    credentials ends it at once. Sessions are clean. The client identifier sent is random
    (gmqtt draws a uuid4); a broker with the run's users makes it the username (mosquitto's
    `use_username_as_clientid`, and the embedded broker likewise), so only another connection
    of the same user can displace this one. The broker forgets our subscriptions with the
    connection, so after each reconnect every subscription held is made again at its QoS
    before anything else is sent. While disconnected:
    - QoS-0 publishes (the peer plane) are dropped and counted (`outages.dropped`): the
      broker would not have kept them for an absent subscriber either, and the state machines
      tolerate a lost frame (a stalled round is the conductor's to repeat);
    - QoS-1 publishes (control, telemetry) are kept, up to OUTAGE_BUFFER, and sent after the
      reconnect, as are those the broker had not acknowledged when the connection dropped
      (gmqtt would drop them: the new session is clean). The receivers drop duplicates.
    What the broker itself held when it died (frames queued for a subscriber) is gone, and a
    frame sent after our reconnect to a subscriber that has not reconnected yet finds no
    subscription: only a resend by the state machines recovers those.
    `get` just waits through an outage, so a machine's ticks go on; `outages` counts it all.
    """

    def __init__(
        self,
        broker: BrokerAddress,
        access: ClientAccess,
        keepalive: int = 30,
        give_up: float = RECONNECT_BUDGET,
        first_wait: float = 0.0,
        connect_timeout: float | None = None,
    ) -> None:
        self.broker, self.access, self.keepalive, self.give_up = broker, access, keepalive, give_up
        self.first_wait = first_wait
        self.connect_timeout = give_up if connect_timeout is None else connect_timeout
        self._first: asyncio.Future[str] | None = None  # the first connect, closed: why
        self._inflight = _Inflight()
        self._client = _Client(
            "",
            clean_session=True,
            logger=_GMQTT_LOG,
            persistent_storage=self._inflight,
            deliver=self._deliver,
        )
        self._client.on_message = self._on_message
        self._client.on_disconnect = self._on_disconnect
        self._client.on_subscribe = self._on_ack
        self._client.on_unsubscribe = self._on_ack
        if access.username is not None:
            self._client.set_auth_credentials(access.username, access.password)
        self._queue: deque[tuple[str, bytes, bool] | None] = deque()  # None: lost for good
        self._waiter: asyncio.Future[None] | None = None  # of the `get` waiting
        self._taker: Taker | None = None
        self._interrupted = False
        self._acks: dict[int, asyncio.Future[None]] = {}  # SUBACKs and UNSUBACKs by mid
        self._lost: str | None = None  # why the connection ended for good
        self._closing = False
        self._up = False  # connected, and every subscription made again
        self._settled = asyncio.Event()  # set while up, and once given up
        self._reconnecting: asyncio.Task[None] | None = None
        self._held: list[tuple[str, bytes, int]] = []  # QoS-1 publishes made while down
        self.outages = Outages()
        self.generation = 0  # successful reconnects so far: a change means frames were lost

    def _ssl(self) -> Any:
        if not self.access.tls:
            return False
        import ssl as ssl_module

        return ssl_module.create_default_context(cafile=self.access.ca_file)

    async def _connect(self) -> None:
        await self._client.connect(
            self.broker.host,
            self.broker.port,
            ssl=self._ssl(),
            keepalive=self.keepalive,
            version=MQTTv311,
        )

    async def __aenter__(self) -> Self:
        """Connect. For up to `first_wait` s the broker may not be there yet (a host's broker
        that comes up after its agents): attempts back off as reconnects do. Past it, a
        server that refuses, closes, answers in another protocol or says nothing within
        `connect_timeout` ends it with MqttError saying which (nothing was lost, so nothing
        is made again)."""
        end, pause = time.monotonic() + self.first_wait, RECONNECT_FIRST
        while True:
            try:
                await self._connect_first()
                break
            except CouldNotConnect as exc:
                if time.monotonic() + pause > end:
                    await self._close()
                    raise
                if not self.outages.attempts:
                    log.warning("no broker at %s yet (%s); trying again", self.broker, exc)
                self.outages.attempts += 1
                with contextlib.suppress(Exception):  # what this attempt left half made
                    await self._client._disconnect()
            except MqttError:
                await self._close()
                raise
            await asyncio.sleep(pause * random.uniform(0.5, 1.0))
            pause = min(2 * pause, RECONNECT_MAX)
        self._up = True
        self._settled.set()
        return self

    async def _connect_first(self) -> None:
        """One first attempt within `connect_timeout`: CouldNotConnect when no broker
        answered, MqttError when one refused us for good."""
        loop = asyncio.get_running_loop()
        self._first = closed = loop.create_future()
        attempt = loop.create_task(self._connect())
        try:
            done, _ = await asyncio.wait(
                (attempt, closed), timeout=self.connect_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if attempt in done:
                attempt.result()
            elif closed.done():
                raise ConnectionError(closed.result())
            else:
                raise TimeoutError(f"no answer to CONNECT in {self.connect_timeout:.0f} s")
        except (OSError, gmqtt.mqtt.handler.MQTTConnectError) as exc:
            attempt.cancel()
            with contextlib.suppress(BaseException):
                await attempt
            if getattr(exc, "_code", None) in _REFUSED_FOR_GOOD:  # a broker, saying no
                raise MqttError(f"the broker at {self.broker} refused us: {exc}") from None
            raise CouldNotConnect(
                f"could not connect to the broker at {self.broker}: {exc}"
            ) from None
        finally:
            self._first = None

    async def __aexit__(self, *exc_info: object) -> None:
        await self._close()

    async def _close(self) -> None:
        self._closing = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
            with contextlib.suppress(BaseException):
                await self._reconnecting
        with contextlib.suppress(Exception):
            await self._client.disconnect()

    def _on_message(self, _c: Any, topic: str, payload: bytes, _qos: int, props: Any) -> int:
        self._deliver(topic, payload, bool(props.get("retain")))
        return 0  # PUBACK: success

    def _deliver(self, topic: str, payload: bytes, retained: bool) -> None:
        waiter = self._waiter
        if (
            self._taker is None
            or waiter is None
            or waiter.done()  # woken already: what comes meanwhile waits its turn
            or not self._taker(topic, payload, retained)
        ):
            self._queue.append((topic, payload, retained))
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def interrupt(self) -> None:
        """End the `get` under way (or else the next) as if its time had run out, before
        any delivery."""
        self._interrupted = True
        self._wake()

    @contextlib.contextmanager
    def taking(self, taker: Taker) -> Iterator[None]:
        """While a `get` waits within this block, a delivery (none being queued) goes to
        `taker` at once, from the transport's callback: no task wakes for it. A taker
        returns False to have it queued instead, and returns the next `get`."""
        self._taker = taker
        try:
            yield
        finally:
            self._taker = None

    def _on_disconnect(self, _c: Any, _packet: Any, exc: BaseException | None = None) -> None:
        for waiter in self._acks.values():
            if not waiter.done():
                waiter.set_exception(_Lost("connection lost before an acknowledgement"))
        self._acks.clear()
        if self._first is not None:  # the first connect: it failed, nothing was lost
            if not self._first.done():
                self._first.set_result(self._refusal(exc))
            return
        if self._closing or self._lost is not None:
            return
        if self._reconnecting is not None and not self._reconnecting.done():
            return  # a failed attempt of the reconnect under way: it retries by itself
        self._up = False
        self._settled.clear()
        self.outages.losses += 1
        log.warning("lost the broker at %s (%s); reconnecting", self.broker, exc or "closed")
        self._reconnecting = asyncio.get_running_loop().create_task(self._reconnect())

    def _refusal(self, exc: BaseException | None) -> str:
        """Why the server closed a connection it never acknowledged."""
        heard = None if self._client.protocol is None else self._client.protocol.not_mqtt
        if heard is not None:
            return f"the server there does not speak MQTT (it answered {heard!r})"
        return f"it closed the connection before answering ({exc or 'no reason given'})"

    def _on_ack(self, _c: Any, mid: int, *_rest: Any) -> None:
        waiter = self._acks.pop(mid, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _reconnect(self) -> None:
        """Connect again with backoff, resubscribe, send what waited; or give up."""
        began = time.monotonic()
        end, pause, attempts, why = began + self.give_up, RECONNECT_FIRST, 0, "none made"
        while (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(pause * random.uniform(0.5, 1.0), left))
            pause = min(2 * pause, RECONNECT_MAX)
            attempts += 1
            try:
                async with asyncio.timeout(min(ATTEMPT_TIMEOUT, max(end - time.monotonic(), 0.5))):
                    await self._connect()
                    await self._resubscribe()
            except gmqtt.mqtt.handler.MQTTConnectError as exc:
                if getattr(exc, "_code", None) in _REFUSED_FOR_GOOD:
                    self._give_up(began, f"the broker at {self.broker} refused us: {exc}")
                    return
                why = str(exc)
            except (OSError, TimeoutError, MqttError) as exc:
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                self._resume(began, attempts)
                return
            self.outages.attempts += 1
            with contextlib.suppress(Exception):  # what this attempt left half made
                await self._client._disconnect()
        self._give_up(
            began,
            f"connection to the broker at {self.broker} lost, and not made again in "
            f"{self.give_up:.0f} s ({attempts} attempts; the last: {why})",
        )

    async def _resubscribe(self) -> None:
        """Every subscription gmqtt holds, at its QoS: a clean session starts with none.

        A loss from here on fails the waiters (`_on_disconnect`); one since the CONNACK (a
        client of our user displacing us, say) must fail the attempt as promptly."""
        if not self._client.is_connected:
            raise _Lost("connection lost right after the CONNACK")
        waits = []
        for sub in list(self._client.subscriptions):
            waiter = asyncio.get_running_loop().create_future()
            self._acks[self._client.resubscribe(sub)] = waiter
            waits.append(waiter)
        await asyncio.gather(*waits)

    def _resume(self, began: float, attempts: int) -> None:
        took = time.monotonic() - began
        o = self.outages
        o.reconnects += 1
        o.seconds += took
        self.generation += 1
        self._up = True
        self._settled.set()
        orphans, self._inflight.orphans = self._inflight.orphans, []
        held, self._held = self._held, []
        for topic, payload, qos in orphans + held:
            self.publish(topic, payload, qos)
        o.resent += len(orphans)
        o.buffered += len(held)
        log.warning(
            "broker at %s back after %.2f s (%d attempts): %d subscriptions made again, "
            "%d unacknowledged and %d held QoS-1 publishes sent; %d publishes dropped so far",
            self.broker,
            took,
            attempts,
            len(self._client.subscriptions),
            len(orphans),
            len(held),
            o.dropped,
        )

    def _give_up(self, began: float, why: str) -> None:
        self._lost = why
        self.outages.seconds += time.monotonic() - began
        self._settled.set()
        self._queue.append(None)
        self._wake()
        log.error("%s", why)

    async def _wait_up(self) -> None:
        """Until connected (at once if so); MqttError once the budget is spent."""
        while True:
            if self._lost is not None:
                raise MqttError(self._lost)
            if self._up:
                return
            await self._settled.wait()

    async def _acked(self, send: Callable[[], int], timeout: float) -> None:
        """Send a SUBSCRIBE or UNSUBSCRIBE and wait for its acknowledgement; if the connection
        drops first, for the reconnect (which makes gmqtt's list of subscriptions true)."""
        await self._wait_up()
        waiter = asyncio.get_running_loop().create_future()
        self._acks[send()] = waiter
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except _Lost:
            await self._wait_up()
        except TimeoutError:
            raise MqttError(
                f"the broker at {self.broker} did not acknowledge in {timeout:.0f} s"
            ) from None

    async def subscribe(self, topic: str, qos: int = QOS, timeout: float = 10.0) -> None:
        """Subscribe and wait for the SUBACK (through an outage: for the reconnect)."""
        await self._acked(lambda: int(self._client.subscribe(topic, qos=qos)), timeout)

    async def unsubscribe(self, topic: str, timeout: float = 10.0) -> None:
        """Unsubscribe and wait for the UNSUBACK (through an outage: for the reconnect)."""
        await self._acked(lambda: int(self._client.unsubscribe(topic)), timeout)

    @property
    def queued(self) -> int:
        """Deliveries waiting for a `get`."""
        return len(self._queue)

    @property
    def up(self) -> bool:
        """Connected, with every subscription made again: deliveries can flow."""
        return self._up and bool(self._client.is_connected)

    def publish(self, topic: str, payload: bytes, qos: int = QOS) -> None:
        """Queue one PUBLISH on the socket (QoS 1: kept until its PUBACK, and across a
        reconnect). While disconnected QoS 0 is dropped and QoS 1 held (see the class)."""
        if self._up and self._client.is_connected:
            if not qos and self._client.protocol is not None:
                self._client.protocol.publish_qos0(topic, payload)
                return
            self._inflight.next = (topic, payload, qos) if qos else None
            try:
                self._client.publish(topic, payload, qos=qos)
            finally:
                self._inflight.next = None
        elif self._lost is not None:
            raise MqttError(self._lost)
        elif qos and len(self._held) < OUTAGE_BUFFER:
            self._held.append((topic, payload, qos))
        else:
            self.outages.dropped += 1

    def corked(self) -> contextlib.AbstractContextManager[None]:
        """Publishes made within it leave in one socket write, when it ends."""
        return self._client.corked()

    async def get(self, timeout: float | None = None) -> tuple[str, bytes, bool]:
        """The next (topic, payload, retained); TimeoutError after `timeout` s (or an
        `interrupt`); MqttError once the connection is lost for good (an outage is waited
        through). One caller at a time."""
        if not self._queue and not self._interrupted:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            timer = None if timeout is None else loop.call_later(max(timeout, 0.0), self._wake)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        if self._interrupted or not self._queue:
            self._interrupted = False
            raise TimeoutError
        item = self._queue[0]
        if item is None:  # left in place: every later get sees it too
            raise MqttError(self._lost or "connection to the broker ended")
        self._queue.popleft()
        return item


def client(
    broker: BrokerAddress,
    access: ClientAccess,
    give_up: float = RECONNECT_BUDGET,
    *,
    first_wait: float = 0.0,
    connect_timeout: float | None = None,
) -> Connection:
    """A connection as every privnet party makes it (use with `async with`)."""
    return Connection(
        broker, access, give_up=give_up, first_wait=first_wait, connect_timeout=connect_timeout
    )


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
    rejoin: bool = False  # started again mid-run: come back from the checkpoint, if any
    checkpoints: str | None = None  # directory for this agent's checkpoint file

    ENV = "PRIVNET_LAUNCH"  # the whole launch as JSON, in one variable
    GROUP_ENV = "PRIVNET_LAUNCHES"  # several agents in one process: a JSON list of launches

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def to_env(self) -> dict[str, str]:
        return {self.ENV: self.to_json()}

    @classmethod
    def group_json(cls, launches: list[AgentLaunch]) -> str:
        """Several launches as one JSON list: $PRIVNET_LAUNCHES, or a stack's launches.json."""
        return json.dumps([asdict(a) for a in launches])

    @classmethod
    def group_env(cls, launches: list[AgentLaunch]) -> dict[str, str]:
        return {cls.GROUP_ENV: cls.group_json(launches)}

    @classmethod
    def group_from_env(cls, env: Mapping[str, str] = os.environ) -> list[AgentLaunch] | None:
        text = env.get(cls.GROUP_ENV)
        return None if text is None else cls.group_from_json(text, f"${cls.GROUP_ENV}")

    @classmethod
    def group_from_json(cls, text: str, where: str) -> list[AgentLaunch]:
        try:
            items = json.loads(text)
            if not isinstance(items, list) or not items:
                raise ValueError("not a non-empty list")
        except ValueError as exc:
            raise ValueError(f"{where} is not a list of launches: {exc}") from None
        return [cls.from_json(json.dumps(item), f"{where}[{n}]") for n, item in enumerate(items)]

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
        launch = Launch(self.run, int(self.agent), identity, token, bool(self.rejoin))
        access = ClientAccess(self.username, self.password, self.tls, self.ca_file)
        return BrokerAddress.parse(self.broker), launch, access


class Machine(Protocol):
    """A sans-IO party: the agent node or the orchestrator's conductor."""

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output: ...
    def tick(self, now: float) -> Output: ...
    def next_tick(self) -> float | None: ...
    def unsubscribed(self, topic: str, now: float) -> Output: ...
    def deaf(self, now: float) -> Output: ...


PROBE = b"privnet/probe\0"  # never a frame: frames are msgpack arrays
PROBE_TIMEOUT = 30.0


def publish(client: Connection, out: Output) -> None:
    """Everything a machine returned, each at its category's QoS (`QOS_OF`), in one write."""
    if not out.publish:
        return
    with client.corked():
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
    last = clock()  # when the machine was last fed
    fast = _FastPath(client, machine, until, on_output)
    while not until():
        wake = machine.next_tick()
        waits = [w for w in (None if wake is None else wake - clock(), every) if w is not None]
        timeout = max(0.0, min(waits)) if waits else None
        fast.arm(None if timeout is None else last + timeout)
        try:
            with client.taking(fast):
                topic, payload, retained = await client.get(timeout)
        except TimeoutError:
            out = Output()
        else:
            out = machine.receive(topic, payload, clock(), retained)
        if fast.error is not None:
            raise fast.error
        if fast.stops:  # the fast path fed the machine, which asked to unsubscribe
            stops, fast.stops = fast.stops, []
            for stop in stops:
                await _drain_and_stop(client, machine, stop, on_output)
            last = clock()
            continue
        # Longer since the last feed than the wait allowed: this process was not running
        # (stopped while waiting or while working), whatever it was doing.
        deaf = client.outages.reconnects != fast.reconnects  # silence meanwhile proves nothing
        if timeout is not None and clock() - last > timeout + PAUSED:
            out += await _backlog(client, machine)
            deaf = True
        if deaf or not client.up:  # no deadline runs out while nothing can be heard
            fast.reconnects = client.outages.reconnects
            out += machine.deaf(clock())
        wake = machine.next_tick()
        if wake is not None and clock() >= wake:
            out += machine.tick(clock())
        await _apply(client, machine, out, on_output)
        last = clock()


class _FastPath:
    """`pump`'s work for one delivery, done in the transport's callback while the pump
    waits (`Connection.taking`): no task wakes and no timer is set per delivery.

    Only the plain case: the pump's own loop takes a delivery (`False`: queued) that may
    come after a pause of this process or a reconnect, and is woken (`interrupt`) once the
    machine is done, wants a tick before the pump's timer, or asked to unsubscribe (the
    pump drains and stops; what arrives meanwhile is queued behind)."""

    def __init__(
        self,
        client: Connection,
        machine: Machine,
        until: Callable[[], bool],
        on_output: Callable[[Output], None] | None,
    ) -> None:
        self.client, self.machine, self.until, self.on_output = client, machine, until, on_output
        self.reconnects = client.outages.reconnects
        self.stops: list[Unsubscribe] = []
        self.error: Exception | None = None
        self._timer: float | None = None  # when the pump wakes by itself
        self._paused_after: float | None = None  # a delivery later than this: we were paused

    def arm(self, timer: float | None) -> None:
        """The pump waits until `timer` (None: for a delivery)."""
        self._timer = timer
        self._paused_after = None if timer is None else timer + PAUSED

    def __call__(self, topic: str, payload: bytes, retained: bool) -> bool:
        clock, client, machine = time.monotonic, self.client, self.machine
        now = clock()
        paused = self._paused_after is not None and now > self._paused_after
        if paused or client.outages.reconnects != self.reconnects or not client.up:
            return False
        try:
            out = machine.receive(topic, payload, now, retained)
            if clock() - now > PAUSED:  # stopped while it worked: no tick may count that time
                _report(client, out, self.on_output)
                client.interrupt()  # the pump's loop sees the pause, and says so (deaf)
                return True
            wake = machine.next_tick()
            if wake is not None and clock() >= wake:
                out += machine.tick(clock())
            _report(client, out, self.on_output)
        except Exception as exc:  # raised by the pump, as its own work would
            self.error = exc
            client.interrupt()
            return True
        self.stops += out.unsubscribe
        wake = machine.next_tick()
        early = wake is not None and (self._timer is None or wake < self._timer)
        if self.stops or early or self.until():
            client.interrupt()
        return True


async def _backlog(client: Connection, machine: Machine) -> Output:
    """This process did not run for a while (SIGSTOP, a suspended host): what arrived
    meanwhile is delivered before time is, so a deadline counts the others' silence, not
    our own absence. Only what had arrived: frames that keep coming meanwhile go through
    the pump as usual, between its ticks. Draining until nothing is left never ended where
    frames came as fast as they were read (a thousand agents' telemetry into an orchestrator
    short of CPU), and a machine that never ticks sends no heartbeat: every agent gave up on
    an orchestrator "silent for 120 s"."""
    await asyncio.sleep(BACKLOG_READ)  # let the transport read what the socket holds
    out, waited = Output(), client.queued
    for _ in range(waited):
        try:
            topic, payload, retained = await client.get(0.0)
        except TimeoutError:  # interrupted: the pump goes on
            break
        out += machine.receive(topic, payload, time.monotonic(), retained)
    log.info("back from a pause: %d deliveries had waited", waited)
    return out


async def _apply(
    client: Connection,
    machine: Machine,
    out: Output,
    on_output: Callable[[Output], None] | None,
) -> None:
    """Publish, unsubscribe and report what a machine returned."""
    _report(client, out, on_output)
    for stop in out.unsubscribe:
        await _drain_and_stop(client, machine, stop, on_output)


def _report(client: Connection, out: Output, on_output: Callable[[Output], None] | None) -> None:
    """Publish and report what a machine returned."""
    publish(client, out)
    if on_output is not None:
        on_output(out)


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
    the peer plane's QoS, the very path of the frames it flushes. A reconnect on the way may
    have lost the probe (and the broker whatever it held for us): the probe goes again."""
    nonce = PROBE + secrets.token_bytes(16)
    await client.subscribe(stop.probe, PEER_QOS)
    await client.unsubscribe(stop.pattern)
    sent = client.generation
    client.publish(stop.probe, nonce, PEER_QOS)
    end = time.monotonic() + PROBE_TIMEOUT
    while True:
        if client.generation != sent:
            sent = client.generation
            client.publish(stop.probe, nonce, PEER_QOS)
        try:
            topic, payload, retained = await client.get(min(1.0, end - time.monotonic()))
        except TimeoutError:
            if time.monotonic() < end:
                continue
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
    codes = await asyncio.gather(
        *(run_agent(*launch.parts(), checkpoints=launch.checkpoints) for launch in launches)
    )
    return max(codes)


def checkpoint_path(directory: str | Path, agent: int) -> Path:
    return Path(directory) / f"agent-{agent}.ckpt"


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Atomically (a crash mid-write leaves the previous one), readable by the owner only:
    it holds true models."""
    write_private(path, checkpoint.to_bytes())


def load_checkpoint(path: Path | None) -> Checkpoint | None:
    if path is None or not path.exists():
        return None
    return Checkpoint.from_bytes(path.read_bytes(), str(path))


async def run_agent(
    broker: BrokerAddress,
    launch: Launch,
    access: ClientAccess,
    checkpoints: str | Path | None = None,
) -> int:
    """Register, serve sessions until Bye (0), a failure (2) or a lost broker (3). A broker
    not there yet is waited for, as long as a lost one would be (RECONNECT_BUDGET s).

    With `checkpoints` (a directory) the agent saves its checkpoints there, and, when
    launched to rejoin, starts from the one it finds."""
    path = None if checkpoints is None else checkpoint_path(checkpoints, launch.agent)
    if path is not None:
        private_dir(path.parent)
    start = load_checkpoint(path) if launch.rejoin else None
    if start is not None and (start.run, start.agent) != (launch.run, launch.agent):
        log.warning("agent %s: %s is another run's checkpoint; not used", launch.agent, path)
        start = None
    node = AgentNode(launch, keys.Identity.generate(), checkpoint=start)

    def on_output(out: Output) -> None:
        _log(out, node.me)
        if out.checkpoint is not None and path is not None:
            save_checkpoint(path, out.checkpoint)

    try:
        async with client(broker, access, first_wait=RECONNECT_BUDGET) as mqtt:
            for topic, qos in node.subscription_qos.items():
                await mqtt.subscribe(topic, qos)
            publish(mqtt, node.start(time.monotonic()))
            await pump(mqtt, node, lambda: node.done, on_output)
    except (MqttError, TimeoutError) as exc:
        log.error("agent %s: %s", launch.agent, exc or f"no answer from the broker at {broker}")
        return 3
    return 0 if node.phase is Phase.CLOSED else 2

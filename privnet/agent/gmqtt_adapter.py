"""The gmqtt adapter: the one file of privnet that imports gmqtt, and the only one that
touches its internals, each pinned to the gmqtt in use by tests/test_edges.py.

gmqtt is every party's MQTT client (`privnet.agent.transport.Connection` drives it).
`DirectProtocol` parses where the bytes arrive, with no read task, and hands QoS-0 PUBLISHes
straight on; `GmqttClient` makes its connections on it, never reconnects by itself (the Connection
decides) and aborts a failed attempt; `Inflight` remembers what each unacknowledged QoS-1
PUBLISH carried; `refused_for_good` reads a refusal's CONNACK code. tests/test_edges.py
lists every private member of gmqtt taken here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import gmqtt
import gmqtt.mqtt.handler
import gmqtt.storage
from gmqtt.mqtt.connection import MQTTConnection
from gmqtt.mqtt.constants import MQTTv311
from gmqtt.mqtt.package import Package
from gmqtt.mqtt.protocol import BaseMQTTProtocol, MQTTProtocol

from privnet.agent import topics

_LOG = logging.getLogger("privnet.gmqtt")
_LOG.setLevel(logging.ERROR)  # gmqtt logs every connect and disconnect at INFO
# ... and a lost connection with a traceback, from its module loggers: `Connection` says it
logging.getLogger("gmqtt").setLevel(logging.ERROR)

ConnectError = gmqtt.mqtt.handler.MQTTConnectError  # no CONNACK, or a refusing one
_REFUSED_FOR_GOOD = frozenset({1, 2, 4, 5})  # CONNACK codes a retry cannot fix (3.1.1)
Deliver = Callable[[str, bytes, bool], None]  # (topic, payload, retained)
_PUBLISH_QOS0 = 0x30  # fixed-header byte of a QoS-0 PUBLISH, flags DUP and RETAIN masked out
# Fixed-header bytes a broker may send (3.1.1; PUBLISH with any flags): a server whose first
# byte is none of them speaks another protocol (an HTTP server's "HTTP/1.1 ...", say).
_FROM_BROKER = frozenset([0x20, 0x40, 0x50, 0x62, 0x70, 0x90, 0xB0, 0xD0, 0xE0, *range(0x30, 0x40)])
NOT_MQTT_SHOWN = 40  # bytes of a non-MQTT server's answer quoted in the error
APART = 16 << 10  # a payload this big is written apart from its packet's header


def refused_for_good(exc: BaseException) -> bool:
    """Whether `exc` is a broker's refusal a retry cannot fix (bad credentials, say)."""
    return getattr(exc, "_code", None) in _REFUSED_FOR_GOOD


class DirectProtocol(MQTTProtocol):  # type: ignore[misc,unused-ignore]
    """gmqtt's MQTT protocol, reading where the bytes arrive and writing in batches.

    gmqtt feeds the socket to a StreamReader that a read task of its own parses, one more loop
    turn per read, and unpacks each PUBLISH twice. Here `data_received` parses at once, hands a
    QoS-0 PUBLISH (every peer frame) straight to `deliver`, and sends every other packet
    gmqtt's own way, in order; `publish_qos0` builds one without gmqtt's Message. Within
    `corked()` the packets written leave in one transport write: a step's publishes in one
    syscall, which the broker reads in one."""

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
        """The PUBLISH gmqtt would build for it (MQTT 3.1.1: no properties). A big payload
        (a model's chunk) is written after its header, not copied behind it."""
        if len(payload) < APART:
            self.write_data(topics.publish_packet(topic, payload))
            return
        head = topics.publish_packet(topic, b"", len(payload))
        if self._corked is None:
            self._write_all([head, payload])
        else:
            self._corked += (head, payload)

    def write_data(self, data: bytes) -> None:
        if self._corked is None:
            super().write_data(data)
        else:
            self._corked.append(data)

    def _write_all(self, pieces: list[bytes]) -> None:
        """`pieces` written in order: joined when small (one copy, one syscall), else handed
        over as they are after the first (uvloop's `writelines` is one writev and holds the
        pieces until sent: a step's model frames at 1M parameters, 4 MB an out-link, are not
        copied twice more, into packets and then into one buffer)."""
        if sum(map(len, pieces)) < APART * 16:
            super().write_data(b"".join(pieces))
            return
        super().write_data(pieces[0])  # gmqtt's: it notes the time, or warns of a closed socket
        if self._transport and not self._transport.is_closing():
            self._transport.writelines(pieces[1:])

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
                self._write_all(held)


class NoReconnect(gmqtt.Client):  # type: ignore[misc,unused-ignore]
    """gmqtt's client without its own reconnect: whoever holds it decides what a lost
    connection means (a task of gmqtt's left sleeping would also be cancelled with the loop,
    printing a traceback)."""

    async def reconnect(self, delay: bool = False) -> None:
        return None


class GmqttClient(NoReconnect):
    """gmqtt's client without its own reconnect (`Connection` reconnects), on `DirectProtocol`.

    gmqtt's `reconnect` waits a fixed `reconnect_delay`, always asks for a persistent session
    (clean_session=False, whatever the client was made with: the broker would keep a session
    for our random id forever), never resubscribes and gives up silently; `reconnect_retries`
    0 still allows one attempt. Its handler calls `reconnect` on every loss and on refused
    CONNACKs: here that does nothing.

    `_create_connection` is gmqtt's with `DirectProtocol` in place of its own (gmqtt takes no
    protocol class as a parameter)."""

    def __init__(
        self,
        deliver: Deliver,
        inflight: Inflight,
        client_id: str = "",  # gmqtt draws a random one
        clean_session: bool = True,
    ) -> None:
        super().__init__(
            client_id, clean_session=clean_session, logger=_LOG, persistent_storage=inflight
        )
        self._deliver = deliver
        self.protocol: DirectProtocol | None = None  # of the latest connection

    async def connect311(self, host: str, port: int, ssl: Any, keepalive: int) -> None:
        """Connect, speaking MQTT 3.1.1 (as mosquitto and amqtt do, and `DirectProtocol`
        parses); raises ConnectError (or OSError) when no connection is made."""
        await self.connect(host, port, ssl=ssl, keepalive=keepalive, version=MQTTv311)

    async def abort(self) -> None:
        """Drop what a failed attempt left half made: gmqtt's `_disconnect`, which (unlike
        `disconnect`) waits for nothing."""
        await self._disconnect()

    async def _create_connection(
        self, host: str, port: int, ssl: Any, clean_session: bool, keepalive: int
    ) -> MQTTConnection:
        self._exit_reconnecting_state()
        self._package_handler.clear_topics_aliases()
        self._connack_received.clear()
        self._connection_lost.clear()
        factory = partial(
            DirectProtocol,
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
        """Publishes made within it leave in one write (`DirectProtocol.corked`)."""
        return contextlib.nullcontext() if self.protocol is None else self.protocol.corked()


class Inflight(gmqtt.storage.PersistentStorage):  # type: ignore[misc,unused-ignore]
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


async def stated_packet_limit(
    host: str, port: int, ssl: Any, username: str | None, password: str | None, timeout: float
) -> int | None:
    """The Maximum Packet Size a broker states in its MQTT 5 CONNACK (mosquitto 2 does when
    `max_packet_size` is set); None when it states none, or will not speak MQTT 5 to us
    (a 3.1.1-only broker, credentials it refuses, no answer in `timeout`): then nobody knows.

    A connection of its own, closed at once: privnet's clients speak 3.1.1, whose CONNACK
    carries no properties."""
    stated: dict[str, Any] = {}
    client = NoReconnect("", clean_session=True, logger=_LOG)  # one MQTT 5 connection
    client.on_connect = lambda _c, _f, _rc, properties: stated.update(properties or {})
    if username is not None:
        client.set_auth_credentials(username, password)
    try:
        await asyncio.wait_for(
            client.connect(host, port, ssl=ssl, keepalive=10, version=gmqtt.constants.MQTTv50),
            timeout,
        )
    except (ConnectError, OSError, TimeoutError):
        return None
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.disconnect(), timeout)
    limit = stated.get("maximum_packet_size")
    return int(limit[0]) if limit else None

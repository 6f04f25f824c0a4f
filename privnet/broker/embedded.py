"""An amqtt broker in its own process, for machines without mosquitto.

`python -m privnet.broker.embedded --port N` serves MQTT on 127.0.0.1:N until SIGTERM or SIGINT; its
own process, so a busy broker never competes with the orchestrator. With `--password-file`
and `--acl-file` it refuses anonymous clients and confines each user to its topics (amqtt's
own plugins); with `--certfile/--keyfile` it speaks TLS only. It has no $SYS tree.
`GuardedBroker` closes what amqtt 0.12 leaves open: no packet size limit (it reads any body
up to MQTT's 256 MiB into memory), and a CONNECT that drops a session before its password
is checked. This is the one file that imports amqtt; every private member of amqtt it
touches is pinned by tests/test_edges.py, so an upgrade fails there, naming what to read.
"""

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections import deque
from pathlib import Path
from typing import Any

from amqtt.adapters import BufferReader, StreamReaderAdapter, StreamWriterAdapter
from amqtt.broker import Broker
from amqtt.contexts import Action
from amqtt.errors import AMQTTError, BrokerError, CodecError, MQTTError, NoDataError
from amqtt.events import BrokerEvents
from amqtt.mqtt.connect import ConnectPacket
from amqtt.mqtt.constants import QOS_1, QOS_2
from amqtt.mqtt.packet import CONNECT
from amqtt.mqtt.protocol.broker_handler import BrokerProtocolHandler
from amqtt.mqtt.publish import PublishPacket
from amqtt.session import IncomingApplicationMessage, OutgoingApplicationMessage, Session

from privnet.agent.loop import run_loop
from privnet.agent.topics import MAX_PACKET_SIZE, publish_packet

log = logging.getLogger("privnet.broker")
VERDICTS = 65_536  # memoized ACL verdicts kept at most (a 30-agent run needs about 2,000)
ROUTES = 65_536  # memoized topic -> subscribers routes kept at most (one per topic in use)
BACKLOG = 16 * 2**20  # bytes waiting for one subscriber beyond which QoS-0 copies are dropped
PASSWORDS = "amqtt.plugins.authentication.FileAuthPlugin"  # the plugin of `amqtt_config`'s users
NOT_AUTHORIZED = bytes([0x20, 2, 0, 5])  # CONNACK: refused, not authorized (MQTT 3.1.1)


class PacketReader(StreamReaderAdapter):
    """amqtt's TCP reader, taking one whole MQTT packet at a time from the socket and
    refusing any longer than `limit` bytes.

    Like mosquitto's `max_packet_size`, it compares the remaining length + 1 with the limit
    (leaving out the 1-4 length bytes), so both brokers let exactly the same packets through.
    A packet announced longer is never read: the connection is aborted and amqtt sees the
    end of the stream. amqtt decodes a packet in many small reads (type, each length byte,
    each field); they are served from the packet in memory, not from the stream.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int):
        super().__init__(reader)
        self._writer = writer
        self._limit = limit
        self._packet = b""  # the packet amqtt is reading
        self._at = 0  # how much of it amqtt has read

    async def read(self, n: int = -1) -> bytes:
        if self._at >= len(self._packet):
            self._packet, self._at = await self._next(), 0
        end = len(self._packet) if n < 0 else self._at + n
        data = self._packet[self._at : end]
        self._at += len(data)
        return data

    async def peek(self) -> bytes:
        """The next whole packet, left for amqtt to read (b"": the stream ended)."""
        if self._at >= len(self._packet):
            self._packet, self._at = await self._next(), 0
        return self._packet[self._at :]

    def replace(self, packet: bytes) -> None:
        """Have amqtt read `packet` in place of the one `peek` returned."""
        self._packet, self._at = packet, 0

    async def _next(self) -> bytes:
        """The next whole packet; b"" at the end of the stream, or once one is refused."""
        stream = self._reader
        try:
            header = await stream.readexactly(2)
            while header[-1] & 0x80 and len(header) < 5:
                header += await stream.readexactly(1)
            remaining = sum((b & 0x7F) << 7 * k for k, b in enumerate(header[1:]))
            if header[-1] & 0x80 or 1 + remaining > self._limit:
                why = (
                    "malformed length"
                    if header[-1] & 0x80
                    else f"oversize packet ({remaining + 1} bytes)"
                )
                self._refuse(why)
                return b""
            return header + await stream.readexactly(remaining)
        except (asyncio.IncompleteReadError, ConnectionError):
            return b""

    def _refuse(self, why: str) -> None:
        peer = self._writer.get_extra_info("peername")
        log.warning("%s from %s (max_packet_size %d): disconnecting", why, peer, self._limit)
        self._writer.transport.abort()
        self._reader.feed_eof()


def _transport(writer: Any) -> asyncio.WriteTransport | None:
    """The socket under amqtt's writer of a TCP connection (None for other listeners)."""
    return getattr(getattr(writer, "_writer", None), "transport", None)


def _plain(topic: str | None) -> bool:
    """A topic a client may publish to (amqtt closes the connection of one that does not)."""
    if not topic:
        return False
    return not topic.startswith("$") and "#" not in topic and "+" not in topic


class GuardedBroker(Broker):
    """amqtt's Broker, made safe and fast enough for privnet's load.

    Safe: each connection is read a whole packet at a time (`PacketReader`, the size limit);
    with a password file every CONNECT is authenticated before amqtt sees it (`_admit`) and
    gets its username as client id, so a client can only take its own user's session, as on
    mosquitto with `use_username_as_clientid`. Fast: amqtt asks its ACL plugins about every
    publish and every copy, one task each, and spends a task per copy; the ACL decides on
    (user, topic, action) alone, so its verdicts are kept, and where every subscription of a
    topic is QoS 0 (the whole peer plane) the copies are encoded once and written straight to
    the subscribers, one write each per loop turn. Anything else takes amqtt's own path. A
    subscriber more than `backlog` bytes behind loses QoS-0 copies (`dropped`), not memory."""

    def __init__(
        self, config: dict[str, Any], max_packet_size: int, backlog: int = BACKLOG
    ) -> None:
        super().__init__(config)
        self.max_packet_size = max_packet_size
        self.username_as_client_id = PASSWORDS in config.get("plugins", {})
        self.backlog = backlog
        self.dropped = 0  # QoS-0 copies not sent to a subscriber `backlog` bytes behind
        self._verdicts: dict[tuple[str | None, str, Action], bool] = {}
        self._routes: dict[str, list[tuple[Session, int]]] = {}
        self._outbox: dict[Any, list[bytes]] = {}  # packets waiting for this loop turn's write
        self._holders: dict[str, asyncio.BaseTransport] = {}  # client id -> its connection

    async def _topic_filtering(self, session: Session, topic: str, action: Action) -> bool:
        key = (session.username, topic, action)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = await super()._topic_filtering(session, topic, action)
            if len(self._verdicts) >= VERDICTS:
                self._verdicts.clear()
            self._verdicts[key] = verdict
        return verdict

    async def _handle_client_session(
        self,
        reader: Any,
        writer: Any,
        client_session: Session,
        handler: BrokerProtocolHandler,
        server: Any,
        listener_name: str,
    ) -> None:
        """Let the client's QoS-0 publishes skip amqtt's delivery queue (see `_publish`), and
        make this connection the one of its client id once amqtt accepts it (`_hold`)."""
        amqtts, connack = handler.handle_publish, handler.mqtt_connack_authorize

        async def handle_publish(packet: PublishPacket) -> None:
            topic, data = packet.topic_name, packet.payload.data if packet.payload else None
            if packet.qos or packet.retain_flag or data is None or not _plain(topic):
                await amqtts(packet)  # acknowledged, retained or invalid: amqtt's own way
            else:
                await self._publish(client_session, topic, data)

        async def mqtt_connack_authorize(authorize: bool) -> None:
            if authorize:  # amqtt has just made it the session of its client id
                self._hold(client_session.client_id or "", transport)
            await connack(authorize)

        handler.handle_publish = handle_publish
        handler.mqtt_connack_authorize = mqtt_connack_authorize
        transport = _transport(writer)
        try:
            await super()._handle_client_session(
                reader, writer, client_session, handler, server, listener_name
            )
        finally:
            if self._holders.get(client_session.client_id or "") is transport:
                del self._holders[client_session.client_id or ""]

    def _hold(self, client_id: str, transport: asyncio.BaseTransport | None) -> None:
        """Make `transport` the one connection of `client_id`, closing the one that had it,
        as mosquitto does. amqtt replaces a client id's session in one step and registers the
        new one in another, awaits apart, and never closes the old connection: two connects
        of one id could both get in, and the one left behind receive nothing, unaware. The
        socket is closed, and amqtt ends that connection as when its client leaves."""
        if transport is None:
            return
        previous, self._holders[client_id] = self._holders.get(client_id), transport
        if previous is not None and previous is not transport:
            log.warning("client %s already connected, closing old connection", client_id)
            previous.close()

    async def _publish(self, session: Session, topic: str, data: bytes) -> None:
        """What amqtt does with a valid QoS-0 PUBLISH once its client's message loop takes
        it from the session's queue (events, the publisher's ACL, the broadcast), done as
        it arrives: the queue and the loop's four-way wait cost more than all of it."""
        message = IncomingApplicationMessage(None, topic, 0, data, False)
        events = self.plugins_manager
        await events.fire_event(
            BrokerEvents.MESSAGE_RECEIVED, client_id=session.client_id, message=message
        )
        if not await self._topic_filtering(session, topic, Action.PUBLISH):
            log.info("%s not allowed to publish to %s", session.client_id, topic)
            return
        await events.fire_event(
            BrokerEvents.MESSAGE_BROADCAST, client_id=session.client_id, message=message
        )
        await self._broadcast_message(session, topic, data)

    async def _broadcast_message(
        self,
        session: Session | None,
        topic: str | None,
        data: bytes | bytearray | None,
        force_qos: int | None = None,
    ) -> None:
        """Write a QoS-0 publish to its subscribers when all of them are QoS 0 (see above)."""
        if not topic or data is None or force_qos or any(q for _, q in self._route(topic)):
            await super()._broadcast_message(session, topic, data, force_qos)
            return
        packet = publish_packet(topic, data)
        for target, _ in self._route(topic):
            if not await self._topic_filtering(target, topic, Action.RECEIVE):
                continue
            handler = self._connected(target)  # after the await: it may have gone meanwhile
            if handler is not None and handler.writer is not None:
                self._send(handler.writer, packet, target)

    async def _run_broadcast(
        self, running_tasks: deque[asyncio.Task[OutgoingApplicationMessage]]
    ) -> None:
        """amqtt's delivery of one queued message, over a snapshot of its subscribers.

        amqtt's own iterates the live subscription table across the ACL plugins' awaits: a
        client that subscribed meanwhile raised "dictionary changed size during iteration"
        and every subscriber after that point lost the message, and one whose subscription
        went meanwhile made the next in its list be skipped. The route is a list made at once.
        """
        broadcast = await self._broadcast_queue.get()
        topic, data = broadcast["topic"], broadcast["data"]
        for target, granted in self._route(topic):
            qos = broadcast.get("qos", granted)
            if not await self._topic_filtering(target, topic, Action.RECEIVE):
                continue
            handler = self._connected(target)
            if handler is not None:
                publish = handler.mqtt_publish(topic, data, qos, retain=False)
                running_tasks.append(asyncio.ensure_future(publish))
            elif target.transitions.state != "connected" and self._kept_offline(target, qos):
                await self._retain_broadcast_message(broadcast, qos, target)

    @staticmethod
    def _kept_offline(session: Session, qos: int) -> bool:
        """Whether amqtt keeps a message for a disconnected session (MQTT 3.1.2.4)."""
        return not session.clean_session and qos in (QOS_1, QOS_2) and not session.is_anonymous

    def _connected(self, session: Session) -> BrokerProtocolHandler | None:
        """The handler of `session` if it is connected and still the session of its client
        id (a route may name one that left, or that its user replaced, since it was made)."""
        if session.transitions.state != "connected":
            return None
        current, handler = self._sessions.get(session.client_id or "", (None, None))
        return handler if current is session else None

    def _route(self, topic: str) -> list[tuple[Session, int]]:
        """The (session, QoS) of every subscription matching `topic`, in amqtt's order."""
        route = self._routes.get(topic)
        if route is None:
            route = [
                pair
                for a_filter, pairs in self._subscriptions.items()
                if self._matches(topic, a_filter)
                for pair in pairs
            ]
            if len(self._routes) >= ROUTES:
                self._routes.clear()
            self._routes[topic] = route
        return route

    def _send(self, writer: Any, packet: bytes, target: Session) -> None:
        """Queue one packet for a subscriber, to be written with its others of this turn."""
        transport = _transport(writer)
        if transport is not None and transport.get_write_buffer_size() > self.backlog:
            if not self.dropped:
                log.warning(
                    "%s is over %d bytes behind: QoS-0 copies dropped",
                    target.client_id,
                    self.backlog,
                )
            self.dropped += 1
            return
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.setdefault(writer, []).append(packet)

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, {}
        for writer, packets in outbox.items():
            try:
                writer.write(b"".join(packets))
            except (ConnectionError, RuntimeError) as exc:  # amqtt's reader sees the loss too
                log.debug("a subscriber's socket is gone: %s", exc)

    # Every change to the subscriptions forgets the routes, once it is made.

    async def add_subscription(self, subscription: tuple[str, int], session: Session) -> int:
        granted = await super().add_subscription(subscription, session)
        self._routes.clear()
        return granted

    async def _del_all_subscriptions(self, session: Session) -> None:
        await super()._del_all_subscriptions(session)
        self._routes.clear()

    def _del_subscription(self, a_filter: str, session: Session) -> int:
        deleted = super()._del_subscription(a_filter, session)
        self._routes.clear()
        return deleted

    async def stream_connected(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, listener_name: str
    ) -> None:
        guarded = PacketReader(reader, writer, self.max_packet_size)
        adapter = StreamWriterAdapter(writer)
        if self.username_as_client_id and not await self._admit(guarded, adapter, listener_name):
            return
        await self.external_connected(guarded, adapter, listener_name)

    async def _admit(
        self, reader: PacketReader, writer: StreamWriterAdapter, listener: str
    ) -> bool:
        """Authenticate the CONNECT before amqtt reads it; False: refused and closed.

        An accepted one is handed on with the username as client id. Anything that is no
        readable CONNECT is left to amqtt, which refuses it its own way."""
        packet = await reader.peek()
        if not packet or packet[0] >> 4 != CONNECT:
            return True
        try:
            connect = await ConnectPacket.from_stream(BufferReader(packet))
        except (AMQTTError, MQTTError, CodecError, NoDataError, ValueError):
            return True
        claimed = Session()
        claimed.username, claimed.password = connect.username, connect.password
        if not connect.username or not await self._authenticate(
            claimed, self.listeners_config[listener]
        ):
            log.info("refused %s (user %r)", writer.get_peer_info(), connect.username)
            writer.write(NOT_AUTHORIZED)
            await writer.close()
            return False
        connect.client_id = connect.username
        reader.replace(bytes(connect.to_bytes()))
        return True

    async def _cleanup_session(self, client_id: str) -> None:
        """amqtt's; its session monitor calls it, one await after another, for the client ids
        whose session was disconnected when it looked: not for one connected again since
        (client ids are users', so a user's next connection has the same one)."""
        session = self._sessions.get(client_id, (None, None))[0]
        again = session is not None and session.transitions.is_connected()
        if not (again and asyncio.current_task() is self._session_monitor_task):
            await super()._cleanup_session(client_id)


def amqtt_config(
    host: str,
    port: int,
    *,
    password_file: Path | None = None,
    acl: dict[str, dict[str, list[str]]] | None = None,
    certfile: Path | None = None,
    keyfile: Path | None = None,
) -> dict[str, Any]:
    """amqtt 0.12 configuration: one TCP (or TLS) listener, and either anonymous access or
    password-file authentication plus the topic ACL (`Credentials.amqtt_acl()`)."""
    listener: dict[str, Any] = {"type": "tcp", "bind": f"{host}:{port}"}
    if certfile is not None and keyfile is not None:
        listener |= {"ssl": True, "certfile": str(certfile), "keyfile": str(keyfile)}
    elif certfile is not None or keyfile is not None:
        raise ValueError("TLS needs both a certificate file and its key file")
    if (password_file is None) != (acl is None):
        raise ValueError("give both a password file and an ACL, or neither (anonymous)")
    plugins: dict[str, Any] = {
        "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
    }
    if password_file is not None and acl is not None:
        plugins = {
            "amqtt.plugins.authentication.FileAuthPlugin": {"password_file": str(password_file)},
            "amqtt.plugins.topic_checking.TopicAccessControlListPlugin": acl,
        }
    return {"listeners": {"default": listener}, "plugins": plugins}


async def serve(config: dict[str, Any], max_packet_size: int) -> None:
    """Run the broker until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    broker = GuardedBroker(config, max_packet_size)
    await broker.start()
    try:
        await stop.wait()
    finally:
        await broker.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m privnet.broker.embedded", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--password-file", type=Path, help="amqtt password file (user:argon2)")
    parser.add_argument("--acl-file", type=Path, help="JSON: {acl: {...}, publish_acl: {...}}")
    parser.add_argument("--certfile", type=Path, help="server certificate (PEM): TLS only")
    parser.add_argument("--keyfile", type=Path, help="its private key (PEM)")
    parser.add_argument(
        "--max-packet-size", type=int, default=MAX_PACKET_SIZE, help="bytes (default 1 MiB + 4 KiB)"
    )
    args = parser.parse_args(argv)
    if not 0 < args.port < 65_536:
        parser.error(f"--port {args.port} is not a TCP port (1-65535)")
    if args.max_packet_size < 2:
        parser.error(f"--max-packet-size {args.max_packet_size} is too small (>= 2 bytes)")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        acl = json.loads(args.acl_file.read_text()) if args.acl_file else None
        config = amqtt_config(
            args.host,
            args.port,
            password_file=args.password_file,
            acl=acl,
            certfile=args.certfile,
            keyfile=args.keyfile,
        )
        run_loop(serve(config, args.max_packet_size))
    except (BrokerError, ValueError, OSError) as exc:
        sys.exit(f"embedded broker on {args.host}:{args.port} failed: {exc}")


if __name__ == "__main__":
    main()

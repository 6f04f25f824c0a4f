"""An amqtt broker in its own process, for machines without mosquitto.

`python -m broker.embedded --port N` serves MQTT on 127.0.0.1:N until SIGTERM or SIGINT,
then shuts down cleanly and exits 0. With `--password-file` and `--acl-file` it refuses
anonymous clients and confines each user to its topics, through amqtt's own FileAuthPlugin
and TopicAccessControlListPlugin; with `--certfile/--keyfile` it speaks TLS only. It has no
$SYS tree. It runs in its own process so a busy broker never competes with the orchestrator.

amqtt 0.12 has no packet size limit: it reads any remaining length up to MQTT's 256 MiB and
then the whole payload into memory (one 64 MB publish grew it by 450 MB). `GuardedBroker`
reads each connection a whole packet at a time and hangs up as soon as a fixed header
announces a packet longer than `--max-packet-size`, before the body is read.
"""

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from amqtt.adapters import StreamReaderAdapter, StreamWriterAdapter
from amqtt.broker import Broker
from amqtt.contexts import Action
from amqtt.errors import BrokerError
from amqtt.events import BrokerEvents
from amqtt.mqtt.protocol.broker_handler import BrokerProtocolHandler
from amqtt.mqtt.publish import PublishPacket
from amqtt.session import IncomingApplicationMessage, Session

from agent.mqtt import run as loop_run
from agent.topics import MAX_PACKET_SIZE, publish_packet

log = logging.getLogger("privnet.broker")
VERDICTS = 65_536  # memoized ACL verdicts kept at most (a 30-agent run needs about 2,000)
ROUTES = 65_536  # memoized topic -> subscribers routes kept at most (one per topic in use)
BACKLOG = 16 * 2**20  # bytes waiting for one subscriber beyond which QoS-0 copies are dropped


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


def _plain(topic: str | None) -> bool:
    """A topic a client may publish to (amqtt closes the connection of one that does not)."""
    if not topic:
        return False
    return not topic.startswith("$") and "#" not in topic and "+" not in topic


class GuardedBroker(Broker):
    """amqtt's Broker with every TCP/TLS connection read through a `PacketReader`, the
    ACL's verdicts memoized, and QoS-0 copies written straight to the subscribers.

    amqtt asks its topic plugins about every PUBLISH it receives and again about every copy
    it delivers (`Action.RECEIVE`), each time through a new task per plugin: with the ACL on,
    that was a quarter of its CPU on privnet's load. The ACL (`TopicAccessControlListPlugin`
    with the run's static tables) decides on the user, the topic and the action alone, so
    the broker keeps its verdict per (user, topic, action) and asks the plugins only once.

    amqtt then queues every publish for a broadcast task that matches the topic against
    every subscription filter and starts one task per copy, which encodes the packet again
    and awaits the socket: over half its CPU on privnet's load. Where every subscription
    matching a topic is QoS 0 (privnet's whole peer plane), the copies are the same bytes,
    nothing is kept for offline sessions and nothing awaits an acknowledgement: they are
    encoded once and written to each subscriber's socket in the order they were published,
    one write per subscriber per loop turn, with the same ACL verdict per receiver. The
    subscribers of a topic are remembered until a subscription changes. Anything else
    (QoS 1 or 2 on either side, retained or internal messages) takes amqtt's own path.
    A subscriber more than `backlog` bytes behind loses QoS-0 copies instead of growing the
    broker without bound (MQTT allows dropping QoS 0; `dropped` counts them).
    """

    def __init__(
        self, config: dict[str, Any], max_packet_size: int, backlog: int = BACKLOG
    ) -> None:
        super().__init__(config)
        self.max_packet_size = max_packet_size
        self.backlog = backlog
        self.dropped = 0  # QoS-0 copies not sent to a subscriber `backlog` bytes behind
        self._verdicts: dict[tuple[str | None, str, Action], bool] = {}
        self._routes: dict[str, list[tuple[Session, int]]] = {}
        self._outbox: dict[Any, list[bytes]] = {}  # packets waiting for this loop turn's write

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
        """Let the client's QoS-0 publishes skip amqtt's delivery queue (see `_publish`)."""
        amqtts = handler.handle_publish

        async def handle_publish(packet: PublishPacket) -> None:
            topic, data = packet.topic_name, packet.payload.data if packet.payload else None
            if packet.qos or packet.retain_flag or data is None or not _plain(topic):
                await amqtts(packet)  # acknowledged, retained or invalid: amqtt's own way
            else:
                await self._publish(client_session, topic, data)

        handler.handle_publish = handle_publish
        await super()._handle_client_session(
            reader, writer, client_session, handler, server, listener_name
        )

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
            if target.transitions.state != "connected":
                continue  # QoS 0 is never kept for an offline session
            if not await self._topic_filtering(target, topic, Action.RECEIVE):
                continue
            handler = self._get_handler(target)
            if handler is not None and handler.writer is not None:
                self._send(handler.writer, packet, target)

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
        transport = getattr(getattr(writer, "_writer", None), "transport", None)
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
        await self.external_connected(guarded, StreamWriterAdapter(writer), listener_name)


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
    parser = argparse.ArgumentParser(prog="python -m broker.embedded", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--password-file", type=Path, help="amqtt password file (user:argon2)")
    parser.add_argument("--acl-file", type=Path, help="JSON: {acl: {...}, publish_acl: {...}}")
    parser.add_argument("--certfile", type=Path, help="server certificate (PEM): TLS only")
    parser.add_argument("--keyfile", type=Path, help="its private key (PEM)")
    parser.add_argument(
        "--max-packet-size", type=int, default=MAX_PACKET_SIZE, help="bytes (default 1 MiB)"
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
        loop_run(serve(config, args.max_packet_size))
    except (BrokerError, ValueError, OSError) as exc:
        sys.exit(f"embedded broker on {args.host}:{args.port} failed: {exc}")


if __name__ == "__main__":
    main()

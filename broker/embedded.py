"""An amqtt broker in its own process, for machines without mosquitto.

`python -m broker.embedded --port N` serves MQTT on 127.0.0.1:N until SIGTERM or SIGINT,
then shuts down cleanly and exits 0. With `--password-file` and `--acl-file` it refuses
anonymous clients and confines each user to its topics, through amqtt's own FileAuthPlugin
and TopicAccessControlListPlugin; with `--certfile/--keyfile` it speaks TLS only. It has no
$SYS tree. It runs in its own process so a busy broker never competes with the orchestrator.

amqtt 0.12 has no packet size limit: it reads any remaining length up to MQTT's 256 MiB and
then the whole payload into memory (one 64 MB publish grew it by 450 MB). `GuardedBroker`
frames each connection's bytes as amqtt reads them and hangs up as soon as a fixed header
announces a packet longer than `--max-packet-size`, before amqtt asks for the body.
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
from amqtt.session import Session

from agent.mqtt import run as loop_run
from agent.topics import MAX_PACKET_SIZE

log = logging.getLogger("privnet.broker")
VERDICTS = 65_536  # memoized ACL verdicts kept at most (a 30-agent run needs about 2,000)


class PacketSizeGuard(StreamReaderAdapter):
    """amqtt's TCP reader, refusing any MQTT packet longer than `limit` bytes.

    Like mosquitto's `max_packet_size`, it compares the remaining length + 1 with the limit
    (leaving out the 1-4 length bytes), so both brokers let exactly the same packets through.

    It follows the packet framing (type byte, remaining-length varint, body) in the bytes it
    hands to amqtt. When a varint completes with too large a length it aborts the connection
    and reports end of stream, so amqtt never requests, nor buffers, the oversized body.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int):
        super().__init__(reader)
        self._writer = writer
        self._limit = limit
        self._header = bytearray()  # fixed header of the packet being framed
        self._body_left = 0  # bytes of the current packet's body still to come
        self._refused = False

    async def read(self, n: int = -1) -> bytes:
        if self._refused:
            return b""
        data: bytes = await super().read(n)
        if not self._frame(data):
            self._refused = True
            peer = self._writer.get_extra_info("peername")
            log.warning(
                "oversize packet from %s (max_packet_size %d): disconnecting", peer, self._limit
            )
            self._writer.transport.abort()
            return b""
        return data

    def _frame(self, data: bytes) -> bool:
        """Advance the framing over `data`; False once a packet is longer than the limit."""
        i = 0
        while i < len(data):
            if self._body_left:
                step = min(self._body_left, len(data) - i)
                self._body_left -= step
                i += step
                continue
            self._header.append(data[i])
            i += 1
            if len(self._header) >= 2 and not self._header[-1] & 0x80:
                remaining = sum((b & 0x7F) << 7 * k for k, b in enumerate(self._header[1:]))
                if 1 + remaining > self._limit:  # mosquitto's own test: the same packets pass
                    return False
                self._header.clear()
                self._body_left = remaining
        return True


class GuardedBroker(Broker):
    """amqtt's Broker with every TCP/TLS connection read through a `PacketSizeGuard`, and
    the ACL's verdicts memoized.

    amqtt asks its topic plugins about every PUBLISH it receives and again about every copy
    it delivers (`Action.RECEIVE`), each time through a new task per plugin: with the ACL on,
    that was a quarter of its CPU on privnet's load. The ACL (`TopicAccessControlListPlugin`
    with the run's static tables) decides on the user, the topic and the action alone, so
    the broker keeps its verdict per (user, topic, action) and asks the plugins only once.
    """

    def __init__(self, config: dict[str, Any], max_packet_size: int) -> None:
        super().__init__(config)
        self.max_packet_size = max_packet_size
        self._verdicts: dict[tuple[str | None, str, Action], bool] = {}

    async def _topic_filtering(self, session: Session, topic: str, action: Action) -> bool:
        key = (session.username, topic, action)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = await super()._topic_filtering(session, topic, action)
            if len(self._verdicts) >= VERDICTS:
                self._verdicts.clear()
            self._verdicts[key] = verdict
        return verdict

    async def stream_connected(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, listener_name: str
    ) -> None:
        guarded = PacketSizeGuard(reader, writer, self.max_packet_size)
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

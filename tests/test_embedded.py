"""The embedded broker's own delivery path (`GuardedBroker`): QoS-0 copies written straight
to the subscribers, everything else on amqtt's path, with real MQTT clients over TCP.

The broker runs in the test's event loop, so the tests can read its counters and spy on
amqtt's path. Access control and the packet size limit are in test_broker_auth.py.
"""

import asyncio
import contextlib
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from amqtt.adapters import ReaderAdapter
from amqtt.broker import Broker
from amqtt.mqtt.packet import MQTTFixedHeader
from amqtt.mqtt.publish import PublishPacket
from hypothesis import given
from hypothesis import strategies as st

from privnet.agent import topics as T
from privnet.agent.topics import MAX_PACKET_SIZE, publish_packet
from privnet.broker.credentials import INSPECTOR, ORCHESTRATOR, Credentials
from privnet.broker.embedded import GuardedBroker, PacketReader, amqtt_config
from privnet.broker.launcher import free_port

WAIT = 10.0


@contextlib.asynccontextmanager
async def serving(
    backlog: int | None = None, credentials: Credentials | None = None, tmp: Path | None = None
) -> AsyncIterator[tuple[GuardedBroker, int]]:
    """An anonymous broker, or with `credentials` (files written into `tmp`) the run's users
    and ACL, as privnet starts it."""
    port = free_port()
    kwargs = {} if backlog is None else {"backlog": backlog}
    users: dict[str, Any] = {}
    if credentials is not None and tmp is not None:
        passwd = tmp / "passwd"
        passwd.write_text(credentials.amqtt_password_file())
        users = {"password_file": passwd, "acl": credentials.amqtt_acl()}
    config = amqtt_config("127.0.0.1", port, **users)
    broker = GuardedBroker(config, MAX_PACKET_SIZE, **kwargs)
    await broker.start()
    try:
        yield broker, port
    finally:
        await broker.shutdown()


def client(port: int) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", port)


async def take(sub: aiomqtt.Client, n: int) -> list[aiomqtt.Message]:
    got: list[aiomqtt.Message] = []
    async with asyncio.timeout(WAIT):
        async for message in sub.messages:
            got.append(message)
            if len(got) == n:
                return got
    raise AssertionError("unreachable")


@pytest.fixture
def slow_path(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The topics amqtt's own broadcast path was asked to deliver."""
    topics: list[str] = []
    original = Broker._broadcast_message

    async def spy(self: Broker, session: object, topic: str, *args: object) -> None:
        topics.append(topic)
        await original(self, session, topic, *args)

    monkeypatch.setattr(Broker, "_broadcast_message", spy)
    return topics


async def test_qos0_copies_arrive_complete_and_in_order(slow_path: list[str]) -> None:
    async with serving() as (_, port), client(port) as a, client(port) as b, client(port) as pub:
        await a.subscribe("run/to/a/from/+", qos=0)
        await b.subscribe("run/to/+/from/p", qos=0)
        for i in range(300):  # some published at QoS 1: delivered at the subscription's 0
            await pub.publish("run/to/a/from/p", i.to_bytes(2, "big") * 50, qos=int(i % 50 == 0))
        got_a, got_b = await asyncio.gather(take(a, 300), take(b, 300))
    for got in (got_a, got_b):
        assert [int.from_bytes(m.payload[:2], "big") for m in got] == list(range(300))
        assert {m.qos for m in got} == {0}
    assert slow_path == [], "every copy went the direct way"


async def test_a_qos1_subscriber_keeps_amqtts_path(slow_path: list[str]) -> None:
    async with serving() as (_, port), client(port) as low, client(port) as high:
        await low.subscribe("t/x", qos=0)
        await high.subscribe("t/+", qos=1)
        async with client(port) as pub:
            await pub.publish("t/x", b"both", qos=0)
            got_low, got_high = await asyncio.gather(take(low, 1), take(high, 1))
    assert got_low[0].payload == got_high[0].payload == b"both"
    assert (got_low[0].qos, got_high[0].qos) == (0, 1)  # amqtt delivers at the subscription's
    assert slow_path == ["t/x"]


async def test_subscription_changes_reach_the_remembered_routes() -> None:
    async with serving() as (_, port), client(port) as sub, client(port) as pub:
        await sub.subscribe("r/one", qos=0)
        await pub.publish("r/one", b"1")  # the route of r/one is now remembered
        assert [m.payload for m in await take(sub, 1)] == [b"1"]
        await sub.unsubscribe("r/one")
        await sub.subscribe("r/two", qos=0)
        await pub.publish("r/one", b"after unsubscribe")
        await pub.publish("r/two", b"2")
        assert [m.payload for m in await take(sub, 1)] == [b"2"]
        async with client(port) as late:  # a new subscriber of a remembered topic gets it
            await late.subscribe("r/+", qos=0)
            await pub.publish("r/two", b"3")
            got_sub, got_late = await asyncio.gather(take(sub, 1), take(late, 1))
        assert got_sub[0].payload == got_late[0].payload == b"3"
        await pub.publish("r/two", b"4")  # the late one has gone: nothing breaks
        assert [m.payload for m in await take(sub, 1)] == [b"4"]


async def test_a_subscriber_too_far_behind_loses_qos0_copies_not_the_others() -> None:
    """A client that stops reading costs the broker at most `backlog` bytes of its own."""
    payload, count = bytes(8192), 400  # 3.2 MB: far beyond the backlog and socket buffers
    async with serving(backlog=64 * 1024) as (broker, port):
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", port))
        stalled.sendall(CONNECT + SUBSCRIBE)  # then never reads
        async with client(port) as reader, client(port) as pub:
            await reader.subscribe("big/+", qos=0)
            await asyncio.sleep(0.2)  # the stalled client's SUBSCRIBE is in
            for i in range(count):
                await pub.publish(f"big/{i % 3}", payload)
            got = await take(reader, count)
        stalled.close()
    assert len(got) == count
    assert broker.dropped > 0


async def test_a_broadcast_reaches_every_subscriber_while_others_subscribe(
    tmp_path: Path,
) -> None:
    """amqtt's broadcast loop iterated the live subscription table across the ACL plugins'
    awaits: an agent subscribing meanwhile raised "dictionary changed size during iteration",
    and the subscribers after that point never got the message (agents left out at start-up).
    Here, as at a run's start: a tap reads everything, agents wait for their Setup on
    ctl/down/m while the others are still subscribing."""
    run, waiting, joining = "race", 12, 24
    creds = Credentials.generate(run, waiting + joining)

    def user(name: str | int) -> aiomqtt.Client:
        name = str(name)
        return aiomqtt.Client("127.0.0.1", port, username=name, password=creds.passwords[name])

    async def join(m: int) -> None:
        async with user(m) as agent:
            for topic in (T.inbox_filter(run, m), T.ctl_down(run, m), T.ctl_down(run, "all")):
                await agent.subscribe(topic, qos=1)

    async with contextlib.AsyncExitStack() as stack:
        _, port = await stack.enter_async_context(serving(credentials=creds, tmp=tmp_path))
        tap = await stack.enter_async_context(user(INSPECTOR))
        await tap.subscribe(T.run_filter(run), qos=1)  # the first filter every match meets
        agents = [await stack.enter_async_context(user(m)) for m in range(waiting)]
        for m, agent in enumerate(agents):
            await agent.subscribe(T.ctl_down(run, m), qos=1)
        orchestrator = await stack.enter_async_context(user(ORCHESTRATOR))
        setups = [orchestrator.publish(T.ctl_down(run, m), b"setup", qos=1) for m in range(waiting)]
        joins = [join(m) for m in range(waiting, waiting + joining)]
        await asyncio.gather(*setups, *joins)
        got = await asyncio.gather(*(take(agent, 1) for agent in agents))
        tapped = await take(tap, waiting)
    assert [m[0].topic.value for m in got] == [T.ctl_down(run, m) for m in range(waiting)]
    assert sorted(m.topic.value for m in tapped) == sorted(
        T.ctl_down(run, m) for m in range(waiting)
    )


# --- the bytes ---------------------------------------------------------------------------------

topics = st.text(  # what a client may publish to: no wildcards, no surrogates, no NUL
    st.characters(exclude_categories=["Cs"], exclude_characters="#+\x00"), min_size=1, max_size=40
)
payloads = st.one_of(st.binary(max_size=300), st.integers(0, 70_000).map(bytes))


@given(topics, payloads)
def test_publish_packet_are_amqtts_own(topic: str, data: bytes) -> None:
    assert (
        publish_packet(topic, data)
        == PublishPacket.build(topic, data, None, False, 0, False).to_bytes()
    )


class Aborts:
    """What `PacketReader` needs of a writer: a transport to abort, a peer to name."""

    def __init__(self) -> None:
        self.transport = self
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, _name: str) -> str:
        return "peer"


async def decode_all(reader: ReaderAdapter) -> list[tuple[str, bytes]]:
    """What amqtt makes of the stream, packet by packet, until its end."""
    got = []
    while (header := await MQTTFixedHeader.from_stream(reader)) is not None:
        packet = await PublishPacket.from_stream(reader, fixed_header=header)
        got.append((packet.topic_name, packet.data))
    return got


@given(
    st.lists(st.tuples(topics, payloads), max_size=8), st.lists(st.integers(1, 5000), max_size=20)
)
async def test_the_reader_hands_amqtt_every_packet_however_the_bytes_come(
    messages: list[tuple[str, bytes]], cuts: list[int]
) -> None:
    wire = b"".join(publish_packet(t, d) for t, d in messages)
    stream = asyncio.StreamReader()
    at = 0
    for cut in cuts:  # the socket delivers the bytes in arbitrary pieces
        stream.feed_data(wire[at : at + cut])
        at += cut
    stream.feed_data(wire[at:])
    stream.feed_eof()
    writer = Aborts()
    assert await decode_all(PacketReader(stream, writer, MAX_PACKET_SIZE)) == messages  # type: ignore[arg-type]
    assert not writer.aborted


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (b"\x30\xff\xff\xff\xff\x01", "malformed length"),
        (b"\x30\x80\x80\x80\x01", "oversize packet"),  # 2 MiB, over MAX_PACKET_SIZE
    ],
)
async def test_the_reader_refuses_before_the_body(
    header: bytes, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    stream = asyncio.StreamReader()
    stream.feed_data(publish_packet("ok", b"1") + header)  # no body follows: none is awaited
    writer = Aborts()
    reader = PacketReader(stream, writer, MAX_PACKET_SIZE)  # type: ignore[arg-type]
    assert await decode_all(reader) == [("ok", b"1")]
    assert writer.aborted
    assert why in caplog.text


# CONNECT (MQTT 3.1.1, clean session, client id "s") and SUBSCRIBE big/+ at QoS 0, by hand:
# the stalled client is a bare socket, so nothing reads on its behalf.
CONNECT = bytes([0x10, 13, 0, 4, *b"MQTT", 4, 2, 0, 60, 0, 1, *b"s"])
SUBSCRIBE = bytes([0x82, 10, 0, 1, 0, 5, *b"big/+", 0])


class Answers:
    """What `GuardedBroker._admit` needs of a writer: it answers, closes, names the peer."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    async def close(self) -> None:
        self.closed = True

    def get_peer_info(self) -> tuple[str, int]:
        return ("peer", 1)


ADMIT_CREDS = Credentials.generate("admit", 1)


@given(st.binary(max_size=80), st.sampled_from([b"", b"\x00\x04MQTT\x04\xc2\x00\x3c"]))
async def test_admission_refuses_or_hands_on_any_connect_and_never_raises(
    body: bytes, head: bytes
) -> None:
    """Whatever a CONNECT holds: refused (CONNACK 5, closed), or handed to amqtt as it came
    (unreadable: amqtt refuses it its own way) or with its username as client id."""
    with tempfile.TemporaryDirectory() as tmp:
        passwd = Path(tmp) / "passwd"
        passwd.write_text(ADMIT_CREDS.amqtt_password_file())
        config = amqtt_config("127.0.0.1", 1, password_file=passwd, acl=ADMIT_CREDS.amqtt_acl())
        broker = GuardedBroker(config, MAX_PACKET_SIZE)
        packet = bytes([0x10, len(head + body)]) + head + body
        stream = asyncio.StreamReader()
        stream.feed_data(packet)
        stream.feed_eof()
        reader, writer = PacketReader(stream, Aborts(), MAX_PACKET_SIZE), Answers()  # type: ignore[arg-type]
        admitted = await broker._admit(reader, writer, "default")  # type: ignore[arg-type]
    if admitted:
        assert not writer.written and await reader.read() in (packet, b"")
    else:
        assert writer.written == bytes([0x20, 2, 0, 5]) and writer.closed

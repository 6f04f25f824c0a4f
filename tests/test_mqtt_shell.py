"""The MQTT shell's own machinery, without a broker: `DirectProtocol` parses what arrives in any
split and writes a corked batch as one, `Connection.get` waits, times out and is
interrupted, and `pump` feeds a machine from the transport's callback while it waits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from gmqtt import Message
from gmqtt.mqtt.constants import MQTTv311
from gmqtt.mqtt.package import PublishPacket
from gmqtt.mqtt.utils import ConnectionState, IdGenerator

from privnet.agent.access import BrokerAddress, ClientAccess
from privnet.agent.driver import pump
from privnet.agent.gmqtt_adapter import DirectProtocol
from privnet.agent.protocol import Output, Publish
from privnet.agent.transport import Connection


def packet(command: int, body: bytes) -> bytes:
    """An MQTT packet: fixed header, remaining length (7 bits a byte), body."""
    length, size = b"", len(body)
    while True:
        size, byte = divmod(size, 128)
        length += bytes([byte | (0x80 if size else 0)])
        if not size:
            return bytes([command]) + length + body


def publish_qos0(topic: str, payload: bytes, retain: bool = False) -> bytes:
    name = topic.encode()
    return packet(0x30 | retain, len(name).to_bytes(2, "big") + name + payload)


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class FakeConnection:
    """What `DirectProtocol` asks of gmqtt's MQTTConnection."""

    def __init__(self, seen: list[object]) -> None:
        self.seen = seen
        self._handler = self
        self.current_connection = self
        self._last_data_in = self._last_data_out = 0.0

    def put_package(self, pkg: Any) -> None:
        self.seen.append(("gmqtt", pkg.cmd, bytes(pkg.data)))


async def protocol() -> tuple[DirectProtocol, FakeTransport, list[object]]:
    seen: list[object] = []
    proto = DirectProtocol(
        deliver=lambda *delivery: seen.append(delivery),
        connection_state=ConnectionState(protocol_version=MQTTv311),
        id_generator=IdGenerator(),
    )
    transport = FakeTransport()
    proto.connection_made(transport)
    proto.set_connection(FakeConnection(seen))
    return proto, transport, seen


STREAM = [
    (publish_qos0("a/b", b"x" * 20_000), ("a/b", b"x" * 20_000, False)),  # 3-byte length
    (packet(0x32, b"\x00\x03q/1\x00\x07one"), ("gmqtt", 0x32, b"\x00\x03q/1\x00\x07one")),
    (publish_qos0("r", b"kept", retain=True), ("r", b"kept", True)),
    (packet(0xD0, b""), ("gmqtt", 0xD0, b"")),  # PINGRESP
    (publish_qos0("", b"no topic"), ("gmqtt", 0x30, b"\x00\x00no topic")),  # gmqtt's to judge
    (publish_qos0("c", b""), ("c", b"", False)),
]


@pytest.mark.parametrize("chunk", [1, 2, 7, 1000, 1 << 20])
async def test_protocol_delivers_every_packet_in_order_however_split(chunk: int) -> None:
    proto, transport, seen = await protocol()
    data = b"".join(raw for raw, _ in STREAM)
    for at in range(0, len(data), chunk):
        proto.data_received(data[at : at + chunk])
    assert seen == [want for _, want in STREAM]
    assert proto._unparsed == b"" and not transport.closed


async def test_protocol_closes_on_a_malformed_length() -> None:
    proto, transport, seen = await protocol()
    proto.data_received(b"\x30\xff\xff\xff\xff\x01")
    assert transport.closed and seen == []


async def test_corked_writes_leave_as_one_write_in_order() -> None:
    proto, transport, _ = await protocol()
    proto.write_data(b"before")
    with proto.corked():
        for n in range(5):
            proto.write_data(b"%d," % n)
        with proto.corked():  # nested: the outer block writes
            proto.write_data(b"inner,")
        assert transport.writes == [b"before"]
    proto.write_data(b"after")
    assert transport.writes == [b"before", b"0,1,2,3,4,inner,", b"after"]
    with proto.corked():
        pass
    assert len(transport.writes) == 3  # nothing held: nothing written


async def test_big_payloads_leave_apart_from_their_headers_uncopied() -> None:
    """A model's chunks (64 KB each, 4 MB an out-link at 1M parameters) are handed to the
    transport as they are, behind their headers, in one `writelines` (uvloop: one writev):
    not copied into packets and then into one buffer. Small frames still go joined."""
    proto, transport, _ = await protocol()
    pieces: list[bytes] = []
    transport.writelines = pieces.extend  # type: ignore[method-assign]
    big = [bytes([n]) * 70_000 for n in range(20)]
    with proto.corked():
        proto.publish_qos0("t/a", b"small")
        for payload in big:
            proto.publish_qos0("t/b", payload)
    want = publish_qos0("t/a", b"small") + b"".join(publish_qos0("t/b", p) for p in big)
    assert b"".join(transport.writes + pieces) == want and len(transport.writes) == 1
    assert [id(p) for p in pieces[1::2]] == [id(p) for p in big]  # the payloads themselves
    pieces.clear()
    transport.writes.clear()
    huge = b"h" * 300_000
    proto.publish_qos0("t/c", huge)  # uncorked: as it is, too
    assert b"".join(transport.writes + pieces) == publish_qos0("t/c", huge)
    assert pieces == [huge] and pieces[0] is huge
    transport.writes.clear()
    with proto.corked():  # under 256 KiB in all: joined, one write
        proto.publish_qos0("t/d", b"1")
        proto.publish_qos0("t/d", big[0])
    assert transport.writes == [publish_qos0("t/d", b"1") + publish_qos0("t/d", big[0])]


@pytest.mark.parametrize("size", [0, 100, 20_000, 3_000_000])
async def test_qos0_publish_is_the_packet_gmqtt_builds(size: int) -> None:
    proto, transport, _ = await protocol()
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    proto.publish_qos0("privnet/r/to/3/from/é", payload)
    _, want = PublishPacket.build_package(Message("privnet/r/to/3/from/é", payload), proto)
    assert b"".join(transport.writes) == bytes(want)  # a big payload: after its header
    assert len(transport.writes) == (1 if size < 256 << 10 else 2)


def connection() -> Connection:
    conn = Connection(BrokerAddress("127.0.0.1", 1), ClientAccess(None, None, False, None))
    conn._up = True
    conn._client._connack_received.set()
    conn._client._connection = FakeTransport()  # is_closing() False: `up`
    return conn


async def test_get_times_out_and_is_interrupted_before_any_delivery() -> None:
    conn = connection()
    conn._deliver("t", b"1", False)
    conn._deliver("t", b"2", True)
    assert await conn.get(0.0) == ("t", b"1", False)
    assert await conn.get(None) == ("t", b"2", True)
    with pytest.raises(TimeoutError):
        await conn.get(0.01)
    waiting = asyncio.ensure_future(conn.get(10.0))
    await asyncio.sleep(0)
    conn._deliver("t", b"3", False)
    conn.interrupt()
    with pytest.raises(TimeoutError):
        await waiting
    assert await conn.get(0.0) == ("t", b"3", False)  # still there


async def test_a_taker_gets_deliveries_only_while_a_get_waits() -> None:
    conn, taken = connection(), []

    def taker(topic: str, payload: bytes, retained: bool) -> bool:
        taken.append(payload)
        return payload != b"declined"

    with conn.taking(taker):
        conn._deliver("t", b"queued", False)  # nobody waits: queued
        assert await conn.get(1.0) == ("t", b"queued", False)
        waiting = asyncio.ensure_future(conn.get(10.0))
        await asyncio.sleep(0)
        conn._deliver("t", b"taken", False)
        conn._deliver("t", b"declined", False)
        conn._deliver("t", b"behind", False)  # the get is woken: queued behind
        assert await waiting == ("t", b"declined", False)
    assert taken == [b"taken", b"declined"]
    assert await conn.get(0.0) == ("t", b"behind", False)


class Echo:
    """A machine that answers every delivery, fails on b'boom', and is done after b'end'."""

    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.done = False

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output:
        if payload == b"boom":
            raise ValueError("boom")
        self.got.append(payload)
        self.done = payload == b"end"
        return Output(publish=[Publish("out", b"re:" + payload, "model")])

    def tick(self, now: float) -> Output:
        return Output()

    def next_tick(self) -> float | None:
        return None

    def unsubscribed(self, topic: str, now: float) -> Output:
        return Output()

    def deaf(self, now: float) -> Output:
        return Output()


async def test_pump_feeds_the_machine_in_the_callback_and_stops_when_done() -> None:
    conn, machine, sent = connection(), Echo(), []
    conn.publish = lambda topic, payload, qos=0: sent.append(payload)  # type: ignore[method-assign]
    pumping = asyncio.ensure_future(pump(conn, machine, lambda: machine.done))
    await asyncio.sleep(0)
    for n in range(3):
        conn._deliver("in", b"%d" % n, False)
        assert sent[-1] == b"re:%d" % n  # answered at once, in the callback
    conn._deliver("in", b"end", False)
    conn._deliver("in", b"after", False)  # the pump is woken: left queued
    await asyncio.wait_for(pumping, 5)
    assert machine.got == [b"0", b"1", b"2", b"end"]
    assert await conn.get(0.0) == ("in", b"after", False)


async def test_pump_raises_what_the_machine_raised_in_the_callback() -> None:
    conn, machine = connection(), Echo()
    conn.publish = lambda *_: None  # type: ignore[method-assign]
    pumping = asyncio.ensure_future(pump(conn, machine, lambda: machine.done))
    await asyncio.sleep(0)
    conn._deliver("in", b"boom", False)
    with pytest.raises(ValueError, match="boom"):
        await asyncio.wait_for(pumping, 5)


class Stopped(Echo):
    """SIGSTOPped while it works on b'stop': its clock jumps past its deadline meanwhile."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self.clock, self.calls = clock, []  # type: list[tuple[str, float]]

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output:
        if payload == b"stop":
            self.clock[0] += 9.0
        return super().receive(topic, payload, now, retained)

    def tick(self, now: float) -> Output:
        self.calls.append(("tick", now))
        self.done = True
        return Output()

    def next_tick(self) -> float | None:
        return 1000.0 + 3.0  # a deadline, 3 s after the start

    def deaf(self, now: float) -> Output:
        self.calls.append(("deaf", now))
        return Output()


async def test_a_stop_while_the_machine_works_is_a_pause_not_a_silence() -> None:
    """The clock jumps inside a delivery the callback feeds (the process was stopped then):
    the machine hears it was deaf before any tick, so no deadline counts the stop."""
    clock = [1000.0]
    conn, machine = connection(), Stopped(clock)
    conn.clock = lambda: clock[0]  # the time the pump tells the machine
    conn.publish = lambda *_: None  # type: ignore[method-assign]
    pumping = asyncio.ensure_future(pump(conn, machine, lambda: machine.done))
    await asyncio.sleep(0)
    conn._deliver("in", b"stop", False)
    await asyncio.wait_for(pumping, 5)
    assert [kind for kind, _ in machine.calls] == ["deaf", "tick"]


class Flooded(Stopped):
    """Stopped on b'stop', then flooded: every frame it reads brings another (senders as
    fast as it reads, as a thousand agents' telemetry into an orchestrator short of CPU)."""

    def __init__(self, clock: list[float], conn: Connection) -> None:
        super().__init__(clock)
        self.conn = conn

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output:
        if payload != b"stop":
            self.conn._deliver("in", b"more", False)
        return super().receive(topic, payload, now, retained)


async def test_a_pause_delivers_what_waited_then_ticks_however_fast_frames_come() -> None:
    """Back from a pause, the pump delivers the frames that had waited, then ticks (a
    machine's heartbeats are ticks): not every frame until none is left, which never
    ended under a steady stream."""
    clock = [1000.0]
    conn = connection()
    conn.clock = lambda: clock[0]  # the time the pump tells the machine
    machine = Flooded(clock, conn)
    conn.publish = lambda *_: None  # type: ignore[method-assign]
    pumping = asyncio.ensure_future(pump(conn, machine, lambda: machine.done))
    await asyncio.sleep(0)
    conn._deliver("in", b"stop", False)
    conn._deliver("in", b"a", False)  # the pump is woken: these wait for it
    conn._deliver("in", b"b", False)
    await asyncio.wait_for(pumping, 5)
    assert [kind for kind, _ in machine.calls] == ["deaf", "tick"]
    assert machine.got == [b"stop", b"a", b"b"] and conn.queued == 2  # the flood waits


class Slow(Stopped):
    """Stopped on b'stop', then half a second of work on every frame that had waited."""

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output:
        if payload != b"stop":
            self.clock[0] += 0.5
        return super().receive(topic, payload, now, retained)


async def test_a_long_backlog_is_ticked_as_it_is_read_hearing_deaf_first() -> None:
    """Back from a pause with a backlog that takes seconds to read (issue 30: a busy
    orchestrator): the machine is ticked whenever its time comes as the backlog is read,
    so its heartbeats go out on time, and hears it was deaf before the first of them."""
    clock = [1000.0]
    conn, machine = connection(), Slow(clock)
    conn.clock = lambda: clock[0]  # the time the pump tells the machine
    conn.publish = lambda *_: None  # type: ignore[method-assign]
    pumping = asyncio.ensure_future(pump(conn, machine, lambda: machine.done))
    await asyncio.sleep(0)
    for payload in (b"stop", b"a", b"b", b"c"):
        conn._deliver("in", payload, False)
    await asyncio.wait_for(pumping, 5)
    kinds = [kind for kind, _ in machine.calls]
    assert kinds[:3] == ["deaf", "tick", "tick"], kinds  # as the backlog is read
    assert machine.got == [b"stop", b"a", b"b", b"c"]

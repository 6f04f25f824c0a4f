"""broker/: real brokers, real sockets, real MQTT clients.

mosquitto tests skip when mosquitto is missing, unless PRIVNET_REQUIRE_MOSQUITTO=1 (CI), where
they fail.
"""

import asyncio
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import psutil
import pytest
from conftest import need_mosquitto
from hypothesis import given
from hypothesis import strategies as st
from paho.mqtt.client import topic_matches_sub
from probes import matches

from privnet.agent import topics as T
from privnet.broker.launcher import (
    BASE_CONFIG,
    Broker,
    BrokerAddress,
    accepts,
    free_port,
    launch,
    mosquitto_config,
    read_sys_bytes,
    sys_bytes,
)

RUN = "run-1"
RECEIVE_TIMEOUT = 5.0


@pytest.fixture(params=["mosquitto", "embedded"])
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "mosquitto":
        need_mosquitto()
    return str(request.param)


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the launcher makes its temp dirs in this test, to check it removes them."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.fixture
async def mosquitto() -> AsyncIterator[Broker]:
    need_mosquitto()
    async with launch("mosquitto") as broker:
        yield broker


def client(broker: Broker, **kwargs: object) -> aiomqtt.Client:
    return aiomqtt.Client(broker.address.host, broker.address.port, **kwargs)  # type: ignore[arg-type]


async def receive_until(sub: aiomqtt.Client, last_topic: str) -> list[tuple[str, bytes]]:
    """Messages in arrival order, up to and including one on `last_topic` (a sentinel)."""
    got: list[tuple[str, bytes]] = []
    async with asyncio.timeout(RECEIVE_TIMEOUT):
        async for message in sub.messages:
            got.append((message.topic.value, bytes(message.payload)))  # type: ignore[arg-type]
            if message.topic.value == last_topic:
                return got
    raise AssertionError("subscription ended early")


def broker_children() -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]


# --- local brokers: start, carry traffic, stop without leftovers -------------------------------


async def test_broker_carries_messages_then_stops_clean(kind: str, private_tmp: Path) -> None:
    topic = T.peer_topic(RUN, 2, 1)
    big = b"\x07" * (T.MAX_PACKET_SIZE - T.mqtt_publish_size(topic, 0) - 2)
    assert T.mqtt_publish_size(topic, len(big)) == T.MAX_PACKET_SIZE
    broker = launch(kind)
    assert broker.kind == kind
    async with broker:
        pid = broker.pid
        assert pid is not None and psutil.pid_exists(pid)
        assert accepts(broker.address)
        async with client(broker) as sub, client(broker) as pub:
            await sub.subscribe(T.inbox_filter(RUN, 2))
            await pub.publish(topic, b"hello", qos=1)
            await pub.publish(topic, big, qos=1)
            await pub.publish(T.peer_topic(RUN, 3, 1), b"not for 2", qos=1)
            await pub.publish(T.peer_topic(RUN, 2, 5), b"end", qos=1)
            got = await receive_until(sub, T.peer_topic(RUN, 2, 5))
        assert got == [(topic, b"hello"), (topic, big), (T.peer_topic(RUN, 2, 5), b"end")]
    assert broker.exit_code == 0, "SIGTERM should shut the broker down cleanly"
    assert broker.pid is None and not psutil.pid_exists(pid)
    assert not accepts(broker.address)
    assert broker_children() == []
    assert list(private_tmp.iterdir()) == []


def test_sync_context_manager_and_double_stop(kind: str) -> None:
    with launch(kind) as broker:
        address = broker.address
        assert accepts(address)
    assert not accepts(address)
    broker.stop()
    assert broker_children() == []


async def test_mosquitto_drops_packets_over_max_size(mosquitto: Broker) -> None:
    """mosquitto disconnects when remaining length + 1 > max_packet_size (it leaves out the
    length bytes), so every packet of at most MAX_PACKET_SIZE bytes passes, and this fails."""
    topic = T.peer_topic(RUN, 0, 1)
    too_big = b"\x00" * (T.MAX_PACKET_SIZE - 2 - len(topic))
    assert T.mqtt_publish_size(topic, len(too_big)) == T.MAX_PACKET_SIZE + 4
    async with client(mosquitto) as pub:
        # paho may still be writing the packet when mosquitto hangs up: watch the connection
        publishing = asyncio.create_task(pub.publish(topic, too_big, timeout=RECEIVE_TIMEOUT))
        with pytest.raises(aiomqtt.MqttError, match="Disconnected"):
            async with asyncio.timeout(RECEIVE_TIMEOUT):
                await anext(pub.messages)
        publishing.cancel()
        await asyncio.gather(publishing, return_exceptions=True)
    assert "oversize packet" in mosquitto.log_tail()


def test_failed_start_names_the_cause_and_leaves_nothing(kind: str, private_tmp: Path) -> None:
    with socket.socket() as taken:  # bound, not listening: connects fail and bind clashes
        taken.bind(("127.0.0.1", 0))
        broker = Broker(kind, BrokerAddress("127.0.0.1", taken.getsockname()[1]))  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="exited with code") as err:
            broker.start()
    assert str(broker.address) in str(err.value)
    assert "in use" in str(err.value).lower(), "the error should carry the broker's own log"
    assert broker.pid is None and broker_children() == []
    assert list(private_tmp.iterdir()) == []


def test_atexit_stops_a_broker_left_running(tmp_path: Path) -> None:
    script = (
        "from privnet.broker.launcher import launch; b = launch('auto'); b.start(); "
        "print(b.pid, b._tmp)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    pid, tmp = int(done.stdout.split()[0]), Path(done.stdout.split()[1])
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not tmp.exists(), "the broker's temp dir outlived the process that made it"


# --- choosing a broker --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [("127.0.0.1:1883", "127.0.0.1", 1883), ("mqtt.lan:8883", "mqtt.lan", 8883),
     ("[::1]:1884", "::1", 1884), (" broker:1 ", "broker", 1)],
)  # fmt: skip
def test_address_parse(text: str, host: str, port: int) -> None:
    address = BrokerAddress.parse(text)
    assert address == BrokerAddress(host, port)
    assert BrokerAddress.parse(str(address)) == address


@pytest.mark.parametrize("text", ["", "host", "host:", ":1883", "h:0", "h:65536", "h:x1", "h:-1"])
def test_address_parse_errors(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        BrokerAddress.parse(text)


def test_launch_rejects_unknown_choices() -> None:
    with pytest.raises(ValueError, match="auto, mosquitto, embedded or HOST:PORT"):
        launch("rabbitmq")
    with pytest.raises(ValueError, match="HOST:PORT"):
        launch("localhost:http")


def test_unreachable_external_broker_is_a_clear_error() -> None:
    broker = launch(f"127.0.0.1:{free_port()}")
    assert broker.kind == "external"
    with pytest.raises(ConnectionError, match=rf"no MQTT broker answers at {broker.address}"):
        broker.start()


async def test_external_broker_is_used_not_owned() -> None:
    async with launch("embedded") as owner:
        async with launch(str(owner.address)) as external:
            assert external.kind == "external" and external.pid is None
            async with client(external) as c:
                await c.publish(T.telemetry(RUN, 0), b"x", qos=1)
        assert accepts(owner.address), "stopping an external broker must not touch it"


# --- mosquitto's $SYS counters ------------------------------------------------------------------


async def test_sys_bytes_count_the_traffic(mosquitto: Broker) -> None:
    before = await asyncio.to_thread(sys_bytes, mosquitto.address)
    topic = T.peer_topic(RUN, 1, 0)
    n, size = 20, 1000
    async with client(mosquitto) as pub:
        for _ in range(n):
            await pub.publish(topic, b"\x01" * size, qos=0)
    after = await read_sys_bytes(mosquitto.address)
    published = n * T.mqtt_publish_size(topic, size)
    # the rest is one CONNECT/DISCONNECT and one $SYS reader's handshake: well under 1 kB
    assert published <= after["bytes_received"] - before["bytes_received"] <= published + 1000
    assert after["messages_received"] - before["messages_received"] >= n
    assert after["bytes_sent"] > before["bytes_sent"]
    assert after["messages_sent"] > before["messages_sent"]


async def test_sys_bytes_on_a_broker_without_sys_times_out() -> None:
    async with launch("embedded") as broker:
        with pytest.raises(TimeoutError, match="no live \\$SYS counters"):
            await read_sys_bytes(broker.address, timeout=0.5)


# --- config ------------------------------------------------------------------------------------


def test_shipped_config_and_generated_config() -> None:
    settings = dict(
        line.split(maxsplit=1)
        for line in BASE_CONFIG.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert settings == settings | {
        "listener": "1883",
        "allow_anonymous": "true",
        "persistence": "false",
        "sys_interval": "1",
        "max_packet_size": str(T.MAX_PACKET_SIZE),
        "log_dest": "stderr",
    }
    generated = mosquitto_config(
        "4242 127.0.0.1", {"allow_anonymous": "false", "acl_file": "/x/acl"}
    ).splitlines()
    assert "listener 4242 127.0.0.1" in generated and "listener 1883" not in generated
    assert "allow_anonymous false" in generated and "allow_anonymous true" not in generated
    assert generated[-1] == "acl_file /x/acl"


# --- topics -------------------------------------------------------------------------------------

names = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-",
    min_size=1,
    max_size=64,
)
ids = st.integers(min_value=0, max_value=10**6)


@given(names, ids, ids)
def test_peer_topic_roundtrip(run: str, k: int, m: int) -> None:
    topic = T.peer_topic(run, k, m)
    assert T.parse_peer_topic(topic) == (run, k, m)
    assert topic_matches_sub(T.inbox_filter(run, k), topic)
    assert topic_matches_sub(T.run_filter(run), topic)


@given(names, names, ids, ids, ids)
def test_filters_select_exactly_their_topics(run: str, other: str, k: int, j: int, m: int) -> None:
    assert topic_matches_sub(T.inbox_filter(run, k), T.peer_topic(run, j, m)) == (k == j)
    assert topic_matches_sub(T.run_filter(other), T.peer_topic(run, k, m)) == (other == run)
    others = [T.ctl_down(run, m), T.ctl_down(run, "all"), T.ctl_up(run, m), T.telemetry(run, m)]
    for topic in others:
        assert topic_matches_sub(T.run_filter(run), topic)
        assert T.parse_peer_topic(topic) is None
        assert not topic_matches_sub(T.inbox_filter(run, k), topic)
    for topic in (T.ctl_up(run, m), T.telemetry(run, m)):
        assert T.parse_up_topic(topic) == (run, m)
        assert any(topic_matches_sub(f, topic) for f in T.up_filters(run))
    for topic in (T.ctl_down(run, m), T.peer_topic(run, k, m)):
        assert T.parse_up_topic(topic) is None
        assert not any(topic_matches_sub(f, topic) for f in T.up_filters(run))
    # the tests' matcher (probes.matches, the Router's oracle) agrees with paho's, filter by filter
    filters = [T.run_filter(run), T.inbox_filter(run, k), *T.up_filters(run), "#", "privnet/+"]
    for f in filters:
        for topic in [*others, T.peer_topic(run, j, m), T.peer_topic(other, k, m)]:
            assert matches(f, topic) == topic_matches_sub(f, topic), (f, topic)


def test_topic_layout() -> None:
    assert T.peer_topic("r", 2, 7) == "privnet/r/to/2/from/7"
    assert T.inbox_filter("r", 2) == "privnet/r/to/2/from/+"
    assert T.ctl_down("r", "all") == "privnet/r/ctl/down/all"
    assert T.ctl_down("r", 0) == "privnet/r/ctl/down/0"
    assert T.ctl_up("r", 4) == "privnet/r/ctl/up/4"
    assert T.telemetry("r", 4) == "privnet/r/telemetry/4"
    assert T.up_filters("r") == ["privnet/r/ctl/up/+", "privnet/r/telemetry/+"]
    assert T.run_filter("r") == "privnet/r/#"


@pytest.mark.parametrize(
    "topic",
    ["privnet/r/to/01/from/2", "privnet/r/to/1/from/-2", "privnet/r/to/1/from/2/x",
     "other/r/to/1/from/2", "privnet/r/to/+/from/2", "privnet/a/b/to/1/from/2", ""],
)  # fmt: skip
def test_parse_peer_topic_rejects_others(topic: str) -> None:
    assert T.parse_peer_topic(topic) is None


@pytest.mark.parametrize("bad_run", ["", "a/b", "+", "#", "a b", "x" * 65, "é"])
def test_bad_run_names(bad_run: str) -> None:
    with pytest.raises(ValueError, match="bad run name"):
        T.peer_topic(bad_run, 0, 1)


@pytest.mark.parametrize("bad_id", [-1, True, 1.0, "1"])
def test_bad_agent_ids(bad_id: object) -> None:
    with pytest.raises(ValueError, match="bad agent id"):
        T.ctl_up(RUN, bad_id)  # type: ignore[arg-type]


# --- PUBLISH size -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "payload_len", "qos", "size"),
    [
        ("a/b", 10, 0, 17),  # 1 + 1 + (2 + 3 + 10)
        ("a/b", 10, 1, 19),  # + 2-byte packet id
        ("a/b", 122, 0, 129),  # remaining 127: last 1-byte length
        ("a/b", 123, 0, 131),  # remaining 128: 2-byte length
        ("a/b", 16_378, 0, 16_386),  # remaining 16383: last 2-byte length
        ("a/b", 16_378, 2, 16_389),  # remaining 16385: 3-byte length
        ("é/ü", 0, 0, 9),  # topic is 5 UTF-8 bytes
        ("", 0, 0, 4),
    ],
)
def test_publish_size_by_hand(topic: str, payload_len: int, qos: int, size: int) -> None:
    assert T.mqtt_publish_size(topic, payload_len, qos) == size


def test_publish_size_errors() -> None:
    with pytest.raises(ValueError, match="QoS"):
        T.mqtt_publish_size("t", 1, qos=3)
    with pytest.raises(ValueError, match="negative"):
        T.mqtt_publish_size("t", -1)
    with pytest.raises(ValueError, match="65535"):
        T.mqtt_publish_size("t" * 65_536, 0)
    with pytest.raises(ValueError, match="limit"):
        T.mqtt_publish_size("t", 268_435_455)


async def read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes, int]:
    """One MQTT packet: (first byte, body, total size on the wire)."""
    first = (await reader.readexactly(1))[0]
    remaining, shift, header = 0, 0, 1
    while True:
        byte = (await reader.readexactly(1))[0]
        header += 1
        remaining |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
    return first, await reader.readexactly(remaining), header + remaining


CASES = [("a/b", 10, 0), ("a/b", 123, 1), ("é/ü", 16_379, 2), (T.peer_topic(RUN, 29, 0), 300, 1),
         ("t", 2_100_000, 0)]  # fmt: skip


async def test_publish_size_matches_what_paho_sends() -> None:
    """A real aiomqtt/paho client talks to a bare TCP server that measures each PUBLISH."""
    sizes: list[int] = []
    finished = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first, _, _ = await read_packet(reader)
        assert first == 0x10, "expected CONNECT"
        writer.write(b"\x20\x02\x00\x00")  # CONNACK, accepted
        while True:
            first, body, size = await read_packet(reader)
            if first >> 4 != 3:  # not a PUBLISH: DISCONNECT ends the test
                break
            sizes.append(size)
            qos = (first >> 1) & 3
            topic_len = int.from_bytes(body[:2], "big")
            packet_id = body[2 + topic_len : 4 + topic_len]
            if qos == 1:
                writer.write(b"\x40\x02" + packet_id)  # PUBACK
            elif qos == 2:
                writer.write(b"\x50\x02" + packet_id)  # PUBREC
                await read_packet(reader)  # PUBREL
                writer.write(b"\x70\x02" + packet_id)  # PUBCOMP
        writer.close()
        finished.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        async with aiomqtt.Client("127.0.0.1", port) as c:
            for topic, payload_len, qos in CASES:
                await c.publish(topic, b"\x00" * payload_len, qos=qos, timeout=5.0)
        async with asyncio.timeout(RECEIVE_TIMEOUT):
            await finished.wait()  # the DISCONNECT, after every PUBLISH
    assert sizes == [T.mqtt_publish_size(*case) for case in CASES]


def test_cli_prints_the_address_and_stops_on_sigterm() -> None:
    cli = subprocess.Popen(
        [sys.executable, "-m", "privnet.broker", "--kind", "auto"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = cli.stdout.readline() if cli.stdout else ""
        address = BrokerAddress.parse(line.split(" listening on ")[1].split()[0])
        assert accepts(address)
        broker_pids = [p.pid for p in psutil.Process(cli.pid).children()]
        assert len(broker_pids) == 1
    finally:
        cli.terminate()
        assert cli.wait(timeout=10) == 0
    assert not accepts(address)
    assert not any(psutil.pid_exists(pid) for pid in broker_pids)

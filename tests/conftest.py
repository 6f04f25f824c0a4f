"""Fixtures shared by the tests that need a real broker or a real packet capture."""

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import NoReturn

import aiomqtt
import pytest
from amqtt.adapters import BufferReader
from amqtt.mqtt.connect import ConnectPacket
from probes import connect_options

from privnet.agent import keys
from privnet.agent.access import BrokerAddress
from privnet.agent.driver import publish, pump
from privnet.agent.node import AgentNode
from privnet.agent.transport import Connection
from privnet.broker.launcher import Broker, has_mosquitto, launch
from privnet.orchestrator.engines.launch import agent_args
from privnet.orchestrator.engines.lifetime import RunSecrets

BROKER_KINDS = ("mosquitto", "embedded")
HOG = "while True: pass"  # one busy loop: a core's worth of someone else's work


@contextlib.contextmanager
def busy(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` busy loops beside whatever runs inside, killed after (whatever happens)."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(count)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


@pytest.fixture
def hogs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """As many busy loops as the machine has cores, beside the test: it must pass on a
    machine busy with other work (issue 30)."""
    with busy(os.cpu_count() or 2) as started:
        assert all(hog.poll() is None for hog in started)
        yield started


def skip_unless_required(env: str, reason: str) -> NoReturn:
    """Skip for `reason`, except where `env`=1 (CI) requires the thing: there it fails."""
    if os.environ.get(env) == "1":
        pytest.fail(f"{env}=1 but {reason}")
    pytest.skip(reason)


def need_mosquitto() -> None:
    """Skip without mosquitto, except in CI (PRIVNET_REQUIRE_MOSQUITTO=1), where it is a failure."""
    if not has_mosquitto():
        skip_unless_required(
            "PRIVNET_REQUIRE_MOSQUITTO",
            "mosquitto is not installed (apt-get install mosquitto); embedded variants run",
        )


def need_torch() -> None:
    """Skip without torch (the PyTorch adapter's extra), except in CI (PRIVNET_REQUIRE_TORCH=1:
    scripts/setup installs its CPU wheel), where it is a failure."""
    try:
        import torch  # noqa: F401
    except ImportError:
        skip_unless_required(
            "PRIVNET_REQUIRE_TORCH", "torch is not installed (pip install 'privnet[torch]')"
        )


@pytest.fixture(scope="module", params=BROKER_KINDS)
def broker_kind(request: pytest.FixtureRequest) -> str:
    """Each broker privnet can launch (module scope: pytest groups a module's tests by broker)."""
    if request.param == "mosquitto":
        need_mosquitto()
    return str(request.param)


@pytest.fixture
def needs_mosquitto() -> None:
    """For tests about mosquitto itself (its $SYS counters, say)."""
    need_mosquitto()


def docker_unreachable() -> str | None:
    """Why no Docker engine can be used here, or None when `docker info` answers."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 30 s"
    if info.returncode != 0:
        last = (info.stderr.strip().splitlines() or ["no output"])[-1]
        return f"`docker info` failed: {last}"
    return None


def need_docker() -> None:
    """Skip without a Docker engine, except in CI (PRIVNET_REQUIRE_DOCKER=1): a failure there."""
    reason = docker_unreachable()
    if reason is not None:
        skip_unless_required("PRIVNET_REQUIRE_DOCKER", f"no Docker engine: {reason}")


def capture_tools() -> bool:
    """Whether tcpdump and tshark are here; in CI (PRIVNET_REQUIRE_PCAP=1) they must be."""
    found = shutil.which("tcpdump") is not None and shutil.which("tshark") is not None
    if not found and os.environ.get("PRIVNET_REQUIRE_PCAP") == "1":
        pytest.fail("PRIVNET_REQUIRE_PCAP=1 but tcpdump or tshark is missing: scripts/setup")
    return found


@contextlib.contextmanager
def tcpdump(pcap: Path, port: int, interface: str = "lo") -> Iterator[None]:
    """Capture TCP `port` on `interface` into `pcap` for the body of the with block."""
    proc = subprocess.Popen(
        ["tcpdump", "-i", interface, "-U", "-w", str(pcap), "tcp", "port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    line = "tcpdump exited"
    for raw in proc.stderr:  # "listening on <interface> ..." once it captures
        line = raw.decode()
        if "listening" in line:
            break
    else:
        proc.wait(5)
        skip_unless_required(
            "PRIVNET_REQUIRE_PCAP", f"tcpdump cannot capture on {interface}: {line.strip()}"
        )
    try:
        yield
    finally:
        time.sleep(0.5)  # the last packets of the run
        proc.send_signal(signal.SIGINT)
        proc.wait(10)


@dataclasses.dataclass
class Prepared:
    """A run whose secrets the test holds: the broker it started, and the run file."""

    broker: Broker
    run: str
    run_json: Path
    secrets: RunSecrets

    def flags(self) -> list[str]:
        """`privnet run` flags for this broker and these secrets."""
        return ["--broker", str(self.broker.address), "--prepared", str(self.run_json)]

    def client(self, user: str) -> aiomqtt.Client:
        """A client logged in as `user` (an agent id, orchestrator or inspector)."""
        return aiomqtt.Client(**connect_options(self.broker, user))


@contextlib.asynccontextmanager
async def prepared(kind: str, run: str, agents: int, out: Path) -> AsyncIterator[Prepared]:
    """A broker enforcing the run's credentials, and the run's secrets in a file."""
    run_secrets = RunSecrets.generate(run, agents)
    run_json = out / "run.json"
    run_json.write_text(run_secrets.to_json())
    async with launch(kind, credentials=run_secrets.credentials) as broker:
        yield Prepared(broker, run, run_json, run_secrets)


@dataclasses.dataclass
class InsiderRun:
    """`privnet run` with one agent run by the test: its operator, an insider."""

    privnet: subprocess.Popen[bytes]
    insider: Connection  # the agent's own connection: the test publishes on it too


@contextlib.asynccontextmanager
async def insider_run(
    setup: Prepared, out: Path, insider: int, flags: list[str]
) -> AsyncIterator[InsiderRun]:
    """`privnet run FLAGS` on the prepared broker and secrets (stderr to out/privnet.err),
    every agent its own process (logs in out/logs) but `insider`, which runs on this event
    loop over a connection the test shares: all that agent's operator holds. Its broker
    user has one connection at a time (its client id is its name), so an attacker with its
    credentials is this operator, or displaces the agent."""
    launches = setup.secrets.launches(str(setup.broker.address), setup.broker.access)
    (out / "logs").mkdir(exist_ok=True)
    with (out / "privnet.err").open("w") as err:
        argv = [sys.executable, "-m", "privnet.orchestrator.cli", "run", *flags, *setup.flags()]
        privnet = subprocess.Popen(
            [*argv, "--external-agents", "--out", str(out)], stdout=subprocess.DEVNULL, stderr=err
        )
    agents = []
    for p, launch_ in launches.items():
        if p != insider:
            with (out / "logs" / f"agent-{p}.log").open("w") as log:
                env = {**os.environ, **launch_.to_env()}
                agents.append(
                    subprocess.Popen(
                        [sys.executable, *agent_args(p)],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
    broker, launch_, access = launches[insider].parts()
    try:
        async with Connection(broker, access) as connection:
            node = AgentNode(launch_, keys.Identity.generate())
            for topic, qos in node.subscription_qos.items():
                await connection.subscribe(topic, qos)
            publish(connection, node.start(time.monotonic()))
            serving = asyncio.create_task(pump(connection, node, lambda: node.done))
            try:
                yield InsiderRun(privnet, connection)
                await asyncio.wait_for(serving, 30)  # until Bye
            finally:
                serving.cancel()
    finally:
        for proc in [privnet, *agents]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


class Relay:
    """A TCP relay in front of a broker. It reads what anyone on the wire reads: every
    CONNECT's username and client id (MQTT 3.1.1 sends both in the clear). And it fails as
    a network does, when told: `drop` cuts every connection, `cut_after_connack` the next
    ones right after the broker's CONNACK."""

    def __init__(self, broker: BrokerAddress) -> None:
        self.broker = broker
        self.address = broker  # where clients connect, once `relay` listens
        self.ids: dict[str | None, list[str]] = {}  # username -> client ids its CONNECTs named
        self.cut_after_connack = 0
        self._writers: list[asyncio.StreamWriter] = []

    def others(self, user: str) -> list[str]:
        """Every client id the wire showed for users other than `user`, and their names."""
        named = [u for u in self.ids if u is not None and u != user]
        return sorted({i for u, ids in self.ids.items() if u != user for i in ids} | set(named))

    def drop(self) -> None:
        """Cut every connection made through the relay so far."""
        for writer in self._writers:
            writer.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream, up = await asyncio.open_connection(self.broker.host, self.broker.port)
        self._writers += [writer, up]
        connect = await read_packet(reader)
        with contextlib.suppress(Exception):  # not a CONNECT: the broker says so
            packet = await ConnectPacket.from_stream(BufferReader(connect))
            if not packet.payload.client_id_is_random:
                self.ids.setdefault(packet.username, []).append(packet.client_id)
        up.write(connect)
        if self.cut_after_connack:
            self.cut_after_connack -= 1
            writer.write(await read_packet(upstream))
            up.close()
            writer.close()  # with the CONNACK: the client reads both at once
            return
        await asyncio.gather(_pipe(reader, up), _pipe(upstream, writer))


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await source.read(65_536):
            sink.write(data)
            await sink.drain()
    sink.close()


async def read_packet(reader: asyncio.StreamReader) -> bytes:
    """One whole MQTT packet from the stream (b"" at its end)."""
    try:
        header = await reader.readexactly(2)
        while header[-1] & 0x80 and len(header) < 5:
            header += await reader.readexactly(1)
    except asyncio.IncompleteReadError:
        return b""
    remaining = sum((b & 0x7F) << 7 * k for k, b in enumerate(header[1:]))
    return header + await reader.readexactly(remaining)


@contextlib.asynccontextmanager
async def relay(broker: BrokerAddress) -> AsyncIterator[Relay]:
    """A `Relay` in front of `broker`, listening on a free local port."""
    wire = Relay(broker)
    server = await asyncio.start_server(wire.serve, "127.0.0.1", 0)
    wire.address = BrokerAddress("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        async with server:
            yield wire
    finally:
        wire.drop()


# Where a run keeps true models, keys, seeds and passwords: never readable by group or others.
SECRET_DIRS = ("journal", "checkpoints", "launch")
SECRET_FILES = ("models.npz", "telemetry.npz", "wire.msgpack", "link_keys.msgpack", "secrets.json")


def assert_private_run(out: Path, *others: str) -> None:
    """The permissions walk: `out` is 0700; every file under it that holds a true model, a
    key, a seed or a password is 0600 (or stricter); no file others could read (were the
    directory opened) holds the run's secret seed; and nothing there is unknown (but the
    test's own `others`)."""
    from privnet.orchestrator.report import OUTPUTS

    assert out.stat().st_mode & 0o077 == 0, f"{out} is {oct(out.stat().st_mode & 0o777)}"
    secrets_json = out / "secrets.json"
    seed = json.loads(secrets_json.read_text())["seed"] if secrets_json.exists() else None
    for path in out.rglob("*"):
        where = path.relative_to(out)
        if where.parts[0] in others:
            continue
        assert where.parts[0] in OUTPUTS, f"{where}: a file privnet does not list in OUTPUTS"
        mode = path.stat().st_mode & 0o777
        secret = where.parts[0] in SECRET_DIRS or where.name in SECRET_FILES
        if path.is_dir():
            assert not secret or mode & 0o077 == 0, f"{where} is {oct(mode)}"
        elif secret:
            assert mode & 0o077 == 0, f"{where} holds secrets and is {oct(mode)}"
        elif seed is not None:
            assert str(seed).encode() not in path.read_bytes(), f"{where} holds the seed"

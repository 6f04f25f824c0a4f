"""`privnet run --runtime docker`: the broker and every agent in a container of their own.

The Docker SDK (the `privnet[docker]` extra) makes, per run, a user-defined bridge network,
an `eclipse-mosquitto:2.0` broker on it with the project's broker config, and one container
per agent from the project's image; everything carries the label `privnet.run=<run>`. The
orchestrator stays on the host and reaches the broker through a port published on
127.0.0.1 (so the engine must run on this machine, as a local or rootless dockerd does).

`DockerBroker` plays the broker's part for the net engine (start, stop, address, kind) and
owns the network; `DockerAgents` is its `Launcher`. Whatever happens (success, failure,
Ctrl-C, exit), `DockerBroker.stop` removes every container labelled with the run and the
network. `DockerBroker.nic` reads each container's interface counters (Docker stats API), and
`NicMeter` turns readings at the start and end of each session's rounds into the NIC bytes
summary.json reports next to the agents' MQTT counts and the broker's $SYS counters.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import io
import tarfile
import threading
import time
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console

from agent.mqtt import BrokerAddress
from agent.spec import ConfigError
from broker.launcher import BASE_CONFIG, accepts, read_sys_bytes
from orchestrator.engines.launch import AGENT_COMMAND, AgentCommand, RunFailed, log_path, log_tail

BROKER_IMAGE = "eclipse-mosquitto:2.0"
MQTT_PORT = 1883
RUN_LABEL = "privnet.run"
ROLE_LABEL = "privnet.role"  # "broker", "agent" or "network"
AGENT_LABEL = "privnet.agent"
READY_TIMEOUT = 30.0
WORKERS = 8  # parallel Docker API calls when starting, reading or removing containers
SOURCE = Path(__file__).resolve().parents[2]  # the checkout, when privnet runs from one

console = Console(stderr=True)
_live: dict[int, DockerBroker] = {}  # started and not yet stopped: atexit cleans these up


def connect() -> Any:
    """A Docker SDK client from the environment (DOCKER_HOST & co.), or a clear ConfigError."""
    try:
        import docker
    except ImportError:
        raise ConfigError(
            "--runtime docker needs the Docker SDK: pip install 'privnet[docker]'"
        ) from None
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise ConfigError(
            f"--runtime docker found no Docker engine ({exc}); start one, or point "
            "DOCKER_HOST at it"
        ) from None
    return client


def default_image() -> str:
    """privnet:<installed version> (privnet:dev when not installed)."""
    try:
        return f"privnet:{metadata.version('privnet')}"
    except metadata.PackageNotFoundError:
        return "privnet:dev"


def source_tree() -> Path | None:
    """The checkout privnet runs from, if it has the Dockerfile to build the image with."""
    wanted = ("Dockerfile", "pyproject.toml", "agent", "broker", "orchestrator")
    return SOURCE if all((SOURCE / name).exists() for name in wanted) else None


def ensure_image(client: Any, image: str | None) -> str:
    """The agents' image: `image` as given, else built (Docker's layer cache makes an
    unchanged tree a matter of seconds) from the checkout, else privnet:<version> if present."""
    if image is not None:
        _need_image(client, image, "pass an image that exists (docker images)")
        return image
    tag = default_image()
    root = source_tree()
    if root is None:
        _need_image(
            client,
            tag,
            "privnet is not running from a source checkout to build it from: build it "
            f"there (docker build -t {tag} .) or pass --image NAME",
        )
        return tag
    with console.status(f"image {tag}: building from {root}") as status:
        for chunk in client.api.build(path=str(root), tag=tag, rm=True, decode=True):
            if "error" in chunk:
                raise RunFailed(f"building image {tag} failed: {chunk['error'].strip()}")
            line = chunk.get("stream", "").strip()
            if line.startswith("Step "):
                status.update(f"image {tag}: {line[:100]}")
    console.print(f"image {tag}: ready")
    return tag


def _need_image(client: Any, image: str, fix: str) -> None:
    import docker

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ConfigError(f"image {image} not found; {fix}") from None


@dataclass(frozen=True)
class NicBytes:
    """A container's interface counters (all its interfaces): bytes received and sent."""

    rx: int
    tx: int

    def __sub__(self, other: NicBytes) -> NicBytes:
        return NicBytes(self.rx - other.rx, self.tx - other.tx)

    def __add__(self, other: NicBytes) -> NicBytes:
        return NicBytes(self.rx + other.rx, self.tx + other.tx)


ZERO = NicBytes(0, 0)


def nic_of(stats: dict[str, Any]) -> NicBytes:
    """The network counters in one Docker stats answer."""
    nets = stats.get("networks") or {}
    return NicBytes(
        sum(int(n["rx_bytes"]) for n in nets.values()),
        sum(int(n["tx_bytes"]) for n in nets.values()),
    )


def _tar(name: str, text: str) -> bytes:
    data = text.encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class DockerBroker:
    """The run's network and mosquitto container; the broker the net engine talks to."""

    run: str
    logs: Path
    image: str | None = None  # the agents' image; None: build or reuse the project's
    client: Any = None
    kind: str = field(default="mosquitto", init=False)
    address: BrokerAddress = field(default=BrokerAddress("127.0.0.1", MQTT_PORT), init=False)
    _network: Any = field(default=None, init=False, repr=False)
    _followers: list[threading.Thread] = field(default_factory=list, init=False, repr=False)

    @property
    def name(self) -> str:
        return f"privnet-{self.run}"

    @property
    def agent_address(self) -> BrokerAddress:
        """Where agents reach the broker: its container name on the run's network."""
        return BrokerAddress(f"{self.name}-broker", MQTT_PORT)

    def labels(self, role: str, **more: str) -> dict[str, str]:
        return {RUN_LABEL: self.run, ROLE_LABEL: role, **more}

    def start(self) -> None:
        """Image ready, network made, broker container up and answering on its port."""
        self.client = self.client or connect()
        _live[id(self)] = self
        try:
            self.image = ensure_image(self.client, self.image)
            self.logs.mkdir(parents=True, exist_ok=True)
            self._network = self.client.networks.create(
                self.name, driver="bridge", labels=self.labels("network")
            )
            broker = self.client.containers.create(
                BROKER_IMAGE,
                name=f"{self.name}-broker",
                network=self.name,
                ports={f"{MQTT_PORT}/tcp": ("127.0.0.1", None)},
                labels=self.labels("broker"),
            )
            broker.put_archive("/mosquitto/config", _tar("mosquitto.conf", BASE_CONFIG.read_text()))
            broker.start()
            self.follow(broker, self.logs / "broker.log")
            broker.reload()
            port = int(broker.ports[f"{MQTT_PORT}/tcp"][0]["HostPort"])
            self.address = BrokerAddress("127.0.0.1", port)
            self._wait_ready(broker)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, broker: Any) -> None:
        """mosquitto says it is running (the published port accepts before it does)."""
        deadline = time.monotonic() + READY_TIMEOUT
        while b" running" not in broker.logs():
            broker.reload()
            if broker.status == "exited" or time.monotonic() > deadline:
                tail = broker.logs(tail=10).decode(errors="replace")
                raise RunFailed(f"the broker container did not come up; its log ends:\n{tail}")
            time.sleep(0.1)
        if not accepts(self.address, timeout=3.0):
            raise RunFailed(f"the broker container runs but {self.address} does not accept")

    def follow(self, container: Any, path: Path) -> None:
        """Copy a container's output into `path` as it comes, until the container goes."""

        def copy() -> None:
            with open(path, "wb") as out, contextlib.suppress(Exception):
                for chunk in container.logs(stream=True, follow=True):
                    out.write(chunk)
                    out.flush()

        thread = threading.Thread(target=copy, name=f"logs-{container.name}", daemon=True)
        thread.start()
        self._followers.append(thread)

    def containers(self, role: str | None = None, **filters: str) -> list[Any]:
        labels = [f"{RUN_LABEL}={self.run}"] + ([f"{ROLE_LABEL}={role}"] if role else [])
        return list(self.client.containers.list(all=True, filters={"label": labels, **filters}))

    def nic(self) -> dict[str, NicBytes]:
        """Every running container's interface counters, by container name."""
        running = self.containers(status="running")
        with ThreadPoolExecutor(WORKERS) as pool:
            stats = pool.map(lambda c: c.stats(stream=False, one_shot=True), running)
            return {c.name: nic_of(s) for c, s in zip(running, stats, strict=True)}

    def remove(self, containers: Sequence[Any]) -> None:
        import docker

        def gone(container: Any) -> None:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)

        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(gone, containers))

    def stop(self) -> None:
        """Remove every container labelled with the run, then the network. Safe to repeat."""
        _live.pop(id(self), None)
        if self.client is None:
            return
        import docker

        self.remove(self.containers())
        for thread in self._followers:
            thread.join(timeout=2.0)
        self._followers.clear()
        for _ in range(20):  # Docker 20.10 keeps a stale endpoint a moment after a removal
            networks = self.client.networks.list(filters={"label": f"{RUN_LABEL}={self.run}"})
            if not networks:
                break
            for network in networks:
                with contextlib.suppress(docker.errors.APIError):
                    network.remove()
            time.sleep(0.25)
        else:
            console.print(f"[yellow]docker network {self.name} could not be removed[/yellow]")


@atexit.register
def _stop_leftovers() -> None:
    for broker in list(_live.values()):
        broker.stop()


class DockerAgents:
    """The Launcher: one container per agent from the project's image, on the run's network."""

    def __init__(self, broker: DockerBroker, grace: float = 3.0) -> None:
        self.broker, self.grace = broker, grace
        self.started: dict[int, str] = {}  # agent -> container name
        self._stopping = threading.Event()

    def start(self, commands: Sequence[AgentCommand]) -> None:
        b = self.broker

        def one(command: AgentCommand) -> None:
            if self._stopping.is_set():
                return
            name = f"{b.name}-agent-{command.agent}"
            container = b.client.containers.create(
                b.image,
                command=[*AGENT_COMMAND, *command.args],
                environment=dict(command.env),
                name=name,
                network=b.name,
                labels=b.labels("agent", **{AGENT_LABEL: str(command.agent)}),
            )
            self.started[command.agent] = name
            container.start()
            b.follow(container, log_path(b.logs, command.agent))

        status = console.status(f"starting {len(commands)} agent containers")
        with status, ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(one, commands))

    def check(self, finished: AbstractSet[int] = frozenset()) -> None:
        """One API call: any container of the run that exited too early, or badly."""
        for container in self.broker.containers(status="exited"):
            role = container.labels.get(ROLE_LABEL)
            code = container.attrs["State"]["ExitCode"]
            if role == "broker":
                raise RunFailed(f"the broker container exited with code {code}")
            agent = int(container.labels[AGENT_LABEL])
            if code != 0 or agent not in finished:
                raise RunFailed(
                    f"agent {agent} (container {container.name}) exited with code {code} "
                    "before the run ended" + self.log_tail(agent)
                )

    def log_tail(self, agent: int, lines: int = 3) -> str:
        return log_tail(self.broker.logs, agent, lines)

    def stop(self) -> None:
        """Give agents a moment to leave by themselves (after Bye), then remove them."""
        self._stopping.set()
        if self.broker.client is None:
            return
        deadline = time.monotonic() + self.grace
        while self.broker.containers("agent", status="running"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.broker.remove(self.broker.containers("agent"))


Reading = tuple[dict[str, NicBytes], dict[str, int]]  # NIC by container name, $SYS counters


@dataclass
class NicMeter:
    """NIC and $SYS byte counts over windows (`async with meter:` around a session: from
    before its Setup to its last Finished); `take` sums the windows since the last take."""

    broker: DockerBroker
    _before: Reading | None = None
    _nic: dict[str, NicBytes] = field(default_factory=dict)
    _sys: dict[str, int] = field(default_factory=dict)

    async def _read(self) -> Reading:
        nic = await asyncio.to_thread(self.broker.nic)
        return nic, await read_sys_bytes(self.broker.address)

    async def __aenter__(self) -> NicMeter:
        self._before = await self._read()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None and self._before is not None:
            self.add(self._before, await self._read())

    def add(self, before: Reading, after: Reading) -> None:
        """Count one window: what every counter grew by between two readings."""
        (nic0, sys0), (nic1, sys1) = before, after
        for name, counters in nic1.items():
            self._nic[name] = self._nic.get(name, ZERO) + (counters - nic0.get(name, ZERO))
        for key, value in sys1.items():
            self._sys[key] = self._sys.get(key, 0) + value - sys0.get(key, 0)

    def take(self, rounds: int) -> dict[str, Any]:
        """summary.json's `nic` (bytes on the containers' interfaces: TCP/IP and MQTT framing,
        acks and keepalives included) and `broker_sys_rounds` ($SYS over the same windows)."""
        agent_prefix, broker_name = f"{self.broker.name}-agent-", f"{self.broker.name}-broker"
        per_agent = {
            int(name.removeprefix(agent_prefix)): nic
            for name, nic in self._nic.items()
            if name.startswith(agent_prefix)
        }
        broker = self._nic.get(broker_name, ZERO)
        tx = sum(n.tx for n in per_agent.values())
        rx = sum(n.rx for n in per_agent.values())
        nic = {
            "agents_tx": tx,
            "agents_rx": rx,
            "agents_total": tx + rx,
            "broker_rx": broker.rx,
            "broker_tx": broker.tx,
            "agents_tx_per_round": tx / rounds,
            "agents_total_per_round": (tx + rx) / rounds,
            "per_agent": {str(p): {"rx": n.rx, "tx": n.tx} for p, n in sorted(per_agent.items())},
        }
        sys_bytes, self._nic, self._sys = self._sys, {}, {}
        return {"nic": nic, "broker_sys_rounds": sys_bytes}

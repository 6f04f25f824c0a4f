"""`privnet run --runtime docker`: the broker and every agent in a container of their own.

Per run, the Docker SDK (the `privnet[docker]` extra) makes a bridge network, an
`eclipse-mosquitto:2.0` broker with the run's credentials and ACL, and one container per
agent from the project's image, its `AgentLaunch` in the environment; everything is
labelled `privnet.run=<run>`, and `DockerBroker.stop` removes all of it whatever happens.
The orchestrator stays on the host and reaches the broker through a port published on
127.0.0.1, so the engine must be on this machine. `DockerAgents` is the `Launcher`;
`ContainerBroker` is what `--runtime swarm` shares; `nic_window` turns two readings of the
containers' interface counters into the NIC bytes summary.json reports.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import tarfile
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from privnet.agent.access import BrokerAddress, ClientAccess
from privnet.agent.launch import AgentLaunch
from privnet.agent.spec import ConfigError
from privnet.broker.credentials import Credentials
from privnet.broker.launcher import accepts, mosquitto_config, mosquitto_settings
from privnet.orchestrator.engines.launch import agent_args, log_path, log_tail
from privnet.orchestrator.errors import RunFailed
from privnet.orchestrator.terminal import console

BROKER_IMAGE = "eclipse-mosquitto:2.0"
MQTT_PORT = 1883
RUN_LABEL = "privnet.run"
ROLE_LABEL = "privnet.role"  # "broker", "agent" or "network"
AGENT_LABEL = "privnet.agent"
READY_TIMEOUT = 30.0
FOLLOW_WAIT = 2.0  # s the log copies get to drain when a run stops
WORKERS = 8  # parallel Docker API calls when starting, reading or removing containers
SOURCE = Path(__file__).resolve().parents[3]  # the checkout, when privnet runs from one
BROKER_FILES = PurePosixPath("/mosquitto/config")  # in the broker container
# The image's mosquitto drops root for its own `mosquitto` user before it reads the password
# file and ACL; that user's uid differs between images, so the container hands the 0600
# files over by name (as docker-compose.yml's broker does), then becomes mosquitto.
BROKER_SCRIPT = (
    f"chown -R mosquitto:mosquitto {BROKER_FILES} "
    f"&& exec mosquitto -c {BROKER_FILES}/mosquitto.conf"
)
BROKER_COMMAND = ["sh", "-c", BROKER_SCRIPT]
_live: dict[int, ContainerBroker] = {}  # started and not yet stopped: atexit cleans these up


def connect(runtime: str = "docker") -> Any:
    """A Docker SDK client from the environment (DOCKER_HOST & co.), or a clear ConfigError."""
    try:
        import docker
    except ImportError:
        raise ConfigError(
            f"--runtime {runtime} needs the Docker SDK: pip install 'privnet[docker]'"
        ) from None
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise ConfigError(
            f"--runtime {runtime} found no Docker engine ({exc}); start one, or point "
            "DOCKER_HOST at it"
        ) from None
    return client


def installed_version() -> str | None:
    """privnet's version as installed (from its git tag at build time), None if it is not."""
    try:
        return metadata.version("privnet")
    except metadata.PackageNotFoundError:
        return None


def default_image() -> str:
    """privnet:<installed version> (privnet:dev when not installed). A tag takes no '+', so a
    version between releases (0.2.1.dev3+g1a2b3c4) is tagged 0.2.1.dev3-g1a2b3c4."""
    version = installed_version()
    return "privnet:dev" if version is None else f"privnet:{version.replace('+', '-')}"


def source_tree() -> Path | None:
    """The checkout privnet runs from, if it has the Dockerfile to build the image with."""
    wanted = ("Dockerfile", "pyproject.toml", "privnet")
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
    return build_image(client, root, tag)


def build_image(client: Any, root: Path, tag: str) -> str:
    """`docker build -t tag root`, its steps shown as it goes; RunFailed if it fails."""
    with console.status(f"image {tag}: building from {root}") as status:
        # The build context has no .git: the version the wheel inside gets is this one.
        version = {"PRIVNET_VERSION": installed_version() or ""}
        chunks = client.api.build(path=str(root), tag=tag, rm=True, decode=True, buildargs=version)
        for chunk in chunks:
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


def remove_all(things: Sequence[Any], **how: Any) -> None:
    """`thing.remove(**how)` for each (containers, services, ...), WORKERS at a time; one
    already gone is fine. Plain threads: an executor takes no work once the interpreter
    exits, and `_stop_leftovers` cleans up at exit."""
    import docker

    todo, failed = list(things), []

    def work() -> None:
        while True:
            try:
                thing = todo.pop()
            except IndexError:
                return
            try:
                thing.remove(**how)
            except docker.errors.NotFound:
                pass
            except Exception as exc:  # raised below, in the caller's thread
                failed.append(exc)

    threads = [threading.Thread(target=work) for _ in range(min(WORKERS, len(todo)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        raise failed[0]


@dataclass(frozen=True)
class NicBytes:
    """A container's interface counters (all its interfaces): bytes received and sent."""

    rx: int
    tx: int

    def __sub__(self, other: NicBytes) -> NicBytes:
        return NicBytes(self.rx - other.rx, self.tx - other.tx)


ZERO = NicBytes(0, 0)


def nic_of(stats: dict[str, Any]) -> NicBytes:
    """The network counters in one Docker stats answer."""
    nets = stats.get("networks") or {}
    return NicBytes(
        sum(int(n["rx_bytes"]) for n in nets.values()),
        sum(int(n["tx_bytes"]) for n in nets.values()),
    )


def broker_files(credentials: Credentials) -> dict[str, bytes]:
    """The broker container's files in BROKER_FILES, by name: mosquitto.conf (listener 1883,
    anonymous refused), the run's password file (`passwd`) and ACL (`acl`)."""
    with tempfile.TemporaryDirectory(prefix="privnet-docker-") as tmp:
        directory = Path(tmp)
        settings = mosquitto_settings(directory, credentials, None, at=Path(BROKER_FILES))
        (directory / "mosquitto.conf").write_text(mosquitto_config(str(MQTT_PORT), settings))
        return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def broker_tar(credentials: Credentials) -> bytes:
    """`broker_files` as a tar to put in the container: private files 0600."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in broker_files(credentials).items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644 if name == "mosquitto.conf" else 0o600
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class ContainerBroker(ABC):
    """What the docker and swarm runtimes share: the run (credentials, logs, the agents'
    image), the names and labels everything of the run carries, and the broker the net engine
    talks to (start, stop, address, access, kind)."""

    credentials: Credentials  # the run's users: the broker enforces them and their ACL
    logs: Path
    image: str | None = None  # the agents' image; None: build or reuse the project's
    client: Any = None
    kind: str = field(default="mosquitto", init=False)
    address: BrokerAddress = field(default=BrokerAddress("127.0.0.1", MQTT_PORT), init=False)
    _followers: list[tuple[threading.Thread, Any]] = field(
        default_factory=list, init=False, repr=False
    )
    runtime: ClassVar[str]  # the --runtime it is, for summary.json

    @property
    def run(self) -> str:
        return self.credentials.run

    def access(self, user: str) -> ClientAccess:
        """How `user` (an agent id as text, "orchestrator" or "inspector") connects."""
        return self.credentials.access(user)

    @property
    def name(self) -> str:
        return f"privnet-{self.run}"

    @property
    def agent_address(self) -> BrokerAddress:
        """Where agents reach the broker: its name on the run's network."""
        return BrokerAddress(f"{self.name}-broker", MQTT_PORT)

    def labels(self, role: str, **more: str) -> dict[str, str]:
        return {RUN_LABEL: self.run, ROLE_LABEL: role, **more}

    @abstractmethod
    def start(self) -> None:
        """The broker up and answering at `address`; agents can be started after."""

    @abstractmethod
    def stop(self) -> None:
        """Remove everything of the run; safe to repeat, and run at exit if never called."""

    def _started(self) -> None:
        """From here on, stop() runs at exit even if no one calls it."""
        _live[id(self)] = self

    def _stopped(self) -> None:
        _live.pop(id(self), None)

    def follow(self, name: str, stream: Any, path: Path) -> None:
        """Copy `stream` (a container's or a service's output, followed: a cancellable
        stream of the SDK) into `path` as it comes, until it ends or the run stops."""

        def copy() -> None:
            with open(path, "wb") as out, contextlib.suppress(Exception):
                for chunk in stream:
                    out.write(chunk)
                    out.flush()

        thread = threading.Thread(target=copy, name=f"logs-{name}", daemon=True)
        thread.start()
        self._followers.append((thread, stream))

    def _stop_following(self, wait: float = FOLLOW_WAIT) -> None:
        """Let the log copies drain for up to `wait` s (a removed container's stream ends
        by itself, a service's never does), then close their streams."""
        deadline = time.monotonic() + wait
        for thread, _ in self._followers:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        for thread, stream in self._followers:
            with contextlib.suppress(Exception):
                stream.close()
            thread.join(timeout=1.0)
        self._followers.clear()


@dataclass
class DockerBroker(ContainerBroker):
    """The run's network and mosquitto container, on this machine's engine."""

    runtime: ClassVar[str] = "docker"

    def start(self) -> None:
        """Image ready, network made, broker container up and answering on its port."""
        self.client = self.client or connect()
        self._started()
        try:
            self.image = ensure_image(self.client, self.image)
            self.logs.mkdir(parents=True, exist_ok=True)
            self.client.networks.create(self.name, driver="bridge", labels=self.labels("network"))
            broker = self.client.containers.create(
                BROKER_IMAGE,
                command=BROKER_COMMAND,
                name=f"{self.name}-broker",
                network=self.name,
                ports={f"{MQTT_PORT}/tcp": ("127.0.0.1", None)},
                labels=self.labels("broker"),
            )
            broker.put_archive(str(BROKER_FILES), broker_tar(self.credentials))
            broker.start()
            output = broker.logs(stream=True, follow=True)
            self.follow(broker.name, output, self.logs / "broker.log")
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
        remove_all(containers, force=True)

    def stop(self) -> None:
        """Remove every container labelled with the run, then the network. Safe to repeat."""
        self._stopped()
        if self.client is None:
            return
        import docker

        self.remove(self.containers())
        self._stop_following()
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
        self._stopping = threading.Event()
        self._reported: set[str] = set()  # exited containers already reported

    def start(self, launches: Mapping[int, AgentLaunch]) -> None:
        """`python -m privnet.agent --id N` per launch, the launch in the container's
        environment."""
        b = self.broker

        def one(p: int) -> None:
            if self._stopping.is_set():
                return
            container = b.client.containers.create(
                b.image,
                command=["python", *agent_args(p)],
                environment=launches[p].to_env(),
                name=f"{b.name}-agent-{p}",
                network=b.name,
                labels=b.labels("agent", **{AGENT_LABEL: str(p)}),
            )
            container.start()
            b.follow(container.name, container.logs(stream=True, follow=True), log_path(b.logs, p))

        status = console.status(f"starting {len(launches)} agent containers")
        with status, ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(one, launches))

    def exited(self) -> dict[int, str]:
        """One API call: the run's containers that exited since the last call."""
        ended: dict[int, str] = {}
        for container in self.broker.containers(status="exited"):
            if container.id in self._reported:
                continue
            self._reported.add(container.id)
            code = container.attrs["State"]["ExitCode"]
            if container.labels.get(ROLE_LABEL) == "broker":
                raise RunFailed(f"the broker container exited with code {code}")
            agent = int(container.labels[AGENT_LABEL])
            ended[agent] = f"container {container.name} exited with code {code}" + log_tail(
                self.broker.logs, agent, 1
            )
        return ended

    def _container(self, agent: int) -> Any:
        found = [
            c for c in self.broker.containers("agent") if c.labels.get(AGENT_LABEL) == str(agent)
        ]
        return found[0] if found else None

    def signal(self, agent: int, sig: int) -> None:
        container = self._container(agent)
        if container is not None:
            container.kill(signal=sig)

    def restart(self, agents: list[int], launches: Mapping[int, AgentLaunch]) -> None:
        """The same containers again (their environment has the launch: they rejoin)."""
        for agent in agents:
            container = self._container(agent)
            if container is not None:
                self._reported.discard(container.id)
                container.start()

    def stop(self, grace: float | None = None) -> None:
        """Give agents a moment to leave by themselves (after Bye), then remove them."""
        self._stopping.set()
        if self.broker.client is None:
            return
        deadline = time.monotonic() + (self.grace if grace is None else grace)
        while self.broker.containers("agent", status="running"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.broker.remove(self.broker.containers("agent"))


def nic_window(
    broker: DockerBroker, before: Mapping[str, NicBytes], after: Mapping[str, NicBytes], rounds: int
) -> dict[str, Any]:
    """summary.json's `nic`: what every counter grew by between two readings (bytes on the
    containers' interfaces: TCP/IP and MQTT framing, acks and keepalives included), and the
    agents' per round. A container missing from `before` started at zero."""
    grown = {name: n - before.get(name, ZERO) for name, n in after.items()}
    agent_prefix = f"{broker.name}-agent-"
    per_agent = {
        int(name.removeprefix(agent_prefix)): n
        for name, n in grown.items()
        if name.startswith(agent_prefix)
    }
    broker_nic = grown.get(f"{broker.name}-broker", ZERO)
    tx = sum(n.tx for n in per_agent.values())
    rx = sum(n.rx for n in per_agent.values())
    return {
        "agents_tx": tx,
        "agents_rx": rx,
        "agents_total": tx + rx,
        "broker_rx": broker_nic.rx,
        "broker_tx": broker_nic.tx,
        "rounds": rounds,
        "agents_tx_per_round": tx / rounds,
        "agents_total_per_round": (tx + rx) / rounds,
        "per_agent": {str(p): {"rx": n.rx, "tx": n.tx} for p, n in sorted(per_agent.items())},
    }

"""`privnet run --runtime swarm`: the broker and every agent as services of a Docker Swarm.

Per run, on an existing swarm (the Docker SDK talking to a manager, DOCKER_HOST as for the
CLI): an overlay network, the broker pinned to that manager, one service per agent spread
by the scheduler, everything labelled `privnet.run=<run>` and removed by `SwarmBroker.stop`.
Secrets are Docker secrets, never environment: each agent's launch is mounted only into its
own service. The swarm is taken as it is: `endpoint_mode: dnsrr` (no IP_VS), the broker's
port published in host mode, no bind mounts. Every node needs the agents' image: without
`--image` it is built on the manager, enough for one node; a task rejected for want of it
fails the run with the fix.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from privnet.agent.access import BrokerAddress
from privnet.agent.launch import AgentLaunch
from privnet.agent.spec import ConfigError
from privnet.broker.credentials import Credentials
from privnet.broker.launcher import accepts
from privnet.orchestrator.engines.docker import (
    AGENT_LABEL,
    BROKER_FILES,
    BROKER_IMAGE,
    BROKER_SCRIPT,
    MQTT_PORT,
    READY_TIMEOUT,
    ROLE_LABEL,
    RUN_LABEL,
    WORKERS,
    ContainerBroker,
    broker_files,
    connect,
    ensure_image,
    remove_all,
)
from privnet.orchestrator.engines.docker_sdk import service_logs
from privnet.orchestrator.engines.launch import agent_args, log_path, log_tail
from privnet.orchestrator.errors import RunFailed
from privnet.orchestrator.faults import parse_faults
from privnet.orchestrator.terminal import console

SCHEDULE_TIMEOUT = 120.0  # s for the broker's task to run (its node may pull the image first)
REMOVAL_TIMEOUT = 60.0  # s for the run's tasks to go, before its secrets and network can
SECRETS = PurePosixPath("/run/secrets")
CONFIGS = PurePosixPath("/run/configs")
CONF = "mosquitto.conf"  # the broker's one file that is no secret: a Docker config
LAUNCH = SECRETS / "launch"  # each agent's launch, in its container
AGENT_UID = "1000"  # privnet, the user the project's image runs as (Dockerfile)
ENDED = {"complete", "failed", "rejected", "shutdown", "orphaned"}  # task states of no return
NAME_MAX = 63  # Docker's longest service name


def broker_script(files: Iterable[str]) -> str:
    """The broker's command: copy its secrets and config where mosquitto.conf names them
    (mounted secrets are read-only; mosquitto wants its private files to be its own), then
    start as the docker runtime's broker does."""
    sources = [str((CONFIGS if name == CONF else SECRETS) / name) for name in files]
    return f"cp {' '.join(sources)} {BROKER_FILES}/ && {BROKER_SCRIPT}"


def runtime(
    credentials: Credentials, logs: Path, image: str | None, faults: str | None
) -> tuple[SwarmBroker, SwarmAgents]:
    """The broker and launcher of a swarm run, once its flags are known to fit it."""
    if any(f.kind != "kill" for f in parse_faults(faults or "", credentials.agents)):
        raise ConfigError(
            "--runtime swarm injects kill: faults only (the agent's service scaled to 0): "
            "a swarm's API cannot pause a task or restart the broker; drop the others"
        )
    broker = SwarmBroker(credentials, logs, image=image)
    longest = f"{broker.name}-agent-{credentials.agents - 1}"
    if len(longest) > NAME_MAX:
        raise ConfigError(
            f"--run-name {broker.run!r} makes service names like {longest!r}, longer than "
            f"Docker's {NAME_MAX} characters: pick a shorter run name"
        )
    return broker, SwarmAgents(broker)


@dataclass
class SwarmBroker(ContainerBroker):
    """The run's overlay network and broker service, on the manager the client talks to."""

    runtime: ClassVar[str] = "swarm"
    service: str | None = field(default=None, init=False)  # the broker's service id

    def start(self) -> None:
        """Manager checked, image ready, network made, broker running and answering."""
        self.client = self.client or connect("swarm")
        swarm = self.client.info().get("Swarm", {})
        if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
            raise ConfigError(
                "--runtime swarm needs a swarm manager: `docker swarm init` here, or point "
                "DOCKER_HOST at a manager of your swarm"
            )
        self._started()
        try:
            if self.image is None:  # built here; other nodes need it too (see the docstring)
                self.image = ensure_image(self.client, None)
            self.logs.mkdir(parents=True, exist_ok=True)
            self.client.networks.create(self.name, driver="overlay", labels=self.labels("network"))
            service = self._broker_service(swarm["NodeID"])
            self.service = service.id
            self.follow(service.name, service_logs(service), self.logs / "broker.log")
            port = self._published(service)
            self.address = BrokerAddress(swarm["NodeAddr"], port)
            self._wait_ready(service)
        except BaseException:
            self.stop()
            raise

    def _broker_service(self, manager: str) -> Any:
        """mosquitto with the run's files, pinned to `manager`, its port published there."""
        from docker.types import ConfigReference, EndpointSpec, RestartPolicy, SecretReference

        files = broker_files(self.credentials)
        conf = self.client.configs.create(
            name=f"{self.name}-{CONF}",
            data=files[CONF],
            labels=self.labels("broker"),
        )
        secrets = []
        for name, data in files.items():
            if name != CONF:
                secret = self.secret(name, data, "broker")
                secrets.append(SecretReference(secret.id, secret.name, filename=name, mode=0o400))
        return self.client.services.create(
            BROKER_IMAGE,
            command=["sh", "-c", broker_script(files)],
            name=f"{self.name}-broker",
            networks=[self.name],
            endpoint_spec=EndpointSpec(mode="dnsrr", ports={0: (MQTT_PORT, "tcp", "host")}),
            constraints=[f"node.id=={manager}"],
            secrets=secrets,
            configs=[ConfigReference(conf.id, conf.name, filename=str(CONFIGS / CONF))],
            restart_policy=RestartPolicy(condition="none"),
            labels=self.labels("broker"),
        )

    def secret(self, name: str, data: bytes, role: str, **more: str) -> Any:
        """A Docker secret of the run, `privnet-<run>-<name>`."""
        return self.client.secrets.create(
            name=f"{self.name}-{name}", data=data, labels=self.labels(role, **more)
        )

    def _published(self, service: Any) -> int:
        """The host port the broker's task got on its node, once the task runs."""
        deadline = time.monotonic() + SCHEDULE_TIMEOUT
        while time.monotonic() < deadline:
            for task in service.tasks():
                status = task["Status"]
                if status["State"] in ENDED:
                    raise RunFailed(f"the broker's task {status['State']}: {status.get('Err')}")
                ports = status.get("PortStatus", {}).get("Ports", [])
                if status["State"] == "running" and ports:
                    return int(ports[0]["PublishedPort"])
            time.sleep(0.2)
        raise RunFailed(
            f"the broker's service did not run within {SCHEDULE_TIMEOUT:.0f} s on the manager "
            "(`docker service ps` says why)"
        )

    def _wait_ready(self, service: Any) -> None:
        """mosquitto says it is running, and its published port accepts."""
        deadline = time.monotonic() + READY_TIMEOUT
        while b" running" not in b"".join(service.logs(stdout=True, stderr=True)):
            if time.monotonic() > deadline:
                raise RunFailed(
                    f"the broker service did not come up; see {self.logs / 'broker.log'}"
                )
            time.sleep(0.2)
        if not accepts(self.address, timeout=3.0):
            raise RunFailed(
                f"the broker runs but {self.address} does not accept: the orchestrator must "
                "reach the manager's swarm address"
            )

    def services(self, role: str | None = None) -> list[Any]:
        return list(self.client.services.list(filters={"label": self._filter(role)}))

    def tasks(self, role: str | None = None) -> list[dict[str, Any]]:
        return list(self.client.api.tasks(filters={"label": self._filter(role)}))

    def _filter(self, role: str | None) -> list[str]:
        return [f"{RUN_LABEL}={self.run}"] + ([f"{ROLE_LABEL}={role}"] if role else [])

    def stop(self) -> None:
        """Remove the run's services, then (once their tasks are gone) its secrets, configs
        and network. Safe to repeat."""
        self._stopped()
        if self.client is None:
            return
        import docker

        remove_all(self.services())
        self._stop_following()
        label = {"label": f"{RUN_LABEL}={self.run}"}
        deadline = time.monotonic() + REMOVAL_TIMEOUT
        while True:
            tasks = self.tasks()
            made = [
                *self.client.secrets.list(filters=label),
                *self.client.configs.list(filters=label),
                *self.client.networks.list(filters=label),
            ]
            if not tasks and not made:
                return
            if time.monotonic() > deadline:
                names = ", ".join([*(f"task {t['ID']}" for t in tasks), *(m.name for m in made)])
                console.print(f"[yellow]swarm: could not remove {names}[/yellow]")
                return
            for thing in made:  # in use until the tasks using it are gone: tried again
                with contextlib.suppress(docker.errors.APIError):
                    thing.remove()
            time.sleep(0.5)


class SwarmAgents:
    """The Launcher: one service per agent (one task), its launch a secret of its own."""

    def __init__(self, broker: SwarmBroker, grace: float = 3.0) -> None:
        self.broker, self.grace = broker, grace
        self._stopping = threading.Event()
        self._services: dict[int, Any] = {}  # agent -> its service
        self._agents: dict[str, int] = {}  # service id -> its agent
        self._reported: set[str] = set()  # ended tasks already reported
        self._live: set[int] = set()  # agents whose task ran at the last look

    def start(self, launches: Mapping[int, AgentLaunch]) -> None:
        """`python -m privnet.agent --id N --launch /run/secrets/launch` per agent."""
        b = self.broker

        def one(p: int) -> None:
            if self._stopping.is_set():
                return
            service = self._create(p, launches[p])
            self._services[p], self._agents[service.id] = service, p
            b.follow(service.name, service_logs(service), log_path(b.logs, p))

        status = console.status(f"starting {len(launches)} agent services")
        with status, ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(one, launches))

    def _create(self, p: int, launch: AgentLaunch) -> Any:
        from docker.types import EndpointSpec, RestartPolicy, SecretReference

        b = self.broker
        secret = b.secret(f"agent-{p}", launch.to_json().encode(), "agent", **_agent(p))
        return b.client.services.create(
            b.image,
            args=["python", *agent_args(p), "--launch", str(LAUNCH)],
            name=f"{b.name}-agent-{p}",
            networks=[b.name],
            endpoint_spec=EndpointSpec(mode="dnsrr"),
            secrets=[
                SecretReference(
                    secret.id, secret.name, filename=LAUNCH.name, uid=AGENT_UID, mode=0o400
                )
            ],
            # Ends are the run's to handle (lost, or --restart); a stop is a kill: agents
            # leave by themselves after Bye, and a fault's kill is a kill.
            restart_policy=RestartPolicy(condition="none"),
            stop_signal="SIGKILL",
            labels=b.labels("agent", **_agent(p)),
        )

    def exited(self) -> dict[int, str]:
        """One API call: the agents whose task ended, or is gone (a service scaled to 0
        removes its task whole once it has stopped), since the last call."""
        ended: dict[int, str] = {}
        live: set[int] = set()
        for task in self.broker.tasks():
            status = task["Status"]
            if task["ServiceID"] == self.broker.service:
                if status["State"] in ENDED:
                    raise RunFailed(f"the broker's task {status['State']}: {status.get('Err')}")
                continue
            agent = self._agents.get(task["ServiceID"])
            if agent is None or task["ID"] in self._reported:
                continue
            if status["State"] not in ENDED:
                live.add(agent)
                continue
            self._reported.add(task["ID"])
            if "No such image" in (status.get("Err") or ""):
                raise RunFailed(
                    f"agent {agent}'s node has no image {self.broker.image}: load it on every "
                    "node (docker save | docker load) or push it to a registry they pull from, "
                    "and pass --image"
                )
            ended[agent] = how(task) + log_tail(self.broker.logs, agent, 1)
        for agent in self._live - live - ended.keys():
            ended[agent] = "its task is gone (its service scaled to 0, or removed)"
        self._live = live
        return ended

    def placement(self) -> dict[str, Any]:
        """summary.json's `swarm`: every node, what ran on it (the broker, agents' ids)."""
        ran: dict[str, set[int]] = {}
        for task in self.broker.tasks("agent"):
            agent = self._agents.get(task["ServiceID"])
            if agent is not None and "NodeID" in task:
                ran.setdefault(task["NodeID"], set()).add(agent)
        broker = {t.get("NodeID") for t in self.broker.tasks("broker")}
        return {
            "nodes": [
                {
                    "id": node.id,
                    "hostname": node.attrs["Description"]["Hostname"],
                    "address": node.attrs["Status"]["Addr"],
                    "role": node.attrs["Spec"]["Role"],
                    "broker": node.id in broker,
                    "agents": sorted(ran.get(node.id, ())),
                }
                for node in self.broker.client.nodes.list()
            ]
        }

    def signal(self, agent: int, sig: int) -> None:
        """SIGKILL: the agent's service scaled to 0 (its stop signal is SIGKILL). A swarm
        cannot send other signals through its managers."""
        if sig != signal.SIGKILL:
            raise RunFailed(f"--runtime swarm cannot send {signal.Signals(sig).name} to agents")
        service = self._services.get(agent)
        if service is not None:
            service.scale(0)

    def restart(self, agents: list[int], launches: Mapping[int, AgentLaunch]) -> None:
        """A new task per agent, from the same launch secret, told to rejoin (`--rejoin`)."""
        from docker.types import ServiceMode

        for agent in agents:
            service = self._services.get(agent)
            if service is None:
                continue
            service.reload()
            template = service.attrs["Spec"]["TaskTemplate"]
            args = template["ContainerSpec"]["Args"]
            if "--rejoin" not in args:
                template["ContainerSpec"]["Args"] = [*args, "--rejoin"]
            template["ForceUpdate"] = template.get("ForceUpdate", 0) + 1
            self.broker.client.api.update_service(
                service.id,
                service.version,
                task_template=template,
                mode=ServiceMode("replicated", 1),
                fetch_current_spec=True,
            )

    def stop(self, grace: float | None = None) -> None:
        """Give agents a moment to leave by themselves (after Bye), then remove them."""
        self._stopping.set()
        if self.broker.client is None:
            return
        deadline = time.monotonic() + (self.grace if grace is None else grace)
        while any(t["Status"]["State"] not in ENDED for t in self.broker.tasks("agent")):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        remove_all(self.broker.services("agent"))


def how(task: Mapping[str, Any]) -> str:
    """How an agent's task ended, for the run's messages."""
    status, node = task["Status"], task.get("NodeID", "?")[:12]
    code = status.get("ContainerStatus", {}).get("ExitCode")
    why = status.get("Err") or status.get("Message")
    return f"its task on node {node} ended ({status['State']}, exit code {code}: {why})"


def _agent(p: int) -> dict[str, str]:
    return {AGENT_LABEL: str(p)}

"""How `privnet run` runs an experiment: every option the net engine reads beside the problem.

The CLI and the library both build one from an `Experiment` (`Experiment.run_options`; the
CLI makes its flags one first); the engines read nothing else, so a
setting has one name, one type and one default from the flag to the engine. The checks that
relate one option to another live here too, so the CLI and the library refuse the same
combinations with the same words.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from privnet.agent.access import BrokerAddress
from privnet.agent.spec import ConfigError
from privnet.broker.launcher import KINDS, BrokerKind

if TYPE_CHECKING:
    from privnet.orchestrator.faults import Fault

LOCALHOST = "127.0.0.1"  # where the live view listens unless told
CONTAINED = "docker or swarm"  # the runtimes that start broker and agents in containers


class Runtime(StrEnum):
    """Where the agents run."""

    LOCAL = "local"  # processes on this machine
    DOCKER = "docker"  # broker and agents in containers (privnet[docker])
    SWARM = "swarm"  # broker and agents as services of a Docker Swarm


class Restart(StrEnum):
    """What happens to an agent process that ends before the run does."""

    NEVER = "never"
    ON_FAILURE = "on-failure"  # started again; it rejoins from its checkpoint


E = TypeVar("E", bound=StrEnum)


def choice(kind: type[E], name: str, value: str | E, spelled: str | None = None) -> E:
    """`value` as one of `kind`'s members, or a ConfigError that lists them."""
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise ConfigError(f"{flag(name, spelled)} {value!r}: choose one of {allowed}") from None


def broker_choice(value: str) -> BrokerKind | str:
    """A broker as a run takes it: one it starts (BrokerKind), else another's HOST:PORT."""
    if value in KINDS:
        return BrokerKind(value)
    if ":" not in value:
        raise ConfigError(
            f"{flag('broker')} {value!r}: choose one of {', '.join(KINDS)}, or give the "
            "HOST:PORT of a running broker"
        )
    BrokerAddress.parse(value)  # a ConfigError that shows how to write one
    return value


def flag(name: str, spelled: str | None = None) -> str:
    """An option as both its users know it: `--view-port (view_port)`; `spelled`: the
    flag's own name where it differs from the field's (`--neighbour-agent (neighbour)`)."""
    return f"--{spelled or name.replace('_', '-')} ({name})"


def check_neighbour(agent: int, agents: int) -> None:
    """The agent whose data D' replaces is one of the network's."""
    if not 0 <= agent < agents:
        raise ConfigError(
            f"{flag('neighbour', 'neighbour-agent')} {agent}: give an agent of 0..{agents - 1}"
        )


@dataclass(frozen=True)
class RunOptions:
    """A run's options (the flags of `privnet run` beyond the experiment's). The defaults
    here are the only ones: the CLI's flags and `Experiment`'s fields read them."""

    broker: BrokerKind | str = BrokerKind.AUTO  # auto | mosquitto | embedded | HOST:PORT
    tls: bool = False  # TLS to the broker (a per-run CA for a local one)
    ca_file: Path | None = None  # the CA certificate of an external broker
    prepared: Path | None = None  # the run's secrets from `privnet prepare`
    external_agents: bool = False  # agents started by someone else register by themselves
    hosts: Path | None = None  # hosts.toml: agents across hosts (`privnet site`)
    launch_dir: Path | None = None  # where external agents' launch files go
    run_name: str | None = None  # topic namespace privnet/<run>/ (None: random)
    deadline: float | None = None  # s of silence before an agent is left out (None: default)
    audit: bool = False  # record and audit the wire
    # a model of more coordinates is audited on a seeded sample of at least this many (whole
    # chunks: one u4 chunk's 16,320, two f8 ones'), so the recording stays a few % of the
    # peer bytes at 1M parameters (privnet.orchestrator.audit.sample)
    audit_sample: int = 16_320
    runtime: Runtime = Runtime.LOCAL
    image: str | None = None  # docker/swarm: the agents' image
    agents_per_process: int = 1  # agents in each agent process
    restart: Restart = Restart.NEVER
    checkpoint_every: int = 25  # rounds between the agents' checkpoints (0: never)
    resume: Path | None = None  # carry on the run in this directory
    faults: str | None = None  # faults to inject, e.g. kill:7@120,broker@300
    telemetry: bool = True  # agents report their models (MSD); False: bytes only
    models_every: int | None = None  # telemetry's true models every K rounds (None: by size)
    view: bool = False  # serve the live view's page
    view_port: int = 0  # its TCP port (0: any free one)
    view_host: str = LOCALHOST  # the address it listens on
    neighbour: int | None = None  # privacy accounted for this agent's data (None: not)
    secret_seed: bool = False  # the seed was drawn here: summary.json does not show it

    def __post_init__(self) -> None:
        object.__setattr__(self, "broker", broker_choice(self.broker))
        object.__setattr__(self, "runtime", choice(Runtime, "runtime", self.runtime))
        object.__setattr__(self, "restart", choice(Restart, "restart", self.restart))
        self._check_ranges()
        self._check_runtime()
        self._check_hosts()
        self._check_telemetry()
        self._check_view()

    def _check_ranges(self) -> None:
        if self.agents_per_process < 1:
            raise ConfigError(
                f"{flag('agents_per_process')} must be >= 1, got {self.agents_per_process}"
            )
        if self.checkpoint_every < 0:
            raise ConfigError(
                f"{flag('checkpoint_every')} must be >= 0 (0: never), got {self.checkpoint_every}"
            )
        if self.models_every is not None and self.models_every < 1:
            raise ConfigError(
                f"{flag('models_every')} must be >= 1 (rounds between the models agents send "
                f"the orchestrator), got {self.models_every}"
            )
        if self.audit_sample < 1:
            raise ConfigError(
                f"{flag('audit_sample')} must be >= 1 (coordinates of each model the audit "
                f"records), got {self.audit_sample}"
            )
        if self.audit_sample != default("audit_sample") and not self.audit:
            raise ConfigError(
                f"{flag('audit_sample')} without {flag('audit')}: it sizes the audit's "
                "recording; add --audit, or drop it"
            )
        if self.deadline is not None and not self.deadline > 0:
            raise ConfigError(f"{flag('deadline')} must be > 0 seconds, got {self.deadline}")
        if not 0 <= self.view_port <= 65535:
            raise ConfigError(
                f"{flag('view_port')} must be a TCP port (0: any free one), got {self.view_port}"
            )

    def _check_runtime(self) -> None:
        """--runtime docker and swarm start their own broker and agents: they take only the
        options they can honour."""
        if self.runtime is Runtime.LOCAL:
            if self.image is not None:
                raise ConfigError(
                    f"{flag('image')} without {flag('runtime')} {CONTAINED}: the image is "
                    "what their containers run; add one, or drop the image"
                )
            return
        given = {
            "broker": self.broker != default("broker"),
            "external_agents": self.external_agents,
            "tls": self.tls,
            "ca_file": self.ca_file is not None,
            "agents_per_process": self.agents_per_process != 1,
        }
        if any(given.values()):
            drop = ", ".join(flag(name) for name, on in given.items() if on)
            raise ConfigError(
                f"{flag('runtime')} {self.runtime} starts its own broker (plain TCP on the "
                f"run's network) and agents: drop {drop}"
            )

    def _check_hosts(self) -> None:
        """--hosts: the core broker comes from hosts.toml and the run's secrets from
        `privnet prepare --hosts`; the agents run on their hosts."""
        if self.hosts is None:
            return
        given = {
            "broker": self.broker != default("broker"),
            "runtime": self.runtime is not Runtime.LOCAL,
            "external_agents": self.external_agents,
            "tls": self.tls,
            "ca_file": self.ca_file is not None,
            "agents_per_process": self.agents_per_process != 1,
            "restart": self.restart is Restart.ON_FAILURE,
            "audit": self.audit,
            "resume": self.resume is not None,
        }
        if any(given.values()):
            drop = ", ".join(flag(name) for name, on in given.items() if on)
            raise ConfigError(
                f"{flag('hosts')}: drop {drop}. The core broker comes from hosts.toml and TLS "
                "from `prepare --hosts --tls`; agents run on their hosts (`privnet site`, with "
                "--agents-per-process there); the audit's tap on the core does not see frames "
                "between two agents of one host"
            )
        if self.prepared is None:
            raise ConfigError(
                f"{flag('hosts')} needs the run's secrets: add {flag('prepared')} "
                f"DIR/core/run.json, written by `privnet prepare --hosts {self.hosts} --out DIR`"
            )

    def _check_telemetry(self) -> None:
        """The true models travel in the telemetry: without it there is nothing to space."""
        if not self.telemetry and self.models_every is not None:
            raise ConfigError(
                f"{flag('models_every')} with --no-telemetry (telemetry=False): agents then "
                "send no models at all; drop one of the two"
            )

    def faults_for(self, agents: int) -> list[Fault]:
        """The faults to inject into a run of `agents` agents (ConfigError for a bad one,
        or one a run across hosts cannot make)."""
        from privnet.orchestrator.faults import parse_faults

        faults = parse_faults(self.faults or "", agents)
        if self.hosts is not None and any(fault.kind != "broker" for fault in faults):
            raise ConfigError(
                f"{flag('hosts')}: kill and stop faults need the agents here; broker@R works"
            )
        return faults

    def _check_view(self) -> None:
        """The view's address and port only mean something with the view."""
        if not self.view:
            given = {
                "view_port": self.view_port != default("view_port"),
                "view_host": self.view_host != default("view_host"),
            }
            if any(given.values()):
                named = ", ".join(flag(name) for name, on in given.items() if on)
                raise ConfigError(f"{named} without {flag('view')}: add it to watch the run")
        elif not self.view_host.strip():
            raise ConfigError(
                f"{flag('view_host')} '': give the address the page listens on, e.g. {LOCALHOST}"
            )

    def check_here(self) -> None:
        """What this machine must have for these options: the broker asked for, the files
        named. Run before anything starts, by the CLI and the library alike."""
        from privnet.broker.launcher import has_mosquitto

        if self.broker is BrokerKind.MOSQUITTO and not has_mosquitto():
            raise ConfigError(
                "mosquitto is not installed: install it (apt-get install mosquitto) or use "
                f"{flag('broker')} embedded"
            )
        for name in ("ca_file", "prepared"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"{flag(name)} {path}: no such file")


def default(name: str) -> Any:
    """The one default of a run option (the CLI's flags and Experiment's fields take it)."""
    return RunOptions.__dataclass_fields__[name].default


# The fields the library and the CLI set from the user's words (the last two are the
# engine's own: derived from account/neighbour and from where the seed came from).
USER_FIELDS = tuple(
    f.name for f in fields(RunOptions) if f.name not in ("neighbour", "secret_seed")
)

"""How `privnet run` runs an experiment: every option the net engine reads beside the problem.

The CLI builds one from its flags (`orchestrator.commands.run.run_options`), the library
from an `Experiment` (`Experiment.run_options`); the engines read nothing else, so a
setting has one name and one type from the flag to the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LOCALHOST = "127.0.0.1"  # where the live view listens unless told


@dataclass(frozen=True)
class RunOptions:
    """A run's options (the flags of `privnet run` beyond the experiment's)."""

    broker: str = "auto"  # auto | mosquitto | embedded | HOST:PORT
    tls: bool = False  # TLS to the broker (a per-run CA for a local one)
    ca_file: Path | None = None  # the CA certificate of an external broker
    prepared: Path | None = None  # the run's secrets from `privnet prepare`
    external_agents: bool = False  # agents started by someone else register by themselves
    hosts: Path | None = None  # hosts.toml: agents across hosts (`privnet site`)
    launch_dir: Path | None = None  # where external agents' launch files go
    run_name: str | None = None  # topic namespace privnet/<run>/ (None: random)
    deadline: float | None = None  # s of silence before an agent is left out (None: default)
    audit: bool = False  # record and audit the wire
    runtime: str = "local"  # local | docker | swarm
    image: str | None = None  # docker/swarm: the agents' image
    agents_per_process: int = 1  # agents in each agent process
    restart: str = "never"  # never | on-failure
    checkpoint_every: int = 25  # rounds between the agents' checkpoints (0: never)
    resume: Path | None = None  # carry on the run in this directory
    faults: str | None = None  # faults to inject, e.g. kill:7@120,broker@300
    telemetry: bool = True  # agents report their models (MSD); False: bytes only
    view: bool = False  # serve the live view's page
    view_port: int = 0  # its TCP port (0: any free one)
    view_host: str = LOCALHOST  # the address it listens on
    neighbour: int | None = None  # privacy accounted for this agent's data (None: not)
    secret_seed: bool = False  # the seed was drawn here: summary.json does not show it

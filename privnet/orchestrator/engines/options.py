"""How `privnet run` runs an experiment: every option the net engine reads beside the problem.

The CLI builds one from its flags (`privnet.orchestrator.commands.run.run_options`), the library
from an `Experiment` (`Experiment.run_options`); the engines read nothing else, so a
setting has one name and one type from the flag to the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LOCALHOST = "127.0.0.1"  # where the live view listens unless told


@dataclass(frozen=True)
class RunOptions:
    """A run's options (the flags of `privnet run` beyond the experiment's). No defaults:
    those are the CLI's flags' and `Experiment`'s, each builder gives every field."""

    broker: str  # auto | mosquitto | embedded | HOST:PORT
    tls: bool  # TLS to the broker (a per-run CA for a local one)
    ca_file: Path | None  # the CA certificate of an external broker
    prepared: Path | None  # the run's secrets from `privnet prepare`
    external_agents: bool  # agents started by someone else register by themselves
    hosts: Path | None  # hosts.toml: agents across hosts (`privnet site`)
    launch_dir: Path | None  # where external agents' launch files go
    run_name: str | None  # topic namespace privnet/<run>/ (None: random)
    deadline: float | None  # s of silence before an agent is left out (None: default)
    audit: bool  # record and audit the wire
    runtime: str  # local | docker | swarm
    image: str | None  # docker/swarm: the agents' image
    agents_per_process: int  # agents in each agent process
    restart: str  # never | on-failure
    checkpoint_every: int  # rounds between the agents' checkpoints (0: never)
    resume: Path | None  # carry on the run in this directory
    faults: str | None  # faults to inject, e.g. kill:7@120,broker@300
    telemetry: bool  # agents report their models (MSD); False: bytes only
    view: bool  # serve the live view's page
    view_port: int  # its TCP port (0: any free one)
    view_host: str  # the address it listens on
    neighbour: int | None  # privacy accounted for this agent's data (None: not)
    secret_seed: bool  # the seed was drawn here: summary.json does not show it

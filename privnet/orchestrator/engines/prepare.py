"""`privnet prepare`: a run's secrets as files, for a broker and agents someone else starts
(docker compose, a swarm stack); and the launch files of external agents (`privnet run
--external-agents`)."""

from __future__ import annotations

import os
from pathlib import Path

from privnet.agent.access import BrokerAddress, ClientAccess
from privnet.agent.launch import AgentLaunch
from privnet.agent.private import private_dir
from privnet.broker.credentials import write_private
from privnet.broker.launcher import write_compose_files
from privnet.orchestrator.engines.lifetime import RunSecrets


def write_launches(directory: Path, launches: dict[int, AgentLaunch]) -> None:
    """Launch files for agents started by someone else (compose): 0600, one per agent.
    Whatever an earlier run left there (files, claims) goes first."""
    private_dir(directory)
    for stale in [*directory.glob("agent-*.json"), *directory.glob("agent-*.claimed")]:
        stale.unlink()
    for p, agent_launch in launches.items():
        write_private(directory / f"agent-{p}.json", agent_launch.to_json())


def prepare(
    out: Path,
    agents: int,
    run: str,
    *,
    broker: str = "broker:1883",
    tls_hostnames: tuple[str, ...] | None = None,
    mount: Path = Path("/privnet"),
    broker_uid: int | None = None,
    client_uid: int | None = None,
    stack: bool = False,
) -> RunSecrets:
    """A run's secrets as files, for agents and a broker someone else starts (compose):
    the broker's files (`write_compose_files`), `run.json` for the orchestrator and one
    launch file per agent in `agents/` (claimed with `python -m privnet.agent --claim`); with
    `stack`, for docker-stack.yml, instead every launch in `launches.json`, in id order (one
    Docker secret: each agent replica takes its own with `python -m privnet.agent --slot`)."""
    run_secrets = RunSecrets.generate(run, agents)
    write_compose_files(
        out,
        run_secrets.credentials,
        tls_hostnames=tls_hostnames,
        mount=mount,
        broker_uid=broker_uid,
        client_uid=client_uid,
        port=BrokerAddress.parse(broker).port,
    )
    ca = str(mount / "ca.crt") if tls_hostnames is not None else None

    def access(user: str) -> ClientAccess:
        return run_secrets.credentials.access(user, tls=ca is not None, ca_file=ca)

    write_private(out / "run.json", run_secrets.to_json())
    launches = run_secrets.launches(broker, access)
    if stack:
        ordered = [launches[p] for p in sorted(launches)]
        write_private(out / "launches.json", AgentLaunch.group_json(ordered))
    else:
        write_launches(out / "agents", launches)
    for p in run_secrets.tokens:  # an agent's password travels only in its launch file
        (out / "users" / f"{p}.env").unlink(missing_ok=True)
    if client_uid is not None:
        theirs = [out / "launches.json"] if stack else [out / "agents", *(out / "agents").iterdir()]
        for path in [out / "run.json", *theirs]:
            os.chown(path, client_uid, client_uid)
    return run_secrets

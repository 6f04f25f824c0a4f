"""`python -m agent [--launch FILE]`: one privnet agent process.

What the agent needs to join a run (broker, run name, its id, the orchestrator's public
key, its launch token, broker credentials) comes out of band: the JSON launch that
`privnet run` writes, in $PRIVNET_LAUNCH or a file (`--launch`). $PRIVNET_LAUNCHES (a JSON
list, `privnet run --agents-per-process K`) runs several agents in this one process, each
with its own MQTT client, credentials, identity and node. `--claim DIR` takes the
first unclaimed launch file in DIR (docker-compose replicas, which share one volume);
`--launch FILE --slot N` the N-th of a list of launches (docker-stack.yml replicas, which
share one Docker secret).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from agent.mqtt import AgentLaunch, run, run_agent, run_agents


def claim(directory: Path, memory: Path | None = None) -> AgentLaunch:
    """The first launch file in `directory` no other process has claimed (an O_EXCL marker);
    read, then removed, so no replica started later can read another's secrets.

    The claim is kept in `memory` (0600, in the container's own filesystem): a container
    started again (`docker start`, or its restart policy) finds it there and comes back as
    the same agent, to rejoin the run. Its checkpoints go beside it unless the launch names
    a directory, so it comes back from its last checkpoint rather than its initial model."""
    memory = memory or claim_memory()
    if memory.exists():
        return replace(AgentLaunch.from_file(memory), rejoin=True)

    def remember(launch: AgentLaunch) -> AgentLaunch:
        """Before the launch file goes: a container killed in between still comes back."""
        if launch.checkpoints is None:
            launch = replace(launch, checkpoints=str(memory.with_suffix(".checkpoints")))
        fd = os.open(memory, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(launch.to_json())
        return launch

    return _claim(directory, remember)


def claim_memory() -> Path:
    """Per host (a container's hostname is its own): where a claim is remembered."""
    return Path(tempfile.gettempdir()) / f"privnet-claim-{socket.gethostname()}.json"


def _claim(directory: Path, remember: Callable[[AgentLaunch], AgentLaunch]) -> AgentLaunch:
    for path in sorted(directory.glob("agent-*.json"), key=lambda p: int(p.stem[6:])):
        try:
            os.close(os.open(path.with_suffix(".claimed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        launch = remember(AgentLaunch.from_file(path))
        path.unlink()
        return launch
    raise ValueError(f"no unclaimed agent-<id>.json launch file in {directory}")


def slot(path: Path, n: int) -> AgentLaunch:
    """The n-th launch (from 1) of a file holding the list of a run's launches."""
    launches = AgentLaunch.group_from_json(path.read_text(), str(path))
    if not 1 <= n <= len(launches):
        raise ValueError(f"--slot {n}, but {path} holds launches 1 to {len(launches)}")
    return launches[n - 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent", description=__doc__)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--launch", type=Path, help="JSON launch file (default: $PRIVNET_LAUNCH)")
    where.add_argument("--claim", type=Path, help="claim a launch file from this directory")
    parser.add_argument(
        "--slot",
        type=int,
        help="with --launch FILE holding a list of launches (`privnet prepare --stack`): take "
        "the N-th, from 1 (a swarm task's {{.Task.Slot}}, docker-stack.yml)",
    )
    parser.add_argument(
        "--id", type=int, help="the agent id the launch must name (a label for ps and logs)"
    )
    parser.add_argument(
        "--rejoin",
        action="store_true",
        help="this agent was started before in this run (it crashed): ask back in, from its "
        "checkpoint if the launch names a checkpoint directory",
    )
    parser.add_argument("--log-level", default=os.environ.get("PRIVNET_LOG", "WARNING"))
    args = parser.parse_args(argv)
    if args.slot is not None and args.launch is None:
        parser.error("--slot N takes the N-th launch of --launch FILE: give the file")
    try:
        group = AgentLaunch.group_from_env() if args.claim is args.launch is None else None
        if group is not None:  # --agents-per-process: several agents, one process
            for each in group:
                each.parts()
            ids = [each.agent for each in group]
            logging.basicConfig(
                level=args.log_level.upper(),
                format=f"%(asctime)s agents[{ids[0]}-{ids[-1]}] %(levelname)s %(message)s",
            )
            return run(run_agents(group))
        if args.claim is not None:
            launch = claim(args.claim)
        elif args.launch is not None and args.slot is not None:
            launch = slot(args.launch, args.slot)
        elif args.launch is not None:
            launch = AgentLaunch.from_file(args.launch)
        else:
            found = AgentLaunch.from_env()
            if found is None:
                parser.error(f"no launch: give --launch FILE, --claim DIR or ${AgentLaunch.ENV}")
            launch = found
        if args.rejoin:
            launch = replace(launch, rejoin=True)
        broker, node_launch, access = launch.parts()
        if args.id is not None and args.id != node_launch.agent:
            raise ValueError(f"--id {args.id}, but the launch is for agent {node_launch.agent}")
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s agent[{launch.agent}] %(levelname)s %(message)s",
    )
    return run(run_agent(broker, node_launch, access, launch.checkpoints))


if __name__ == "__main__":
    sys.exit(main())

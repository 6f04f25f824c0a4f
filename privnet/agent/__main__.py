"""`python -m privnet.agent [--launch FILE]`: one privnet agent process.

What an agent needs to join a run (broker, run, id, the orchestrator's key, its launch
token, broker credentials) comes out of band, never from the broker: the JSON launch that
`privnet run` writes, in $PRIVNET_LAUNCH or a file (`--launch`); $PRIVNET_LAUNCHES runs
several agents in one process (`--agents-per-process`). `--claim DIR` (docker-compose
replicas sharing a volume, `--remember FILE` keeping the claim) and `--slot N` (swarm
replicas sharing one secret) pick one launch of many.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from privnet.agent.launch import AgentLaunch
from privnet.agent.loop import batch_scheduling, run_loop
from privnet.agent.private import write_private
from privnet.agent.process import run_agent, run_agents

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def claim(directory: Path, memory: Path | None = None) -> AgentLaunch:
    """The first launch file in `directory` no other process has claimed (an O_EXCL marker
    holding a random claim token); read, then removed, so no replica started later can read
    another's secrets.

    With `memory` (`--remember FILE`, a path in the container's own filesystem) the claim is
    also kept there, 0600: a container started again (`docker start`, or its restart policy)
    finds it and comes back as the same agent, to rejoin the run, from its last checkpoint
    (kept beside it unless the launch names a directory). A memory whose marker is gone or
    holds another token (a later `privnet prepare` wrote new launches) is stale: a new
    launch is claimed. Without `memory` every call claims a new launch: processes sharing a
    host and its temp directory are different agents."""
    if memory is not None and (kept := _remembered(directory, memory)) is not None:
        return replace(kept, rejoin=True)

    def remember(launch: AgentLaunch, token: str) -> AgentLaunch:
        """Before the launch file goes: a container killed in between still comes back."""
        if memory is None:
            return launch
        if launch.checkpoints is None:
            launch = replace(launch, checkpoints=str(memory.with_suffix(".checkpoints")))
        write_private(memory, json.dumps({"claim": token, "launch": asdict(launch)}))
        return launch

    return _claim(directory, remember)


def _remembered(directory: Path, memory: Path) -> AgentLaunch | None:
    """The launch `memory` holds, if its claim still stands in `directory`."""
    try:
        kept = json.loads(memory.read_text())
        launch = AgentLaunch.from_json(json.dumps(kept["launch"]), str(memory))
        marker = (directory / f"agent-{launch.agent}.claimed").read_text()
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none, unreadable, or its marker is gone
    return launch if marker == kept["claim"] else None


def _claim(directory: Path, remember: Callable[[AgentLaunch, str], AgentLaunch]) -> AgentLaunch:
    for path in sorted(directory.glob("agent-*.json"), key=lambda p: int(p.stem[6:])):
        token = secrets.token_hex(16)
        try:
            fd = os.open(path.with_suffix(".claimed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(token)
        launch = remember(AgentLaunch.from_file(path), token)
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
    parser = argparse.ArgumentParser(prog="python -m privnet.agent", description=__doc__)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--launch", type=Path, help="JSON launch file (default: $PRIVNET_LAUNCH)")
    where.add_argument("--claim", type=Path, help="claim a launch file from this directory")
    parser.add_argument(
        "--remember",
        type=Path,
        metavar="FILE",
        help="with --claim: keep the claim in FILE (in a container's own filesystem), so the "
        "container started again comes back as the same agent",
    )
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
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LEVELS,
        default=os.environ.get("PRIVNET_LOG", "INFO").upper(),
        help="what goes to the log (default $PRIVNET_LOG, else INFO: each phase of each "
        "session, what the agent sent and rejected, broker outages)",
    )
    args = parser.parse_args(argv)
    batch_scheduling()  # throughput work: woken less often, more frames a wake
    if args.log_level not in LEVELS:  # from $PRIVNET_LOG: argparse checks only what is typed
        parser.error(f"$PRIVNET_LOG={args.log_level}: choose one of {', '.join(LEVELS)}")
    if args.remember is not None and args.claim is None:
        parser.error("--remember keeps a claim: give --claim DIR too")
    if args.slot is not None and args.launch is None:
        parser.error("--slot N takes the N-th launch of --launch FILE: give the file")
    try:
        group = AgentLaunch.group_from_env() if args.claim is args.launch is None else None
        if group is not None:  # --agents-per-process: several agents, one process
            for each in group:
                each.parts()
            ids = [each.agent for each in group]
            logging.basicConfig(
                level=args.log_level,
                format=f"%(asctime)s agents[{ids[0]}-{ids[-1]}] %(levelname)s %(message)s",
            )
            return run_loop(run_agents(group))
        if args.claim is not None:
            launch = claim(args.claim, args.remember)
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
        level=args.log_level,
        format=f"%(asctime)s agent[{launch.agent}] %(levelname)s %(message)s",
    )
    return run_loop(run_agent(broker, node_launch, access, launch.checkpoints))


if __name__ == "__main__":
    sys.exit(main())

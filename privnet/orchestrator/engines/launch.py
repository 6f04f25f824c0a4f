"""Where agents run: the `Launcher` the net engine starts, watches and stops them through.

The net engine decides what each agent is told (its `AgentLaunch`: broker, run, id, the
orchestrator's key, its token and broker credentials, handed over in the environment, never
on a command line); a launcher only decides where `python -m privnet.agent --id N` runs.
`LocalLauncher` runs each agent as a process on this machine; `privnet.orchestrator.engines.docker`
runs each in a container. Both write one log per agent, `<logs>/agent-<id>.log`, so a
failure report quotes the agent's last words either way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from privnet.agent.launch import AgentLaunch
from privnet.orchestrator.engines.zygote import Spawn, Zygote


def agent_args(agent: int) -> list[str]:
    """What every agent runs (`python -m privnet.agent --id N`); its launch comes in the
    environment."""
    return ["-m", "privnet.agent", "--id", str(agent)]


class Launcher(Protocol):
    """Starts agents somewhere, says whether they still live, and always stops them."""

    def start(self, launches: Mapping[int, AgentLaunch]) -> None:
        """Start one agent per launch; return once all are started (not yet registered)."""

    def exited(self) -> dict[int, str]:
        """Agents whose process (or container) ended since the last call, and how."""

    def signal(self, agent: int, sig: int) -> None:
        """Send `sig` to the process (or container) running `agent` (faults, for tests)."""

    def restart(self, agents: list[int], launches: Mapping[int, AgentLaunch]) -> None:
        """Start these ended agents again, each with its launch (to rejoin)."""

    def stop(self, grace: float | None = None) -> None:
        """Stop every agent started (and whatever else the launcher made), after `grace` s
        (None: the launcher's own) to leave by themselves; safe to repeat."""


def log_path(logs: Path, agent: int) -> Path:
    return logs / f"agent-{agent}.log"


def log_tail(logs: Path, agent: int, lines: int = 3) -> str:
    """The end of an agent's log, formatted for a message."""
    path = log_path(logs, agent)
    if not path.exists():
        return ""
    text = path.read_text(errors="replace").strip().splitlines()[-lines:]
    return "; its log ends: " + " | ".join(text) if text else ""


class LocalLauncher:
    """Agent processes on this machine, each in its own session and process group: one
    agent per process by default, or `per_process` consecutive agents sharing one (`--agents-
    per-process`: each still its own MQTT client, credentials, identity and node; their
    launches go in $PRIVNET_LAUNCHES, their log is `<logs>/agents-<first>-<last>.log`).

    Each process is forked by a zygote (`privnet.orchestrator.engines.zygote`) that imported the
    agent's modules once; the zygote starts here, so its imports overlap the broker's start."""

    def __init__(self, logs: Path, grace: float = 3.0, per_process: int = 1) -> None:
        if per_process < 1:
            raise ValueError(f"agents per process must be >= 1, got {per_process}")
        self.logs, self.grace, self.per_process = logs, grace, per_process
        self.zygote = Zygote()
        self.procs: dict[int, int] = {}  # first agent id -> the pid of its process
        self.groups: dict[int, list[int]] = {}  # first agent id -> the agents it runs

    def preload(self, plugin: object) -> None:
        """Let the zygote import the module of the run's problem (`Instance.plugin`) before
        it forks the agents, where it is privnet's own (the torch adapter: torch)."""
        self.zygote.preload(type(plugin).__module__)

    def start(self, launches: Mapping[int, AgentLaunch]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        ids = sorted(launches)
        for at in range(0, len(ids), self.per_process):
            self._spawn(ids[at : at + self.per_process], launches)

    def _spawn(
        self, group: list[int], launches: Mapping[int, AgentLaunch], append: bool = False
    ) -> None:
        first = self.group(group)
        if len(group) == 1:
            args, env = agent_args(first), launches[first].to_env()
        else:
            args, env = ["-m", "privnet.agent"], AgentLaunch.group_env([launches[p] for p in group])
        spawn = Spawn(args, env, str(self._log(first)), append)
        self.procs[first] = self.zygote.spawn(spawn)

    def group(self, group: list[int]) -> int:
        self.groups[group[0]] = group
        return group[0]

    def pids(self) -> dict[int, int]:
        """The pid of the process running each agent now (what the live view samples)."""
        return {
            a: pid for first, pid in self.procs.items() for a in self.groups.get(first, [first])
        }

    def _first(self, agent: int) -> int:
        """The first agent of the process that runs `agent` (the key of `procs`)."""
        return next((f for f, group in self.groups.items() if agent in group), agent)

    def _log(self, first: int) -> Path:
        group = self.groups.get(first, [first])
        if len(group) == 1:
            return log_path(self.logs, first)
        return self.logs / f"agents-{first}-{group[-1]}.log"

    def exited(self) -> dict[int, str]:
        ended: dict[int, str] = {}
        for first, pid in list(self.procs.items()):
            code = self.zygote.poll(pid)
            if code is None:
                continue
            del self.procs[first]
            how = f"its process (pid {pid}) exited with code {code}"
            if code < 0:
                how = f"its process (pid {pid}) was killed by {signal.Signals(-code).name}"
            for agent in self.groups.get(first, [first]):
                ended[agent] = how + log_tail(self.logs, agent, 1)
        return ended

    def signal(self, agent: int, sig: int) -> None:
        pid = self.procs.get(self._first(agent))
        if pid is not None and self.zygote.poll(pid) is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)

    def restart(self, agents: list[int], launches: Mapping[int, AgentLaunch]) -> None:
        """Each process again, with every agent it ran (a group restarts whole)."""
        for first in sorted({self._first(a) for a in agents}):
            self._spawn(self.groups.get(first, [first]), launches, append=True)

    def stop(self, grace: float | None = None) -> None:
        """Wait briefly for clean exits, then terminate and kill whatever is left; then let
        the zygote go."""
        grace = self.grace if grace is None else grace
        deadline = time.monotonic() + grace
        for pid in self.procs.values():
            self.zygote.wait(pid, max(0.0, deadline - time.monotonic()))
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = [pid for pid in self.procs.values() if self.zygote.poll(pid) is None]
            for pid in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, sig)
            for pid in alive:
                self.zygote.wait(pid, 2.0)
        self.zygote.close(max(grace, 0.1))

"""Where agents run: the `Launcher` the net engine starts, watches and stops them through.

The net engine decides what each agent is told (its command-line arguments and environment:
broker, run, id, and whatever credentials a run hands out); a launcher only decides where
that command runs. `LocalLauncher` runs each agent as a process on this machine;
`orchestrator.engines.docker` runs each in a container. Both write one log per agent,
`<logs>/agent-<id>.log`, so a failure report quotes the agent's last words either way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agent.mqtt import BrokerAddress

AGENT_COMMAND = ("python", "-m", "agent")  # what every agent runs, followed by its args


class RunFailed(Exception):
    """The networked run cannot complete; the message names the agent and the cause."""


@dataclass(frozen=True)
class AgentCommand:
    """How to start one agent: `python -m agent *args`, with `env` on top of the launcher's."""

    agent: int
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


def agent_commands(broker: BrokerAddress, run: str, agents: int) -> list[AgentCommand]:
    """Agents 0..agents-1 of `run`, each told the broker address it can reach."""
    return [
        AgentCommand(p, ("--broker", str(broker), "--run", run, "--id", str(p)))
        for p in range(agents)
    ]


class Launcher(Protocol):
    """Starts agents somewhere, says whether they still live, and always stops them."""

    def start(self, commands: Sequence[AgentCommand]) -> None:
        """Start one agent per command; return once all are started (not yet registered)."""

    def check(self, finished: AbstractSet[int] = frozenset()) -> None:
        """Raise RunFailed if an agent ended before saying Finished, or ended badly."""

    def log_tail(self, agent: int, lines: int = 3) -> str:
        """'; its log ends: ...' with the agent's last log lines, or '' without a log."""

    def stop(self) -> None:
        """Stop every agent started (and whatever else the launcher made); safe to repeat."""


def log_path(logs: Path, agent: int) -> Path:
    return logs / f"agent-{agent}.log"


def log_tail(logs: Path, agent: int, lines: int = 3) -> str:
    """The end of an agent's log, formatted for a RunFailed message."""
    path = log_path(logs, agent)
    if not path.exists():
        return ""
    text = path.read_text(errors="replace").strip().splitlines()[-lines:]
    return "; its log ends: " + " | ".join(text) if text else ""


class LocalLauncher:
    """Agent processes on this machine, one per id, each in its own process group."""

    def __init__(self, logs: Path, grace: float = 3.0) -> None:
        self.logs, self.grace = logs, grace
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, commands: Sequence[AgentCommand]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        base = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for command in commands:
            with open(log_path(self.logs, command.agent), "wb") as log:
                self.procs[command.agent] = subprocess.Popen(
                    [sys.executable, *AGENT_COMMAND[1:], *command.args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**base, **command.env},
                    start_new_session=True,
                )

    def check(self, finished: AbstractSet[int] = frozenset()) -> None:
        for p, proc in self.procs.items():
            code = proc.poll()
            if code is not None and (code != 0 or p not in finished):
                raise RunFailed(
                    f"agent {p} (pid {proc.pid}) exited with code {code} before the run ended"
                    + self.log_tail(p)
                )

    def log_tail(self, agent: int, lines: int = 3) -> str:
        return log_tail(self.logs, agent, lines)

    def stop(self) -> None:
        """Wait briefly for clean exits, then terminate and kill whatever is left."""
        deadline = time.monotonic() + self.grace
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = [p for p in self.procs.values() if p.poll() is None]
            for proc in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
            for proc in alive:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(2.0)

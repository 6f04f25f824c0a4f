"""Where agents run: the `Launcher` the net engine starts, watches and stops them through.

The net engine decides what each agent is told (its `AgentLaunch`: broker, run, id, the
orchestrator's key, its token and broker credentials, handed over in the environment, never
on a command line); a launcher only decides where `python -m agent --id N` runs.
`LocalLauncher` runs each agent as a process on this machine; `orchestrator.engines.docker`
runs each in a container. Both write one log per agent, `<logs>/agent-<id>.log`, so a
failure report quotes the agent's last words either way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from agent.mqtt import AgentLaunch
from orchestrator.engines.memory import RunFailed


def agent_args(agent: int) -> list[str]:
    """What every agent runs (`python -m agent --id N`); its launch comes in the environment."""
    return ["-m", "agent", "--id", str(agent)]


class Launcher(Protocol):
    """Starts agents somewhere, says whether they still live, and always stops them."""

    def start(self, launches: Mapping[int, AgentLaunch]) -> None:
        """Start one agent per launch; return once all are started (not yet registered)."""

    def check(self) -> None:
        """Raise RunFailed if an agent ended while the run still needs it."""

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

    def start(self, launches: Mapping[int, AgentLaunch]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        base = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for p, launch in launches.items():
            with open(log_path(self.logs, p), "wb") as log:
                self.procs[p] = subprocess.Popen(
                    [sys.executable, *agent_args(p)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**base, **launch.to_env()},
                    start_new_session=True,
                )

    def check(self) -> None:
        for p, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                raise RunFailed(
                    f"agent {p} (pid {proc.pid}) exited with code {code} before the run ended"
                    + log_tail(self.logs, p)
                )

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

"""The shell around `Watch` (`engines.watch`): what writes the run's files, signals the
agents' processes, starts the insiders of `--faults flap` and samples the processes and the
orchestrator's CPU. `Watch` decides (its outputs' `effects`); this does, as the pump reports
each output (`react`), and samples beside the pump (`watching`, a sibling task)."""

from __future__ import annotations

import asyncio
import csv
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from privnet.agent.protocol import Output
from privnet.broker.launcher import Broker
from privnet.orchestrator.engines import journal
from privnet.orchestrator.engines.docker import ContainerBroker
from privnet.orchestrator.engines.launch import Launcher
from privnet.orchestrator.engines.watch import (
    POLL,
    KillBroker,
    Redo,
    Restart,
    RestartBroker,
    Say,
    SessionDone,
    Signal,
    StartInsider,
    StopInsider,
    Watch,
    WriteMembership,
    WriteRows,
    write_membership,
)
from privnet.orchestrator.insider import environment
from privnet.orchestrator.terminal import console


class WatchShell:
    """Does what a `Watch` asks, where the run is: its `out` directory, its `pool` of agent
    processes (None: external agents), its `broker`."""

    def __init__(
        self, watch: Watch, pool: Launcher | None, broker: Broker | ContainerBroker, out: Path
    ) -> None:
        self.watch, self.pool, self.broker, self.out = watch, pool, broker, out
        # this process's CPU seconds while sessions ran (Go to the session's end): what the
        # orchestrator costs a round, in summary.json
        self.session_cpu = 0.0
        self._cpu_since: float | None = None
        self.insiders: dict[int, subprocess.Popen[bytes]] = {}  # --faults flap: by key

    def react(self, out: Output) -> None:
        """What an output of the watch asks done, done now (files, signals, processes)."""
        for event in out.events:
            if event.kind == "started" and self._cpu_since is None:
                self._cpu_since = time.process_time()
            if event.kind == "session-done" and self._cpu_since is not None:
                self.session_cpu += time.process_time() - self._cpu_since
                self._cpu_since = None
        for effect in out.effects:
            self.do(effect)

    def do(self, effect: object) -> None:
        """One effect; TypeError for one no watch makes."""
        match effect:
            case Say(text):
                console.print(text)
            case WriteMembership(views):
                write_membership(self.out / "membership.json", list(views))
            case SessionDone(index, result):
                journal.session_done(self.out, index, result)
            case Redo(session, keep, shape, series):
                journal.truncate(self.out, session, keep, shape)
                path = self.out / "metrics.csv"
                if series is not None and path.exists():
                    _truncate_metrics(path, series, keep)
            case WriteRows():
                self._rows(effect)
            case Signal(agent, signum):
                if self.pool is not None:
                    self.pool.signal(agent, signum)
            case Restart(launches):
                if self.pool is not None:
                    self.pool.restart(sorted(launches), launches)
            case KillBroker():
                if not isinstance(self.broker, Broker):
                    raise RuntimeError("--faults broker@ROUND needs a broker this run started")
                self.broker.kill()
            case RestartBroker():
                assert isinstance(self.broker, Broker)
                self.broker.restart()
            case StartInsider(agent, key):
                self.insiders[key] = self._insider(agent)
            case StopInsider(key):
                self.insiders[key].terminate()
            case _:
                raise TypeError(f"no watch asks for {effect!r}")

    def _rows(self, rows: WriteRows) -> None:
        """Rounds into the journal and metrics.csv (started again when fresh or absent)."""
        journal.rounds(self.out, rows.session, rows.models, rows.metrics)
        path = self.out / "metrics.csv"
        fresh = rows.fresh or not path.exists()
        with path.open("w" if fresh else "a", newline="") as fh:
            writer = csv.writer(fh)
            if fresh:
                writer.writerow(rows.header)
            writer.writerows(rows.rows)

    async def watching(self, feed: Callable[[Output], None]) -> None:
        """Every POLL s while the watch wants it (`Watch.polling`), the agents' processes
        sampled and what ended `feed` to it (`Watch.polled`); beside the pump, forever."""
        while True:
            if self.watch.polling:
                ended = self.pool.exited() if self.pool is not None else {}
                feed(self.watch.polled(ended, time.monotonic()))
            await asyncio.sleep(POLL)

    def _insider(self, agent: int) -> subprocess.Popen[bytes]:
        """An insider with `agent`'s broker credentials, connecting in a loop (its output
        in logs/insider-AGENT.log)."""
        launch = self.watch.launches[agent]
        _, _, access = launch.parts()
        env = environment(str(self.broker.address), launch.run, agent, access)
        logs = self.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / f"insider-{agent}.log").open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "privnet.orchestrator.insider"],
                env={**_inherited(), **env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def close(self) -> None:
        """Stop the insiders `--faults flap` started (the run's end, however it ends)."""
        insiders = list(self.insiders.values())
        for insider in insiders:
            if insider.poll() is None:
                insider.terminate()
        for insider in insiders:
            try:
                insider.wait(5)
            except subprocess.TimeoutExpired:
                insider.kill()
                insider.wait()


def _inherited() -> dict[str, str]:
    """The environment a child needs to import privnet as this process does, no secrets."""
    keep = ("PATH", "PYTHONPATH", "HOME", "LANG", "VIRTUAL_ENV", "SYSTEMROOT")
    return {k: v for k, v in os.environ.items() if k in keep}


def _truncate_metrics(path: Path, series: tuple[str, str, str], keep: int) -> None:
    """Drop the rows of `series` (strategy, scheme, repeat) after round `keep`."""
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    whole = [row for row in rows[1:] if len(row) == len(rows[0])]  # a kill cuts a write short
    kept = [row for row in whole if tuple(row[:3]) != series or int(row[3]) <= keep]
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as fh:
        csv.writer(fh).writerows([rows[0], *kept])
    tmp.replace(path)

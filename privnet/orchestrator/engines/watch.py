"""What only the orchestrator's shell can see, fed to the conductor as it happens.

`Watch` is the machine `privnet run` pumps: the conductor, plus the agents' processes (one
that ends is an agent lost; with `--restart on-failure` it is started again, to rejoin),
`--faults` injected at their rounds, and the run's files written as the run goes:
`metrics.csv` gains every round once every member has completed it, `membership.json`
every view, and the console a line per view. An orchestrator that dies mid-run leaves
both files holding everything completed.
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from privnet.agent.launch import AgentLaunch
from privnet.agent.protocol import Output
from privnet.broker.launcher import Broker
from privnet.orchestrator.conductor import IN_SESSION, Conductor, Stage, View
from privnet.orchestrator.curves import METRICS_HEADER
from privnet.orchestrator.engines import journal
from privnet.orchestrator.engines.docker import ContainerBroker
from privnet.orchestrator.engines.launch import Launcher
from privnet.orchestrator.experiment.problem import Problem, msd
from privnet.orchestrator.faults import Fault
from privnet.orchestrator.insider import environment
from privnet.orchestrator.terminal import console

POLL = 0.5  # how often child processes are checked


class Watch:
    """The conductor as the pump drives it, with the shell's eyes; see the module docstring."""

    def __init__(
        self,
        conductor: Conductor,
        pool: Launcher | None,
        broker: Broker | ContainerBroker,
        launches: Mapping[int, AgentLaunch],
        problem: Problem,
        out: Path,
        faults: list[Fault] | None = None,
        restart: bool = False,
    ) -> None:
        self.conductor, self.pool, self.broker = conductor, pool, broker
        self.launches, self.problem, self.out = dict(launches), problem, out
        self.faults, self.restart = list(faults or []), restart
        self.restarts: dict[int, int] = {}  # agent -> times started again
        self.injected: list[str] = []  # faults applied, with the round they hit
        self._next_poll = 0.0
        self._later: list[tuple[float, Callable[[], None]]] = []  # (when, action)
        self._streamed = (-1, 0)  # (session, rounds written: every member reported them)
        # this process's CPU seconds while sessions ran (Go to the session's end): what the
        # orchestrator costs a round, in summary.json
        self.session_cpu = 0.0
        self._cpu_since: float | None = None
        self.insiders: list[subprocess.Popen[bytes]] = []  # --faults flap: stopped by `close`

    # ---- the Machine protocol (privnet.agent.driver.pump) ----------------------------------------

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output:
        out = self._seen(self.conductor.receive(topic, payload, now, retained))
        self._inject(now)  # as soon as the round is known done, not at the next poll
        return out

    def unsubscribed(self, topic: str, now: float) -> Output:
        return self.conductor.unsubscribed(topic, now)

    def deaf(self, now: float) -> Output:
        return self.conductor.deaf(now)

    def next_tick(self) -> float | None:
        times = [self.conductor.next_tick()]
        if self.conductor.stage in (*IN_SESSION, Stage.REGISTERING):
            times.append(self._next_poll)
        times += [when for when, _ in self._later]
        known = [t for t in times if t is not None]
        return min(known) if known else None

    def tick(self, now: float) -> Output:
        out = Output()
        if now >= self._next_poll and self.conductor.stage in (*IN_SESSION, Stage.REGISTERING):
            self._next_poll = now + POLL
            out += self._poll(now)
            self._inject(now)
        due = [action for when, action in self._later if when <= now]
        self._later = [(when, action) for when, action in self._later if when > now]
        for action in due:
            action()
        wake = self.conductor.next_tick()
        if wake is not None and now >= wake:
            out += self.conductor.tick(now)
        return self._seen(out)

    # ---- processes and faults ----------------------------------------------------------

    def _poll(self, now: float) -> Output:
        """Agents whose process ended are lost; with --restart on-failure, started again."""
        if self.pool is None:
            return Output()
        out = Output()
        ended = self.pool.exited()
        for agent, how in sorted(ended.items()):
            out += self.conductor.lost(agent, how, now)
        if ended and self.restart and self.conductor.stage in IN_SESSION:
            again = sorted(ended)
            for agent in again:
                self.restarts[agent] = self.restarts.get(agent, 0) + 1
            rejoin = {p: replace(self.launches[p], rejoin=True) for p in again}
            self.pool.restart(again, rejoin)
            console.print(f"restarted agents {again}")
        return out

    def _inject(self, now: float) -> None:
        if not self.faults:
            return
        done = self.conductor.rounds_done
        while self.faults and self.faults[0].round <= done and self.conductor.stage in IN_SESSION:
            fault = self.faults.pop(0)
            self.injected.append(f"{fault} (at round {done})")
            console.print(f"[yellow]fault:[/yellow] {fault} at round {done}")
            if fault.kind == "broker":
                self._broker_down(now, fault.seconds)
            elif fault.kind == "flap" and fault.agent is not None:
                self._insider(now, fault.agent, fault.seconds)
            elif self.pool is not None and fault.agent is not None:
                agent = fault.agent
                if fault.kind == "kill":
                    self.pool.signal(agent, signal.SIGKILL)
                else:
                    self.pool.signal(agent, signal.SIGSTOP)
                    wake = (now + fault.seconds, lambda a=agent: self._cont(a))
                    self._later.append(wake)

    def _insider(self, now: float, agent: int, seconds: float) -> None:
        """An insider with `agent`'s broker credentials, connecting in a loop (its output
        in logs/insider-AGENT.log); stopped after `seconds` (0: by `close`)."""
        launch = self.launches[agent]
        _, _, access = launch.parts()
        env = environment(str(self.broker.address), launch.run, agent, access)
        logs = self.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / f"insider-{agent}.log").open("ab") as log:
            insider = subprocess.Popen(
                [sys.executable, "-m", "privnet.orchestrator.insider"],
                env={**_inherited(), **env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.insiders.append(insider)
        if seconds:
            self._later.append((now + seconds, insider.terminate))

    def close(self) -> None:
        """Stop the insiders `--faults flap` started (the run's end, however it ends)."""
        for insider in self.insiders:
            if insider.poll() is None:
                insider.terminate()
        for insider in self.insiders:
            try:
                insider.wait(5)
            except subprocess.TimeoutExpired:
                insider.kill()
                insider.wait()

    def _cont(self, agent: int) -> None:
        if self.pool is not None:
            self.pool.signal(agent, signal.SIGCONT)

    def _broker_down(self, now: float, seconds: float) -> None:
        if not isinstance(self.broker, Broker):
            raise RuntimeError("--faults broker@ROUND needs a broker this run started")
        self.broker.kill()
        self._later.append((now + seconds, self.broker.restart))

    # ---- files as the run goes ---------------------------------------------------------

    def _seen(self, out: Output) -> Output:
        for event in out.events:
            if event.kind == "started" and self._cpu_since is None:
                self._cpu_since = time.process_time()
            if event.kind == "session-done" and self._cpu_since is not None:
                self.session_cpu += time.process_time() - self._cpu_since
                self._cpu_since = None
            if event.kind == "session-done":
                result = self.conductor.results[-1]
                journal.session_done(self.out, len(self.conductor.results) - 1, result)
            elif event.kind == "view":
                console.print(f"[cyan]membership:[/cyan] {event.detail}")
                write_membership(self.out / "membership.json", self.conductor.membership.views)
            elif event.kind in ("lost", "restarted"):
                console.print(f"[yellow]{event.kind}:[/yellow] {event.detail}")
        self._stream()
        return out

    @property
    def reported(self) -> int:
        """Rounds of the current session every member has reported (and metrics.csv has)."""
        session, written = self._streamed
        return written if session == self.conductor.session else 0

    def _stream(self) -> None:
        """Append the rounds every member has now completed to metrics.csv (the final
        outputs rewrite it whole, with every series)."""
        conductor = self.conductor
        plan = conductor.current
        if plan is None or conductor.stage not in IN_SESSION:
            return
        session, written = self._streamed
        path = self.out / "metrics.csv"
        strategy, scheme, repeat = str(plan.strategy), str(plan.scheme), str(plan.repeat)
        if session != conductor.session:  # from its first view's start (a resumed session)
            session, written = conductor.session, conductor.membership.views[-1].start - 1
            journal.truncate(self.out, session, written, conductor.collection.models.shape[1:])
            if conductor.membership.views[-1].reason == "resumed" and path.exists():
                _truncate_metrics(path, (strategy, scheme, repeat), written)  # it redoes them
        done = reported(conductor, written)
        if done <= written:
            return
        metrics = conductor.collection.metrics
        journal.rounds(
            self.out, session, conductor.collection.models[written:done], metrics[written:done]
        )
        fresh = not path.exists() or (conductor.session == 0 and written == 0)
        w_opt, q = self.problem.w_opt[int(repeat)], self.problem.q
        told = self.problem.agent_metrics(metrics[written:done])
        with path.open("w" if fresh else "a", newline="") as fh:
            writer = csv.writer(fh)
            if fresh:
                writer.writerow((*METRICS_HEADER, *told))
            for r in range(written, done):
                cen, avg = msd(conductor.collection.models[r], w_opt, q)
                mine = [repr(float(v[r - written])) for v in told.values()]
                writer.writerow((strategy, scheme, repeat, r + 1, repr(cen), repr(avg), *mine))
        self._streamed = (session, done)


def _inherited() -> dict[str, str]:
    """The environment a child needs to import privnet as this process does, no secrets."""
    import os

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


def reported(conductor: Conductor, since: int = 0) -> int:
    """Rounds (from the first) every current member has reported (its metrics, and its
    model at a model round: `Collection.done`), given that
    the first `since` are: rows are looked at from there on, one at a time, so a call on
    every delivery costs the few rows reported since the last."""
    members = conductor.membership.ids
    complete = conductor.collection.done
    done, rounds = since, complete.shape[0]
    while done < rounds and complete[done, members].all():
        done += 1
    return done


def write_membership(path: Path, views: list[View]) -> None:
    """Every view of the run, in order (`privnet simulate --membership` replays them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    lines = ",\n ".join(json.dumps(v.to_json()) for v in views)  # a view per line
    tmp.write_text(f"[{lines}]\n")
    tmp.replace(path)


def read_membership(path: Path) -> list[View]:
    """The views of a membership.json; ValueError saying what is wrong."""
    try:
        items = json.loads(path.read_text())
        if not isinstance(items, list):
            raise ValueError("expected a list of views")
        return [View.from_json(item) for item in items]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a privnet membership.json: {exc}") from None

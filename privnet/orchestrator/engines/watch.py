"""What only the orchestrator's shell can see, fed to the conductor as it happens.

`Watch` is the machine `privnet run` pumps: the conductor, plus what the shell tells it of
the agents' processes (one that ends is an agent lost; with `--restart on-failure` it is
started again, to rejoin), `--faults` to inject at their rounds, and the run's files as the
run goes: `metrics.csv` gains every round once every member has completed it,
`membership.json` every view, and the console a line per view. An orchestrator that dies
mid-run leaves both files holding everything completed.

`Watch` is sans-IO, as the conductor is: what it wants done beside publishing it returns as
effects (`Output.effects`: the dataclasses below), and the shell (`engines.shell`) writes
the files, signals the processes and samples them.
"""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from privnet.agent import wire
from privnet.agent.launch import AgentLaunch
from privnet.agent.protocol import Output
from privnet.orchestrator.conductor import IN_SESSION, Conductor, SessionResult, Stage, View
from privnet.orchestrator.curves import METRICS_HEADER
from privnet.orchestrator.experiment.instance import Instance, msd
from privnet.orchestrator.faults import Fault

POLL = 0.5  # how often the shell samples the agents' processes


# ---- effects: what the shell does for the watch ---------------------------------------


@dataclass(frozen=True)
class Say:
    """A line on the console."""

    text: str


@dataclass(frozen=True)
class WriteMembership:
    """membership.json, whole: every view so far."""

    views: tuple[View, ...]


@dataclass(frozen=True)
class SessionDone:
    """A session's result into the journal (`journal.session_done`)."""

    index: int
    result: SessionResult


@dataclass(frozen=True)
class Redo:
    """A session (re)started from round `keep`: the journal's rounds after it dropped, and
    with `series` (strategy, scheme, repeat: a resumed session) metrics.csv's rows too."""

    session: int
    keep: int
    shape: tuple[int, ...]
    series: tuple[str, str, str] | None


@dataclass(frozen=True)
class WriteRows:
    """Rounds every member completed: into the journal (`models`, `metrics`) and as rows of
    metrics.csv (`fresh`: the file starts again with `header`, else it is appended to;
    one that does not exist yet starts with it too)."""

    session: int
    models: tuple[np.ndarray | None, ...]  # per round, P x M (None: no model that round)
    metrics: np.ndarray
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    fresh: bool


@dataclass(frozen=True)
class Signal:
    """A signal to an agent's process (SIGKILL, SIGSTOP, SIGCONT)."""

    agent: int
    signum: int


@dataclass(frozen=True)
class Restart:
    """Start these agents' processes again, with these launches (to rejoin)."""

    launches: Mapping[int, AgentLaunch]


@dataclass(frozen=True)
class KillBroker:
    """Kill the broker this run started (`--faults broker@ROUND`)."""


@dataclass(frozen=True)
class RestartBroker:
    """Start the killed broker again."""


@dataclass(frozen=True)
class StartInsider:
    """An insider with `agent`'s broker credentials (`--faults flap`), known by `key`."""

    agent: int
    key: int


@dataclass(frozen=True)
class StopInsider:
    """Stop the insider started as `key`."""

    key: int


Effect = (
    Say
    | WriteMembership
    | SessionDone
    | Redo
    | WriteRows
    | Signal
    | Restart
    | KillBroker
    | RestartBroker
    | StartInsider
    | StopInsider
)


class Watch:
    """The conductor as the pump drives it, with the shell's eyes; see the module docstring."""

    def __init__(
        self,
        conductor: Conductor,
        launches: Mapping[int, AgentLaunch],
        problem: Instance,
        faults: list[Fault] | None = None,
        restart: bool = False,
    ) -> None:
        self.conductor, self.launches, self.problem = conductor, dict(launches), problem
        self.faults, self.restart = list(faults or []), restart
        self.restarts: dict[int, int] = {}  # agent -> times started again
        self.injected: list[str] = []  # faults applied, with the round they hit
        self._later: list[tuple[float, Effect]] = []  # (when, what then)
        self._streamed = (-1, 0)  # (session, rounds written: every member reported them)
        self._redone: Redo | None = None  # asked for since the last rows were written
        self._centroid: tuple[int, int, float] = (-1, 0, math.nan)  # (session, round, MSD)

    # ---- the Machine protocol (privnet.agent.driver.pump) ----------------------------------------

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output:
        out = self._seen(self.conductor.receive(topic, payload, now, retained))
        return self._inject(out, now)  # as soon as the round is known done, not at the next poll

    def unsubscribed(self, topic: str, now: float) -> Output:
        return self.conductor.unsubscribed(topic, now)

    def deaf(self, now: float) -> Output:
        return self.conductor.deaf(now)

    def next_tick(self) -> float | None:
        times = [self.conductor.next_tick(), *(when for when, _ in self._later)]
        known = [t for t in times if t is not None]
        return min(known) if known else None

    def tick(self, now: float) -> Output:
        out = Output()
        due = tuple(effect for when, effect in self._later if when <= now)
        self._later = [(when, effect) for when, effect in self._later if when > now]
        out.effects += due
        wake = self.conductor.next_tick()
        if wake is not None and now >= wake:
            out += self.conductor.tick(now)
        return self._seen(out)

    # ---- processes and faults ----------------------------------------------------------

    @property
    def polling(self) -> bool:
        """Whether the agents' processes are to be sampled now (`polled`)."""
        return self.conductor.stage in (*IN_SESSION, Stage.REGISTERING)

    def polled(self, ended: Mapping[int, str], now: float) -> Output:
        """The shell sampled the agents' processes: those in `ended` (agent -> how) ended.
        They are lost; with --restart on-failure, started again. Faults now due are injected."""
        out = Output()
        for agent, how in sorted(ended.items()):
            out += self.conductor.lost(agent, how, now)
        if ended and self.restart and self.conductor.stage in IN_SESSION:
            again = sorted(ended)
            for agent in again:
                self.restarts[agent] = self.restarts.get(agent, 0) + 1
            rejoin = {p: replace(self.launches[p], rejoin=True) for p in again}
            out.effects += (Restart(rejoin), Say(f"restarted agents {again}"))
        return self._inject(self._seen(out), now)

    def _inject(self, out: Output, now: float) -> Output:
        """`out`, with the effects of the faults due at the rounds done."""
        if not self.faults:
            return out
        done = self.conductor.rounds_done
        while self.faults and self.faults[0].round <= done and self.conductor.stage in IN_SESSION:
            fault = self.faults.pop(0)
            self.injected.append(f"{fault} (at round {done})")
            out.effects += (Say(f"[yellow]fault:[/yellow] {fault} at round {done}"),)
            out.effects += self._fault(fault, now)
        return out

    def _fault(self, fault: Fault, now: float) -> tuple[Effect, ...]:
        """What a fault does now; what it undoes later goes to `_later`."""
        agent = fault.agent
        if fault.kind == "broker":
            self._later.append((now + fault.seconds, RestartBroker()))
            return (KillBroker(),)
        if agent is None:
            return ()
        if fault.kind == "flap":
            key = len(self.injected)
            if fault.seconds:  # else stopped at the run's end
                self._later.append((now + fault.seconds, StopInsider(key)))
            return (StartInsider(agent, key),)
        if fault.kind == "kill":
            return (Signal(agent, signal.SIGKILL),)
        self._later.append((now + fault.seconds, Signal(agent, signal.SIGCONT)))
        return (Signal(agent, signal.SIGSTOP),)

    # ---- files as the run goes ---------------------------------------------------------

    def _seen(self, out: Output) -> Output:
        for event in out.events:
            if event.kind == "session-done":
                result = self.conductor.results[-1]
                out.effects += (SessionDone(len(self.conductor.results) - 1, result),)
            elif event.kind == "view":
                out.effects += (
                    Say(f"[cyan]membership:[/cyan] {event.detail}"),
                    WriteMembership(tuple(self.conductor.membership.views)),
                )
            elif event.kind in ("lost", "restarted"):
                out.effects += (Say(f"[yellow]{event.kind}:[/yellow] {event.detail}"),)
        out.effects += self._stream()
        return out

    @property
    def reported(self) -> int:
        """Rounds of the current session every member has reported (and metrics.csv has)."""
        session, written = self._streamed
        return written if session == self.conductor.session else 0

    def centroid(self) -> float | None:
        """The centroid MSD at the last round reported (None: none yet in this session): its
        row's, or, of a resumed session before its first rows, computed once."""
        shown, session, plan = self.reported, self.conductor.session, self.conductor.current
        if not shown or plan is None:
            return None
        if self._centroid[:2] != (session, shown):
            w, w_opt = self.conductor.collection.models[shown - 1], self.problem.w_opt[plan.repeat]
            self._centroid = (session, shown, msd(w, w_opt, self.problem.q)[0])
        return self._centroid[2]

    def _stream(self) -> tuple[Effect, ...]:
        """The rounds every member has now completed, for the journal and metrics.csv (the
        final outputs rewrite it whole, with every series)."""
        conductor = self.conductor
        plan = conductor.current
        if plan is None or conductor.stage not in IN_SESSION:
            return ()
        session, written = self._streamed
        strategy, scheme, repeat = str(plan.strategy), str(plan.scheme), str(plan.repeat)
        effects: tuple[Effect, ...] = ()
        if session != conductor.session:  # from its first view's start (a resumed session)
            session, written = conductor.session, conductor.membership.views[-1].start - 1
            resumed = conductor.membership.views[-1].reason == "resumed"  # it redoes them
            series = (strategy, scheme, repeat) if resumed else None
            redo = Redo(session, written, conductor.collection.models.shape[1:], series)
            if redo != self._redone:  # once: the rows stay dropped until rows come
                effects, self._redone = (redo,), redo
        done = conductor.collection.through(conductor.membership.ids, written)
        if done <= written:
            return effects
        metrics = conductor.collection.metrics
        w_opt, q = self.problem.w_opt[int(repeat)], self.problem.q
        told = self.problem.agent_metrics(metrics[written:done])
        rows = []
        for r in range(written, done):
            cen, avg = msd(conductor.collection.models[r], w_opt, q)
            mine = [repr(float(v[r - written])) for v in told.values()]
            rows.append((strategy, scheme, repeat, str(r + 1), repr(cen), repr(avg), *mine))
            self._centroid = (session, r + 1, cen)  # the progress line's, at no second MSD
        fresh = conductor.session == 0 and written == 0
        header = (*METRICS_HEADER, *told)
        # the model rounds' only: a big model's other rounds are pages never written; as
        # float32 where the telemetry carried float32 (exact: half the journal's bytes)
        kept = conductor.collection.models[written:done]
        narrow = conductor.collection.dtype == wire.F4
        models = tuple(
            None if np.isnan(w[:, 0]).all() else w.astype(np.float32) if narrow else w.copy()
            for w in kept
        )
        held = metrics[written:done].copy()
        self._streamed, self._redone = (session, done), None
        return (*effects, WriteRows(session, models, held, header, tuple(rows), fresh))


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

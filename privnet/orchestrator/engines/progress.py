"""The console's progress lines of a net run, one per strategy/scheme, redrawn from the
conductor's state as the pump delivers (`privnet.orchestrator.engines.net`)."""

from __future__ import annotations

import time

import numpy as np
from rich.progress import Progress, TaskID

from privnet.agent.protocol import Event
from privnet.orchestrator.conductor import SessionPlan
from privnet.orchestrator.engines.watch import Watch
from privnet.orchestrator.experiment.instance import Instance, msd


class ProgressLines:
    """Progress lines, one per strategy/scheme: rounds done, rounds/s, the current centroid
    MSD, and the seconds its sessions spent being set up (Setup to Go: the agents building
    their data and agreeing keys; a new view's re-keying too). A session's line ends as the
    session did (`settle`), so a log shows final lines, not the last refresh."""

    def __init__(self, bar: Progress, problem: Instance, watch: Watch) -> None:
        self.bar, self.problem, self.watch = bar, problem, watch
        self.tasks: dict[str, TaskID] = {}
        self.t0 = time.perf_counter()  # when the session under way started its rounds
        self.began: float | None = None  # ... or began being set up, while it is
        self.setup: dict[str, float] = {}  # seconds of set-up, by line
        self.first = 0  # rounds done when it started them (later than 0, when resumed)
        self.settled = len(watch.conductor.results)  # sessions done before (--resume)
        self.shown: tuple[int, int, int, float | None] | None = None  # what the line shows

    def event(self, event: Event) -> None:
        now = time.perf_counter()
        if event.kind == "configuring":
            self.began = now
        elif event.kind == "started" and self.began is not None:
            plan = self.watch.conductor.current  # the session just started
            name = _progress_line(plan)[0] if plan is not None else event.detail
            self.setup[name] = self.setup.get(name, 0.0) + now - self.began
            self.began, self.t0, self.first = None, now, self.watch.conductor.rounds_done

    def update(self) -> None:
        """Called after every delivery: redraws only when a round, a report or a set-up
        came in (a 1000-agent run gets hundreds of frames a round; the MSD walks every agent)."""
        self.settle()
        conductor, c = self.watch.conductor, self.problem.config
        plan = conductor.current
        if plan is None:
            return
        rounds, shown = conductor.rounds_done, self.watch.reported
        now = (conductor.session, rounds, shown, self.began)
        if now == self.shown:
            return
        self.shown = now
        name, repeat = _progress_line(plan)
        rate = (rounds - self.first) / max(time.perf_counter() - self.t0, 1e-9)
        rate = 0.0 if self.began is not None else rate
        self._show(name, repeat * c.iters + rounds, rate, self.watch.centroid())

    def settle(self) -> None:
        """Every session done since: its line at all its rounds, its rate (the rounds it
        ran, over Go to the last Finished) and its last centroid MSD."""
        conductor, c = self.watch.conductor, self.problem.config
        results = conductor.results
        for index, result in enumerate(results[self.settled :], self.settled):
            name, repeat = _progress_line(conductor.plans[index])  # its plan: in order
            rate = result.counted / result.wall if result.wall > 0 else 0.0
            w_opt, q = self.problem.w_opt[repeat], self.problem.q
            self._show(name, (repeat + 1) * c.iters, rate, msd(result.models[-1], w_opt, q)[0])
        self.settled = len(results)

    def _show(self, name: str, done: int, rate: float, cent: float | None) -> None:
        if name not in self.tasks:
            total = self.problem.config.iters * self.problem.config.repeats
            self.tasks[name] = self.bar.add_task(name, total=total, status="")
        status = f"{rate:.1f} rounds/s"  # short: the line fits 80 columns, even piped
        if cent is not None and np.isfinite(cent) and cent > 0:
            status += f", MSD {10 * np.log10(cent):.2f} dB"
        if name in self.setup:
            status += f", set-up {self.setup[name]:.1f} s"
        self.bar.update(self.tasks[name], completed=done, status=status)


def _progress_line(plan: SessionPlan) -> tuple[str, int]:
    """A session's progress line (one per strategy and scheme) and its repeat."""
    return f"{plan.strategy}/{plan.scheme}", plan.repeat

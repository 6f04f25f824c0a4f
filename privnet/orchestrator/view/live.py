"""The run's side of the live view (`privnet run --view`): what the orchestrator already
knows, pushed into a `ViewState` that the server streams to the page.

Nothing here adds a byte to the broker or the agents' wire. `Lookout`, pumped by the net
engine in place of its `Watch`, passes everything through, counting what the orchestrator
receives; the view notes the conductor's events on the timeline as the pump reports them
(`seen`); a sampler, twice a second beside the run (a sibling task), reads the conductor's
stage and views, the reported models' scalars (never the models), the agents' processes,
the sessions' Finished frames and, with `--account`, the accountant's twin runs in a
low-priority worker process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Mapping
from multiprocessing.pool import AsyncResult, Pool
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from privnet.agent import topics
from privnet.agent.driver import Machine
from privnet.agent.protocol import QOS, Output
from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.conductor import IN_SESSION, Conductor, SessionPlan, Stage, View, describe
from privnet.orchestrator.engines.launch import LocalLauncher
from privnet.orchestrator.engines.shell import WatchShell
from privnet.orchestrator.engines.watch import Watch
from privnet.orchestrator.experiment.instance import Instance, msd
from privnet.orchestrator.privacy import accountant
from privnet.orchestrator.privacy.accountant import Account
from privnet.orchestrator.view.files import AUDIT_FILE, VIEW_FILE, audit_summary, run_meta
from privnet.orchestrator.view.links import link_bytes
from privnet.orchestrator.view.server import ServerThread, ViewServer
from privnet.orchestrator.view.state import ViewState, db

if TYPE_CHECKING:
    from privnet.orchestrator.audit import WireTap

SAMPLE = 0.5  # s between samples of the run
PROCESSES_EVERY = 4  # samples between samples of the agents' processes (2 s)
RATE_WINDOW = 2.0  # s of rounds over which rounds/s is measured
TEST_ROWS = 4  # testing error: at most this many new rows per sample (each costs a pass)
# What the timeline notes of the conductor's events (views come from its membership).
NOTED = {"registered", "lost", "restarted", "failed", "closing"}


class Lookout:
    """The net engine's `Watch` as the pump drives it, counting the bytes the orchestrator
    receives by category (`received_bytes`, MQTT PUBLISH sizes); sans-IO, as the watch is."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.received_bytes = {"telemetry": 0, "control": 0}

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output:
        category = "telemetry" if "/telemetry/" in topic else "control"
        self.received_bytes[category] += topics.mqtt_publish_size(topic, len(payload), QOS)
        return self.watch.receive(topic, payload, now, retained)

    def tick(self, now: float) -> Output:
        return self.watch.tick(now)

    def next_tick(self) -> float | None:
        return self.watch.next_tick()

    def unsubscribed(self, topic: str, now: float) -> Output:
        return self.watch.unsubscribed(topic, now)

    def deaf(self, now: float) -> Output:
        return self.watch.deaf(now)


class LiveView:
    """The page of one `privnet run --view`: its state, its server and its sampler."""

    def __init__(
        self,
        shell: WatchShell,
        problem: Instance,
        out: Path,
        *,
        neighbour: int | None = None,
        tap: WireTap | None = None,
    ) -> None:
        self.shell, self.watch = shell, shell.watch
        self.problem, self.out, self.tap = problem, out, tap
        conductor = self.watch.conductor
        c = problem.config
        meta = run_meta(problem, conductor.run, [p.label for p in conductor.plans], live=True)
        meta |= {"deadline": conductor.deadline, "account": neighbour, "audit": tap is not None}
        meta["broker"] = shell.broker.kind
        nodes = [problem.graph.nodes[p]["pos"] for p in range(c.agents)]
        self.state = ViewState(meta, nodes)
        self.state.set_edges(problem.graph.edges)
        self.server = ServerThread(ViewServer(self.state, out / "logs"))
        self.t0 = time.monotonic()
        self.lookout = Lookout(self.watch)
        self._views = self._faults = self._results = 0
        self._session, self._rows = -1, 0
        self._plan: SessionPlan | None = None  # the session shown (the last, once all are done)
        self._reached = np.zeros(c.agents, dtype=np.int64)  # rounds per agent, this session
        self._rates: deque[tuple[float, int]] = deque()
        self._model_per_round = 0.0  # bytes, the current view
        self._totals = {"model": 0.0, "telemetry": 0.0, "control": 0.0}
        self._last: tuple[float, int, dict[str, float]] | None = None  # for bytes per round
        self._procs = Processes()
        self._samples = 0
        self._accounts: dict[str, AsyncResult[Account]] = {}
        self._neighbour: int | None = None
        self._pool: Pool | None = None
        if neighbour is not None:
            self._account(neighbour)

    # ---- life ------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> str:
        """Serve the page; its URL. The sampler is the caller's to run (`sampling`)."""
        return await asyncio.to_thread(self.server.start, host, port)

    def machine(self) -> Machine:
        return self.lookout

    async def close(self) -> None:
        """The run is over (its outputs written, or it failed; the sampler stopped): a last
        sample, the page's state kept as view.json beside the outputs, the server stopped."""
        with contextlib.suppress(Exception), self.state.lock:  # the view never fails a run
            self.sample(time.monotonic())
            self.state.update(stage="ended")
            save_view(self.out, self.state)
        if self._pool is not None:
            self._pool.terminate()
        await asyncio.to_thread(self.server.stop)

    async def sampling(self) -> None:
        """Sample the run every SAMPLE s, forever: a task beside the run's."""
        while True:
            with self.state.lock:  # the server's thread reads it
                self.sample(time.monotonic())
            await asyncio.sleep(SAMPLE)

    # ---- reported by the pump ----------------------------------------------------------

    def seen(self, out: Output) -> None:
        """An output of the watch: its events noted on the timeline."""
        for event in out.events:
            if event.kind in NOTED:
                self._note(event.kind, event.detail)

    def _note(self, kind: str, text: str, label: str | None = None) -> None:
        if label is None:
            plan = self.watch.conductor.current
            label = plan.label if plan is not None else ""
        with self.state.lock:
            self.state.note(time.monotonic() - self.t0, label, kind, text)

    # ---- the sampler -------------------------------------------------------------------

    def sample(self, now: float) -> None:
        conductor = self.watch.conductor
        self._finished_sessions(conductor)
        plan = conductor.current
        if plan is not None and conductor.session != self._session:
            self._session, self._rows, self._plan = conductor.session, 0, plan
            self._reached[:] = 0
            self._rates.clear()
        self._new_views(conductor)
        for fault in self.watch.injected[self._faults :]:
            self._note("fault", fault)
        self._faults = len(self.watch.injected)
        running = plan is not None and conductor.stage in IN_SESSION
        if running:
            assert plan is not None
            self._rows = self._metric_rows(
                plan,
                conductor.collection.models,
                conductor.collection.metrics,
                self.watch.reported,
            )
            rounds = conductor.rounds_done
        else:  # before the first session, or after the last (its rounds all done)
            rounds = self._plan.rounds if self._plan is not None else 0
        self._agents(conductor)
        self._traffic(now, rounds)
        self._samples += 1
        if self._samples % PROCESSES_EVERY == 1:
            self._processes(now)
        self._epsilon(rounds)
        if self.tap is not None:
            self._audit()
        view = conductor.membership.view
        self.state.update(
            stage=str(conductor.stage),
            label=self._plan.label if self._plan is not None else "",
            session=conductor.session,
            round=rounds,
            rounds=self._plan.rounds if self._plan is not None else 0,
            view=view.view if view is not None else None,
            members=len(conductor.membership.members),
            elapsed=round(now - self.t0, 1),
            rate=self._rate(now, rounds) if running else None,
            failure=conductor.failure,
            orchestrator_rejected=dict(conductor.deliveries.rejected),
        )

    def _finished_sessions(self, conductor: Conductor) -> None:
        """A session done: its last rows (the conductor moved on to the next session's
        array), each agent's rejections and the session's bytes as the agents counted."""
        for n, result in enumerate(conductor.results[self._results :], self._results):
            if self._results == self._session:
                plan = conductor.plans[n]
                self._metric_rows(plan, result.models, result.metrics, result.models.shape[0])
            rounds = max(result.models.shape[0], 1)
            for agent, done in result.finished.items():
                row = self.state.agents[agent]
                for reason, n in done.rejected.items():
                    row.rejected[reason] = row.rejected.get(reason, 0) + n
            per_round = {k: v / rounds for k, v in sorted(result.totals("bytes").items())}
            rate = rounds / max(result.wall, 1e-9)
            self.state.results.append(
                {
                    "label": result.label,
                    "rounds_per_s": rate,
                    "bytes_per_round": per_round,
                    "rejected": result.totals("rejected"),
                }
            )
            self._note("session", f"done: {rate:.1f} rounds/s", result.label)
            self._results += 1

    def _new_views(self, conductor: Conductor) -> None:
        for view in conductor.membership.views[self._views :]:
            if view.view > 0 or view.start > 1:
                self._note("view", describe(view))
            self._edges(conductor.plans[view.session], view)
        self._views = len(conductor.membership.views)

    def _edges(self, plan: SessionPlan, view: View) -> None:
        """Model bytes per round on each link of the graph under `view` (0: not in it)."""
        members = frozenset(view.members)
        specs = plan.specs
        if len(members) != len(specs) and plan.view_specs is not None:
            specs = plan.view_specs(members)
        conductor = self.watch.conductor
        sent = link_bytes(
            conductor.run, specs, members, view.start, view.view, conductor.seal_links
        )
        self.state.edge_bytes = [sent.get(edge, 0.0) for edge in self.state.edges]
        self._model_per_round = sum(sent.values())
        self.state.touch()

    def _metric_rows(
        self, plan: SessionPlan, models: np.ndarray, metrics: np.ndarray | None, reported: int
    ) -> int:
        """The rows every member has reported since the last sample, as the page's curve:
        MSD in dB, or the problem's test metric in %, of the centroid and the average agent
        at the rounds with models (at most TEST_ROWS scored), and every round the agents'
        own score (their risk in dB, or their test metric in %)."""
        curve = self.state.curve(plan.label)
        rows = range(self._rows, reported)
        w_opt, q = self.problem.w_opt[plan.repeat], self.problem.q
        own = np.full(len(rows), np.nan)
        if metrics is not None:
            told = self.problem.agent_metrics(metrics[self._rows : reported])
            own = told[self.problem.agent_series[1]]
        held = [r for r in rows if not np.isnan(models[r, :, 0]).all()]
        points: dict[int, tuple[float | None, float | None]] = {}
        if self.problem.classifies:
            step = max(1, len(held) // TEST_ROWS)
            for r in sorted({*held[::step][: TEST_ROWS - 1], *held[-1:]}):
                scored = self.problem.scores(models[r : r + 1])
                assert scored is not None
                points[r] = (100 * scored[0][0], 100 * scored[1][0])
        else:
            for r in held:
                cen, avg = msd(models[r], w_opt, q)
                points[r] = (db(cen), db(avg))
        for n, r in enumerate(rows):
            mine = 100 * own[n] if self.problem.classifies else db(own[n])
            if metrics is not None or r in points:
                curve.add(r + 1, *points.get(r, (None, None)), mine)
        return max(self._rows, reported)

    def _agents(self, conductor: Conductor) -> None:
        rounds = conductor.completed
        if rounds.size:
            np.maximum(self._reached, rounds, out=self._reached)
        view = conductor.membership.view
        left = {} if view is None else view.left
        for agent, row in enumerate(self.state.agents):
            row.round = int(self._reached[agent])
            row.phase = phase(conductor, agent, rounds)
            if view is not None and agent in view.members:
                row.view, row.why = view.view, ""
            elif agent in left:
                row.why = left[agent]

    def _traffic(self, now: float, rounds: int) -> None:
        """Bytes per round by category over the last interval in which rounds were made:
        model frames by their size, what the orchestrator received and published."""
        conductor, received = self.watch.conductor, self.lookout.received_bytes
        totals = {
            "model": self._totals["model"],
            "telemetry": float(received["telemetry"]),
            "control": float(received["control"] + conductor.outbox.traffic.octets["control"]),
        }
        if self._last is not None and self._last[1] < rounds:
            made = rounds - self._last[1]
            totals["model"] += made * self._model_per_round
            before = self._last[2]
            per = {k: (totals[k] - before[k]) / made for k in totals}
            self.state.bytes.add(
                now - self.t0, per["model"], None, per["telemetry"], per["control"]
            )
        if self._last is None or self._last[1] != rounds:
            self._last = (now, rounds, totals)
        self._totals = totals

    def _rate(self, now: float, rounds: int) -> float | None:
        if self._rates and rounds < self._rates[-1][1]:  # a view redoes rounds: start again
            self._rates.clear()
        self._rates.append((now, rounds))
        while len(self._rates) > 2 and now - self._rates[1][0] >= RATE_WINDOW:
            self._rates.popleft()
        (t0, r0) = self._rates[0]
        if now - t0 < SAMPLE / 2:
            return None
        rate = (rounds - r0) / (now - t0)
        self.state.rates.add(now - self.t0, rate)
        return rate

    def _processes(self, now: float) -> None:
        pool = self.shell.pool
        if not isinstance(pool, LocalLauncher):
            return  # containers: `docker stats` is the place
        sampled = self._procs.sample(pool.pids(), now)
        for agent, row in enumerate(self.state.agents):
            if agent in sampled:
                row.rss_mb, row.cpu_pct, row.cpu_s = sampled[agent]
            else:  # its process is gone: CPU s is what it had used
                row.rss_mb = row.cpu_pct = None

    # ---- privacy and audit -------------------------------------------------------------

    def _account(self, neighbour: int) -> None:
        """The accountant's twin runs of every session, one after the other, in a worker
        process started now: epsilon depends on the data and the seed, not on the network,
        so it can be known before the network gets there. The outputs use its very runs
        (`account`): the work --account does after the rounds is done beside them."""
        context = multiprocessing.get_context("spawn")  # the orchestrator has threads
        self._pool = context.Pool(1)
        for plan in self.watch.conductor.plans:
            self._accounts[plan.label] = self._pool.apply_async(
                account_session, (self.problem, plan.strategy, plan.scheme, plan.repeat, neighbour)
            )
        self._neighbour = neighbour
        self.state.epsilon = {"neighbour": neighbour, "sessions": {}}

    def account(
        self, problem: Instance, strategy: Strategy, scheme: Scheme, neighbour: int, repeat: int
    ) -> Account:
        """`accountant.account`, from the twin runs the worker made where it made them
        (it blocks until they are done: the outputs would run them otherwise)."""
        pending = self._accounts.get(f"{strategy}/{scheme}/{repeat}")
        if pending is None or problem is not self.problem or neighbour != self._neighbour:
            return accountant.account(problem, strategy, scheme, neighbour, repeat)
        return pending.get()

    def _epsilon(self, rounds: int) -> None:
        if self.state.epsilon is None:
            return
        plan = self._plan
        sessions = self.state.epsilon["sessions"]
        for label, pending in self._accounts.items():
            if not pending.ready():
                sessions.setdefault(label, {"pending": True})
                continue
            try:
                got = pending.get()
            except Exception as exc:  # shown on the page; the outputs run the accountant again
                sessions[label] = {"error": repr(exc)[:200]}
                continue
            eps, network = got.epsilon, got.epsilon_network
            done = {r["label"] for r in self.state.results}
            at = eps.shape[0] if label in done else rounds if plan and plan.label == label else 0
            row = max(at, 1) - 1
            sessions[label] = {
                "round": at,
                "agents": [jsonable(e) if at else 0.0 for e in eps[row]],
                "network": jsonable(network[row]) if at else 0.0,
            }

    def _audit(self) -> None:
        assert self.tap is not None
        audit = {"recorded": len(self.tap.records)}
        path = self.out / AUDIT_FILE
        if path.is_file():  # written by the audit after the run (privnet run --audit)
            with contextlib.suppress(ValueError, OSError):
                audit |= audit_summary(json.loads(path.read_text()))
        self.state.audit = audit


def account_session(
    problem: Instance, strategy: Strategy, scheme: Scheme, repeat: int, neighbour: int
) -> Account:
    """The accountant's twin runs of one session (in the view's worker process), without
    the replays behind them (`charges`: every frame's values, which the outputs need not
    and which would cross back from the worker for nothing)."""
    accounted = accountant.account(problem, strategy, scheme, neighbour, repeat)
    return dataclasses.replace(accounted, charges=None)


def jsonable(value: float) -> float | str:
    """An epsilon for JSON: infinite ones are spelt "inf", as summary.json spells them."""
    return float(value) if np.isfinite(value) else "inf"


def phase(conductor: Conductor, agent: int, rounds: np.ndarray) -> str:
    """What the page colours an agent by (state.PHASES); `rounds`: `conductor.completed`."""
    if agent in conductor.collection.farewells:
        return "left"
    if agent not in conductor.registry.registered:
        return "failed" if conductor.stage is Stage.FAILED else "registering"
    if conductor.stage is Stage.FAILED:
        return "failed"
    if agent not in conductor.membership.alive or agent not in conductor.membership.members:
        view = conductor.membership.view
        why = view.left.get(agent, "") if view is not None else ""
        return "failed" if why.startswith("failed") else "excluded"
    plan = conductor.current
    stage = conductor.stage
    if stage is Stage.CONFIGURING:
        return "keying"
    if stage is Stage.HOLDING:
        return "held"
    if stage is Stage.RUNNING and plan is not None and rounds[agent] < plan.rounds:
        return "running"
    return "finished"


class Processes:
    """RSS and CPU of the agents' processes, one /proc/<pid>/stat read each: psutil's two
    reads a process, twice a second for every agent, would be the view's largest cost."""

    TICK = os.sysconf("SC_CLK_TCK")
    PAGE = os.sysconf("SC_PAGE_SIZE")

    def __init__(self) -> None:
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> (when, CPU s then)

    def sample(
        self, pids: Mapping[int, int], now: float
    ) -> dict[int, tuple[float, float | None, float]]:
        """agent -> (RSS MB, CPU % since the last sample, CPU s in all)."""
        seen: dict[int, tuple[float, float | None, float]] = {}
        out = {}
        for agent, pid in pids.items():
            if pid not in seen:
                with contextlib.suppress(OSError, ValueError, IndexError):  # gone meanwhile
                    seen[pid] = self._one(pid, now)
            if pid in seen:
                out[agent] = seen[pid]
        for gone in set(self._cpu) - set(pids.values()):
            self._cpu.pop(gone)
        return out

    def _one(self, pid: int, now: float) -> tuple[float, float | None, float]:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rindex(b")") + 2 :].split()  # from field 3, the state
        cpu = (int(fields[11]) + int(fields[12])) / self.TICK  # utime + stime
        rss = int(fields[21]) * self.PAGE
        before = self._cpu.get(pid)
        self._cpu[pid] = (now, cpu)
        pct = None if before is None else 100 * (cpu - before[1]) / max(now - before[0], 1e-9)
        return rss / 1e6, pct, cpu


def save_view(out: Path, state: ViewState) -> None:
    """What only the live view saw, for `privnet view` to show again: rounds/s and bytes
    over time, and the per-agent table (processes, rejections)."""
    doc = {
        "rates": state.rates.data,
        "bytes": state.bytes.data,
        "agents": [a.to_json() for a in state.agents],
        "timeline": list(state.timeline),
        "results": state.results,
        "epsilon": state.epsilon,
    }
    (out / VIEW_FILE).write_text(json.dumps(doc, allow_nan=False) + "\n")

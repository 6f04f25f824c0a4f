"""The `memory` engine: the whole protocol, control plane included, in one process.

A `Network` is the conductor and one agent node per agent, each pumped by the driver
(`privnet.agent.driver.pump`, as `privnet run` pumps them over MQTT) on its link to one
in-memory broker (`privnet.agent.inmemory`): the same router interface as the network's,
another implementation, as httpx has its HTTP and mock transports. The bytes are the bytes
the MQTT shells publish (signed, sealed, MACed), so the memory engine checks the networked
run's life cycle as well as its math, and the audit's replay, the overhead measurement and
the tests all plug in here: a `tap` sees every publish. Time is the broker's virtual clock:
it moves only once every party waits, so a run is deterministic and a slow machine fires
no deadline; the wall time a session reports is the real one, measured here.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privnet.agent import keys, wire
from privnet.agent.core import AgentCore
from privnet.agent.driver import publish, pump
from privnet.agent.inmemory import MemoryBroker, MemoryLink
from privnet.agent.node import AgentNode, Launch
from privnet.agent.protocol import QOS, Output, Publish
from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.conductor import (
    Conductor,
    SessionPlan,
    SessionResult,
    Stage,
    View,
    add_counts,
)
from privnet.orchestrator.curves import Curve
from privnet.orchestrator.errors import RunFailed
from privnet.orchestrator.experiment.instance import Instance, msd
from privnet.orchestrator.experiment.specs import session_list, session_plans

CONDUCTOR = "orchestrator"
Tap = Callable[[str, Publish], None]  # (publisher, frame)
WireTap = Callable[[str, str, bytes], None]  # (publisher, topic, payload): the broker's view
Told = Callable[[Output], None] | None  # a pump's `on_output`


@dataclass
class Network:
    """A run in memory: the conductor and the nodes, each on its link to one broker."""

    conductor: Conductor
    nodes: list[AgentNode]
    tap: Tap | None = None

    @classmethod
    def build(
        cls,
        plans: list[SessionPlan],
        *,
        core: Callable[..., AgentCore] = AgentCore,
        tap: Tap | None = None,
        deadline: float = 30.0,
        telemetry: bool = True,
        run: str = "memory",
        script: Iterable[View] | None = None,
        seal_links: bool = True,
        escrow: bool = False,
        models_every: int | None = None,
    ) -> Network:
        """Fresh identities and launch tokens for every party, as `privnet run` makes them."""
        agents = len(plans[0].specs)
        orchestrator = keys.Identity.generate()
        tokens = {p: secrets.token_bytes(32) for p in range(agents)}
        conductor = Conductor(
            run,
            orchestrator,
            tokens,
            plans,
            deadline=deadline,
            telemetry=telemetry,
            script=script,
            seal_links=seal_links,
            escrow=escrow,
            models_every=models_every,
        )
        nodes = [
            AgentNode(
                Launch(run, p, orchestrator.public, tokens[p]), keys.Identity.generate(), core
            )
            for p in range(agents)
        ]
        return cls(conductor, nodes, tap)

    def play(self) -> list[SessionResult]:
        """Every session to the end, then Bye; RunFailed if the conductor gave up. Blocks,
        called from a coroutine too (the run gets an event loop of its own, on a thread)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # the usual case, run below: outside the handler, so no error chains to it
        else:
            with ThreadPoolExecutor(1, "memory-engine") as pool:
                return pool.submit(asyncio.run, self.drive()).result()
        return asyncio.run(self.drive())

    async def drive(
        self, close: float = 30.0, wire_tap: WireTap | None = None
    ) -> list[SessionResult]:
        """`play` in a running event loop. After Bye the agents have `close` (virtual) s to
        leave. `wire_tap` sees what the broker routes, the driver's own probes too."""
        broker = MemoryBroker(wire_tap)
        conducting = broker.connect(CONDUCTOR)
        for topic in self.conductor.subscriptions:
            await conducting.subscribe(topic, QOS)
        links = [broker.connect(f"agent-{node.me}") for node in self.nodes]
        for node, link in zip(self.nodes, links, strict=True):
            for topic, qos in node.subscription_qos.items():
                await link.subscribe(topic, qos)
        walls = _Walls(self.conductor)
        told = self._told(CONDUCTOR, walls)
        tells = [self._told(link.name) for link in links]  # one each, for its whole run
        now = broker.clock()
        _start(conducting, self.conductor.start(now), told)
        for node, link, tell in zip(self.nodes, links, tells, strict=True):
            _start(link, node.start(now), tell)
        try:
            done = await self._pump(broker, conducting, links, tells, told, close)
        except* Exception as group:  # a party's own failure, not the task group's wrapping
            raise group.exceptions[0] from None
        if not done:
            self._check()
        for result, wall in zip(self.conductor.results, walls.seconds, strict=False):
            result.wall = wall
        return self.conductor.results

    async def _pump(
        self,
        broker: MemoryBroker,
        conducting: MemoryLink,
        links: list[MemoryLink],
        tells: list[Told],
        told: Told,
        close: float,
    ) -> bool:
        """Every party pumped until the conductor ends (or nothing can happen any more),
        then, after a Bye, until the agents left; whether the conductor got to the end."""
        conductor, ended = self.conductor, (Stage.DONE, Stage.FAILED)
        async with asyncio.TaskGroup() as group:
            serving = group.create_task(broker.serve())
            agents = []
            for node, link, tell in zip(self.nodes, links, tells, strict=True):
                task = group.create_task(pump(link, node, _done(node), tell))
                task.add_done_callback(_closing(link))
                agents.append(task)
            conducted = group.create_task(
                pump(conducting, conductor, lambda: conductor.stage in ended, told)
            )
            await asyncio.wait((conducted, serving), return_when=asyncio.FIRST_COMPLETED)
            conducting.close()
            done = conductor.stage is Stage.DONE
            if done:
                _start(conducting, conductor.bye(), told)
                gone = asyncio.Event()
                broker.clock.later(close, gone.set)
                waits = (group.create_task(asyncio.wait(agents)), group.create_task(gone.wait()))
                await asyncio.wait((*waits, serving), return_when=asyncio.FIRST_COMPLETED)
                waits[1].cancel()
            for task in (*agents, conducted, serving):
                task.cancel()
        return done

    def _told(self, name: str, walls: _Walls | None = None) -> Told:
        """What the pump reports of `name`'s outputs: every publish to the tap, and the
        conductor's session ends to the wall clock (None: nothing to report)."""
        tap = self.tap
        if tap is None and walls is None:
            return None

        def told(out: Output) -> None:
            if tap is not None:
                for frame in out.publish:
                    tap(name, frame)
            if walls is not None:
                walls.heard()

        return told

    def _check(self) -> None:
        """RunFailed, saying why, unless the conductor got to the end."""
        if self.conductor.stage is not Stage.DONE:
            stuck = [n.me for n in self.nodes if n.phase.value != "finished"]
            failed = [f"; {n.failure}" for n in self.nodes if n.failure][:3]  # e.g. wire-range
            raise RunFailed(
                (
                    self.conductor.failure
                    or f"the run stopped in stage {self.conductor.stage}; agents {stuck} are stuck"
                )
                + "".join(failed)  # what stopped them: the view's end may not say it
            )


@dataclass
class _Walls:
    """Each session's real seconds, its first Go to its last Finished: the conductor's own
    clock is the broker's virtual one, which stands still while the parties work."""

    conductor: Conductor
    seconds: list[float] = field(default_factory=list)
    began: float | None = None

    def heard(self) -> None:
        """After each output of the conductor's: a session ended, or one began."""
        c = self.conductor
        if len(c.results) > len(self.seconds):
            now = time.perf_counter()
            self.seconds.append(now - (self.began or now))
            self.began = None
        if self.began is None and c.pacing.go_at:
            self.began = time.perf_counter()


def _start(link: MemoryLink, out: Output, told: Told) -> None:
    """Publish and report what a party said outside its pump (its start, the Bye)."""
    publish(link, out)
    if told is not None:
        told(out)


def _closing(link: MemoryLink) -> Callable[[object], None]:
    """A pump task's done callback: its party left, the broker no longer waits for it."""
    return lambda _: link.close()


def _done(node: AgentNode) -> Callable[[], bool]:
    """Whether `node` is done (its pump's `until`)."""
    return lambda: node.done


def run_session(
    problem: Instance, strategy: Strategy, scheme: Scheme, repeat: int
) -> SessionResult:
    """One session through conductor and nodes: its models, bytes, messages, views."""
    plans = session_plans(problem, [(strategy, scheme, repeat)])
    return Network.build(plans, seal_links=problem.config.seal_links).play()[0]


def run_memory(
    problem: Instance,
    strategies: Iterable[Strategy] | None = None,
    schemes: Iterable[Scheme] | None = None,
    progress: Callable[[int], None] | None = None,
    models: dict[str, np.ndarray] | None = None,
) -> list[Curve]:
    """Every strategy x scheme x repeat through conductor and nodes; one Curve per pair,
    with what the wire cost (the bytes the agents' shells would publish). `models` gets
    every session's models, (iters, P, M), by its label (`atc/none/0`)."""
    c = problem.config
    curves = []
    for strategy in strategies or c.strategies:
        for scheme in schemes or c.schemes:
            results = []
            for r in range(c.repeats):
                results.append(run_session(problem, strategy, scheme, r))
                if models is not None:
                    models[results[-1].label] = results[-1].models
                if progress:
                    progress(1)
            curves.append(results_curve(problem, str(strategy), str(scheme), results))
    return curves


def curve_of(
    problem: Instance,
    strategy: str,
    scheme: str,
    runs: list[np.ndarray],
    rounds_per_s: float,
    extra: dict | None = None,
    metrics: list[np.ndarray | None] | None = None,
) -> Curve:
    """MSD (and testing errors, for classification) over repeats of models (T, P, M), of
    the honest agents: NaN at rounds without models (--models-every); Byzantine agents'
    rows are left out (as absent agents are) and their own average MSD is reported apart,
    in `extra` (issue 34); with `metrics` (T, P, 2) per repeat, the agents' own every round
    (`Instance.agent_series`)."""
    cent = np.zeros((len(runs), problem.config.iters))
    avg = np.zeros_like(cent)
    scored = np.zeros((2, *cent.shape))
    byzantine = sorted(problem.config.attackers())
    if byzantine:
        extra = {**(extra or {}), "byzantine": byzantine, **_attackers_msd(problem, runs)}
        runs = [_honest(models, byzantine) for models in runs]
    for r, models in enumerate(runs):
        for i, w in enumerate(models):
            cent[r, i], avg[r, i] = msd(w, problem.w_opt[r], problem.q)
        tested = problem.scores(models)
        if tested is not None:
            scored[:, r] = tested
    series = {name: scored[n] for n, name in enumerate(problem.metric_series)}
    if metrics and all(m is not None for m in metrics):
        agents = [problem.agent_metrics(m) for m in metrics if m is not None]
        for name in problem.agent_series:
            series[name] = np.stack([a[name] for a in agents])
    return Curve(strategy, scheme, cent, avg, rounds_per_s, extra or {}, series)


def _honest(models: np.ndarray, byzantine: list[int]) -> np.ndarray:
    """Models (T, P, M) with the Byzantine agents' rows NaN (msd leaves them out)."""
    honest = np.array(models, dtype=np.float64)
    honest[:, byzantine] = np.nan
    return honest


def _attackers_msd(problem: Instance, runs: list[np.ndarray]) -> dict[str, Any]:
    """The Byzantine agents' own average MSD over the last tenth of the rounds, in dB."""
    byzantine = sorted(problem.config.attackers())
    tail = max(1, problem.config.iters // 10)
    values = [
        np.nanmean(np.sum((models[-tail:, byzantine] - problem.w_opt[r]) ** 2, axis=-1))
        for r, models in enumerate(runs)
    ]
    return {"byzantine_msd_avg_db": float(10 * np.log10(np.mean(values)))}


def results_curve(
    problem: Instance, strategy: str, scheme: str, results: list[SessionResult]
) -> Curve:
    """MSD over repeats plus what the wire cost, from the sessions of one strategy x scheme."""
    wall = sum(res.wall for res in results)
    traffic = add_counts(res.totals("bytes") for res in results)
    messages = add_counts(res.totals("messages") for res in results)
    rejected = add_counts(res.totals("rejected") for res in results)
    rounds = sum(res.counted for res in results)  # fewer than iters x repeats after --resume
    per_round = {k: v / rounds for k, v in traffic.items() if k != "control"}
    extra = model_frames(problem, traffic, messages, rounds) | {
        "bytes": traffic,
        "messages": messages,
        "rejected": rejected,
        "bytes_per_round": sum(per_round.values()),
        # what privacy costs, as `privnet overhead` defines it: peer-plane bytes per round
        "peer_bytes_per_round": (traffic.get("model", 0) + traffic.get("keys", 0)) / rounds,
        "bytes_per_round_by_category": per_round,
        "rounds_counted": rounds,  # what bytes, messages, wall and rounds/s cover
        "wall_s": wall,
        # where membership changed (a mark on the MSD plot): [round, why] per session
        "views": sorted({(v.start, v.reason) for r in results for v in r.views if v.start > 1}),
        # the centroid metrics' rounds: every K and the last (the agents' own: every round)
        "models_every": results[0].models_every if results else 1,
    }
    models = [res.models for res in results]
    rate = rounds / max(wall, 1e-9)
    told = [res.metrics for res in results]
    return curve_of(problem, strategy, scheme, models, rate, extra, told)


def model_frames(
    problem: Instance, traffic: dict[str, int], messages: dict[str, int], rounds: int
) -> dict[str, Any]:
    """What a model costs on the wire: its parameters and wire form, the model bytes and
    whole model frames (a chunked model counts once) per round, and their quotient: bytes
    a parameter a model frame (8.0x for f8, 4.0x for u4, the rest frame and MQTT headers)."""
    dim, code = problem.config.dim, problem.wire.code
    per_model = wire.chunk_count(dim, code) if wire.needs_chunks(dim, code) else 1
    frames = messages.get("model", 0) / per_model / max(rounds, 1)
    model_bytes = traffic.get("model", 0) / max(rounds, 1)
    return {
        "params": dim,
        "wire_dtype": str(problem.wire),
        "model_bytes_per_round": model_bytes,
        "model_frames_per_round": frames,
        "bytes_per_param_per_model_frame": model_bytes / frames / dim if frames else None,
    }


def results_curves(problem: Instance, results: list[SessionResult]) -> list[Curve]:
    """One Curve per strategy x scheme from a conductor's sessions, in `session_list` order."""
    c = problem.config
    curves, at = [], 0
    for strategy in c.strategies:
        for scheme in c.schemes:
            chunk = results[at : at + c.repeats]
            at += c.repeats
            curves.append(results_curve(problem, str(strategy), str(scheme), chunk))
    return curves


def replay(
    problem: Instance, membership: list[View], models: dict[str, np.ndarray] | None = None
) -> list[Curve]:
    """Every session of a run, applying its recorded membership views at their rounds (a
    faulty network run, reproduced in memory: same config and seed, same trajectories).
    `models` gets every session's models by its label."""
    plans = session_plans(problem, session_list(problem.config))
    network = Network.build(plans, script=membership, seal_links=problem.config.seal_links)
    results = network.play()
    if models is not None:
        models.update((r.label, r.models) for r in results)
    return results_curves(problem, results)

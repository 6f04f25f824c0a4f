"""`privnet run`: broker + agent processes + orchestrator, start to finish, nothing left behind."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiomqtt
import numpy as np
from rich.console import Console
from rich.progress import Progress, TaskID

from agent.spec import ConfigError
from broker.launcher import Broker, launch, read_sys_bytes
from orchestrator.cli import finish, progress_bar
from orchestrator.engines.launch import (
    AgentCommand,
    Launcher,
    LocalLauncher,
    RunFailed,
    agent_commands,
)
from orchestrator.engines.net import Orchestrator, SessionResult, new_run_name
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.problem import Problem, msd
from orchestrator.report import Curve

if TYPE_CHECKING:
    from agent.mqtt import BrokerAddress
    from orchestrator.audit import WireTap
    from orchestrator.engines.docker import DockerBroker, NicMeter

console = Console(stderr=True)


def curve_of(problem: Problem, strategy: str, scheme: str, results: list[SessionResult]) -> Curve:
    """MSD over repeats plus what the wire cost, from the sessions of one strategy x scheme."""
    c = problem.config
    cent = np.zeros((len(results), c.iters))
    avg = np.zeros((len(results), c.iters))
    for r, result in enumerate(results):
        for i in range(c.iters):
            cent[r, i], avg[r, i] = msd(result.models[i], problem.w_opt[r], problem.q)
    wall = sum(res.wall for res in results)
    traffic = _sum_dicts(res.totals("bytes") for res in results)
    messages = _sum_dicts(res.totals("messages") for res in results)
    rejected = _sum_dicts(res.totals("rejected") for res in results)
    rounds = c.iters * len(results)
    per_round = {k: v / rounds for k, v in traffic.items() if k != "control"}
    extra = {
        "bytes": traffic,
        "messages": messages,
        "rejected": rejected,
        "bytes_per_round": sum(per_round.values()),
        "bytes_per_round_by_category": per_round,
        "wall_s": wall,
    }
    return Curve(strategy, scheme, cent, avg, rounds / wall, extra)


def _sum_dicts(dicts) -> dict[str, int]:
    total: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            total[k] = total.get(k, 0) + v
    return total


@dataclass
class Runtime:
    """Where the broker and the agents run: this machine, or containers (--runtime docker)."""

    broker: Broker | DockerBroker
    launcher: Launcher | None  # None: external agents register by themselves
    meter: NicMeter | None = None  # NIC byte counts, where the agents have interfaces of their own
    agent_broker: BrokerAddress | None = None  # where agents reach the broker, if not .address


def _runtime(args: argparse.Namespace, run: str, logs: Path) -> Runtime:
    if args.runtime == "local":
        return Runtime(launch(args.broker), None if args.external_agents else LocalLauncher(logs))
    if args.broker != "auto" or args.external_agents:
        raise ConfigError(
            "--runtime docker starts its own broker and agent containers: "
            "drop --broker and --external-agents"
        )
    from orchestrator.engines.docker import DockerAgents, DockerBroker, NicMeter

    broker = DockerBroker(run, logs, image=args.image)
    return Runtime(broker, DockerAgents(broker), NicMeter(broker), broker.agent_address)


async def run_network(config: ExperimentConfig, args: argparse.Namespace, out: Path) -> int:
    previous = signal.getsignal(signal.SIGTERM)
    try:
        return await _run_network(config, args, out)
    finally:
        signal.signal(signal.SIGTERM, previous)  # _drive ignores SIGTERM once the run is done


async def _run_network(config: ExperimentConfig, args: argparse.Namespace, out: Path) -> int:
    problem = Problem.build(config)
    run = args.run_name or new_run_name()
    runtime = _runtime(args, run, out / "logs")
    broker, pool = runtime.broker, runtime.launcher
    try:
        broker.start()
        where = "external agents" if args.external_agents else f"agent logs in {out}/logs"
        console.print(f"broker: {broker.kind} at {broker.address}; run {run}; {where}")
        commands = agent_commands(runtime.agent_broker or broker.address, run, config.agents)
        tap = None
        if args.audit:
            from orchestrator.audit import WireTap  # scipy & co. only when auditing

            tap = WireTap(broker.address, run)
        return await _drive(problem, broker, run, pool, args, out, tap, commands, runtime.meter)
    except RunFailed as exc:
        console.print(f"[red]run failed:[/red] {exc}")
        return 1
    finally:
        if pool is not None:
            pool.stop()
        broker.stop()


async def _drive(
    problem: Problem,
    broker: Broker | DockerBroker,
    run: str,
    pool: Launcher | None,
    args: argparse.Namespace,
    out: Path,
    tap: WireTap | None = None,
    commands: Sequence[AgentCommand] = (),
    meter: NicMeter | None = None,
) -> int:
    """Register, run every session, write the outputs (and the audit), then dismiss the
    agents; the exit code.

    Outputs come before Bye: under `docker compose up --exit-code-from orchestrator` the
    first agent to exit stops every container and ends the log stream, and the operator
    must still see the results.
    """
    c = problem.config
    address = broker.address
    sys_before = await _sys(broker)
    async with aiomqtt.Client(address.host, address.port, max_inflight_messages=200) as client:
        orch = Orchestrator(
            client, run, c.agents, pool, deadline=args.deadline, telemetry=not args.no_telemetry
        )
        try:
            async with tap or contextlib.nullcontext():  # the audit's tap, before any agent
                await orch.subscribe()
                if pool is not None:
                    pool.start(commands)
                started = time.perf_counter()
                await orch.register()
                took = time.perf_counter() - started
                console.print(f"{c.agents} agents registered in {took:.1f} s")
                curves = await _sessions(problem, orch, tap, meter)
            # The run is complete. Under compose the first agent to leave stops every
            # container: a SIGTERM from here on must not cut the outputs short.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            extra: dict[str, Any] = {"broker": broker.kind, "run": run, "runtime": args.runtime}
            if sys_before is not None and (sys_after := await _sys(broker)) is not None:
                extra["broker_sys"] = {k: sys_after[k] - sys_before[k] for k in sys_after}
            # Off the loop, which keeps answering the broker's keepalives meanwhile: the
            # audit replays the whole run for its ground truth.
            code = await asyncio.to_thread(_outputs, out, problem, curves, extra, tap)
            await orch.bye()
        except BaseException as exc:  # Ctrl-C included: tell the agents before tearing down
            await orch.abort(f"orchestrator stopped: {type(exc).__name__}")
            raise
        finally:
            await orch.close()
    return code


def _outputs(
    out: Path, problem: Problem, curves: list[Curve], extra: dict[str, Any], tap: WireTap | None
) -> int:
    """Write the run's outputs, and audit its wire when it was tapped; the exit code."""
    finish(out, problem.config, problem, curves, "net", extra)
    if tap is None:
        return 0
    from orchestrator.audit import show_audit

    tap.save(out, problem.config)
    return show_audit(out)


async def _sessions(
    problem: Problem, orch: Orchestrator, tap: WireTap | None, meter: NicMeter | None = None
) -> list[Curve]:
    c = problem.config
    curves = []
    with progress_bar() as bar:
        for strategy in c.strategies:
            for scheme in c.schemes:
                task = bar.add_task(f"{strategy}/{scheme}", total=c.iters * c.repeats, status="")
                results = []
                for repeat in range(c.repeats):
                    show = partial(_show, bar, task, problem, repeat, time.perf_counter())
                    async with meter or contextlib.nullcontext():  # NIC bytes of the session
                        results.append(await orch.session(problem, strategy, scheme, repeat, show))
                    if tap is not None:  # the sealed telemetry validates the audit's truth
                        tap.telemetry.append(results[-1].models)
                curves.append(curve_of(problem, str(strategy), str(scheme), results))
                if meter is not None:
                    curves[-1].extra.update(meter.take(c.iters * c.repeats))
    return curves


def _show(
    bar: Progress,
    task: TaskID,
    problem: Problem,
    repeat: int,
    t0: float,
    rounds: int,
    models: np.ndarray,
) -> None:
    """Progress line: rounds done, rounds/s, current centroid MSD."""
    rate = rounds / max(time.perf_counter() - t0, 1e-9)
    status = f"{rate:6.1f} rounds/s"
    if rounds:
        cent, _ = msd(models[rounds - 1], problem.w_opt[repeat], problem.q)
        status += f"  MSD {10 * np.log10(cent):7.2f} dB"
    bar.update(task, completed=repeat * problem.config.iters + rounds, status=status)


async def _sys(broker: Broker | DockerBroker) -> dict[str, int] | None:
    if broker.kind != "mosquitto":
        return None
    with contextlib.suppress(TimeoutError, aiomqtt.MqttError):
        return await read_sys_bytes(broker.address)
    return None

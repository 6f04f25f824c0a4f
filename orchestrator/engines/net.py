"""The `net` engine, `privnet run`: a broker, agent processes and the conductor over MQTT.

The conductor (`orchestrator.conductor`) decides everything; this shell launches the
broker and the agents (here; with `--runtime docker` in containers; with `--runtime swarm`
as services of a Docker Swarm), hands each agent its launch out of band (its id, the run's
orchestrator key, its token, its broker credentials), pumps MQTT into the conductor,
watches the agents, shows progress and writes the outputs. Whatever it started it stops: on
success, on failure and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import aiomqtt
import numpy as np
from rich.progress import Progress, TaskID

from agent.access import BrokerAddress, ClientAccess
from agent.driver import Machine, publish, pump
from agent.launch import AgentLaunch
from agent.private import private_dir, private_file
from agent.protocol import QOS, Event, Output
from agent.spec import ConfigError
from agent.transport import Connection, CouldNotConnect, MqttError, client
from broker.bridge import CoreBroker
from broker.credentials import INSPECTOR, ORCHESTRATOR, Credentials, write_private
from broker.launcher import Broker, launch, read_sys_bytes, write_compose_files
from orchestrator.conductor import (
    Conductor,
    Resume,
    SessionResult,
    Stage,
    View,
    add_counts,
    describe,
)
from orchestrator.engines import journal, memory, swarm
from orchestrator.engines.docker import ContainerBroker, DockerAgents, DockerBroker, nic_window
from orchestrator.engines.launch import Launcher, LocalLauncher
from orchestrator.engines.lifetime import RunSecrets, Stop
from orchestrator.engines.watch import POLL, Watch, write_membership
from orchestrator.experiment.problem import Problem, msd
from orchestrator.experiment.specs import session_list, session_plans
from orchestrator.faults import parse_faults
from orchestrator.report import finish, load_plotting
from orchestrator.results import Curve, RunFailed
from orchestrator.terminal import console, progress_bar

if TYPE_CHECKING:
    from orchestrator.audit import WireTap
    from orchestrator.view.live import LiveView

T = TypeVar("T")
DEFAULT_DEADLINE = 30.0  # s of silence before an agent is left out (--deadline)
DEADLINE_PER_AGENT = 0.12  # s: a 1000-agent network on 2 cores needs 120 s (keying, heartbeats)


def default_deadline(agents: int) -> float:
    """--deadline when not given: 30 s, longer for networks large enough that 30 s does not
    cover their keying and heartbeats on one machine (1000 agents: 120 s)."""
    return max(DEFAULT_DEADLINE, DEADLINE_PER_AGENT * agents)


def new_run_name() -> str:
    return f"run-{secrets.token_hex(4)}"


def write_launches(directory: Path, launches: dict[int, AgentLaunch]) -> None:
    """Launch files for agents started by someone else (compose): 0600, one per agent.
    Whatever an earlier run left there (files, claims) goes first."""
    private_dir(directory)
    for stale in [*directory.glob("agent-*.json"), *directory.glob("agent-*.claimed")]:
        stale.unlink()
    for p, agent_launch in launches.items():
        write_private(directory / f"agent-{p}.json", agent_launch.to_json())


def prepare(
    out: Path,
    agents: int,
    run: str,
    *,
    broker: str = "broker:1883",
    tls_hostnames: tuple[str, ...] | None = None,
    mount: Path = Path("/privnet"),
    broker_uid: int | None = None,
    client_uid: int | None = None,
    stack: bool = False,
) -> RunSecrets:
    """A run's secrets as files, for agents and a broker someone else starts (compose):
    the broker's files (`write_compose_files`), `run.json` for the orchestrator and one
    launch file per agent in `agents/` (claimed with `python -m agent --claim`); with
    `stack`, for docker-stack.yml, instead every launch in `launches.json`, in id order (one
    Docker secret: each agent replica takes its own with `python -m agent --slot`)."""
    run_secrets = RunSecrets.generate(run, agents)
    write_compose_files(
        out,
        run_secrets.credentials,
        tls_hostnames=tls_hostnames,
        mount=mount,
        broker_uid=broker_uid,
        client_uid=client_uid,
        port=BrokerAddress.parse(broker).port,
    )
    ca = str(mount / "ca.crt") if tls_hostnames is not None else None

    def access(user: str) -> ClientAccess:
        return run_secrets.credentials.access(user, tls=ca is not None, ca_file=ca)

    write_private(out / "run.json", run_secrets.to_json())
    launches = run_secrets.launches(broker, access)
    if stack:
        ordered = [launches[p] for p in sorted(launches)]
        write_private(out / "launches.json", AgentLaunch.group_json(ordered))
    else:
        write_launches(out / "agents", launches)
    for p in run_secrets.tokens:  # an agent's password travels only in its launch file
        (out / "users" / f"{p}.env").unlink(missing_ok=True)
    if client_uid is not None:
        theirs = [out / "launches.json"] if stack else [out / "agents", *(out / "agents").iterdir()]
        for path in [out / "run.json", *theirs]:
            os.chown(path, client_uid, client_uid)
    return run_secrets


STOP_GRACE = 0.3  # s for agents told Abort to leave by themselves, after a stop signal


async def run_network(problem: Problem, args: argparse.Namespace, out: Path) -> int:
    """`privnet run`; its exit code (128 + the signal when SIGINT or SIGTERM stopped it)."""
    task = asyncio.current_task()
    assert task is not None
    stop = Stop(task)
    try:
        return await _run_network(problem, args, out, stop)
    except asyncio.CancelledError:
        if not stop.stopping:
            raise
        assert stop.signum is not None
        name = signal.Signals(stop.signum).name
        console.print(
            f"[yellow]interrupted ({name}); everything started was stopped. {out}/metrics.csv "
            f"holds every round completed; `privnet run --resume {out}` goes on[/yellow]"
        )
        return 128 + stop.signum
    finally:
        stop.close()


async def _settled(job: asyncio.Future[T], hurry: Callable[[], None]) -> T:
    """A job in a thread. If the run is stopped meanwhile, `hurry` it to its end and wait
    for that (it may start what the teardown must then stop), then stop. What `hurry` or the
    job raise then is the teardown's to meet again."""
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            hurry()
        await asyncio.wait([job])
        raise


async def _run_network(problem: Problem, args: argparse.Namespace, out: Path, stop: Stop) -> int:
    began = time.perf_counter()
    config = problem.config
    resume: Resume | None = None
    done: list[SessionResult] = []
    if args.resume is not None:
        secrets_json, done, index, got = journal.load(out)
        run_secrets = RunSecrets.from_json(secrets_json, str(out / journal.JOURNAL / "run.json"))
        resume = journal.resume_point(problem.config, index, got)
        console.print(f"resuming {run_secrets.run}: {index} sessions done, going on with the next")
    elif args.prepared is not None:
        run_secrets = RunSecrets.from_json(args.prepared.read_text(), str(args.prepared))
        if run_secrets.credentials.agents != config.agents:
            raise ConfigError(
                f"{args.prepared} is for {run_secrets.credentials.agents} agents, the run has "
                f"{config.agents}: prepare it again with --agents {config.agents}"
            )
    else:
        run_secrets = RunSecrets.generate(args.run_name or new_run_name(), config.agents)
    run = run_secrets.run
    faults = parse_faults(args.faults or "", config.agents)
    broker: Broker | ContainerBroker
    pool: Launcher | None
    if getattr(args, "hosts", None) is not None:  # across hosts: the agents run there
        from orchestrator import sites  # only across hosts: a local run's start-up skips it

        sites.check_run_flags(args, faults)
        broker, pool = sites.core_broker(args.hosts, args.prepared, run_secrets), None
    else:
        broker, pool = _runtime(args, run_secrets.credentials, out / "logs")
    docker = broker if isinstance(broker, ContainerBroker) else None
    code = 1
    try:
        if resume is None:
            journal.begin(out, config, run_secrets.to_json(), args.secret_seed)
        await _start(broker)
        conductor = Conductor(
            run,
            run_secrets.orchestrator,
            run_secrets.tokens,
            session_plans(problem, session_list(config)),
            deadline=args.deadline or default_deadline(config.agents),
            telemetry=not args.no_telemetry,
            checkpoint_every=args.checkpoint_every,
            resume=resume,
            seal_links=config.seal_links,
            escrow=bool(args.audit),
        )
        conductor.results = done
        reach = docker.agent_address if docker is not None else broker.address
        launches = run_secrets.launches(str(reach), broker.access)
        if pool is not None and args.checkpoint_every:
            kept = str(out / "checkpoints") if docker is None else None
            again = resume is not None  # come back from their checkpoints
            launches = {p: replace(a, checkpoints=kept, rejoin=again) for p, a in launches.items()}
        if args.external_agents and args.prepared is None:
            write_launches(args.launch_dir or out / "launch", launches)
        tap = None
        if args.audit:
            from orchestrator.audit import WireTap  # scipy & co. only when auditing

            tap = WireTap(broker.address, run, broker.access(INSPECTOR))
        neighbour = args.neighbour if args.account else None  # --account
        restart = args.restart == "on-failure"
        watch = Watch(conductor, pool, broker, launches, problem, out, faults, restart)
        view = await _view(args, watch, problem, out, tap, neighbour)
        try:
            code = await _drive(problem, broker, watch, out, began, stop, tap, neighbour, view)
            return code
        finally:
            if view is not None:
                await view.close()
    except RunFailed as exc:
        console.print(f"[red]run failed:[/red] {exc}")
        return 1
    except CouldNotConnect as exc:
        if broker.kind == "external":  # the address the user gave
            raise ConfigError(f"{exc}: give --broker the HOST:PORT of an MQTT broker") from None
        console.print(f"[red]run failed:[/red] {exc}")
        return 1
    except (MqttError, aiomqtt.MqttError) as exc:  # ours, or the tap's and $SYS reader's
        hint = (
            "; a broker someone else runs needs this run's users: write them with "
            "`privnet prepare` and pass --prepared"
            if broker.kind == "external"
            else ""
        )
        said = exc if isinstance(exc, MqttError) else f"the broker at {broker.address}: {exc}"
        console.print(f"[red]run failed:[/red] {said}{hint}")  # ours name the broker
        return 1
    finally:
        if pool is not None:
            pool.stop(STOP_GRACE if stop.stopping else None)
        broker.stop()
        if code != 0 and resume is None:  # nothing to resume from: no journal
            journal.discard_if_empty(out)


async def _start(broker: Broker | ContainerBroker) -> None:
    """Start the broker (an external one: check it answers). matplotlib loads meanwhile
    (and the agents' zygote imports), in a thread that nothing waits for: the event loop
    stays free to hear a stop."""
    threading.Thread(target=load_plotting, name="load-plotting", daemon=True).start()
    starting = asyncio.get_running_loop().run_in_executor(None, broker.start)
    try:
        await _settled(starting, broker.stop)
    except ConnectionError as exc:  # an external broker not there: the user's address
        raise ConfigError(str(exc)) from None


async def _view(
    args: argparse.Namespace,
    watch: Watch,
    problem: Problem,
    out: Path,
    tap: WireTap | None,
    neighbour: int | None,
) -> LiveView | None:
    """With --view, the page of this run, served from this event loop (its URL printed)."""
    if not getattr(args, "view", False):
        return None
    from orchestrator.view.live import LiveView  # aiohttp: only when watched

    view = LiveView(watch, problem, out, neighbour=neighbour, tap=tap)
    url = await view.start(args.view_host, args.view_port)  # ConfigError: cannot listen
    console.print(f"view: {url}", soft_wrap=True)
    return view


def _runtime(
    args: argparse.Namespace, credentials: Credentials, logs: Path
) -> tuple[Broker | ContainerBroker, Launcher | None]:
    """The broker, and the launcher of the agents (None: external agents register by
    themselves): on this machine, in containers (--runtime docker) or as services of a swarm
    (--runtime swarm); the flags they cannot honour are refused before (`orchestrator.cli`)."""
    if args.runtime == "local":
        local = launch(args.broker, credentials=credentials, tls=args.tls, ca_file=args.ca_file)
        return local, None if args.external_agents else LocalLauncher(
            logs, per_process=getattr(args, "agents_per_process", 1)
        )
    if args.runtime == "swarm":
        return swarm.runtime(credentials, logs, args.image, args.faults)
    broker = DockerBroker(credentials, logs, image=args.image)
    return broker, DockerAgents(broker)


async def _drive(
    problem: Problem,
    broker: Broker | ContainerBroker,
    watch: Watch,
    out: Path,
    began: float,
    stop: Stop,
    tap: WireTap | None = None,
    neighbour: int | None = None,
    view: LiveView | None = None,
) -> int:
    """Register, run every session, write the outputs (privacy accounted with `neighbour`,
    and the audit) and dismiss the agents; the exit code. `began`: when the run began, which
    the console's set-up times count from. A `view` watches the pump.

    Agent processes this run started here are dismissed first: they leave while the outputs
    are written. Other agents get their Bye after the outputs (under `docker compose up
    --exit-code-from orchestrator` the first agent to exit stops every container and ends
    the log stream, and the operator must still see the results).
    """
    c = problem.config
    conductor, pool = watch.conductor, watch.pool
    docker = broker if isinstance(broker, DockerBroker) else None  # NIC counters: one engine
    nic_before = await asyncio.to_thread(docker.nic) if docker is not None else None
    # A broker restart is ridden out as the agents ride it out (`agent.transport.Connection`): for
    # as long as the conductor would wait for a silent session anyway, at least 10 s.
    give_up = max(conductor.deadline, 10.0)
    access = broker.access(ORCHESTRATOR)
    async with client(broker.address, access, give_up, connect_timeout=conductor.deadline) as mqtt:
        where = "external agents" if pool is None else f"agent logs in {out}/logs"
        if isinstance(broker, CoreBroker):
            where = "agents on " + ", ".join(f"{b.host} ({len(b.agents)})" for b in broker.bridges)
        took = time.perf_counter() - began
        console.print(
            f"broker: {broker.kind} at {broker.address}, connected at {took:.1f} s; "
            f"run {conductor.run}; {where}"
        )
        try:
            async with tap or contextlib.nullcontext():  # the audit's tap, before any agent
                for topic in conductor.subscriptions:
                    await mqtt.subscribe(topic, qos=QOS)
                publish(mqtt, conductor.start(time.monotonic()))
                if isinstance(pool, LocalLauncher):
                    await pool.zygote.started()  # its imports: spawns are quick from then on
                if pool is not None:
                    pool.start(watch.launches)
                await _conduct(mqtt, watch, problem, view.machine() if view else watch, began)
                stop.finishing = True  # complete: a signal from here on waits for the outputs
                write_membership(out / "membership.json", conductor.membership)
                if tap is not None:  # the sealed telemetry validates the audit's truth
                    tap.telemetry += [r.models for r in conductor.results]
                    tap.link_keys = conductor.link_keys  # to open the sealed frames
            extra: dict[str, Any] = {
                "broker": broker.kind,
                "runtime": _runtime_name(broker),
                "run": conductor.run,
                "seed": journal.SECRETS if journal.secret_seed(out) else c.seed,
                "orchestrator": _orchestrator(conductor),
                "broker_outages": asdict(mqtt.outages),  # as the orchestrator lived them
                "membership": _membership(watch),
            }
            # $SYS and NIC counters over the same window: from before the agents start to
            # the last session's end (registration and every session's setup included).
            # The run started its mosquitto, whose counters start at zero with it and count
            # nothing before the orchestrator connects (nothing to read first, so no wait for
            # a $SYS tick). A restarted broker counts from zero again: its window is void then.
            restarted = mqtt.outages.losses > 0
            if not restarted:
                extra |= await _sys(broker)
            if docker is not None and nic_before is not None:
                rounds = sum(plan.rounds for plan in conductor.plans)
                nic_after = await asyncio.to_thread(docker.nic)
                extra["nic"] = nic_window(docker, nic_before, nic_after, rounds)
            if isinstance(pool, swarm.SwarmAgents):  # which node ran what
                extra["swarm"] = await asyncio.to_thread(pool.placement)
            ours = isinstance(pool, LocalLauncher)  # processes here; containers as before
            if ours:
                publish(mqtt, conductor.bye())
            # After the Bye: nothing beats any more, and a session whose membership changed
            # is replayed here (its MSD per round), which outlasts a short --deadline.
            curves = await asyncio.to_thread(memory.results_curves, problem, conductor.results)
            save_models(out / "models.npz", conductor.results)
            # Off the loop, which keeps answering the broker's keepalives meanwhile: the
            # audit replays the whole run for its ground truth.
            accounts = view.account if view is not None else None  # its twin runs, if done
            code = await asyncio.to_thread(
                _outputs,
                out,
                problem,
                curves,
                extra,
                tap,
                neighbour,
                accounts,
                conductor.membership,
            )
            if not ours:
                publish(mqtt, conductor.bye())
        except BaseException as exc:  # a stop signal included: tell the agents first
            why = str(exc) if isinstance(exc, asyncio.CancelledError) else type(exc).__name__
            with contextlib.suppress(MqttError):
                publish(mqtt, conductor.abort(f"orchestrator stopped: {why}"))
            raise
    return code


async def _conduct(
    mqtt: Connection, watch: Watch, problem: Problem, machine: Machine, began: float
) -> None:
    """Pump `machine` (the watch, or a view's lookout on it) until every session is done;
    RunFailed when the conductor fails. `began`: when the run began (perf_counter), which
    the set-up times on the console count from."""
    conductor = watch.conductor
    with progress_bar() as bar:
        show = _Show(bar, problem, watch)

        def until() -> bool:
            return conductor.stage in (Stage.DONE, Stage.FAILED)

        def on_output(out: Output) -> None:
            for event in out.events:
                if event.kind == "registered":
                    took = time.perf_counter() - began
                    console.print(f"{conductor.agents} agents registered at {took:.1f} s")
                show.event(event)
            show.update()

        try:
            await pump(mqtt, machine, until, on_output, every=POLL)
        except RunFailed as exc:
            publish(mqtt, conductor.abort(str(exc)))
            raise
        finally:
            show.settle()
    if conductor.stage is Stage.FAILED:
        raise RunFailed(conductor.failure)


def _orchestrator(conductor: Conductor) -> dict[str, Any]:
    """What the orchestrator received and did not use, by reason (agents report theirs in
    each result's `rejected`), and what it published before Bye."""
    d = conductor.deliveries
    return {
        "received": d.received,
        "used": d.used,
        "rejected": dict(d.rejected),
        "published_bytes": conductor.traffic.bytes["control"],
        "published_messages": conductor.traffic.messages["control"],
        "deliveries_of_published": conductor.recipients,
        # what agents dropped after their last Finished, reported when they left
        "agents_rejected_after_finish": add_counts(conductor.left.values()),
        "agents_not_left": sorted(set(range(conductor.agents)) - conductor.left.keys()),
        "agents_left_bytes": conductor.left_traffic.bytes["control"],
        "agents_left_messages": conductor.left_traffic.messages["control"],
    }


def save_models(path: Path, results: list[SessionResult]) -> None:
    """Every agent's true model after every round, per session (NaN: not reported): what a
    replay (`privnet simulate --membership`) is checked against. 0600: true models."""
    with private_file(path) as fh:
        arrays: dict[str, Any] = {r.label: r.models for r in results}
        np.savez_compressed(fh, **arrays)


def _membership(watch: Watch) -> dict[str, Any]:
    """Views, rounds each agent missed per session, restarts and faults: for summary.json."""
    conductor = watch.conductor
    return {
        "views": len(conductor.membership),
        "changes": [describe(v) for v in conductor.membership if v.view > 0],
        "pauses": conductor.pauses,  # per change: rounds redone, seconds the network stood
        "missed_rounds": {r.label: r.missed for r in conductor.results if r.missed},
        "restarts": watch.restarts,
        "faults": watch.injected,
    }


class _Show:
    """Progress lines, one per strategy/scheme: rounds done, rounds/s, the current centroid
    MSD, and the seconds its sessions spent being set up (Setup to Go: the agents building
    their data and agreeing keys; a new view's re-keying too). A session's line ends as the
    session did (`settle`), so a log shows final lines, not the last refresh."""

    def __init__(self, bar: Progress, problem: Problem, watch: Watch) -> None:
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
            name, _ = _progress_line(event.detail)
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
        name, repeat = _progress_line(plan.label)
        rate = (rounds - self.first) / max(time.perf_counter() - self.t0, 1e-9)
        rate = 0.0 if self.began is not None else rate
        cent = None
        if shown:  # the rows Watch streamed: complete, never redone
            cent = msd(conductor.models[shown - 1], self.problem.w_opt[repeat], self.problem.q)[0]
        self._show(name, repeat * c.iters + rounds, rate, cent)

    def settle(self) -> None:
        """Every session done since: its line at all its rounds, its rate (the rounds it
        ran, over Go to the last Finished) and its last centroid MSD."""
        results, c = self.watch.conductor.results, self.problem.config
        for result in results[self.settled :]:
            name, repeat = _progress_line(result.label)
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


def _progress_line(label: str) -> tuple[str, int]:
    """A session label `strategy/scheme/repeat` as its progress line and repeat."""
    name, repeat = label.rsplit("/", 1)
    return name, int(repeat)


def _outputs(
    out: Path,
    problem: Problem,
    curves: list[Curve],
    extra: dict[str, Any],
    tap: WireTap | None,
    neighbour: int | None = None,
    account_of: Callable[..., Any] | None = None,
    membership: Sequence[View] = (),
) -> int:
    """Write the run's outputs (privacy accounted with `neighbour`, by `account_of` where
    given, under the run's `membership` with the tapped wire's reach of each view), and
    audit its wire when it was tapped; the exit code."""
    changed = any(view.view for view in membership)
    reach = None
    if tap is not None:
        tap.save(out, problem.config)
        if changed and neighbour is not None:
            from orchestrator.audit import reach_of

            reach = reach_of(tap.records, tap.run, problem.config.dim)
    views = membership if changed else None
    c = problem.config
    code = finish(out, c, problem, curves, "net", extra, neighbour, views, reach, account_of)
    if tap is None:
        return code
    from orchestrator.audit import show_audit

    return max(code, show_audit(out))


async def _sys(broker: Broker | ContainerBroker) -> dict[str, Any]:
    """summary.json's `broker_sys`: mosquitto's $SYS counters, read as the inspector (the
    orchestrator's own connection is still up, and a second one of its user would displace
    it; the audit's tap, the other inspector, has closed). Across hosts, every broker's."""
    if isinstance(broker, CoreBroker):
        from orchestrator import sites  # only across hosts

        return await sites.counters(broker)
    if broker.kind != "mosquitto":
        return {}
    with contextlib.suppress(TimeoutError, aiomqtt.MqttError):
        return {"broker_sys": await read_sys_bytes(broker.address, access=broker.access(INSPECTOR))}
    return {}


def _runtime_name(broker: Broker | ContainerBroker) -> str:
    if isinstance(broker, ContainerBroker):
        return broker.runtime  # docker or swarm
    return "sites" if isinstance(broker, CoreBroker) else "local"

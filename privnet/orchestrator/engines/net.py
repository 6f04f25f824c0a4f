"""The `net` engine, `privnet run`: a broker, agent processes and the conductor over MQTT.

The conductor (`privnet.orchestrator.conductor`) decides everything; this shell launches the
broker and the agents (here; with `--runtime docker` in containers; with `--runtime swarm`
as services of a Docker Swarm), hands each agent its launch out of band (its id, the run's
orchestrator key, its token, its broker credentials), pumps MQTT into the conductor,
watches the agents, shows progress and writes the outputs. Whatever it started it stops: on
success, on failure and on Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import aiomqtt
import numpy as np

from privnet.agent.driver import Machine, publish, pump
from privnet.agent.loop import beside
from privnet.agent.private import private_file
from privnet.agent.protocol import QOS, Output
from privnet.agent.spec import ConfigError
from privnet.agent.transport import Connection, CouldNotConnect, MqttError, client
from privnet.broker.bridge import CoreBroker
from privnet.broker.credentials import INSPECTOR, ORCHESTRATOR
from privnet.broker.launcher import Broker, launch, read_sys_bytes
from privnet.orchestrator.conductor import (
    Conductor,
    Resume,
    SessionResult,
    Stage,
    View,
    add_counts,
    describe,
)
from privnet.orchestrator.curves import ROUNDS_SUFFIX, Curve, model_rounds
from privnet.orchestrator.engines import journal, memory, swarm
from privnet.orchestrator.engines.docker import (
    ContainerBroker,
    DockerAgents,
    DockerBroker,
    nic_window,
)
from privnet.orchestrator.engines.launch import Launcher, LocalLauncher
from privnet.orchestrator.engines.lifetime import RunSecrets, Stop
from privnet.orchestrator.engines.options import Restart, RunOptions, Runtime
from privnet.orchestrator.engines.prepare import write_launches
from privnet.orchestrator.engines.progress import ProgressLines
from privnet.orchestrator.engines.shell import WatchShell
from privnet.orchestrator.engines.watch import POLL, Watch, write_membership
from privnet.orchestrator.errors import RunFailed
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_list, session_plans
from privnet.orchestrator.faults import Fault
from privnet.orchestrator.report import finish, load_plotting
from privnet.orchestrator.terminal import console, progress_bar

if TYPE_CHECKING:
    from privnet.orchestrator.audit import WireTap
    from privnet.orchestrator.view.live import LiveView

T = TypeVar("T")
DEFAULT_DEADLINE = 30.0  # s of silence before an agent is left out (--deadline)
DEADLINE_PER_AGENT = 0.12  # s: a 1000-agent network on 2 cores needs 120 s (keying, heartbeats)


def default_deadline(agents: int) -> float:
    """--deadline when not given: 30 s, longer for networks large enough that 30 s does not
    cover their keying and heartbeats on one machine (1000 agents: 120 s)."""
    return max(DEFAULT_DEADLINE, DEADLINE_PER_AGENT * agents)


def new_run_name() -> str:
    return f"run-{secrets.token_hex(4)}"


STOP_GRACE = 0.3  # s for agents told Abort to leave by themselves, after a stop signal


async def run_network(problem: Instance, options: RunOptions, out: Path) -> int:
    """`privnet run`; its exit code (128 + the signal when SIGINT or SIGTERM stopped it)."""
    task = asyncio.current_task()
    assert task is not None
    stop = Stop(task)
    try:
        return await _run_network(problem, options, out, stop)
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


@dataclass(frozen=True)
class _Origin:
    """Where a run starts from: its secrets (fresh, `privnet prepare`'s, or a journal's) and,
    resumed, the point to go on from and the sessions already done."""

    secrets: RunSecrets
    resume: Resume | None = None
    done: list[SessionResult] = field(default_factory=list)


@dataclass(frozen=True)
class _Run:
    """What a run's steps share once its broker is up. `began`: when the run began
    (perf_counter), which the console's set-up times count from; `neighbour`: privacy
    accounted for this agent's data; a `view` watches the pump."""

    problem: Instance
    broker: Broker | ContainerBroker
    shell: WatchShell
    out: Path
    began: float
    stop: Stop
    tap: WireTap | None = None
    neighbour: int | None = None
    view: LiveView | None = None


async def _run_network(problem: Instance, options: RunOptions, out: Path, stop: Stop) -> int:
    began = time.perf_counter()
    origin = _origin(problem, options, out)
    faults = options.faults_for(problem.config.agents)
    broker, pool = _runtime(options, faults, origin.secrets, out / "logs")
    if isinstance(pool, LocalLauncher):
        pool.preload(problem.plugin)
    code, shell = 1, None
    try:
        if origin.resume is None:
            journal.begin(out, problem.config, origin.secrets.to_json(), options.secret_seed)
        await _start(broker)
        shell = WatchShell(
            _watch(problem, options, out, origin, broker, pool, faults), pool, broker, out
        )
        code = await _watched(problem, options, shell, out, began, stop)
        return code
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
        if shell is not None:
            shell.close()  # the insiders of --faults flap
        if pool is not None:
            pool.stop(STOP_GRACE if stop.stopping else None)
        broker.stop()
        if code != 0 and origin.resume is None:  # nothing to resume from: no journal
            journal.discard_if_empty(out)


def _origin(problem: Instance, options: RunOptions, out: Path) -> _Origin:
    """The run's secrets: from its journal (--resume), from `privnet prepare` (--prepared,
    for as many agents as the run has), or new."""
    config = problem.config
    if options.resume is not None:
        secrets_json, done, index, got = journal.load(out)
        run_secrets = RunSecrets.from_json(secrets_json, str(out / journal.JOURNAL / "run.json"))
        resume = journal.resume_point(config, index, got)
        console.print(f"resuming {run_secrets.run}: {index} sessions done, going on with the next")
        return _Origin(run_secrets, resume, done)
    if options.prepared is not None:
        run_secrets = RunSecrets.from_json(options.prepared.read_text(), str(options.prepared))
        if run_secrets.credentials.agents != config.agents:
            raise ConfigError(
                f"{options.prepared} is for {run_secrets.credentials.agents} agents, the run "
                f"has {config.agents}: prepare it again with --agents {config.agents}"
            )
        return _Origin(run_secrets)
    return _Origin(RunSecrets.generate(options.run_name or new_run_name(), config.agents))


def _watch(
    problem: Instance,
    options: RunOptions,
    out: Path,
    origin: _Origin,
    broker: Broker | ContainerBroker,
    pool: Launcher | None,
    faults: list[Fault],
) -> Watch:
    """The conductor of the run, and the watch over it with the agents' launches (written
    out for external agents; with checkpoints where this run keeps them)."""
    config, run_secrets = problem.config, origin.secrets
    conductor = Conductor(
        run_secrets.run,
        run_secrets.orchestrator,
        run_secrets.tokens,
        session_plans(problem, session_list(config)),
        deadline=options.deadline or default_deadline(config.agents),
        telemetry=options.telemetry,
        models_every=options.models_every,
        checkpoint_every=options.checkpoint_every,
        resume=origin.resume,
        seal_links=config.seal_links,
        escrow=options.audit,
    )
    conductor.results = origin.done
    docker = broker if isinstance(broker, ContainerBroker) else None
    reach = docker.agent_address if docker is not None else broker.address
    launches = run_secrets.launches(str(reach), broker.access)
    if pool is not None and options.checkpoint_every:
        kept = str(out / "checkpoints") if docker is None else None
        again = origin.resume is not None  # come back from their checkpoints
        launches = {p: replace(a, checkpoints=kept, rejoin=again) for p, a in launches.items()}
    if options.external_agents and options.prepared is None:
        write_launches(options.launch_dir or out / "launch", launches)
    restart = options.restart is Restart.ON_FAILURE
    return Watch(conductor, launches, problem, faults, restart)


async def _watched(
    problem: Instance, options: RunOptions, shell: WatchShell, out: Path, began: float, stop: Stop
) -> int:
    """The run driven, tapped with --audit and watched in a page with --view (its sampler
    beside the run); the exit code."""
    tap = None
    broker = shell.broker
    if options.audit:
        from privnet.orchestrator.audit import WireTap, sample  # scipy & co. only when auditing

        drawn = sample.draw(problem.config.dim, problem.wire.code, options.audit_sample)
        tap = WireTap(broker.address, shell.watch.conductor.run, broker.access(INSPECTOR), drawn)
    view = await _view(options, shell, problem, out, tap)
    run = _Run(problem, broker, shell, out, began, stop, tap, options.neighbour, view)
    if view is None:
        return await _drive(run)
    try:
        return await beside(_drive(run), view.sampling())
    finally:
        await view.close()


async def _start(broker: Broker | ContainerBroker) -> None:
    """Start the broker (an external one: check it answers). matplotlib loads meanwhile (and
    the zygote imports), in a thread nothing waits for: the event loop stays free to hear a stop."""
    threading.Thread(target=load_plotting, name="load-plotting", daemon=True).start()
    starting = asyncio.get_running_loop().run_in_executor(None, broker.start)
    try:
        await _settled(starting, broker.stop)
    except ConnectionError as exc:  # an external broker not there: the user's address
        raise ConfigError(str(exc)) from None


async def _view(
    options: RunOptions, shell: WatchShell, problem: Instance, out: Path, tap: WireTap | None
) -> LiveView | None:
    """With --view, the page of this run, served from this event loop (its URL printed)."""
    if not options.view:
        return None
    from privnet.orchestrator.view.live import LiveView  # aiohttp: only when watched

    view = LiveView(shell, problem, out, neighbour=options.neighbour, tap=tap)
    url = await view.start(options.view_host, options.view_port)  # ConfigError: cannot listen
    console.print(f"view: {url}", soft_wrap=True)
    return view


def _runtime(
    options: RunOptions, faults: list[Fault], run_secrets: RunSecrets, logs: Path
) -> tuple[Broker | ContainerBroker, Launcher | None]:
    """The broker, and the launcher of the agents (None: external agents register by
    themselves, or agents across hosts run there): on this machine, in containers (--runtime
    docker), as services of a swarm (--runtime swarm) or across hosts (--hosts); the flags
    they cannot honour are refused before, by `RunOptions`)."""
    credentials = run_secrets.credentials
    if options.hosts is not None:  # across hosts: the agents run there
        from privnet.orchestrator import sites  # only across hosts: a local run's start-up skips it

        assert options.prepared is not None  # RunOptions refuses --hosts without it
        return sites.core_broker(options.hosts, options.prepared, run_secrets), None
    if options.runtime is Runtime.LOCAL:
        local = launch(
            options.broker, credentials=credentials, tls=options.tls, ca_file=options.ca_file
        )
        return local, None if options.external_agents else LocalLauncher(
            logs, per_process=options.agents_per_process
        )
    if options.runtime is Runtime.SWARM:
        return swarm.runtime(credentials, logs, options.image, options.faults)
    broker = DockerBroker(credentials, logs, image=options.image)
    return broker, DockerAgents(broker)


async def _drive(run: _Run) -> int:
    """Register, run every session, write the outputs (privacy accounted, and the audit) and
    dismiss the agents; the exit code.

    Agent processes this run started here are dismissed first: they leave while the outputs
    are written. Other agents get their Bye after the outputs (under `docker compose up
    --exit-code-from orchestrator` the first agent to exit stops every container and ends
    the log stream, and the operator must still see the results).
    """
    broker, conductor = run.broker, run.shell.watch.conductor
    docker = broker if isinstance(broker, DockerBroker) else None  # NIC counters: one engine
    nic_before = await asyncio.to_thread(docker.nic) if docker is not None else None
    # A broker restart is ridden out as the agents ride it out
    # (`privnet.agent.transport.Connection`): for as long as the conductor would wait for a silent
    # session anyway, at least 10 s.
    give_up = max(conductor.deadline, 10.0)
    access = broker.access(ORCHESTRATOR)
    async with client(broker.address, access, give_up, connect_timeout=conductor.deadline) as mqtt:
        _connected(run)
        try:
            await _sessions(run, mqtt)
            extra = await _extra(run, mqtt, nic_before)
            ours = isinstance(run.shell.pool, LocalLauncher)  # processes here; containers as before
            if ours:
                publish(mqtt, conductor.bye())
            code = await _written(run, extra)
            if not ours:
                publish(mqtt, conductor.bye())
        except BaseException as exc:  # a stop signal included: tell the agents first
            why = str(exc) if isinstance(exc, asyncio.CancelledError) else type(exc).__name__
            with contextlib.suppress(MqttError):
                publish(mqtt, conductor.abort(f"orchestrator stopped: {why}"))
            raise
    return code


def _connected(run: _Run) -> None:
    """The console's line once the orchestrator is connected: the broker, the run, where
    the agents are."""
    broker, pool, conductor = run.broker, run.shell.pool, run.shell.watch.conductor
    where = "external agents" if pool is None else f"agent logs in {run.out}/logs"
    if isinstance(broker, CoreBroker):
        where = "agents on " + ", ".join(f"{b.host} ({len(b.agents)})" for b in broker.bridges)
    took = time.perf_counter() - run.began
    console.print(
        f"broker: {broker.kind} at {broker.address}, connected at {took:.1f} s; "
        f"run {conductor.run}; {where}"
    )


async def _sessions(run: _Run, mqtt: Connection) -> None:
    """Subscribe, start the conductor and the agents, and pump every session to its end;
    then the membership is written and the audit's tap given what checks it."""
    shell, conductor, tap = run.shell, run.shell.watch.conductor, run.tap
    async with tap or contextlib.nullcontext():  # the audit's tap, before any agent
        for topic in conductor.subscriptions:
            await mqtt.subscribe(topic, qos=QOS)
        publish(mqtt, conductor.start(time.monotonic()))
        if isinstance(shell.pool, LocalLauncher):
            await shell.pool.zygote.started()  # its imports: spawns are quick from then on
        if shell.pool is not None:
            shell.pool.start(shell.watch.launches)
        # w^o, which metrics.csv's first row needs: solved while the agents start and key,
        # not in the rounds (1.3 s of the orchestrator at 1000 agents)
        run.problem.w_opt  # noqa: B018
        await _conduct(mqtt, shell, run.problem, run.view, run.began)
        run.stop.finishing = True  # complete: a signal from here on waits for the outputs
        write_membership(run.out / "membership.json", conductor.membership.views)
        if tap is not None:  # the sealed telemetry validates the audit's truth
            tap.telemetry += [r.models for r in conductor.results]
            tap.link_keys = conductor.collection.link_keys  # to open the sealed frames


async def _extra(run: _Run, mqtt: Connection, nic_before: Any) -> dict[str, Any]:
    """summary.json's run figures beyond the curves: broker, runtime, the orchestrator's
    deliveries, outages, membership, and the counters of the broker and the NICs."""
    broker, conductor, pool = run.broker, run.shell.watch.conductor, run.shell.pool
    extra: dict[str, Any] = {
        "broker": broker.kind,
        "runtime": _runtime_name(broker),
        "run": conductor.run,
        "seed": journal.SECRETS if journal.secret_seed(run.out) else run.problem.config.seed,
        "orchestrator": _orchestrator(conductor)
        | {"session_cpu_s": round(run.shell.session_cpu, 3)},
        "broker_outages": asdict(mqtt.outages),  # as the orchestrator lived them
        "membership": _membership(run.shell.watch),
    }
    # $SYS and NIC counters over the same window: from before the agents start to
    # the last session's end (registration and every session's setup included).
    # The run started its mosquitto, whose counters start at zero with it and count
    # nothing before the orchestrator connects (nothing to read first, so no wait for
    # a $SYS tick). A restarted broker counts from zero again: its window is void then.
    restarted = mqtt.outages.losses > 0
    if not restarted:
        extra |= await _sys(broker)
    if isinstance(broker, DockerBroker) and nic_before is not None:
        rounds = sum(plan.rounds for plan in conductor.plans)
        nic_after = await asyncio.to_thread(broker.nic)
        extra["nic"] = nic_window(broker, nic_before, nic_after, rounds)
    if isinstance(pool, swarm.SwarmAgents):  # which node ran what
        extra["swarm"] = await asyncio.to_thread(pool.placement)
    return extra


async def _written(run: _Run, extra: dict[str, Any]) -> int:
    """The curves, models and outputs written (and the wire audited); the exit code."""
    conductor = run.shell.watch.conductor
    # After the Bye: nothing beats any more, and a session whose membership changed
    # is replayed here (its MSD per round), which outlasts a short --deadline.
    curves = await asyncio.to_thread(memory.results_curves, run.problem, conductor.results)
    save_models(run.out / "models.npz", conductor.results)
    # Off the loop, which keeps answering the broker's keepalives meanwhile: the
    # audit replays the whole run for its ground truth.
    accounts = run.view.account if run.view is not None else None  # its twin runs, if done
    return await asyncio.to_thread(
        _outputs,
        run.out,
        run.problem,
        curves,
        extra,
        run.tap,
        run.neighbour,
        accounts,
        conductor.membership.views,
    )


async def _conduct(
    mqtt: Connection, shell: WatchShell, problem: Instance, view: LiveView | None, began: float
) -> None:
    """Pump the watch (or a view's lookout on it) until every session is done, its shell
    doing what it asks and sampling the agents' processes beside the pump; RunFailed when
    the conductor fails. `began`: when the run began (perf_counter), which the set-up
    times on the console count from."""
    watch = shell.watch
    conductor = watch.conductor
    machine: Machine = view.machine() if view is not None else watch
    with progress_bar() as bar:
        show = ProgressLines(bar, problem, watch)

        def until() -> bool:
            return conductor.stage in (Stage.DONE, Stage.FAILED)

        def on_output(out: Output) -> None:
            shell.react(out)
            if view is not None:
                view.seen(out)
            for event in out.events:
                if event.kind == "registered":
                    took = time.perf_counter() - began
                    console.print(f"{conductor.agents} agents registered at {took:.1f} s")
                show.event(event)
            show.update()

        def feed(out: Output) -> None:
            """What the watch made of a sample of the processes: out as the pump's is."""
            if out.publish or out.events or out.effects:
                publish(mqtt, out)
                on_output(out)
                mqtt.interrupt()  # the pump looks at the watch's next tick again

        try:
            await beside(pump(mqtt, machine, until, on_output, every=POLL), shell.watching(feed))
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
        "published_bytes": conductor.outbox.traffic.octets["control"],
        "published_messages": conductor.outbox.traffic.messages["control"],
        "deliveries_of_published": conductor.outbox.recipients,
        # what agents dropped after their last Finished, reported when they left
        "agents_rejected_after_finish": add_counts(conductor.collection.farewells.values()),
        "agents_not_left": sorted(
            set(range(conductor.agents)) - conductor.collection.farewells.keys()
        ),
        "agents_left_bytes": conductor.collection.farewell_traffic.octets["control"],
        "agents_left_messages": conductor.collection.farewell_traffic.messages["control"],
        # the longest wait between two frames to every agent (Beats among them), s
        "longest_beat_gap": round(conductor.pacing.beats.longest, 3),
        "deadline": conductor.deadline,
    }


def save_models(path: Path, results: list[SessionResult]) -> None:
    """Every agent's true model after every round, per session (NaN: not reported): what a
    replay (`privnet simulate --membership`) is checked against. 0600: true models."""
    arrays: dict[str, Any] = {}
    for r in results:  # with --models-every K > 1: the rounds that have models, and which
        held = model_rounds(r.models)
        sparse = r.models_every > 1
        arrays[r.label] = r.models[held] if sparse else r.models
        if sparse:
            arrays[f"{r.label}{ROUNDS_SUFFIX}"] = held + 1
    with private_file(path) as fh:
        np.savez(fh, **arrays)  # not compressed: random floats barely shrink, at seconds a GB


def _membership(watch: Watch) -> dict[str, Any]:
    """Views, rounds each agent missed per session, restarts and faults: for summary.json."""
    conductor = watch.conductor
    return {
        "views": len(conductor.membership.views),
        "changes": [describe(v) for v in conductor.membership.views if v.view > 0],
        "pauses": conductor.membership.pauses,  # per change: rounds redone, seconds stood
        "missed_rounds": {r.label: r.missed for r in conductor.results if r.missed},
        "restarts": watch.restarts,
        "faults": watch.injected,
    }


def _outputs(
    out: Path,
    problem: Instance,
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
        extra = {**extra, "audit_sample": tap.sample_summary()}
        if changed and neighbour is not None:
            from privnet.orchestrator.audit import reach_of

            reach = reach_of(tap.records, tap.run, problem.config.dim)
    views = membership if changed else None
    c = problem.config
    code = finish(out, c, problem, curves, "net", extra, neighbour, views, reach, account_of)
    if tap is None:
        return code
    from privnet.orchestrator.audit import show_audit

    return max(code, show_audit(out))


async def _sys(broker: Broker | ContainerBroker) -> dict[str, Any]:
    """summary.json's `broker_sys`: mosquitto's $SYS counters, read as the inspector (the
    orchestrator's own connection is still up, and a second one of its user would displace
    it; the audit's tap, the other inspector, has closed). Across hosts, every broker's."""
    if isinstance(broker, CoreBroker):
        from privnet.orchestrator import sites  # only across hosts

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

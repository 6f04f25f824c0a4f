"""privnet from Python: an `Experiment`, and `simulate`, `run`, `run_async` giving a `Result`.

`privnet simulate` (privnet.orchestrator.cli) is `simulate` on the experiment its flags make;
`privnet run` drives the same net engine and writes the same files. `run` works in a script
and inside a running event loop (a notebook): there it runs the network on a thread of its
own and waits for it; `await run_async(...)` runs it on the caller's loop instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from typing import Any

from privnet.agent.private import private_dir
from privnet.agent.spec import ConfigError
from privnet.broker.launcher import BrokerKind
from privnet.orchestrator.conductor import View
from privnet.orchestrator.curves import Curve
from privnet.orchestrator.engines.options import (
    USER_FIELDS,
    Restart,
    RunOptions,
    Runtime,
    check_neighbour,
    choice,
    default,
    flag,
)
from privnet.orchestrator.engines.watch import read_membership
from privnet.orchestrator.errors import RunFailed
from privnet.orchestrator.experiment import config as configuration
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance, check_wire
from privnet.orchestrator.report import finish, result_record, settings
from privnet.orchestrator.result import Result
from privnet.orchestrator.terminal import console, progress_bar
from privnet.orchestrator.trackers import Trackers, export


def _version() -> str:
    try:
        return metadata.version("privnet")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


VERSION = _version()  # privnet.__version__, `privnet --version`


class Engine(StrEnum):
    """Where `simulate` (`privnet simulate --engine`) runs an experiment."""

    ORACLE = "oracle"  # vectorized
    MEMORY = "memory"  # the agents' own cores, every message through the wire codec


CONFIG_FIELDS = tuple(f.name for f in fields(ExperimentConfig))
# RunOptions' fields an Experiment has by the same name, meaning and default (its neighbour
# counts only with account; secret_seed is the run's own), and those of them that are paths
PATHS = ("ca_file", "prepared", "launch_dir", "resume", "hosts")
STOPPED = 128  # a run's exit code above this: stopped by signal (code - 128)


@dataclass(frozen=True)
class Experiment(ExperimentConfig):
    """An experiment and how to run it: every setting of an experiment TOML file
    (ExperimentConfig's fields: agents, iters, strategies, schemes, problem, dataset, ...)
    and every flag of `privnet simulate` and `privnet run`. Names may be given as text
    (`schemes="none,local-ghp"`, `strategies="atc"`)."""

    # both
    out: str | Path | None = None  # output directory (simulate: no files unless given)
    account: bool = False  # epsilon(i) per agent from twin runs on D and D'
    neighbour: int = 0  # the agent whose data D' replaces
    tensorboard: str | Path | None = None  # write the metrics as TensorBoard event files here
    mlflow: bool = False  # and to MLflow: <out>/mlflow.db unless mlflow_uri names a store
    mlflow_uri: str | None = None  # an MLflow tracking URI (implies mlflow)
    # privnet simulate
    engine: Engine | str = Engine.ORACLE  # oracle (vectorized) | memory (the agents' cores)
    membership: str | Path | None = None  # replay a run's membership.json (memory engine)
    # privnet run
    # privnet run: RunOptions' fields, with its defaults (paths may be given as text)
    broker: BrokerKind | str = default("broker")  # auto | mosquitto | embedded | HOST:PORT
    tls: bool = default("tls")
    ca_file: str | Path | None = default("ca_file")
    prepared: str | Path | None = default("prepared")  # secrets from `privnet prepare`
    external_agents: bool = default("external_agents")
    hosts: str | Path | None = default("hosts")  # hosts.toml: agents across hosts
    launch_dir: str | Path | None = default("launch_dir")
    run_name: str | None = default("run_name")
    deadline: float | None = default("deadline")  # s of silence before an agent is left out
    audit: bool = default("audit")
    audit_sample: int = default("audit_sample")  # coordinates a big model's audit records
    runtime: Runtime | str = default("runtime")  # local | docker | swarm
    image: str | None = default("image")
    agents_per_process: int = default("agents_per_process")
    restart: Restart | str = default("restart")  # never | on-failure
    checkpoint_every: int = default("checkpoint_every")
    resume: str | Path | None = default("resume")  # carry on a run whose orchestrator died
    faults: str | None = default("faults")  # e.g. kill:7@120,broker@300
    telemetry: bool = default("telemetry")  # agents report their models (MSD)
    models_every: int | None = default("models_every")  # models every K rounds (None: by size)
    view: bool = default("view")  # serve the live view's page
    view_port: int = default("view_port")
    view_host: str = default("view_host")

    def __post_init__(self) -> None:
        """Every check that relates one option to another, here or in RunOptions: the CLI
        builds its commands' Experiment from its flags, so both refuse alike."""
        super().__post_init__()
        object.__setattr__(self, "engine", choice(Engine, "engine", self.engine))
        if self.membership is not None and self.engine is not Engine.MEMORY:
            raise ConfigError(
                f"{flag('membership')} replays on the memory engine: add {flag('engine')} memory"
            )
        if self.account:
            check_neighbour(self.neighbour, self.agents)
        if self.wire_dtype is not None:  # else the problem's dtype decides, when built
            check_wire(self)
        options = self.run_options()  # the run options' own checks
        if self.resume is None:  # a resumed run's agents are its journal's
            options.faults_for(self.agents)

    @classmethod
    def load(cls, source: str | Path, **changes: Any) -> Experiment:
        """A TOML experiment file or shipped preset (`paper-regression`, ...), with changes."""
        try:
            return cls.of(configuration.load(source), **changes)
        except TypeError as exc:
            raise ConfigError(f"{exc}; the settings are Experiment's fields") from None

    @classmethod
    def of(cls, config: ExperimentConfig, **options: Any) -> Experiment:
        """`config`'s experiment, run with `options` (the fields beyond ExperimentConfig's)."""
        return cls(**{name: getattr(config, name) for name in CONFIG_FIELDS}, **options)

    @property
    def config(self) -> ExperimentConfig:
        """The experiment alone, as summary.json records it (no run options)."""
        return ExperimentConfig(**{name: getattr(self, name) for name in CONFIG_FIELDS})

    def trackers(self, out: Path | None) -> Trackers:
        """Where the metrics go beside `out`'s files (TensorBoard, MLflow)."""
        return Trackers.of(self.tensorboard, self.mlflow, self.mlflow_uri, out)

    def run_options(self, secret_seed: bool = False) -> RunOptions:
        """The run options the net engine reads (`secret_seed`: the seed is the run's
        secret, kept out of summary.json)."""
        given = {name: getattr(self, name) for name in USER_FIELDS}
        paths = {name: None if given[name] is None else Path(given[name]) for name in PATHS}
        neighbour = self.neighbour if self.account else None
        return RunOptions(**(given | paths), neighbour=neighbour, secret_seed=secret_seed)


def experiment_default(name: str) -> Any:
    """The one default of an Experiment's setting (the CLI's flags take it too)."""
    return Experiment.__dataclass_fields__[name].default


def simulate(experiment: ExperimentConfig, engine: str | None = None) -> Result:
    """The experiment in this process: on the vectorized oracle, or on the memory engine
    (the agents' own cores, every message through the wire codec). Writes the CLI's files
    only when the experiment names an `out` directory (`privnet simulate` is this)."""
    exp = _experiment(experiment)
    if engine is not None:
        exp = replace(exp, engine=engine)  # checked as the field is
    engine = str(exp.engine)
    views = None if exp.membership is None else _views(Path(exp.membership))
    out = None if exp.out is None else Path(exp.out)
    trackers = exp.trackers(out)
    trackers.check()
    problem = Instance.build(exp.config)
    models: dict[str, Any] = {}
    c = problem.config
    units = len(c.strategies) * (c.repeats * len(c.schemes) if engine == "memory" else 1)
    start = time.perf_counter()
    with progress_bar() as bar:
        task = bar.add_task(f"{engine} engine", total=units, status="")
        curves = _engine(engine, problem, views, models, lambda n: bar.advance(task, n))
    wall = time.perf_counter() - start
    console.print(
        f"{engine} engine: {len(curves)} curves x {c.repeats} repeats x "
        f"{c.iters} iterations in {wall:.2f} s"
    )
    neighbour = exp.neighbour if exp.account else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        finish(out, c, problem, curves, engine, {"wall_s": wall}, neighbour, views)
    elif neighbour is not None:
        from privnet.orchestrator.privacy import accountant

        for curve in curves:
            accountant.attach(curve, problem, neighbour)
    records = [result_record(curve, settings(c, engine)) for curve in curves]
    result = Result(c, engine, curves, records, problem.graph, problem.q, models, out=out)
    track(result, trackers)
    return result


def track(result: Result, trackers: Trackers) -> None:
    """The finished run's metrics to TensorBoard and MLflow, if asked."""
    for line in export(result, trackers):
        console.print(f"[green]{line}[/green]")


def _views(path: Path) -> list[View]:
    """A run's membership.json, to replay."""
    try:
        return read_membership(path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _engine(
    engine: str,
    problem: Instance,
    views: list[View] | None,
    models: dict[str, Any],
    progress: Callable[[int], None],
) -> list[Curve]:
    if engine == "oracle":
        from privnet.orchestrator.engines.oracle import run_oracle

        curves: list[Curve] = run_oracle(problem, progress=progress, models=models)
        return curves
    from privnet.orchestrator.engines import memory

    if views is None:
        return memory.run_memory(problem, progress=progress, models=models)
    curves = memory.replay(problem, views, models=models)
    progress(len(curves) * problem.config.repeats)
    return curves


def run(experiment: ExperimentConfig) -> Result:
    """The experiment on a real network: a broker and one process per agent (`privnet
    run`). In a script it runs an event loop of its own; inside a running one (a notebook)
    on a thread of its own, and waits for it."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _loop(run_async(experiment))
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="privnet-run") as pool:
        return pool.submit(_loop, run_async(experiment)).result()


def _loop(main: Any) -> Result:
    from privnet.agent.loop import run_loop

    result: Result = run_loop(main)
    return result


async def run_async(experiment: ExperimentConfig) -> Result:
    """`run` on the caller's event loop: `result = await privnet.run_async(experiment)`."""
    from privnet.orchestrator.engines.net import run_network

    exp = _experiment(experiment)
    problem, options, out = _network(exp)
    trackers = exp.trackers(out)
    trackers.check()
    code = await run_network(problem, options, out)
    if code > STOPPED:
        raise KeyboardInterrupt(f"the run was stopped by signal {code - STOPPED}; {out} holds it")
    if code != 0:
        raise RunFailed(f"the run failed (exit code {code}); its logs are in {out}/logs")
    result = Result.load(out, problem)
    track(result, trackers)
    return result


def _network(exp: Experiment) -> tuple[Instance, RunOptions, Path]:
    """What the net engine takes for `exp`: its problem (a resumed run's own, secret seed
    included), its run options, and its output directory (made private: 0700, as the run
    keeps its secrets there)."""
    from privnet.orchestrator.engines import journal

    config = exp.config
    if exp.resume is not None:
        out = Path(exp.resume)
        try:
            config = journal.config(out)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        secret = journal.secret_seed(out)
    else:
        out = Path(exp.out or default_out(config, "run"))
        secret = False  # the Experiment's seed is the caller's: summary.json records it
    options = exp.run_options(secret)
    options.check_here()  # before anything is made
    options.faults_for(config.agents)
    problem = Instance.build(config)
    return problem, options, out if exp.resume is not None else private_dir(out)


def default_out(config: ExperimentConfig, command: str) -> Path:
    """runs/<command>-<name>-<time>, as the CLI names its output directories."""
    return Path("runs") / f"{command}-{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _experiment(experiment: ExperimentConfig) -> Experiment:
    if isinstance(experiment, Experiment):
        return experiment
    if not isinstance(experiment, ExperimentConfig):
        raise ConfigError(
            f"expected a privnet.Experiment, got {type(experiment).__name__}: "
            "build one with privnet.Experiment(agents=..., ...) or Experiment.load(toml)"
        )
    return Experiment.of(experiment)

"""`privnet run` (a real network: its flags made the library's `Experiment`, whose checks
and `RunOptions` the run takes)
and `privnet view` (a run's directory in the live view's page)."""

from __future__ import annotations

import argparse
import secrets
from typing import Any

from privnet.agent.spec import ConfigError, Scheme, Strategy
from privnet.orchestrator import api
from privnet.orchestrator.commands.experiment import experiment, out_dir
from privnet.orchestrator.engines.options import USER_FIELDS
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.terminal import console


def run(args: argparse.Namespace, config: ExperimentConfig) -> int:
    """The net engine on the experiment, with the options the flags give."""
    from privnet.agent.loop import run_loop
    from privnet.orchestrator.engines.net import run_network

    exp = run_experiment(args, config)
    options = exp.run_options(args.secret_seed)
    if options.view:
        check_view_host(options.view_host)  # a warning: once every check has passed
    out = options.resume
    if out is None:
        out = out_dir(args, config, "run", private=True)
    # Built before the event loop, where a stop signal ends it at once: nothing has started.
    problem = Instance.build(config)
    code: int = run_loop(run_network(problem, options, out))
    asked = exp.trackers(out)
    if (asked.tensorboard or asked.mlflow) and (out / "metrics.csv").is_file():
        from privnet.orchestrator.api import track  # what the run wrote, even if it failed
        from privnet.orchestrator.result import Result

        track(Result.load(out, problem), asked)
    return code


def run_experiment(args: argparse.Namespace, config: ExperimentConfig) -> api.Experiment:
    """`privnet run`'s flags as the library's Experiment, the one place a flag becomes an
    option: every check the library makes, in its words. Each flag's dest is its option's
    name, but for the two the CLI spells as a switch (`--audit yes|no`, `--no-telemetry`)."""
    switches = ("audit", "telemetry")
    given: dict[str, Any] = {n: getattr(args, n) for n in USER_FIELDS if n not in switches}
    return api.Experiment.of(
        config,
        **given,
        audit=bool(args.audit),
        telemetry=not args.no_telemetry,
        account=args.account,
        neighbour=args.neighbour,
        tensorboard=args.tensorboard,
        mlflow=args.mlflow,
        mlflow_uri=args.mlflow_uri,
    )


def run_config(args: argparse.Namespace) -> ExperimentConfig:
    """`privnet run`'s experiment, every run flag checked.

    The seed determines every agent's data: unless the user picks one, it is a secret
    drawn here (`args.secret_seed`), kept in the run's secrets.json (0600), sealed in each
    agent's Setup and never written where others may read it."""
    from privnet.orchestrator.engines import journal

    if args.resume is not None:  # the interrupted run's experiment, secret seed included
        try:
            config = journal.config(args.resume)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        args.secret_seed = journal.secret_seed(args.resume)
    else:
        drawn = secrets.randbits(63)
        base = ExperimentConfig(
            strategies=(Strategy.ATC,), schemes=(Scheme.LOCAL_GHP,), repeats=1, seed=drawn
        )
        config = experiment(args, base, drawn)
        args.secret_seed = config.seed == drawn
    exp = run_experiment(args, config)  # refuses what the library refuses, in its words
    options = exp.run_options(args.secret_seed)
    options.check_here()
    options.faults_for(config.agents)  # a resumed run's: its journal's agents
    exp.trackers(None).check()
    return config


def view(args: argparse.Namespace, _: None) -> int:
    """Serve a run's directory through the live view's page until Ctrl-C."""
    from privnet.agent.loop import run_loop
    from privnet.orchestrator.view.server import serve_run

    check_view_host(args.view_host)
    return run_loop(serve_run(args.run_dir, args.view_host, args.view_port))


def view_config(args: argparse.Namespace) -> None:
    """The page reads the run directory itself, and says what it lacks."""
    if not args.view_host.strip():
        raise ConfigError("--host '': give the address the page listens on, e.g. 127.0.0.1")


def check_view_host(host: str) -> None:
    """Say so when the page is reachable beyond this machine (it still needs the token)."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(
            f"[yellow]view:[/yellow] listening on {host}, beyond loopback: anyone who can reach "
            "it and has the URL's token can read the run"
        )

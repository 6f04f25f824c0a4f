"""`privnet`: simulate, reproduce the paper, run on a real network."""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import os
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Any

from privnet.agent.spec import Scheme, Strategy
from privnet.broker.launcher import LOCAL_KINDS, BrokerKind
from privnet.orchestrator.api import VERSION, Engine, experiment_default
from privnet.orchestrator.commands import robust
from privnet.orchestrator.commands.experiment import experiment_flags
from privnet.orchestrator.commands.hosts import (
    COMPOSE_BROKER,
    COMPOSE_MOUNT,
    lab,
    nothing,
    prepare,
    prepare_config,
    site,
)
from privnet.orchestrator.commands.measure import (
    bench,
    bench_config,
    inspect,
    inspect_config,
    overhead,
    overhead_config,
)
from privnet.orchestrator.commands.run import run, run_config, view, view_config
from privnet.orchestrator.commands.simulate import (
    dp_audit,
    dp_audit_config,
    reproduce_config,
    simulate,
    simulate_config,
)
from privnet.orchestrator.engines.options import Restart, Runtime, default
from privnet.orchestrator.flags import (
    USER_ERROR,
    Parser,
    agent_ids,
    comma_list,
    integer,
    one_of,
    port,
    positive,
    user_error,
    yes_no,
)
from privnet.orchestrator.terminal import console, print_error


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM (`signum`), raised where Python was when it came."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def _view_flags(parser: argparse.ArgumentParser, prefix: str) -> None:
    """The live view's port and address: `--view-port` of run, `--port` of view."""
    parser.add_argument(
        f"{prefix}port",
        dest="view_port",
        type=port,
        default=default("view_port"),
        metavar="N",
        help="the page's TCP port (default: any free one)",
    )
    parser.add_argument(
        f"{prefix}host",
        dest="view_host",
        default=default("view_host"),
        metavar="ADDR",
        help="the address the page listens on (default 127.0.0.1; any other address lets "
        "other machines reach it, still only with the token in the URL)",
    )


def _tracker_flags(parser: argparse.ArgumentParser) -> None:
    """Where the metrics go beside metrics.csv: TensorBoard, MLflow (optional extras)."""
    parser.add_argument(
        "--tensorboard",
        type=Path,
        metavar="DIR",
        help="also write the per-round metrics, bytes and epsilon as TensorBoard event files "
        "under DIR (one run per strategy/scheme/repeat; extra: privnet[tensorboard])",
    )
    parser.add_argument(
        "--mlflow",
        action="store_true",
        help="also log them to MLflow, one run per strategy/scheme/repeat, in the output "
        "directory's mlflow.db unless --mlflow-uri says (extra: privnet[mlflow])",
    )
    parser.add_argument(
        "--mlflow-uri",
        metavar="URI",
        help="the MLflow tracking URI to log to (implies --mlflow), e.g. http://host:5000",
    )


def _common(parser: argparse.ArgumentParser, default: Any = False) -> None:
    """--verbose and --quiet, before the subcommand (`default` False) or after it
    (`default` SUPPRESS: the first's value stands unless given again)."""
    parser.add_argument(
        "--verbose",
        action="store_true",
        default=default,
        help="a traceback with every error, and the orchestrator's log (INFO) on stderr",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        default=default,
        help="no progress or status lines: only the result tables and errors",
    )


def parser() -> argparse.ArgumentParser:
    """The `privnet` command line."""
    cli = Parser(prog="privnet", description=__doc__)
    cli.add_argument("--version", action="version", version=f"privnet {VERSION}")
    _common(cli)
    sub = cli.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "simulate", help="in-process engines (oracle: vectorized; memory: agent cores)"
    )
    experiment_flags(p)
    p.add_argument(
        "--engine",
        choices=[e.value for e in Engine],
        default=experiment_default("engine").value,
    )
    p.add_argument(
        "--membership",
        type=Path,
        metavar="JSON",
        help="replay a run's membership.json (its views at their rounds) on the memory "
        "engine: with the run's config and seed, the same trajectories",
    )
    _tracker_flags(p)
    p.set_defaults(func=simulate, configure=simulate_config)

    p = sub.add_parser("reproduce", help="the paper's Fig. 3 preset on the oracle engine")
    experiment_flags(p)
    _tracker_flags(p)
    p.set_defaults(func=simulate, configure=reproduce_config, engine=Engine.ORACLE, membership=None)

    p = sub.add_parser("run", help="agents as real processes over an MQTT broker")
    experiment_flags(p)
    p.add_argument(
        "--broker",
        default=default("broker"),
        help=f"{' | '.join(BrokerKind)} | HOST:PORT ({BrokerKind.AUTO}: "
        f"{BrokerKind.MOSQUITTO} if installed, else {BrokerKind.EMBEDDED})",
    )
    p.add_argument(
        "--external-agents",
        action="store_true",
        help="do not spawn agents: write their launch files (--launch-dir) and wait for "
        "--agents of them to register (docker compose)",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        help="TLS to the broker: a per-run CA for a local broker (clients verify it)",
    )
    p.add_argument(
        "--ca-file", type=Path, help="the CA certificate of an external broker (implies TLS)"
    )
    p.add_argument(
        "--prepared",
        type=Path,
        metavar="RUN_JSON",
        help="the run's secrets from `privnet prepare` (compose): key, tokens, credentials",
    )
    p.add_argument(
        "--launch-dir",
        type=Path,
        help="where --external-agents launch files go (default <out>/launch); secrets, 0600",
    )
    p.add_argument(
        "--runtime",
        choices=[r.value for r in Runtime],
        default=default("runtime").value,
        help="local: agents as processes here; docker: broker and agents in containers "
        "(privnet[docker]), with NIC byte counts; swarm: broker and agents as services of "
        "the Docker Swarm whose manager DOCKER_HOST names",
    )
    p.add_argument(
        "--image",
        help="--runtime docker/swarm: the agents' image (default: built from the checkout, "
        "else privnet:<version>; on a swarm of several nodes, every node must have it)",
    )
    p.add_argument("--run-name", help="topic namespace privnet/<run>/ (default: random)")
    p.add_argument(
        "--hosts",
        type=Path,
        metavar="HOSTS_TOML",
        help="agents on several hosts (`privnet site` on each): start the core broker of "
        "hosts.toml for their bridges and wait for them; with --prepared DIR/core/run.json",
    )
    p.add_argument(
        "--deadline",
        type=positive,
        help="seconds an agent may be silent, or stall the network (twice within 20 "
        "deadlines), before it is left out of the run (a new membership view); the longest "
        "the others are held for one member; agents give up on a silent orchestrator after "
        "one deadline, or 3 while their neighbours still speak (default: 30, and 0.12 per "
        "agent above 250 agents: a large network's keying and heartbeats take longer)",
    )
    p.add_argument(
        "--restart",
        choices=[r.value for r in Restart],
        default=default("restart").value,
        help="on-failure: start an agent whose process ended again; it rejoins the run from "
        "its checkpoint",
    )
    p.add_argument(
        "--checkpoint-every",
        type=integer(0),
        default=default("checkpoint_every"),
        metavar="K",
        help="agents save their model to <out>/checkpoints every K rounds (0: never)",
    )
    p.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="carry on a run whose orchestrator died: its experiment, secrets and finished "
        "sessions from RUN_DIR/journal, the agents from their checkpoints (other experiment "
        "flags are ignored)",
    )
    p.add_argument(
        "--faults",
        metavar="LIST",
        help="inject faults at rounds, e.g. kill:7@120,stop:12@200+15s,flap:3@40,broker@300",
    )
    p.add_argument(
        "--agents-per-process",
        type=integer(1),
        default=default("agents_per_process"),
        metavar="K",
        help="run K agents in each agent process (each its own MQTT client, credentials, "
        "identity and node); default 1, one process per agent",
    )
    p.add_argument(
        "--no-telemetry",
        action="store_true",
        help="agents send no per-round models (no MSD; bytes only)",
    )
    p.add_argument(
        "--models-every",
        type=integer(1),
        default=default("models_every"),
        metavar="K",
        help="agents send their metrics every round and their true model every K rounds "
        "and the last (centroid metrics at those rounds); default: 1 up to 130,804 "
        "parameters, else the telemetry messages one model takes",
    )
    p.add_argument(
        "--audit",
        nargs="?",
        const=True,
        default=default("audit"),
        type=yes_no,
        metavar="yes|no",
        help="record and audit the wire (`privnet inspect`); a value, for docker-compose's env",
    )
    p.add_argument(
        "--audit-sample",
        type=integer(1),
        default=default("audit_sample"),
        metavar="N",
        help="with --audit, a model of more than N parameters is recorded and audited on a "
        "seeded sample of at least N of its coordinates (whole chunks; the seed is drawn "
        "for the run and stated in audit.json); default %(default)s",
    )
    _view_flags(p, "--view-")
    p.add_argument(
        "--view",
        action="store_true",
        help="watch the run in a browser: a page served by the orchestrator (URL printed, "
        "with its token); read-only; `privnet view RUN_DIR` shows it again later",
    )
    _tracker_flags(p)
    p.set_defaults(func=run, configure=run_config)

    p = sub.add_parser("view", help="a finished run's directory, in the live view's page")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run's --out directory")
    _view_flags(p, "--")
    p.set_defaults(func=view, configure=view_config)

    p = sub.add_parser("inspect", help="audit the wire of a `privnet run --audit`")
    p.add_argument("--run", type=Path, required=True, help="the run's --out directory")
    p.add_argument("--pcap", type=Path, help="audit this capture of the broker port instead")
    p.add_argument("--port", type=int, help="broker port in the pcap (default: the run's)")
    p.add_argument(
        "--attack",
        action="store_true",
        help="also reconstruct every agent's models and local minimizer, from the whole wire "
        "and as each adversary (one link, a hub, a coalition, the broker; sealed or open), "
        "with the epsilon that holds against each",
    )
    p.add_argument(
        "--neighbour-agent",
        dest="neighbour",
        type=integer(0),
        default=experiment_default("neighbour"),
        metavar="P",
        help="--attack: the agent whose data the epsilons are for, whose link and hub are "
        "attacked (default 0)",
    )
    p.add_argument(
        "--coalition",
        type=agent_ids,
        metavar="M,N",
        help="--attack: the colluding agents (default: the two that weigh agent P most)",
    )
    p.set_defaults(func=inspect, configure=inspect_config)

    p = sub.add_parser(
        "prepare", help="write a run's secrets for a broker and agents started by compose"
    )
    p.add_argument("--out", type=Path, required=True, help="directory to write (created)")
    p.add_argument("--agents", type=integer(1), help="agents (with --hosts: as hosts.toml places)")
    p.add_argument("--run-name", required=True, help="topic namespace privnet/<run>/")
    p.add_argument(
        "--hosts",
        type=Path,
        metavar="HOSTS_TOML",
        help="a run across hosts: one bundle per host (its agents, its bridge) and the core's",
    )
    p.add_argument("--broker", default=COMPOSE_BROKER, help="HOST:PORT agents connect to")
    p.add_argument("--tls", action="store_true", help="a per-run CA and a broker certificate")
    p.add_argument("--hostname", action="append", default=[], help="the broker's name (TLS)")
    p.add_argument("--mount", type=Path, default=COMPOSE_MOUNT, help="where --out is mounted")
    p.add_argument(
        "--broker-uid", type=int, help="owner of privnet/broker/ (1883 in eclipse-mosquitto)"
    )
    p.add_argument("--client-uid", type=int, help="owner of the clients' files (1000: privnet)")
    p.add_argument(
        "--stack",
        action="store_true",
        help="for docker-stack.yml: every launch in one launches.json (agents take theirs by "
        "slot) instead of agents/ claim files",
    )
    p.set_defaults(func=prepare, configure=prepare_config)

    p = sub.add_parser(
        "dp-audit", help="empirical epsilon lower bounds (many short trials on D and D')"
    )
    experiment_flags(p)
    p.add_argument(
        "--trials",
        type=integer(2),
        default=1000,
        help="trials per dataset (D and D'): half fit the attack, half test it",
    )
    p.set_defaults(func=dp_audit, configure=dp_audit_config)

    p = sub.add_parser("overhead", help="what each privacy scheme costs on the wire")
    p.add_argument("--agents", type=integer(2), default=30)
    p.add_argument(
        "--iters",
        type=integer(1),
        default=100,
        help="the run's rounds: played, and the key set-up amortized over them",
    )
    p.add_argument("--strategy", choices=[str(s) for s in Strategy], default="atc")
    p.add_argument("--topologies", default="ring,geometric,complete")
    p.add_argument("--seed", type=integer(0, 2**63 - 1), default=1)
    p.add_argument("--out", type=Path, help="output directory (default runs/overhead-<time>)")
    p.add_argument(
        "--runtime",
        choices=("none", "docker"),
        default="none",
        help="docker: also run every row on containers and add its NIC bytes per round",
    )
    p.add_argument("--image", help="--runtime docker: the agents' image (as for run)")
    p.set_defaults(func=partial(overhead, main), configure=overhead_config)

    p = sub.add_parser(
        "robustness", help="what Byzantine agents do to the honest ones, attack x scheme x defense"
    )
    robust.flags(p)
    p.set_defaults(func=robust.robustness, configure=robust.robustness_config)

    p = sub.add_parser("bench", help="rounds/s against the transport ceiling, in one sitting")
    p.add_argument(
        "--brokers",
        type=comma_list(one_of(LOCAL_KINDS), "a broker"),
        default=",".join(LOCAL_KINDS),
    )
    p.add_argument("--schemes", type=comma_list(Scheme, "a scheme"), default="none,local-ghp")
    p.add_argument(
        "--agents", type=comma_list(integer(2), "agents"), default="30", help="a comma list"
    )
    p.add_argument("--iters", type=integer(1), default=200, help="rounds per measurement")
    p.add_argument("--strategy", choices=[str(s) for s in Strategy], default="atc")
    p.add_argument("--repeats", type=integer(1), default=3, help="median of this many")
    p.add_argument("--seed", type=integer(0, 2**63 - 1), default=1)
    p.add_argument(
        "--workers", type=integer(1), default=os.cpu_count() or 2, help="ceiling processes"
    )
    p.add_argument(
        "--extra",
        default="",
        help="more `privnet run` flags, quoted: the memory engine and the ceiling get them too",
    )
    p.add_argument(
        "--against",
        default="",
        help="`privnet run` flags to compare with, quoted: each repeat runs without, then with",
    )
    p.add_argument(
        "--params",
        type=integer(100),
        help="a model of about this many parameters (mlp on digits) instead of the paper's",
    )
    p.add_argument("--out", type=Path, help="output directory (default runs/bench-<time>)")
    p.set_defaults(func=bench, configure=partial(bench_config, parser))

    p = sub.add_parser(
        "site", help="one host's part of a run across hosts: its broker, bridged, its agents"
    )
    p.add_argument("bundle", type=Path, metavar="BUNDLE", help="bundles/<host> of prepare --hosts")
    p.add_argument(
        "--via",
        metavar="HOST:PORT",
        help="reach the core broker through this address (a tunnel or a proxy) instead",
    )
    p.add_argument("--port", type=port, help="this host's broker port on 127.0.0.1 (default: free)")
    p.add_argument("--out", type=Path, help="the agents' logs (default runs/site-<host>-<time>)")
    p.add_argument(
        "--agents-per-process",
        type=integer(1),
        default=default("agents_per_process"),
        metavar="K",
        help="run K agents in each agent process (as for run)",
    )
    p.set_defaults(func=site, configure=nothing)

    p = sub.add_parser(
        "lab",
        help="a run across hosts made of network namespaces here, over links with delay, "
        "loss, rate and partitions (root); other flags go to `privnet run`",
        allow_abbrev=False,
    )
    p.add_argument("--hosts", type=int, required=True, metavar="N", help="host namespaces")
    p.add_argument("--delay", default="0ms", help="each link's one-way delay, e.g. 25ms")
    p.add_argument("--loss", default="0%", help="each link's loss per direction, e.g. 1%%")
    p.add_argument("--rate", default="", help="each link's rate per direction, e.g. 10mbit")
    p.add_argument(
        "--partition",
        metavar="LIST",
        help="cut a host off at a round, e.g. 2@200+5s (host 2, round 200, 5 s)",
    )
    p.set_defaults(func=lab, configure=nothing)

    for command in sub.choices.values():
        _common(command, argparse.SUPPRESS)
    return cli


def configure(argv: list[str] | None = None) -> tuple[argparse.Namespace, Any]:
    """Parse and check a command line (TOML files included) without running anything: the
    arguments and what the command runs with (its experiment, where it has one). A bad value
    raises what `user_error` turns into one line, or exits 2 (argparse)."""
    args = _parse(argv)
    return args, args.configure(args)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The arguments; `privnet lab` forwards those it does not know to `privnet run`."""
    parsed = parser()
    args, forward = parsed.parse_known_args(argv)
    if forward and args.func is not lab:
        parsed.error(f"unrecognized arguments: {' '.join(forward)}")
    args.forward = forward
    return args


def main(argv: list[str] | None = None) -> int:
    """`privnet ARGV`: the command's exit code."""
    args = _parse(argv)
    quiet, console.quiet = console.quiet, console.quiet or args.quiet  # nested: as the outer
    try:
        return _main(args)
    finally:
        console.quiet = quiet


def _main(args: argparse.Namespace) -> int:
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # `docker stop` and friends send SIGTERM: clean up as for Ctrl-C. SIGINT too when the
    # shell started us with it ignored (`privnet run &` in a script). `privnet run` takes
    # both on its event loop while the run goes on (`privnet.orchestrator.engines.lifetime.Stop`).
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    # The interpreter's last collections walk every object a command loaded (0.9 s of a
    # stopped run's exit with matplotlib, scipy and networkx, on 2 cores): the process is
    # ending and its memory goes with it, so they are skipped.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    try:
        return int(args.func(args, args.configure(args)))
    except Interrupted as exc:
        console.print("[yellow]interrupted; everything started was stopped[/yellow]")
        return 128 + exc.signum
    except Exception as exc:  # the one place a user's mistake becomes one line
        message = user_error(exc)
        if message is None:
            raise
        if args.verbose:
            console.print_exception()
        print_error(message)
        return USER_ERROR


if __name__ == "__main__":
    sys.exit(main())

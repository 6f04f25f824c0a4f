"""`privnet`: simulate, reproduce the paper, run on a real network."""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import logging
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.private import private_dir
from agent.spec import ConfigError, Rekey, Scheme, Strategy
from orchestrator.api import VERSION
from orchestrator.experiment import config as configuration
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.problem import Problem
from orchestrator.experiment.topology import RULES, TOPOLOGIES
from orchestrator.flags import USER_ERROR, Parser, integer, positive, print_error, user_error
from orchestrator.report import OUTPUTS
from orchestrator.terminal import console, progress_bar, table_console

RANDOM_SEED = "random"  # --seed random: a fresh secret seed

if TYPE_CHECKING:
    pass


def _experiment_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        help="a TOML experiment file, or a shipped preset: " + ", ".join(configuration.presets()),
    )
    parser.add_argument(
        "--strategy", dest="strategies", help="consensus|cta|atc|all or a comma list"
    )
    parser.add_argument(
        "--scheme", dest="schemes", help="none|random|ghp|local-ghp|masked-ghp|all or a comma list"
    )
    parser.add_argument("--agents", type=int)
    parser.add_argument("--iters", type=int, help="rounds (iterations)")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--mu", type=float, help="step size")
    parser.add_argument("--sigma-g2", dest="sigma_g2", type=float, help="noise variance sigma_g^2")
    parser.add_argument("--rule", choices=RULES)
    parser.add_argument("--matrix", help="a user-given combination matrix (.npy or text)")
    parser.add_argument("--topology", choices=TOPOLOGIES)
    parser.add_argument("--radius", type=float, help="random geometric graph radius")
    parser.add_argument("--edges", help="edge-list file for --topology file")
    parser.add_argument("--batch", type=int, help="minibatch size (default: full batch)")
    parser.add_argument("--rekey", choices=[str(r) for r in Rekey])
    parser.add_argument(
        "--seal-links",
        dest="seal_links",
        type=_on_off,
        metavar="on|off",
        help="seal every peer frame end to end (default on); off: the paper's visible wire",
    )
    parser.add_argument(
        "--seed",
        type=_seed,
        help="data, graph and noise seed; `random` (or empty): a fresh one (`privnet run`: "
        "secret, kept in the run's secrets.json, 0600)",
    )
    parser.add_argument("--out", type=Path, help="output directory (default runs/<name>-<time>)")
    parser.add_argument(
        "--account",
        action="store_true",
        help="account epsilon(i) per agent from twin runs on D and D' (`privacy` in summary.json)",
    )
    parser.add_argument(
        "--neighbour-agent",
        dest="neighbour",
        type=int,
        default=0,
        metavar="P",
        help="the agent whose data D' replaces (default 0)",
    )


OVERRIDES = (
    "strategies",
    "schemes",
    "agents",
    "iters",
    "repeats",
    "mu",
    "sigma_g2",
    "rule",
    "matrix",
    "topology",
    "radius",
    "edges",
    "batch",
    "rekey",
    "seed",
    "seal_links",
)


def _on_off(text: str) -> bool:
    if text.lower() in ("on", "yes", "true"):
        return True
    if text.lower() in ("off", "no", "false"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: give on or off")


def _seed(text: str) -> int | str:
    if text.strip().lower() in ("", RANDOM_SEED):
        return RANDOM_SEED
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give an integer, or `random`") from None
    if not 0 <= seed < 2**63:
        raise argparse.ArgumentTypeError(f"{seed}: give an integer in [0, 2^63), or `random`")
    return seed


def experiment(
    args: argparse.Namespace, base: ExperimentConfig | None = None, drawn: int | None = None
) -> ExperimentConfig:
    """The experiment: `base` (or the --config file) with the flags over it; `--seed random`
    takes `drawn`, or a fresh seed."""
    config = configuration.load(args.config) if args.config else (base or ExperimentConfig())
    flags = {k: getattr(args, k) for k in OVERRIDES}
    if flags["seed"] == RANDOM_SEED:
        flags["seed"] = secrets.randbits(63) if drawn is None else drawn
    config = configuration.with_overrides(config, flags)
    if getattr(args, "account", False) or args.command == "dp-audit":
        _check_agent("--neighbour-agent", args.neighbour, config)
    return config


def _check_agent(flag: str, agent: int, config: ExperimentConfig) -> None:
    if not 0 <= agent < config.agents:
        raise ConfigError(f"{flag} {agent}: give an agent of 0..{config.agents - 1}")


PREVIOUS = "previous-"  # where an earlier run's files in a reused --out go


def out_dir(
    args: argparse.Namespace, config: ExperimentConfig, command: str, private: bool = False
) -> Path:
    """The command's directory (`private`: 0700, its files hold secrets). An --out that
    holds an earlier run's files keeps them apart: they move into `previous-<time>/` first
    (anything else there stays where it is)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or Path("runs") / f"{command}-{config.name}-{stamp}"
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file: give a directory (made if missing)")
    earlier = [out / name for name in OUTPUTS if (out / name).exists()]
    if earlier:
        previous = out / f"{PREVIOUS}{stamp}"
        previous.mkdir(mode=0o700, exist_ok=True)
        for path in earlier:
            path.rename(previous / path.name)
        console.print(f"{out} held an earlier run: its files are now in {previous}")
    if private:
        return private_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def simulate(args: argparse.Namespace, config: ExperimentConfig) -> int:
    """`privnet.simulate` on the experiment the flags make; exit 1 when a curve diverged."""
    from orchestrator import api

    experiment = api.Experiment.of(
        config,
        out=out_dir(args, config, "simulate"),
        engine=args.engine,
        membership=args.membership,
        account=args.account,
        neighbour=args.neighbour,
    )
    result = api.simulate(experiment)
    return 1 if any(record["diverged"] for record in result.records) else 0


def _simulate_config(args: argparse.Namespace) -> ExperimentConfig:
    if args.membership is not None and args.engine != "memory":
        raise ConfigError("--membership replays on the memory engine: add --engine memory")
    return experiment(args)


def _reproduce_config(args: argparse.Namespace) -> ExperimentConfig:
    """The paper's preset on the vectorized oracle: 20 repeats, 3 strategies, 5 schemes."""
    return experiment(args, configuration.load("paper-regression"))


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM (`signum`), raised where Python was when it came."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def run(args: argparse.Namespace, config: ExperimentConfig) -> int:
    from agent.loop import run_loop
    from orchestrator.engines.net import run_network

    if args.view:
        check_view_host(args.view_host)  # a warning: once every check has passed
    out = args.resume if args.resume is not None else out_dir(args, config, "run", private=True)
    # Built before the event loop, where a stop signal ends it at once: nothing has started.
    return run_loop(run_network(Problem.build(config), args, out))


def _run_config(args: argparse.Namespace) -> ExperimentConfig:
    """`privnet run`'s experiment, every run flag checked.

    The seed determines every agent's data: unless the user picks one, it is a secret
    drawn here (`args.secret_seed`), kept in the run's secrets.json (0600), sealed in each
    agent's Setup and never written where others may read it."""
    from orchestrator.engines import journal

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
    _check_runtime(args)
    _check_view(args)
    from orchestrator.faults import parse_faults

    parse_faults(args.faults or "", config.agents)
    for flag, path in (("--ca-file", args.ca_file), ("--prepared", args.prepared)):
        if path is not None and not path.is_file():
            raise ConfigError(f"{flag} {path}: no such file")
    return config


def _check_runtime(args: argparse.Namespace) -> None:
    """The broker asked for exists; --runtime docker and swarm get only the flags they can
    honour."""
    from agent.access import BrokerAddress
    from broker.launcher import KINDS, has_mosquitto

    if args.broker == "mosquitto" and not has_mosquitto():
        raise ConfigError(
            "mosquitto is not installed: install it (apt-get install mosquitto) or use "
            "--broker embedded"
        )
    if args.broker not in KINDS:
        BrokerAddress.parse(args.broker)
    if args.runtime not in ("docker", "swarm"):
        return
    given = {
        "--broker": args.broker != "auto",
        "--external-agents": args.external_agents,
        "--tls": args.tls,
        "--ca-file": args.ca_file is not None,
        "--agents-per-process": args.agents_per_process != 1,
    }
    if any(given.values()):
        raise ConfigError(
            f"--runtime {args.runtime} starts its own broker (plain TCP on the run's network) "
            f"and agents: drop {', '.join(flag for flag, on in given.items() if on)}"
        )


def _check_view(args: argparse.Namespace) -> None:
    """--view-port and --view-host only mean something with --view."""
    if not args.view:
        given = {"--view-port": args.view_port != 0, "--view-host": args.view_host != "127.0.0.1"}
        if any(given.values()):
            flags = ", ".join(flag for flag, on in given.items() if on)
            raise ConfigError(f"{flags} without --view: add --view to watch the run")
    elif not args.view_host.strip():
        raise ConfigError("--view-host '': give the address the page listens on, e.g. 127.0.0.1")


def prepare(args: argparse.Namespace, _: None) -> int:
    """Secrets for a compose run: broker users and ACL, the orchestrator's key, agent launches;
    with --hosts, one bundle per host and the core's."""
    from orchestrator.engines.net import prepare as write

    if args.hosts is not None:
        from orchestrator import sites

        compose = {
            "--broker": args.broker != "broker:1883",
            "--mount": args.mount != Path("/privnet"),
            "--broker-uid": args.broker_uid is not None,
            "--client-uid": args.client_uid is not None,
        }
        if any(compose.values()):
            flags = ", ".join(flag for flag, given in compose.items() if given)
            raise ConfigError(
                f"prepare --hosts: drop {flags} (compose's); the core's address is hosts.toml's"
            )
        hosts = sites.Hosts.load(args.hosts)
        if args.agents is not None:
            hosts.check(args.agents, str(args.hosts))
        sites.prepare_hosts(
            args.out, hosts, args.run_name, tuple(args.hostname) if args.tls else None
        )
        console.print(
            f"wrote run {args.run_name!r} ({hosts.agents} agents) to {args.out}: core/ stays "
            f"here, {', '.join(f'{h}/' for h in hosts.hosts)} go to their hosts"
        )
        return 0
    if args.agents is None:
        raise ConfigError("prepare needs --agents N (or --hosts hosts.toml)")
    write(
        args.out,
        args.agents,
        args.run_name,
        broker=args.broker,
        tls_hostnames=tuple(args.hostname) if args.tls else None,
        mount=args.mount,
        broker_uid=args.broker_uid,
        client_uid=args.client_uid,
        stack=args.stack,
    )
    console.print(
        f"wrote the secrets of run {args.run_name!r} ({args.agents} agents) to {args.out}"
    )
    return 0


def _prepare_config(args: argparse.Namespace) -> None:
    from agent.access import BrokerAddress

    BrokerAddress.parse(args.broker)
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file: give a directory (made if missing)")


def inspect(args: argparse.Namespace, _: None) -> int:
    """Audit the wire of a `privnet run --audit` (its live recording, or a pcap of it)."""
    from orchestrator.audit import AttackPlan, show_audit

    plan = AttackPlan(args.neighbour, args.coalition) if args.attack else None
    return show_audit(args.run, args.pcap, args.port, plan)


def _inspect_config(args: argparse.Namespace) -> None:
    if not args.run.is_dir():
        raise ConfigError(f"--run {args.run}: no such directory; give a `privnet run --out` one")
    if args.pcap is not None and not args.pcap.is_file():
        raise ConfigError(f"--pcap {args.pcap}: no such file")


def overhead(args: argparse.Namespace, base: ExperimentConfig) -> int:
    """What privacy costs on the wire, per scheme and re-key policy, on three topologies."""
    from orchestrator import overhead as cost

    topologies = tuple(t.strip() for t in args.topologies.split(","))
    out = args.out or Path("runs") / f"overhead-{time.strftime('%Y%m%d-%H%M%S')}"
    wire = None
    if args.runtime == "docker":
        wire = {
            (topology, str(scheme), str(rekey)): _docker_wire(args, topology, scheme, rekey, out)
            for topology in topologies
            for scheme, rekey in cost.runs()
        }
    with progress_bar() as bar:
        task = bar.add_task("overhead", total=len(cost.runs()) * len(topologies), status="")
        rows = cost.overhead(
            base,
            Strategy(args.strategy),
            topologies,
            lambda name: bar.update(task, advance=1, status=name),
            wire,
        )
    cost.write_overhead(rows, out)
    for table in cost.overhead_tables(rows):
        table_console().print(table)
    console.print(f"wrote {out}/overhead.json and overhead.png")
    return 0


def _overhead_config(args: argparse.Namespace) -> ExperimentConfig:
    topologies = [t.strip() for t in args.topologies.split(",")]
    unknown = [t for t in topologies if t not in TOPOLOGIES or t == "file"]
    if unknown:
        raise ConfigError(
            f"unknown topologies {unknown}; choose from "
            + ", ".join(t for t in TOPOLOGIES if t != "file")
        )
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file: give a directory (made if missing)")
    return ExperimentConfig(agents=args.agents, iters=args.iters, seed=args.seed)


def bench(args: argparse.Namespace, _: None) -> int:
    """rounds/s of privnet against its transport's ceiling and the memory engine."""
    from orchestrator.bench import bench as measure

    return measure(args)


def _docker_wire(
    args: argparse.Namespace, topology: str, scheme: Scheme, rekey: Rekey, out: Path
) -> dict[str, Any]:
    """`privnet run --runtime docker` of one row (the NIC window spans a whole run): its
    summary's `nic` and `broker_sys` figures."""
    where = out / f"docker-{topology}-{scheme}-{rekey}"
    flags = ["--agents", str(args.agents), "--iters", str(args.iters), "--seed", str(args.seed)]
    flags += ["--strategy", args.strategy, "--scheme", str(scheme), "--rekey", str(rekey)]
    flags += ["--topology", topology, "--repeats", "1", "--out", str(where)]
    image = ["--image", args.image] if args.image else []
    code = main(["run", "--runtime", "docker", *image, *flags])
    if code != 0:
        raise ConfigError(f"the docker run for the NIC column failed (exit {code}); see {where}")
    config: dict[str, Any] = json.loads((where / "summary.json").read_text())["config"]
    return {k: config[k] for k in ("nic", "broker_sys") if k in config}


def lab(args: argparse.Namespace, _: None) -> int:
    """A run across hosts that are network namespaces on this machine, over WAN-like links."""
    from orchestrator.lab.netns import Conditions, parse_partitions
    from orchestrator.lab.run import run_lab, strip_flags

    given = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    given.set_defaults(command="lab")
    _experiment_flags(given)
    given.add_argument("--tls", action="store_true")
    given.add_argument("--agents-per-process", type=integer(1), default=1)
    known, _rest = given.parse_known_args(args.forward)
    taken = [a for a in args.forward if a.split("=")[0] in ("--prepared", "--resume")]
    if taken:
        raise ConfigError(f"privnet lab prepares and starts the run itself: drop {taken}")
    config = experiment(known)
    conditions = Conditions.parse(args.delay, args.loss, args.rate)
    partitions = parse_partitions(args.partition or "", args.hosts)
    drop = {"--tls": False, "--agents-per-process": True, "--out": True}
    return run_lab(
        args.hosts,
        conditions,
        partitions,
        config.agents,
        out_dir(known, config, "lab"),
        strip_flags(args.forward, drop),
        tls=known.tls,
        per_process=known.agents_per_process,
    )


def site(args: argparse.Namespace, _: None) -> int:
    """One host's part of a run across hosts (`privnet site BUNDLE`)."""
    from orchestrator.sites import site as serve

    return serve(args)


def dp_audit(args: argparse.Namespace, config: ExperimentConfig) -> int:
    """Empirical lower bounds on epsilon for each scheme, against the accountant's claim."""
    from orchestrator.privacy import dpaudit, sampler

    problem = Problem.build(config)
    out = out_dir(args, config, "dp-audit")
    records = []
    for strategy in config.strategies:
        for scheme in config.schemes:
            with console.status(f"dp-audit {strategy}/{scheme}: {args.trials} trials on D and D'"):
                records += dpaudit.dp_audit(
                    problem, strategy, scheme, args.neighbour, args.trials, config.seed
                )
    samplers = sampler.sampler_report(config.sigma_g)
    report = {
        "config": config.to_dict(),
        "confidence": dpaudit.CONFIDENCE,
        "audits": records,
        "sampler_leak": samplers,
    }
    (out / "dp_audit.json").write_text(json.dumps(report, indent=2) + "\n")
    table_console().print(dpaudit.audit_table(records))
    table_console().print(dpaudit.sampler_table(samplers))
    console.print(f"wrote {out}/dp_audit.json")
    return 0 if all(r["consistent"] for r in records) else 1


def _dp_audit_config(args: argparse.Namespace) -> ExperimentConfig:
    base = ExperimentConfig(
        name="dp-audit", agents=10, iters=1, sigma_g2=0.01, strategies=(Strategy.ATC,), repeats=1
    )
    return experiment(args, base)


def _agents(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(m) for m in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give agent ids, e.g. 3,7") from None


def view(args: argparse.Namespace, _: None) -> int:
    """Serve a run's directory through the live view's page until Ctrl-C."""
    from agent.loop import run_loop
    from orchestrator.view.server import serve_run

    check_view_host(args.view_host)
    return run_loop(serve_run(args.run_dir, args.view_host, args.view_port))


def _nothing(_: argparse.Namespace) -> None:
    """The command checks its own flags as it runs (`site`, `lab`)."""


def _view_config(args: argparse.Namespace) -> None:
    """The page reads the run directory itself, and says what it lacks."""
    if not args.view_host.strip():
        raise ConfigError("--host '': give the address the page listens on, e.g. 127.0.0.1")


def _view_flags(parser: argparse.ArgumentParser, prefix: str) -> None:
    parser.add_argument(
        f"{prefix}port",
        dest="view_port",
        type=_port,
        default=0,
        metavar="N",
        help="the page's TCP port (default: any free one)",
    )
    parser.add_argument(
        f"{prefix}host",
        dest="view_host",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address the page listens on (default 127.0.0.1; any other address lets "
        "other machines reach it, still only with the token in the URL)",
    )


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a TCP port, 0-65535") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port}: give a TCP port, 0-65535 (0: any free one)")
    return port


def check_view_host(host: str) -> None:
    """Say so when the page is reachable beyond this machine (it still needs the token)."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(
            f"[yellow]view:[/yellow] listening on {host}, beyond loopback: anyone who can reach "
            "it and has the URL's token can read the run"
        )


def _yes_no(text: str) -> bool:
    answers = {"yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}
    try:
        return answers[text.strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r}: say yes or no") from None


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
    _experiment_flags(p)
    p.add_argument("--engine", choices=("oracle", "memory"), default="oracle")
    p.add_argument(
        "--membership",
        type=Path,
        metavar="JSON",
        help="replay a run's membership.json (its views at their rounds) on the memory "
        "engine: with the run's config and seed, the same trajectories",
    )
    p.set_defaults(func=simulate, configure=_simulate_config)

    p = sub.add_parser("reproduce", help="the paper's Fig. 3 preset on the oracle engine")
    _experiment_flags(p)
    p.set_defaults(func=simulate, configure=_reproduce_config, engine="oracle", membership=None)

    p = sub.add_parser("run", help="agents as real processes over an MQTT broker")
    _experiment_flags(p)
    p.add_argument(
        "--broker",
        default="auto",
        help="auto (mosquitto if installed, else embedded) | mosquitto | embedded | HOST:PORT",
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
        choices=("local", "docker", "swarm"),
        default="local",
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
        help="seconds of silence before an agent is left out of the run (a new membership "
        "view), or an orchestrator given up by the agents (default: 30, and 0.12 per agent "
        "above 250 agents: a large network's keying and heartbeats take longer)",
    )
    p.add_argument(
        "--restart",
        choices=("never", "on-failure"),
        default="never",
        help="on-failure: start an agent whose process ended again; it rejoins the run from "
        "its checkpoint",
    )
    p.add_argument(
        "--checkpoint-every",
        type=integer(0),
        default=25,
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
        help="inject faults at rounds, e.g. kill:7@120,stop:12@200+15s,broker@300",
    )
    p.add_argument(
        "--agents-per-process",
        type=integer(1),
        default=1,
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
        "--audit",
        nargs="?",
        const=True,
        default=False,
        type=_yes_no,
        metavar="yes|no",
        help="record and audit the wire (`privnet inspect`); a value, for docker-compose's env",
    )
    _view_flags(p, "--view-")
    p.add_argument(
        "--view",
        action="store_true",
        help="watch the run in a browser: a page served by the orchestrator (URL printed, "
        "with its token); read-only; `privnet view RUN_DIR` shows it again later",
    )
    p.set_defaults(func=run, configure=_run_config)

    p = sub.add_parser("view", help="a finished run's directory, in the live view's page")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run's --out directory")
    _view_flags(p, "--")
    p.set_defaults(func=view, configure=_view_config)

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
        default=0,
        metavar="P",
        help="--attack: the agent whose data the epsilons are for, whose link and hub are "
        "attacked (default 0)",
    )
    p.add_argument(
        "--coalition",
        type=_agents,
        metavar="M,N",
        help="--attack: the colluding agents (default: the two that weigh agent P most)",
    )
    p.set_defaults(func=inspect, configure=_inspect_config)

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
    p.add_argument("--broker", default="broker:1883", help="HOST:PORT agents connect to")
    p.add_argument("--tls", action="store_true", help="a per-run CA and a broker certificate")
    p.add_argument("--hostname", action="append", default=[], help="the broker's name (TLS)")
    p.add_argument("--mount", type=Path, default=Path("/privnet"), help="where --out is mounted")
    p.add_argument("--broker-uid", type=int, help="owner of broker/ (1883 in eclipse-mosquitto)")
    p.add_argument("--client-uid", type=int, help="owner of the clients' files (1000: privnet)")
    p.add_argument(
        "--stack",
        action="store_true",
        help="for docker-stack.yml: every launch in one launches.json (agents take theirs by "
        "slot) instead of agents/ claim files",
    )
    p.set_defaults(func=prepare, configure=_prepare_config)

    p = sub.add_parser(
        "dp-audit", help="empirical epsilon lower bounds (many short trials on D and D')"
    )
    _experiment_flags(p)
    p.add_argument(
        "--trials",
        type=integer(2),
        default=1000,
        help="trials per dataset (D and D'): half fit the attack, half test it",
    )
    p.set_defaults(func=dp_audit, configure=_dp_audit_config)

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
    p.set_defaults(func=overhead, configure=_overhead_config)

    from orchestrator.bench import add_parser as add_bench  # gmqtt: not on every start-up

    add_bench(sub, bench, parser)

    p = sub.add_parser(
        "site", help="one host's part of a run across hosts: its broker, bridged, its agents"
    )
    p.add_argument("bundle", type=Path, metavar="BUNDLE", help="bundles/<host> of prepare --hosts")
    p.add_argument(
        "--via",
        metavar="HOST:PORT",
        help="reach the core broker through this address (a tunnel or a proxy) instead",
    )
    p.add_argument(
        "--port", type=_port, help="this host's broker port on 127.0.0.1 (default: free)"
    )
    p.add_argument("--out", type=Path, help="the agents' logs (default runs/site-<host>-<time>)")
    p.add_argument(
        "--agents-per-process",
        type=integer(1),
        default=1,
        metavar="K",
        help="run K agents in each agent process (as for run)",
    )
    p.set_defaults(func=site, configure=_nothing)

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
    p.set_defaults(func=lab, configure=_nothing)

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
    # both on its event loop while the run goes on (`orchestrator.engines.lifetime.Stop`).
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

"""`privnet`: simulate, reproduce the paper, run on a real network."""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import secrets
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.spec import ConfigError, Rekey, Scheme, Strategy
from orchestrator.experiment import config as configuration
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.problem import Problem
from orchestrator.experiment.topology import RULES, TOPOLOGIES
from orchestrator.report import Curve, console, finish, progress_bar, table_console


def _experiment_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        help="a TOML experiment file, or a shipped preset: " + ", ".join(configuration.presets()),
    )
    parser.add_argument(
        "--strategy", dest="strategies", help="consensus|cta|atc|all or a comma list"
    )
    parser.add_argument(
        "--scheme", dest="schemes", help="none|random|ghp|local-ghp|all or a comma list"
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
        help="data, graph and noise seed; `random` (or empty): a secret one, kept in summary.json",
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


def _seed(text: str) -> int | None:
    if text.strip().lower() in ("", "random"):
        return secrets.randbits(63)
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give an integer, or `random`") from None


def experiment(args: argparse.Namespace, base: ExperimentConfig | None = None) -> ExperimentConfig:
    config = configuration.load(args.config) if args.config else (base or ExperimentConfig())
    return configuration.with_overrides(config, {k: getattr(args, k) for k in OVERRIDES})


def out_dir(args: argparse.Namespace, config: ExperimentConfig, command: str) -> Path:
    out = args.out or Path("runs") / f"{command}-{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def simulate(
    args: argparse.Namespace, base: ExperimentConfig | None = None, engine: str | None = None
) -> int:
    config = experiment(args, base)
    engine = engine or args.engine
    problem = Problem.build(config)
    out = out_dir(args, config, "simulate")
    runner = _engine(engine)
    membership = getattr(args, "membership", None)
    if membership is not None:
        if engine != "memory":
            raise ConfigError("--membership replays on the memory engine: add --engine memory")
        runner = _replay(membership)
    units = len(config.strategies) * (
        config.repeats * len(config.schemes) if engine == "memory" else 1
    )
    start = time.perf_counter()
    with progress_bar() as bar:
        task = bar.add_task(f"{engine} engine", total=units, status="")
        curves = runner(problem, progress=lambda n: bar.advance(task, n))
    wall = time.perf_counter() - start
    console.print(
        f"{engine} engine: {len(curves)} curves x {config.repeats} repeats x "
        f"{config.iters} iterations in {wall:.2f} s"
    )
    neighbour = args.neighbour if args.account else None
    finish(out, config, problem, curves, engine, {"wall_s": wall}, neighbour)
    return 0


def _engine(name: str) -> Callable[..., list[Curve]]:
    if name == "oracle":
        from orchestrator.engines.oracle import run_oracle

        return run_oracle
    from orchestrator.engines.memory import run_memory

    return run_memory


def _replay(path: Path) -> Callable[..., list[Curve]]:
    from orchestrator.engines.memory import replay
    from orchestrator.engines.watch import read_membership

    try:
        views = read_membership(path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None

    def runner(problem: Problem, progress: Callable[[int], None]) -> list[Curve]:
        curves = replay(problem, views)
        progress(len(curves) * problem.config.repeats)
        return curves

    return runner


def reproduce(args: argparse.Namespace) -> int:
    """The paper's preset on the vectorized oracle: 20 repeats, 3 strategies, 4 schemes."""
    base = configuration.load("paper-regression")
    return simulate(args, base, engine="oracle")


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM (`signum`), raised where Python was when it came."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def run(args: argparse.Namespace) -> int:
    from agent.mqtt import run as run_loop
    from orchestrator.engines.net import run_network

    _check_view(args)
    # The seed determines every agent's data: unless the operator picks one, it is a
    # secret drawn here, kept in the run's summary.json and sealed in each agent's Setup.
    seed = secrets.randbits(63)
    base = ExperimentConfig(
        strategies=(Strategy.ATC,), schemes=(Scheme.LOCAL_GHP,), repeats=1, seed=seed
    )
    if args.resume is not None:  # the interrupted run's experiment, secret seed included
        from orchestrator.engines import journal

        try:
            config = journal.config(args.resume)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        out = args.resume
    else:
        config = experiment(args, base)
        out = out_dir(args, config, "run")
    # Built before the event loop, where a stop signal ends it at once: nothing has started.
    return run_loop(run_network(Problem.build(config), args, out))


def _check_view(args: argparse.Namespace) -> None:
    """--view-port and --view-host only mean something with --view."""
    if not args.view:
        given = {"--view-port": args.view_port != 0, "--view-host": args.view_host != "127.0.0.1"}
        if any(given.values()):
            flags = ", ".join(flag for flag, on in given.items() if on)
            raise ConfigError(f"{flags} without --view: add --view to watch the run")
        return
    check_view_host(args.view_host)


def prepare(args: argparse.Namespace) -> int:
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


def inspect(args: argparse.Namespace) -> int:
    """Audit the wire of a `privnet run --audit` (its live recording, or a pcap of it)."""
    from orchestrator.audit import show_audit

    return show_audit(args.run, args.pcap, args.port, args.attack)


def overhead(args: argparse.Namespace) -> int:
    """Bytes and messages per round of every scheme and re-key policy, on three topologies."""
    from orchestrator import overhead as cost

    base = ExperimentConfig(agents=args.agents, iters=args.iters, seed=args.seed)
    topologies = tuple(t.strip() for t in args.topologies.split(","))
    unknown = [t for t in topologies if t not in TOPOLOGIES or t == "file"]
    if unknown:
        raise ConfigError(
            f"unknown topologies {unknown}; choose from "
            + ", ".join(t for t in TOPOLOGIES if t != "file")
        )
    out = args.out or Path("runs") / f"overhead-{time.strftime('%Y%m%d-%H%M%S')}"
    nic = None
    if args.runtime == "docker":
        nic = {
            (topology, str(scheme), str(rekey)): _docker_nic(args, topology, scheme, rekey, out)
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
            nic,
        )
    cost.write_overhead(rows, out)
    table_console().print(cost.overhead_table(rows))
    console.print(f"wrote {out}/overhead.json and overhead.png")
    return 0


def bench(args: argparse.Namespace) -> int:
    """rounds/s of privnet against its transport's ceiling and the memory engine."""
    from orchestrator.bench import bench as measure

    return measure(args)


def _docker_nic(
    args: argparse.Namespace, topology: str, scheme: Scheme, rekey: Rekey, out: Path
) -> dict[str, Any]:
    """`privnet run --runtime docker` of one row (the NIC window spans a whole run): its
    summary's `nic` figures."""
    where = out / f"docker-{topology}-{scheme}-{rekey}"
    flags = ["--agents", str(args.agents), "--iters", str(args.iters), "--seed", str(args.seed)]
    flags += ["--strategy", args.strategy, "--scheme", str(scheme), "--rekey", str(rekey)]
    flags += ["--topology", topology, "--repeats", "1", "--out", str(where)]
    image = ["--image", args.image] if args.image else []
    code = main(["run", "--runtime", "docker", *image, *flags])
    if code != 0:
        raise ConfigError(f"the docker run for the NIC column failed (exit {code}); see {where}")
    nic: dict[str, Any] = json.loads((where / "summary.json").read_text())["config"]["nic"]
    return nic


def lab(args: argparse.Namespace) -> int:
    """A run across hosts that are network namespaces on this machine, over WAN-like links."""
    from orchestrator.lab.netns import Conditions, parse_partitions
    from orchestrator.lab.run import run_lab, strip_flags

    given = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _experiment_flags(given)
    given.add_argument("--tls", action="store_true")
    given.add_argument("--agents-per-process", type=int, default=1)
    known, _ = given.parse_known_args(args.forward)
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


def site(args: argparse.Namespace) -> int:
    """One host's part of a run across hosts (`privnet site BUNDLE`)."""
    from orchestrator.sites import site as serve

    return serve(args)


def dp_audit(args: argparse.Namespace) -> int:
    """Empirical lower bounds on epsilon for each scheme, against the accountant's claim."""
    from orchestrator.privacy import dpaudit, sampler

    base = ExperimentConfig(
        name="dp-audit", agents=10, iters=1, sigma_g2=0.01, strategies=(Strategy.ATC,), repeats=1
    )
    config = experiment(args, base)
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


def view(args: argparse.Namespace) -> int:
    """Serve a run's directory through the live view's page until Ctrl-C."""
    from agent.mqtt import run as run_loop
    from orchestrator.view.server import serve_run

    check_view_host(args.view_host)
    return run_loop(serve_run(args.run_dir, args.view_host, args.view_port))


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="privnet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

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
    p.set_defaults(func=simulate)

    p = sub.add_parser("reproduce", help="the paper's Fig. 3 preset on the oracle engine")
    _experiment_flags(p)
    p.set_defaults(func=reproduce)

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
        type=float,
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
        type=int,
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
        type=int,
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
    p.set_defaults(func=run)

    p = sub.add_parser("view", help="a finished run's directory, in the live view's page")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run's --out directory")
    _view_flags(p, "--")
    p.set_defaults(func=view)

    p = sub.add_parser("inspect", help="audit the wire of a `privnet run --audit`")
    p.add_argument("--run", type=Path, required=True, help="the run's --out directory")
    p.add_argument("--pcap", type=Path, help="audit this capture of the broker port instead")
    p.add_argument("--port", type=int, help="broker port in the pcap (default: the run's)")
    p.add_argument(
        "--attack",
        action="store_true",
        help="also reconstruct every agent's models and local minimizer from the wire",
    )
    p.set_defaults(func=inspect)

    p = sub.add_parser(
        "prepare", help="write a run's secrets for a broker and agents started by compose"
    )
    p.add_argument("--out", type=Path, required=True, help="directory to write (created)")
    p.add_argument("--agents", type=int, help="agents (with --hosts: as hosts.toml places)")
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
    p.set_defaults(func=prepare)

    p = sub.add_parser(
        "dp-audit", help="empirical epsilon lower bounds (many short trials on D and D')"
    )
    _experiment_flags(p)
    p.add_argument("--trials", type=int, default=1000, help="trials per dataset (D and D')")
    p.set_defaults(func=dp_audit)

    p = sub.add_parser("overhead", help="what each privacy scheme costs on the wire")
    p.add_argument("--agents", type=int, default=30)
    p.add_argument("--iters", type=int, default=5, help="rounds")
    p.add_argument("--strategy", choices=[str(s) for s in Strategy], default="atc")
    p.add_argument("--topologies", default="ring,geometric,complete")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, help="output directory (default runs/overhead-<time>)")
    p.add_argument(
        "--runtime",
        choices=("none", "docker"),
        default="none",
        help="docker: also run every row on containers and add its NIC bytes per round",
    )
    p.add_argument("--image", help="--runtime docker: the agents' image (as for run)")
    p.set_defaults(func=overhead)

    from orchestrator.bench import add_parser as add_bench

    add_bench(sub, bench)

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
        type=int,
        default=1,
        metavar="K",
        help="run K agents in each agent process (as for run)",
    )
    p.set_defaults(func=site)

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
    p.set_defaults(func=lab)

    args, forward = parser.parse_known_args(argv)
    if forward and args.func is not lab:
        parser.error(f"unrecognized arguments: {' '.join(forward)}")
    args.forward = forward
    # `docker stop` and friends send SIGTERM: clean up as for Ctrl-C. SIGINT too when the
    # shell started us with it ignored (`privnet run &` in a script). `privnet run` takes
    # both on its event loop while the run goes on (`orchestrator.engines.net.Stop`).
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    # The interpreter's last collections walk every object a command loaded (0.9 s of a
    # stopped run's exit with matplotlib, scipy and networkx, on 2 cores): the process is
    # ending and its memory goes with it, so they are skipped.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    try:
        return args.func(args)
    except ConfigError as exc:
        console.print(f"[red]configuration error:[/red] {exc}")
        return 2
    except Interrupted as exc:
        console.print("[yellow]interrupted; everything started was stopped[/yellow]")
        return 128 + exc.signum


if __name__ == "__main__":
    sys.exit(main())

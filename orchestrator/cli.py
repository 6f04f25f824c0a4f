"""`privnet`: simulate, reproduce the paper, run on a real network."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agent.spec import ConfigError, Rekey, Scheme, Strategy
from orchestrator.experiment import config as configuration
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.problem import Problem
from orchestrator.experiment.topology import RULES, TOPOLOGIES
from orchestrator.report import Curve, results_table, table_console, write_outputs

console = Console(stderr=True)


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
    parser.add_argument("--seed", type=int)
    parser.add_argument("--out", type=Path, help="output directory (default runs/<name>-<time>)")


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
)


def experiment(args: argparse.Namespace, base: ExperimentConfig | None = None) -> ExperimentConfig:
    config = configuration.load(args.config) if args.config else (base or ExperimentConfig())
    return configuration.with_overrides(config, {k: getattr(args, k) for k in OVERRIDES})


def out_dir(args: argparse.Namespace, config: ExperimentConfig, command: str) -> Path:
    out = args.out or Path("runs") / f"{command}-{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def settings(config: ExperimentConfig, engine: str) -> dict[str, Any]:
    return {
        "rule": config.rule,
        "mu": config.mu,
        "sigma_g2": config.sigma_g2,
        "agents": config.agents,
        "iters": config.iters,
        "repeats": config.repeats,
        "topology": config.topology,
        "rekey": str(config.rekey),
        "engine": engine,
    }


def finish(
    out: Path,
    config: ExperimentConfig,
    problem: Problem,
    curves: list[Curve],
    engine: str,
    extra: dict[str, Any] | None = None,
) -> None:
    summary = write_outputs(
        out,
        {**config.to_dict(), **(extra or {})},
        curves,
        settings(config, engine),
        graph=problem.graph,
        q=problem.q,
    )
    table_console().print(results_table(summary["results"]))
    console.print(f"wrote {out}/summary.json, metrics.csv, msd.png, topology.png")


def progress_bar() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
    )


def simulate(
    args: argparse.Namespace, base: ExperimentConfig | None = None, engine: str | None = None
) -> int:
    config = experiment(args, base)
    engine = engine or args.engine
    problem = Problem.build(config)
    out = out_dir(args, config, "simulate")
    runner = _engine(engine)
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
    finish(out, config, problem, curves, engine, {"wall_s": wall})
    return 0


def _engine(name: str) -> Callable[..., list[Curve]]:
    if name == "oracle":
        from orchestrator.engines.oracle import run_oracle

        return run_oracle
    from orchestrator.engines.memory import run_memory

    return run_memory


def reproduce(args: argparse.Namespace) -> int:
    """The paper's preset on the vectorized oracle: 20 repeats, 3 strategies, 4 schemes."""
    base = configuration.load("paper-regression")
    return simulate(args, base, engine="oracle")


def run(args: argparse.Namespace) -> int:
    from orchestrator.engines.netrun import run_network

    base = ExperimentConfig(strategies=(Strategy.ATC,), schemes=(Scheme.LOCAL_GHP,), repeats=1)
    config = experiment(args, base)
    out = out_dir(args, config, "run")
    return asyncio.run(run_network(config, args, out))


def inspect(args: argparse.Namespace) -> int:
    """Audit the wire of a `privnet run --audit` (its live recording, or a pcap of it)."""
    from orchestrator.audit import show_audit

    return show_audit(args.run, args.pcap, args.port)


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
        nic = {}
        for topology in topologies:
            for rekey in Rekey:
                schemes = "all" if rekey is Rekey.ONCE else str(Scheme.LOCAL_GHP)
                nic.update(_docker_nic(args, topology, schemes, rekey, out))
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


def _docker_nic(
    args: argparse.Namespace, topology: str, schemes: str, rekey: Rekey, out: Path
) -> dict[tuple[str, str, str], dict[str, Any]]:
    """`privnet run --runtime docker` of one topology's schemes: each one's NIC figures."""
    where = out / f"docker-{topology}-{rekey}"
    flags = ["--agents", str(args.agents), "--iters", str(args.iters), "--seed", str(args.seed)]
    flags += ["--strategy", args.strategy, "--scheme", schemes, "--rekey", str(rekey)]
    flags += ["--topology", topology, "--repeats", "1", "--out", str(where)]
    image = ["--image", args.image] if args.image else []
    code = main(["run", "--runtime", "docker", *image, *flags])
    if code != 0:
        raise ConfigError(f"the docker run for the NIC column failed (exit {code}); see {where}")
    results = json.loads((where / "summary.json").read_text())["results"]
    return {(topology, r["scheme"], str(rekey)): r["nic"] for r in results}


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
        help="do not spawn agents; wait for --agents of them to register (docker)",
    )
    p.add_argument(
        "--runtime",
        choices=("local", "docker"),
        default="local",
        help="local: agents as processes here; docker: broker and agents in containers "
        "(privnet[docker]), with NIC byte counts",
    )
    p.add_argument(
        "--image",
        help="--runtime docker: the agents' image (default: built from the checkout, "
        "else privnet:<version>)",
    )
    p.add_argument("--run-name", help="topic namespace privnet/<run>/ (default: random)")
    p.add_argument(
        "--deadline",
        type=float,
        default=30.0,
        help="seconds of silence before a run is declared failed",
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
    p.set_defaults(func=run)

    p = sub.add_parser("inspect", help="audit the wire of a `privnet run --audit`")
    p.add_argument("--run", type=Path, required=True, help="the run's --out directory")
    p.add_argument("--pcap", type=Path, help="audit this capture of the broker port instead")
    p.add_argument("--port", type=int, help="broker port in the pcap (default: the run's)")
    p.set_defaults(func=inspect)

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

    args = parser.parse_args(argv)
    # `docker stop` and friends send SIGTERM: clean up as for Ctrl-C.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return args.func(args)
    except ConfigError as exc:
        console.print(f"[red]configuration error:[/red] {exc}")
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; everything started was stopped[/yellow]")
        return 130


if __name__ == "__main__":
    sys.exit(main())

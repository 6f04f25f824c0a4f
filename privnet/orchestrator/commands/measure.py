"""What a run costs and shows: `privnet inspect` (the audit of a run's wire), `privnet
overhead` (what each privacy scheme costs on the wire) and `privnet bench` (rounds/s against
the transport's ceiling)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from privnet.agent.spec import ConfigError, Rekey, Scheme, Strategy
from privnet.orchestrator.commands.experiment import experiment
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.topology import TOPOLOGIES, parse_topology, written
from privnet.orchestrator.terminal import console, progress_bar, table_console

Entry = Callable[[list[str]], int]  # a command line's entry point: argv -> exit code


def inspect(args: argparse.Namespace, _: None) -> int:
    """Audit the wire of a `privnet run --audit` (its live recording, or a pcap of it)."""
    from privnet.orchestrator.audit import AttackPlan, show_audit

    plan = AttackPlan(args.neighbour, args.coalition) if args.attack else None
    return show_audit(args.run, args.pcap, args.port, plan)


def inspect_config(args: argparse.Namespace) -> None:
    """The run's directory and the pcap, before the audit reads them."""
    if not args.run.is_dir():
        raise ConfigError(f"--run {args.run}: no such directory; give a `privnet run --out` one")
    if args.pcap is not None and not args.pcap.is_file():
        raise ConfigError(f"--pcap {args.pcap}: no such file")


def overhead(cli: Entry, args: argparse.Namespace, base: ExperimentConfig) -> int:
    """What privacy costs on the wire, per scheme and re-key policy, on three topologies;
    with --runtime docker, each row also run on containers by `cli` (`privnet run`)."""
    from privnet.orchestrator import overhead as cost

    topologies = tuple(t.strip() for t in args.topologies.split(","))
    out = args.out or Path("runs") / f"overhead-{time.strftime('%Y%m%d-%H%M%S')}"
    wire = None
    if args.runtime == "docker":
        wire = {
            (where, str(scheme), str(rekey)): _docker_wire(cli, args, where, scheme, rekey, out)
            for where in topologies
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


def overhead_config(args: argparse.Namespace) -> ExperimentConfig:
    """The topologies and --out checked; the experiment every row plays."""
    topologies = [t.strip() for t in args.topologies.split(",")]
    unknown = [t for t in topologies if t.partition(":")[0] not in TOPOLOGIES or t == "file"]
    if unknown:
        raise ConfigError(
            f"unknown topologies {unknown}; choose from "
            + ", ".join(written(t) for t in TOPOLOGIES if t != "file")
        )
    for name in topologies:
        parse_topology(name)
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file: give a directory (made if missing)")
    return ExperimentConfig(agents=args.agents, iters=args.iters, seed=args.seed)


def _docker_wire(
    cli: Entry, args: argparse.Namespace, topology: str, scheme: Scheme, rekey: Rekey, out: Path
) -> dict[str, Any]:
    """`privnet run --runtime docker` of one row (the NIC window spans a whole run): its
    summary's `nic` and `broker_sys` figures."""
    where = out / f"docker-{topology}-{scheme}-{rekey}"
    flags = ["--agents", str(args.agents), "--iters", str(args.iters), "--seed", str(args.seed)]
    flags += ["--strategy", args.strategy, "--scheme", str(scheme), "--rekey", str(rekey)]
    flags += ["--topology", topology, "--repeats", "1", "--out", str(where)]
    image = ["--image", args.image] if args.image else []
    code = cli(["run", "--runtime", "docker", *image, *flags])
    if code != 0:
        raise ConfigError(f"the docker run for the NIC column failed (exit {code}); see {where}")
    config: dict[str, Any] = json.loads((where / "summary.json").read_text())["config"]
    return {k: config[k] for k in ("nic", "broker_sys") if k in config}


def bench(args: argparse.Namespace, _: None) -> int:
    """rounds/s of privnet against its transport's ceiling and the memory engine."""
    from privnet.orchestrator.bench import Sitting, bench  # gmqtt: loaded only to measure

    sitting = Sitting(
        brokers=tuple(args.brokers.split(",")),
        schemes=tuple(Scheme(s) for s in args.schemes.split(",")),
        agents=tuple(int(n) for n in str(args.agents).split(",")),
        iters=args.iters,
        strategy=Strategy(args.strategy),
        repeats=args.repeats,
        seed=args.seed,
        workers=args.workers,
        extra=args.extra,
        against=args.against,
        out=args.out,
        params=args.params,
        base=args.base,
    )
    return bench(sitting)


def bench_config(parser: Callable[[], argparse.ArgumentParser], args: argparse.Namespace) -> None:
    """--extra and --against hold `privnet run` flags: checked as that command checks them
    (`parser` builds the whole command line's parser)."""
    parser().parse_args(["run", *args.extra.split(), *args.against.split()])
    args.base = experiment(parser().parse_args(["run", *args.extra.split()]))
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file: give a directory (made if missing)")

"""`privnet robustness`: the table of what Byzantine agents do, per attack x scheme x defense
(privnet.orchestrator.robustness)."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from privnet.agent import attacks, defenses
from privnet.agent.spec import ConfigError, Scheme, Strategy
from privnet.orchestrator import robustness as table
from privnet.orchestrator.experiment.config import ExperimentConfig, load, parse_choices
from privnet.orchestrator.terminal import console, progress_bar


def flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--attacks", default=",".join(table.ALL_ATTACKS), help="a comma list")
    p.add_argument("--schemes", default="all", help="a comma list, or all")
    p.add_argument("--defenses", default=",".join(table.ALL_DEFENSES), help="a comma list")
    p.add_argument("--attackers", default="1,3", help="how many attackers: a comma list of 1, 3")
    p.add_argument(
        "--config",
        default="paper-regression",
        help="the problem: a preset (paper-regression: V-A; paper-classification: Adult) or a "
        "TOML file; its agents, rounds, repeats and seed are the flags below",
    )
    p.add_argument("--agents", type=int, default=30)
    p.add_argument("--iters", type=int, default=300, help="rounds a run")
    p.add_argument("--repeats", type=int, default=1, help="runs a cell")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, help="output directory (default runs/robustness-<time>)")


def robustness_config(args: argparse.Namespace) -> ExperimentConfig:
    """Every list checked before the first run (an attack, a defense, a count unknown)."""
    for name in args.attacks.split(","):
        attacks.parse(name)
    for name in args.defenses.split(","):
        defenses.parse(name)
    counts = [c.strip() for c in args.attackers.split(",")]
    if any(c not in ("1", "3") for c in counts):
        raise ConfigError(f"--attackers {args.attackers!r}: give 1, 3 or 1,3")
    if args.agents <= max(table.ATTACKERS[int(c)] for c in counts)[-1]:
        raise ConfigError(f"--agents {args.agents}: the attackers are agents 7, 15 and 23")
    return replace(
        load(args.config),
        agents=args.agents, iters=args.iters, repeats=args.repeats, seed=args.seed,
        strategies=(Strategy.ATC,),
    )  # fmt: skip


def robustness(args: argparse.Namespace, base: ExperimentConfig) -> int:
    kinds = [a.strip() for a in args.attacks.split(",")]
    names = [d.strip() for d in args.defenses.split(",")]
    counts = [int(c) for c in args.attackers.split(",")]
    schemes = parse_choices(args.schemes, Scheme)
    out = args.out or Path("runs") / f"robustness-{time.strftime('%Y%m%d-%H%M%S')}"
    runs = sum(1 + len(kinds) * len(counts) for d in names if any(
        table.applicable(d, s) for s in schemes))  # fmt: skip
    with progress_bar() as bar:
        task = bar.add_task("robustness", total=runs, status="")
        cells = table.robustness(
            base, kinds, schemes, names, counts,
            lambda name: bar.update(task, advance=1, status=name),
        )  # fmt: skip
    table.write(cells, base, out)
    console.print(table.markdown(cells, base))
    console.print(f"wrote {out}/robustness.json, robustness.md and robustness.png")
    return 0

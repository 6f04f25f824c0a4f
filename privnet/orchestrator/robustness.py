"""`privnet robustness`: what Byzantine agents do to the honest ones, per attack x scheme x
defense, with 1 and with 3 attackers (issue 34).

Every cell is measured: the honest agents' steady-state average MSD (the last fifth of the
rounds, in dB; the attackers' models left out) against the same scheme and defense with no
attacker. The cells run on the memory engine, the agents' own cores with every frame through
the wire codec: `privnet run` computes the same models (tests/test_byzantine_net.py holds
networked == memory for every defense, attackers included), and the memory engine runs the
table's hundreds of cells in minutes on one core.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from privnet.agent import attacks, defenses
from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.engines.memory import run_memory
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance

# Attackers spread over the ids (the geometric graph's ids carry no position).
ATTACKERS = {1: (7,), 3: (7, 15, 23)}
STEADY = 0.2  # the last fifth of the rounds


@dataclass(frozen=True)
class Cell:
    attack: str  # "" for the no-attacker run
    scheme: str
    defense: str
    attackers: int
    honest_db: float  # honest agents' steady-state average MSD, dB
    clean_db: float  # the same scheme and defense without attackers
    runs: int  # repeats behind the number
    rounds_per_s: float

    @property
    def delta_db(self) -> float:
        return self.honest_db - self.clean_db


def applicable(defense: str, scheme: Scheme) -> bool:
    return not (defenses.parse(defense).kind.sees_messages and scheme.masked)


def steady_db(msd: np.ndarray) -> float:
    """(repeats, iters) linear MSD -> the mean of its last fifth, in dB."""
    tail = max(1, int(msd.shape[1] * STEADY))
    return float(10 * np.log10(np.mean(msd[:, -tail:])))


def _measure(
    config: ExperimentConfig, schemes: tuple[Scheme, ...]
) -> dict[str, tuple[float, float]]:
    """scheme -> (honest steady-state dB, rounds/s) of one memory-engine run."""
    curves = run_memory(Instance.build(config), schemes=schemes)
    return {c.scheme: (steady_db(c.msd_avg), c.rounds_per_s) for c in curves}


def robustness(
    base: ExperimentConfig,
    kinds: Iterable[str],
    schemes: Iterable[Scheme],
    names: Iterable[str],
    counts: Iterable[int],
    progress: Callable[[str], None] | None = None,
) -> list[Cell]:
    """Every cell: for each defense, the no-attacker run and each attack x count, all its
    schemes in one run (sessions one after another)."""
    cells: list[Cell] = []
    schemes, counts = tuple(schemes), tuple(counts)
    for defense in names:
        lanes = tuple(s for s in schemes if applicable(defense, s))
        if not lanes:
            continue
        config = replace(base, strategies=(Strategy.ATC,), schemes=lanes, defense=defense)
        if progress is not None:
            progress(f"{defense} without attackers")
        clean = _measure(replace(config, byzantine=""), lanes)
        for s in lanes:
            cells.append(
                Cell("", s, defense, 0, clean[s][0], clean[s][0], base.repeats, clean[s][1])
            )
        for count in counts:
            ids = ",".join(str(i) for i in ATTACKERS[count])
            for kind in kinds:
                if progress is not None:
                    progress(f"{defense} {count}x{kind}")
                got = _measure(replace(config, byzantine=f"{ids}:{kind}"), lanes)
                cells += [
                    Cell(kind, s, defense, count, got[s][0], clean[s][0], base.repeats, got[s][1])
                    for s in lanes
                ]
    return cells


def markdown(cells: list[Cell], config: ExperimentConfig) -> str:
    """The table: a row per attack x attackers x defense, a column per scheme; each cell the
    change of the honest agents' MSD against no attacker, dB (the no-attacker rows: the MSD)."""
    schemes = list(dict.fromkeys(c.scheme for c in cells))
    rows: dict[tuple[str, int, str], dict[str, Cell]] = {}
    for c in cells:
        rows.setdefault((c.attack or "(no attacker)", c.attackers, c.defense), {})[c.scheme] = c
    head = (
        f"{config.agents} agents, {config.topology}, ATC, {config.iters} rounds, "
        f"{config.repeats} run(s) a cell, seed {config.seed}; honest agents' steady-state "
        "average MSD change vs no attacker, dB (no-attacker rows: the MSD itself, dB)\n\n"
    )
    lines = ["| attack | attackers | defense | " + " | ".join(schemes) + " |"]
    lines.append("|---|---|---|" + "---|" * len(schemes))
    for (attack, count, defense), by in rows.items():
        values = [
            "n/a (refused)" if s not in by
            else f"{by[s].honest_db:.1f}" if count == 0 else f"{by[s].delta_db:+.1f}"
            for s in schemes
        ]  # fmt: skip
        lines.append(f"| {attack} | {count} | {defense} | " + " | ".join(values) + " |")
    return head + "\n".join(lines) + "\n"


def write(cells: list[Cell], config: ExperimentConfig, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = [asdict(c) | {"delta_db": c.delta_db} for c in cells]
    meta = {"config": config.to_dict(), "made": time.strftime("%Y-%m-%d %H:%M:%S")}
    (out / "robustness.json").write_text(json.dumps(meta | {"cells": rows}, indent=1))
    (out / "robustness.md").write_text(markdown(cells, config))


ALL_ATTACKS = tuple(k.value for k in attacks.Kind)
ALL_DEFENSES = tuple(k.value for k in defenses.Kind)

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
from privnet.orchestrator.curves import Curve
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
    honest_error: float | None = None  # classification: steady-state test error, points
    clean_error: float | None = None
    # per run (repeat r against the clean run's repeat r: the same data), for the spread
    run_db: tuple[float, ...] = ()
    clean_run_db: tuple[float, ...] = ()
    run_error: tuple[float, ...] = ()
    clean_run_error: tuple[float, ...] = ()

    @property
    def delta_db(self) -> float:
        return self.honest_db - self.clean_db

    @property
    def delta_points(self) -> float | None:
        if self.honest_error is None or self.clean_error is None:
            return None
        return self.honest_error - self.clean_error

    def spread_db(self) -> tuple[float, float] | None:
        """The lowest and highest of the runs' own changes, dB (None: one run)."""
        return _spread(self.run_db, self.clean_run_db)

    def spread_points(self) -> tuple[float, float] | None:
        return _spread(self.run_error, self.clean_run_error)


def _spread(got: tuple[float, ...], clean: tuple[float, ...]) -> tuple[float, float] | None:
    if len(got) < 2 or len(got) != len(clean):
        return None
    deltas = [g - c for g, c in zip(got, clean, strict=True)]
    return min(deltas), max(deltas)


def applicable(defense: str, scheme: Scheme) -> bool:
    return not (defenses.parse(defense).kind.sees_messages and scheme.masked)


def steady_db(msd: np.ndarray) -> float:
    """(repeats, iters) linear MSD -> the mean of its last fifth, in dB."""
    tail = max(1, int(msd.shape[1] * STEADY))
    return float(10 * np.log10(np.mean(msd[:, -tail:])))


def run_dbs(msd: np.ndarray) -> tuple[float, ...]:
    """steady_db of each repeat alone."""
    return tuple(steady_db(row[None, :]) for row in msd)


# (honest dB, rounds/s, test error in points, each run's dB, each run's error)
Measured = tuple[float, float, float | None, tuple[float, ...], tuple[float, ...]]


def steady_error(curve: Curve) -> float | None:
    """The honest agents' average test error over the last fifth, in points (None: the
    problem does not classify)."""
    series = curve.series.get("test_error_avg")
    return None if series is None else _steady_points(series)


def _steady_points(series: np.ndarray) -> float:
    """The mean of the last fifth of `series` (repeats x rounds), in points."""
    tail = max(1, int(series.shape[1] * STEADY))
    return float(100 * np.nanmean(series[:, -tail:]))


def run_errors(curve: Curve) -> tuple[float, ...]:
    """steady_error of each repeat alone (empty: the problem does not classify)."""
    series = curve.series.get("test_error_avg")
    return () if series is None else tuple(_steady_points(row[None, :]) for row in series)


def _measure(config: ExperimentConfig, schemes: tuple[Scheme, ...]) -> dict[str, Measured]:
    """scheme -> (honest steady-state dB, rounds/s, test error) of one memory-engine run."""
    curves = run_memory(Instance.build(config), schemes=schemes)
    return {
        c.scheme: (steady_db(c.msd_avg), c.rounds_per_s, steady_error(c), run_dbs(c.msd_avg),
                   run_errors(c))
        for c in curves
    }  # fmt: skip


def _cell(kind: str, s: str, defense: str, count: int, got: Measured, clean: Measured,
          runs: int) -> Cell:  # fmt: skip
    return Cell(kind, s, defense, count, got[0], clean[0], runs, got[1], got[2], clean[2],
                got[3], clean[3], got[4], clean[4])  # fmt: skip


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
        cells += [_cell("", s, defense, 0, clean[s], clean[s], base.repeats) for s in lanes]
        for count in counts:
            ids = ",".join(str(i) for i in ATTACKERS[count])
            for kind in kinds:
                if progress is not None:
                    progress(f"{defense} {count}x{kind}")
                got = _measure(replace(config, byzantine=f"{ids}:{kind}"), lanes)
                cells += [
                    _cell(kind, s, defense, count, got[s], clean[s], base.repeats) for s in lanes
                ]
    return cells


def _value(c: Cell) -> str:
    """One cell: the change in dB (and in test-error points when it classifies); the
    no-attacker rows give the MSD (and the error) itself."""
    if c.attackers == 0:
        text = f"{c.honest_db:.1f}"
        return text if c.honest_error is None else f"{text} ({c.honest_error:.1f} %)"
    text = f"{c.delta_db:+.1f}" + _range(c.spread_db())
    points = c.delta_points
    return text if points is None else f"{text} ({points:+.1f} pt{_range(c.spread_points())})"


def _range(spread: tuple[float, float] | None) -> str:
    """' [lowest, highest]' of the runs' own changes when there are several, else ''."""
    return "" if spread is None else f" [{spread[0]:+.1f}, {spread[1]:+.1f}]"


def markdown(cells: list[Cell], config: ExperimentConfig) -> str:
    """The table: a row per attack x attackers x defense, a column per scheme; each cell the
    change of the honest agents' MSD against no attacker, dB (the no-attacker rows: the MSD),
    and the runs behind each of the row's cells."""
    schemes = list(dict.fromkeys(c.scheme for c in cells))
    rows: dict[tuple[str, int, str], dict[str, Cell]] = {}
    for c in cells:
        rows.setdefault((c.attack or "(no attacker)", c.attackers, c.defense), {})[c.scheme] = c
    scored = any(c.honest_error is not None for c in cells)
    head = (
        f"{config.name or config.problem}: {config.agents} agents, {config.topology}, ATC, "
        f"{config.iters} rounds, seed {config.seed}; honest agents' steady-state average MSD "
        "change vs the same scheme and defense without attackers, dB (no-attacker rows: the "
        "MSD itself, dB)"
        + ("; in brackets the test error's change, points (no-attacker rows: the error)"
           if scored else "")
        + ("; after a change, [lowest, highest] of its runs' own changes (each run against the "
           "no-attacker run on the same data)" if any(c.runs > 1 for c in cells) else "")
        + "\n\n"
    )  # fmt: skip
    lines = ["| attack | attackers | defense | runs | " + " | ".join(schemes) + " |"]
    lines.append("|---|---|---|---|" + "---|" * len(schemes))
    for (attack, count, defense), by in rows.items():
        values = [_value(by[s]) if s in by else "n/a (refused)" for s in schemes]
        runs = min(c.runs for c in by.values())
        lines.append(f"| {attack} | {count} | {defense} | {runs} | " + " | ".join(values) + " |")
    return head + "\n".join(lines) + "\n"


def figure(cells: list[Cell], path: Path) -> None:
    """The table as a heat map per defense: attack x attackers down, scheme across, the
    change in dB in each square ("refused" where the scheme refuses the defense, "not run"
    where a partial sitting left the cell out)."""
    from matplotlib.figure import Figure

    defenses_ = list(dict.fromkeys(c.defense for c in cells))
    schemes = list(dict.fromkeys(c.scheme for c in cells))
    attacked = [c for c in cells if c.attackers]
    rows = list(dict.fromkeys((c.attack, c.attackers) for c in attacked))
    fig = Figure(figsize=(3.2 * len(defenses_) + 1, 0.32 * len(rows) + 1.6), layout="constrained")
    axes = fig.subplots(1, len(defenses_), squeeze=False, sharey=True)[0]
    image = None
    for ax, defense in zip(axes, defenses_, strict=True):
        grid = np.full((len(rows), len(schemes)), np.nan)
        for c in attacked:
            if c.defense == defense:
                grid[rows.index((c.attack, c.attackers)), schemes.index(c.scheme)] = c.delta_db
        image = ax.imshow(np.clip(grid, -5, 60), cmap="magma_r", vmin=-5, vmax=60, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            blank = "refused" if not applicable(defense, Scheme(schemes[j])) else "not run"
            text = blank if np.isnan(v) else f"{v:+.0f}"
            colour = "grey" if np.isnan(v) else "white" if v >= 15 else "black"
            ax.text(j, i, text, ha="center", va="center", fontsize=6, color=colour)
        ax.set_title(f"defense: {defense}", fontsize=9)
        ax.set_xticks(range(len(schemes)), schemes, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(rows)), [f"{a} x{n}" for a, n in rows], fontsize=7)
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="honest MSD change, dB")
    fig.savefig(path, dpi=130)


def write(cells: list[Cell], config: ExperimentConfig, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = [asdict(c) | {"delta_db": c.delta_db} for c in cells]
    meta = {"config": config.to_dict(), "made": time.strftime("%Y-%m-%d %H:%M:%S")}
    (out / "robustness.json").write_text(json.dumps(meta | {"cells": rows}, indent=1))
    (out / "robustness.md").write_text(markdown(cells, config))
    figure(cells, out / "robustness.png")


ALL_ATTACKS = tuple(k.value for k in attacks.Kind)
ALL_DEFENSES = tuple(k.value for k in defenses.Kind)

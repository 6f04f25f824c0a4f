"""`privnet robustness --repeats N` (issue 34): each cell keeps its runs' own numbers, and the
table gives their range beside the pooled change."""

from __future__ import annotations

from dataclasses import replace

from privnet.agent.spec import Scheme
from privnet.orchestrator import robustness as table
from privnet.orchestrator.experiment.config import ExperimentConfig, load


def test_several_runs_give_each_runs_change_and_their_range() -> None:
    base = ExperimentConfig(iters=6, seed=2, repeats=3)
    cells = table.robustness(base, ["sign-flip"], [Scheme.NONE], ["none"], [3])
    clean, attacked = cells
    assert attacked.runs == 3 and len(attacked.run_db) == 3 == len(attacked.clean_run_db)
    assert attacked.clean_run_db == clean.run_db  # each run against the same data's clean run
    low, high = attacked.spread_db() or (0.0, -1.0)
    assert low < high  # three data sets: three different changes
    # the pooled change (a ratio of sums) lies between the runs' own (ratios)
    assert low <= attacked.delta_db <= high
    row = next(line for line in table.markdown(cells, base).splitlines() if "sign-flip" in line)
    assert row.endswith(f"| 3 | {attacked.delta_db:+.1f} [{low:+.1f}, {high:+.1f}] |")


def test_one_run_has_no_range_and_its_own_number_is_the_cell() -> None:
    base = ExperimentConfig(iters=6, seed=2)
    cells = table.robustness(base, ["sign-flip"], [Scheme.NONE], ["none"], [1])
    assert all(c.spread_db() is None and c.run_db == (c.honest_db,) for c in cells)
    assert "[" not in table.markdown(cells, base).split("\n\n", 1)[1]


def test_classification_runs_give_the_errors_range_too() -> None:
    base = replace(load("paper-classification"), agents=24, iters=4, repeats=2)
    cells = table.robustness(base, ["sign-flip"], [Scheme.NONE], ["none"], [3])
    attacked = cells[1]
    assert len(attacked.run_error) == 2 and attacked.spread_points() is not None
    assert " pt [" in table.markdown(cells, base)

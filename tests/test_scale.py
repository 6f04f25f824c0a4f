"""Large networks complete and compute what the memory engine computes (not timed: the
numbers live in `privnet bench`): 100 agents, one process each; 200 agents, 50 per process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from probes import read_metrics

from privnet.broker.launcher import has_mosquitto
from privnet.orchestrator.cli import main

pytestmark = pytest.mark.net

BROKER = "mosquitto" if has_mosquitto() else "embedded"


def run_and_compare(tmp_path: Path, agents: int, *flags: str) -> None:
    config = ["--agents", str(agents), "--iters", "3", "--seed", "5", "--strategy", "atc"]
    config += ["--scheme", "none,local-ghp"]
    net, memory = tmp_path / "net", tmp_path / "memory"
    assert main(["run", *config, "--broker", BROKER, "--out", str(net), *flags]) == 0
    assert main(["simulate", "--engine", "memory", *config, "--out", str(memory)]) == 0
    got, want = read_metrics(net / "metrics.csv"), read_metrics(memory / "metrics.csv")
    assert got.keys() == want.keys() and len(want) == 2
    for key, (centroid, average) in want.items():
        np.testing.assert_allclose(got[key][0], centroid, rtol=1e-9, err_msg=f"{key} centroid")
        np.testing.assert_allclose(got[key][1], average, rtol=1e-9, err_msg=f"{key} average")


def test_hundred_agents_one_process_each_equal_the_memory_engine(tmp_path: Path) -> None:
    run_and_compare(tmp_path, 100)
    assert len(list((tmp_path / "net" / "logs").glob("agent-*.log"))) == 100


def test_two_hundred_agents_fifty_per_process_equal_the_memory_engine(tmp_path: Path) -> None:
    run_and_compare(tmp_path, 200, "--agents-per-process", "50")
    logs = sorted(p.name for p in (tmp_path / "net" / "logs").glob("agents-*.log"))
    assert logs == ["agents-0-49.log", "agents-100-149.log", "agents-150-199.log",
                    "agents-50-99.log"]  # fmt: skip

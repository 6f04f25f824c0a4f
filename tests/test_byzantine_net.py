"""Issue 34 on the real wire: Byzantine agents as real processes over mosquitto (sealed
links, their own keys), honest hubs defending; the run's models are the memory engine's,
for every defense, attackers included."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import need_mosquitto

import privnet
from privnet.orchestrator.cli import main

pytestmark = pytest.mark.net

LATTICE_RTOL = 1e-6  # the masked schemes' terms on the noise grid (as tests/runs.py)
# (schemes, defense, attackers): every defense, every attack, every scheme
CASES = [
    ("none,ghp", "clip", "1:alie;4:dissensus;6:gaussian:sigma=2"),
    ("none,random", "trim:b=1", "2:sign-flip;5:large-norm"),
    ("local-ghp,masked-ghp", "clip-step", "3:ipm;7:label-flip;1:alie"),
    ("masked-ghp", "none", "0:sign-flip;8:dissensus"),
]


@pytest.mark.parametrize(("schemes", "defense", "byzantine"), CASES)
def test_a_byzantine_run_over_mosquitto_equals_the_memory_engine(
    schemes: str, defense: str, byzantine: str, tmp_path: Path
) -> None:
    need_mosquitto()
    flags = ["--agents", "10", "--iters", "12", "--seed", "7", "--strategy", "atc"]
    flags += ["--scheme", schemes, "--defense", defense, "--byzantine", byzantine]
    assert main(["run", *flags, "--broker", "mosquitto", "--out", str(tmp_path)]) == 0
    net = np.load(tmp_path / "models.npz")
    exp = privnet.Experiment(
        agents=10, iters=12, seed=7, strategies="atc", schemes=schemes,
        defense=defense, byzantine=byzantine,
    )  # fmt: skip
    memory = privnet.simulate(exp, "memory")
    assert memory.models.keys() == set(net.keys())
    for key, models in memory.models.items():
        scale = np.abs(models).max()
        np.testing.assert_allclose(net[key], models, rtol=0, atol=LATTICE_RTOL * scale, err_msg=key)
        assert np.abs(models).max() < 1e12  # the attack ran (no inf), and was compared
    # the attackers' models are left out of the honest metrics and reported apart
    ids = sorted(int(i) for g in byzantine.split(";") for i in g.split(":")[0].split(","))
    summary = json.loads((tmp_path / "summary.json").read_text())
    for record in [*memory.records, *summary["results"]]:
        assert record["byzantine"] == ids
        assert np.isfinite(record["byzantine_msd_avg_db"])

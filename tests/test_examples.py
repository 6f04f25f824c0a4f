"""Every script under examples/ runs as a user runs it (`python examples/x.py`, in another
directory), a few rounds on the memory engine, and says what its docstring promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need_torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ROOT = EXAMPLES.parent
FLOAT = r"([-+]?[0-9.]+(?:e[-+]?[0-9]+)?)"


def run(name: str, *flags: str, cwd: Path) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--engine", "memory", *flags],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_every_example_is_tested() -> None:
    assert {p.name for p in EXAMPLES.glob("*.py")} == {
        "custom_problem.py",
        "custom_dataset.py",
        "custom_partition.py",
        "torch_mlp.py",
        "torch_cnn.py",
    }


def test_custom_problem(tmp_path: Path) -> None:
    out = run("custom_problem.py", "--iters", "60", cwd=tmp_path)
    msd = {s: float(v) for s, v in re.findall(rf"atc/(\S+): MSD .* {FLOAT} dB", out)}
    assert set(msd) == {"none", "local-ghp"}
    assert msd["none"] < -30 and abs(msd["none"] - msd["local-ghp"]) < 0.01  # masks cancel
    assert not list(tmp_path.iterdir())  # simulate writes no files unless given `out`


@pytest.mark.parametrize("name", ["custom_dataset.py", "custom_partition.py"])
def test_custom_data(name: str, tmp_path: Path) -> None:
    out = run(name, "--iters", "10", cwd=tmp_path)
    first, last = (float(v) for v in re.search(rf"{FLOAT} -> {FLOAT}", out).groups())  # type: ignore[union-attr]
    assert 0 < last < 0.35 and last <= first + 0.05, out  # better than chance (0.5)


def test_torch_mlp(tmp_path: Path) -> None:
    need_torch()
    out = run("torch_mlp.py", "--agents", "4", "--iters", "3", cwd=tmp_path)
    assert "model: 2442 parameters" in out
    gap = float(re.search(rf"w\(none\)\| .*: {FLOAT}", out).group(1))  # type: ignore[union-attr]
    assert gap < 1e-5  # local-ghp rounds each weighted term to the noise grid, 2^-24
    rows = re.findall(rf"^\s+(\d+)\s+{FLOAT}\s+{FLOAT}$", out, re.M)
    assert [int(r) for r, _, _ in rows] == [1, 2, 3]
    assert all(a == b for _, a, b in rows)  # the same accuracy, to the printed digit
    assert re.search(r"none: [0-9.]+ rounds/s, [0-9,]+ bytes/round", out)


def test_torch_cnn(tmp_path: Path) -> None:
    """The CNN of over 100k parameters, float32 on the u4 wire: none and local-ghp agree to
    the lattice's rounding (measured, 150 rounds: docs/tasks/big-models.md)."""
    need_torch()
    out = run("torch_cnn.py", "--agents", "4", "--iters", "3", cwd=tmp_path)
    assert "model: 121354 parameters" in out
    gap = float(re.search(rf"w\(none\)\| .*: {FLOAT}", out).group(1))  # type: ignore[union-attr]
    assert 0 < gap < 1e-5
    rows = re.findall(rf"^\s+(\d+)\s+{FLOAT}\s+{FLOAT}\s+{FLOAT}$", out, re.M)
    assert [int(r) for r, _, _, _ in rows] == [1, 2, 3]
    assert all(a == b and 0 <= float(apart) <= gap for _, a, b, apart in rows)
    assert len(re.findall(r"rounds/s, [0-9,]+ bytes/round \(u4 wire, 4\.0\d+ bytes", out)) == 2

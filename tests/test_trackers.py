"""`--tensorboard DIR` and `--mlflow`: a run's metrics read back by each tool's own reader
(TensorBoard's EventAccumulator, MLflow's MlflowClient) hold the same per-round values as
its metrics.csv, and summary.json's bytes and epsilon."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray

from privnet.agent.spec import ConfigError
from privnet.orchestrator.trackers import Trackers

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("strategy", "scheme", "repeat")
Series = dict[tuple[str, str, str], dict[str, dict[int, float]]]


def _privnet(args: list[str], cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "privnet", "--quiet", *args]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stderr}"


def _csv(path: Path) -> Series:
    """metrics.csv as session -> column -> round -> value (empty cells and NaN left out)."""
    out: Series = defaultdict(dict)
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            key = (row["strategy"], row["scheme"], row["repeat"])
            for name, value in row.items():
                if name not in (*KEYS, "iter") and value != "" and not math.isnan(float(value)):
                    out[key].setdefault(name, {})[int(row["iter"])] = float(value)
    return out


def _tensorboard(logdir: Path, key: tuple[str, str, str]) -> dict[str, dict[int, float]]:
    events = EventAccumulator(str(logdir.joinpath(*key)), size_guidance={"tensors": 0})
    events.Reload()
    return {
        tag: {e.step: float(make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)}
        for tag in events.Tags()["tensors"]
    }


def _mlflow(uri: str) -> dict[tuple[str, str, str], tuple[dict[str, dict[int, float]], dict]]:
    client = MlflowClient(tracking_uri=uri)
    (experiment,) = [e for e in client.search_experiments() if e.name.startswith("privnet/")]
    found = {}
    for run in client.search_runs([experiment.experiment_id]):
        tags = run.data.tags
        key = (tags["strategy"], tags["scheme"], tags["repeat"])
        metrics = {
            name: {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)}
            for name in run.data.metrics
        }
        found[key] = (metrics, run.data.params)
    return found


def _same(got: dict[int, float], want: dict[int, float], rtol: float) -> None:
    assert sorted(got) == sorted(want)
    for step, value in want.items():
        if math.isinf(value):  # MLflow's SQLite store keeps inf as the largest float
            assert got[step] >= np.finfo(np.float64).max or math.isinf(got[step])
        else:
            assert got[step] == pytest.approx(value, rel=rtol, abs=0), step


def _check(out: Path, logdir: Path, uri: str, iters: int) -> None:
    want = _csv(out / "metrics.csv")
    summary = json.loads((out / "summary.json").read_text())
    records = {(r["strategy"], r["scheme"]): r for r in summary["results"]}
    logged = _mlflow(uri)
    assert sorted(logged) == sorted(want)  # one MLflow run per strategy x scheme x repeat
    for key, columns in want.items():
        record = records[key[:2]]
        board = _tensorboard(logdir, key)
        metrics, params = logged[key]
        for name, rounds in columns.items():
            _same(board[name], rounds, rtol=1e-7)  # float32 in the event file
            _same(metrics[name], rounds, rtol=1e-15)
        assert params["agents"] == str(summary["config"]["agents"])
        assert params["seed"] == str(summary["config"]["seed"])
        for name, value in record["bytes"].items():
            assert board[f"summary/bytes/{name}"] == {iters: pytest.approx(value)}
            assert metrics[f"summary/bytes/{name}"] == {iters: value}
        assert metrics["summary/bytes_per_round"] == {iters: record["bytes_per_round"]}
        if "privacy" in record:
            epsilon = float(record["privacy"]["epsilon_network"])
            _same(board["summary/privacy/epsilon_network"], {iters: epsilon}, 1e-7)
            _same(metrics["summary/privacy/epsilon_network"], {iters: epsilon}, 1e-15)


def test_simulate_writes_tensorboard_and_mlflow(tmp_path: Path) -> None:
    iters = 6
    flags = ["--agents", "4", "--iters", str(iters), "--repeats", "2", "--strategy", "atc"]
    flags += ["--scheme", "none,local-ghp", "--engine", "memory", "--account", "--seed", "3"]
    logdir = tmp_path / "tb"
    flags += ["--out", "out", "--tensorboard", str(logdir), "--mlflow"]
    _privnet(["simulate", *flags], tmp_path)
    out = tmp_path / "out"
    assert "epsilon_network" in (out / "metrics.csv").read_text().split("\n")[0]
    _check(out, logdir, f"sqlite:///{out / 'mlflow.db'}", iters)


@pytest.mark.net
def test_run_writes_tensorboard_and_mlflow(tmp_path: Path) -> None:
    iters = 5
    flags = ["--agents", "4", "--iters", str(iters), "--scheme", "local-ghp"]  # a secret seed
    logdir, store = tmp_path / "tb", tmp_path / "store.db"
    flags += ["--out", "net", "--tensorboard", str(logdir), "--mlflow-uri", f"sqlite:///{store}"]
    _privnet(["run", *flags], tmp_path)
    assert len(_csv(tmp_path / "net" / "metrics.csv")[("atc", "local-ghp", "0")]) >= 2
    _check(tmp_path / "net", logdir, f"sqlite:///{store}", iters)
    secret = json.loads((tmp_path / "net" / "secrets.json").read_text())["seed"]
    ((_, params),) = _mlflow(f"sqlite:///{store}").values()
    assert str(secret) not in params.values()  # MLflow shows the seed summary.json shows


def test_trackers_say_where_and_what_is_missing(tmp_path: Path) -> None:
    trackers = Trackers.of(None, True, None, tmp_path)
    assert trackers.mlflow == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert Trackers.of(None, False, "http://127.0.0.1:5000", None).mlflow == (
        "http://127.0.0.1:5000"
    )
    assert Trackers.of(None, False, None, tmp_path) == Trackers(None, None)
    with pytest.raises(ConfigError, match="give a tracking URI"):
        Trackers.of(None, True, " ", tmp_path)


def test_missing_extra_is_named(tmp_path: Path) -> None:
    """Without the package, the error names the extra to install, before anything runs."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('tensorboard', 'mlflow'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    for flag, extra in (("--tensorboard=tb", "tensorboard"), ("--mlflow", "mlflow")):
        cmd = [sys.executable, "-m", "privnet", "simulate", "--iters", "2", "--out", "o", flag]
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode != 0
        assert f"pip install 'privnet[{extra}]'" in done.stderr + done.stdout
        assert not (tmp_path / "o").exists()  # refused before the run

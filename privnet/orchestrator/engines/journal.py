"""What `privnet run` keeps on disk as it goes, so `privnet run --resume RUN_DIR` can carry
on after the orchestrator died (`kill -9`, a reboot).

`<run>/journal/` (0700, every file 0600): the experiment (`config.json`, the secret seed
included) and the run's secrets (`run.json`: the orchestrator's key, the agents' tokens,
broker users), every finished session (`session-<n>.npz` models, `session-<n>.json` what
the agents reported), and the rounds of the session under way as the orchestrator got
them (`rounds-<n>.bin`). The agents keep their own checkpoints (`<run>/checkpoints/`).
Everything here is as secret as the run's telemetry: true models.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np

from privnet.agent import control
from privnet.agent.private import PRIVATE, private_dir, private_file, write_private
from privnet.orchestrator.conductor import Resume, SessionResult, View
from privnet.orchestrator.experiment.config import ExperimentConfig, with_overrides

JOURNAL = "journal"
SECRETS = "secrets.json"  # the run's secret seed, 0600 (summary.json says where it is)


def begin(out: Path, config: ExperimentConfig, secrets_json: str, secret_seed: bool) -> None:
    """The journal of a new run; with `secret_seed`, the run's secrets.json (its seed, which
    regenerates every agent's data and noise, is nowhere else outside the journal)."""
    where = private_dir(out / JOURNAL)
    write_private(where / "config.json", json.dumps(config.to_dict()))
    write_private(where / "run.json", secrets_json)
    if secret_seed:
        write_private(out / SECRETS, json.dumps({"seed": config.seed}) + "\n")


def secret_seed(out: Path) -> bool:
    """Whether the run in `out` drew its seed (kept in its secrets.json)."""
    return (out / SECRETS).is_file()


def discard_if_empty(out: Path) -> None:
    """Remove the journal (and secrets.json) of a run that ended before any round it could
    carry on from."""
    where = out / JOURNAL
    kept = [*where.glob("session-*.json"), *where.glob("rounds-*.bin")]
    if where.is_dir() and not any(path.stat().st_size for path in kept):
        shutil.rmtree(where)
        (out / SECRETS).unlink(missing_ok=True)


def session_done(out: Path, index: int, result: SessionResult) -> None:
    where = out / JOURNAL
    with private_file(where / f"session-{index}.npz") as fh:
        np.savez(fh, models=result.models)
    finished = {str(m): asdict(done) for m, done in result.finished.items()}
    views = [v.to_json() for v in result.views]
    record = {"label": result.label, "wall": result.wall, "finished": finished, "views": views}
    write_private(where / f"session-{index}.json", json.dumps(record))
    (where / f"rounds-{index}.bin").unlink(missing_ok=True)


def rounds(out: Path, index: int, models: np.ndarray) -> None:
    """Append the next rounds of session `index` (rows of `models`, each P x M): the file
    holds rounds 1, 2, ... in order."""
    path = out / JOURNAL / f"rounds-{index}.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE)
    with os.fdopen(fd, "ab") as fh:
        fh.write(np.ascontiguousarray(models, dtype="<f8").tobytes())


def truncate(out: Path, index: int, keep: int, shape: tuple[int, ...]) -> None:
    """Keep the first `keep` rounds of session `index` (a resumed session redoes the rest)."""
    path = out / JOURNAL / f"rounds-{index}.bin"
    if path.exists():
        size = keep * int(np.prod(shape)) * 8
        with open(path, "r+b") as fh:
            fh.truncate(min(size, path.stat().st_size))


def config(out: Path) -> ExperimentConfig:
    """The experiment of the run in `out` (its secret seed included)."""
    return with_overrides(ExperimentConfig(), json.loads(_read(out, "config.json")))


def load(out: Path) -> tuple[str, list[SessionResult], int, np.ndarray | None]:
    """(secrets JSON, finished sessions, index of the next, its rounds as received)."""
    where = out / JOURNAL
    secrets_json = _read(out, "run.json")
    results: list[SessionResult] = []
    while (where / f"session-{len(results)}.json").exists():
        n = len(results)
        record = json.loads((where / f"session-{n}.json").read_text())
        models = np.load(where / f"session-{n}.npz")["models"]
        finished = {int(m): control.Finished(**d) for m, d in record["finished"].items()}
        views = [View.from_json(v) for v in record.get("views", [])]
        results.append(SessionResult(record["label"], models, finished, record["wall"], views))
    return secrets_json, results, len(results), _rows(where / f"rounds-{len(results)}.bin")


def _read(out: Path, name: str) -> str:
    try:
        return (out / JOURNAL / name).read_text()
    except OSError as exc:
        raise ValueError(
            f"{out} has no journal ({exc.strerror}: {exc.filename}); --resume takes the --out "
            "directory of a `privnet run` that was interrupted"
        ) from None


def resume_point(config: ExperimentConfig, session: int, got: np.ndarray | None) -> Resume:
    """Session `session` as the first run recorded it: `got`, its rounds as received."""
    shape = (config.iters, config.agents, config.dim)
    models = np.full(shape, np.nan)
    per_round = config.agents * config.dim
    recorded = 0
    if got is not None:  # whole rounds only: a write the kill cut short is not one
        rows = got[: got.size - got.size % per_round].reshape(-1, config.agents, config.dim)
        recorded = min(rows.shape[0], config.iters)
        models[:recorded] = rows[:recorded]
    return Resume(session, models, recorded)


def _rows(path: Path) -> np.ndarray | None:
    """The floats appended to `path` (None: none)."""
    if not path.exists():
        return None
    raw = path.read_bytes()
    return np.frombuffer(raw, dtype="<f8") if raw else None

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
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from privnet.agent import control
from privnet.agent.messages import METRIC_COUNT
from privnet.agent.private import PRIVATE, private_dir, private_file, write_private
from privnet.orchestrator.conductor import Resume, SessionResult, View
from privnet.orchestrator.conductor.collection import blank_models
from privnet.orchestrator.curves import ROUNDS_SUFFIX, expand_models, model_rounds
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
    held = model_rounds(result.models)  # all rounds, or those of --models-every
    metrics = result.metrics if result.metrics is not None else np.zeros((0,))
    with private_file(where / f"session-{index}.npz") as fh:
        np.savez(fh, models=result.models[held], rounds=held + 1, metrics=metrics)
    finished = {str(m): asdict(done) for m, done in result.finished.items()}
    views = [v.to_json() for v in result.views]
    record = {
        "label": result.label,
        "wall": result.wall,
        "finished": finished,
        "views": views,
        "models_every": result.models_every,
    }
    write_private(where / f"session-{index}.json", json.dumps(record))
    (where / f"rounds-{index}.bin").unlink(missing_ok=True)


WIDTHS = {1: "<f8", 2: "<f4"}  # a round record's flag -> the dtype of the models after it


def rounds(out: Path, index: int, models: Sequence[np.ndarray | None], metrics: np.ndarray) -> None:
    """Append the next rounds of session `index`: per round a record of a flag (0: no
    models; 1: its models follow as <f8; 2: as <f4, a float32 problem's, which its telemetry
    carried as float32), the agents' metrics (P x METRIC_COUNT, <f8) and, at a model round,
    their models (P x M). The file holds rounds 1, 2, ... in order."""
    path = out / JOURNAL / f"rounds-{index}.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE)
    with os.fdopen(fd, "ab") as fh:
        for w, told in zip(models, metrics, strict=True):
            narrow = w is not None and w.dtype == np.float32
            flag = 0 if w is None else 2 if narrow else 1
            fh.write(np.float64(flag).astype("<f8").tobytes())
            fh.write(np.ascontiguousarray(told, dtype="<f8").tobytes())
            if w is not None:  # the array's own buffer: no 128 MB copy at 16 x 1M
                fh.write(np.ascontiguousarray(w, dtype=WIDTHS[flag]).data.cast("B"))


def _records(path: Path, agents: int, dim: int) -> list[tuple[int, str | None]]:
    """(offset, dtype of its models or None) of every whole round record in `path`."""
    size, at, out = path.stat().st_size, 0, []
    head = 8 * (1 + agents * METRIC_COUNT)
    with open(path, "rb") as fh:
        while at + head <= size:
            fh.seek(at)
            flag = int(np.frombuffer(fh.read(8), dtype="<f8")[0])
            dtype = WIDTHS.get(flag)
            if flag and dtype is None:
                raise ValueError(f"{path}: a round record's flag is {flag}, not 0, 1 or 2")
            length = head + (np.dtype(dtype).itemsize * agents * dim if dtype else 0)
            if at + length > size:
                break  # a write the kill cut short is not a round
            out.append((at, dtype))
            at += length
    return out


def truncate(out: Path, index: int, keep: int, shape: tuple[int, ...]) -> None:
    """Keep the first `keep` rounds of session `index` (a resumed session redoes the rest)."""
    path = out / JOURNAL / f"rounds-{index}.bin"
    if path.exists():
        records = _records(path, *shape)
        if keep < len(records):
            with open(path, "r+b") as fh:
                fh.truncate(records[keep][0])


def config(out: Path) -> ExperimentConfig:
    """The experiment of the run in `out` (its secret seed included)."""
    return with_overrides(ExperimentConfig(), json.loads(_read(out, "config.json")))


def load(out: Path) -> tuple[str, list[SessionResult], int, Path | None]:
    """(secrets JSON, finished sessions, index of the next, its rounds file if any)."""
    where = out / JOURNAL
    secrets_json = _read(out, "run.json")
    results: list[SessionResult] = []
    while (where / f"session-{len(results)}.json").exists():
        n = len(results)
        record = json.loads((where / f"session-{n}.json").read_text())
        with np.load(where / f"session-{n}.npz") as saved:
            models, held, metrics = saved["models"], saved["rounds"], saved["metrics"]
        every = int(record.get("models_every", 1))
        finished = {int(m): control.Finished(**d) for m, d in record["finished"].items()}
        views = [View.from_json(v) for v in record.get("views", [])]
        whole = expand_models({"m": models, "m" + ROUNDS_SUFFIX: held})["m"]
        told = metrics if metrics.ndim == 3 else None
        result = SessionResult(record["label"], whole, finished, record["wall"], views, told, every)
        results.append(result)
    path = where / f"rounds-{len(results)}.bin"
    return secrets_json, results, len(results), path if path.exists() else None


def _read(out: Path, name: str) -> str:
    try:
        return (out / JOURNAL / name).read_text()
    except OSError as exc:
        raise ValueError(
            f"{out} has no journal ({exc.strerror}: {exc.filename}); --resume takes the --out "
            "directory of a `privnet run` that was interrupted"
        ) from None


def resume_point(config: ExperimentConfig, session: int, got: Path | None) -> Resume:
    """Session `session` as the first run recorded it: `got`, its rounds file."""
    shape = (config.iters, config.agents, config.dim)
    models = blank_models(*shape)
    metrics = np.full((config.iters, config.agents, METRIC_COUNT), np.nan)
    recorded = 0
    if got is not None:  # whole rounds only: a write the kill cut short is not one
        records = _records(got, config.agents, config.dim)[: config.iters]
        head = config.agents * METRIC_COUNT
        with open(got, "rb") as fh:
            for r, (at, dtype) in enumerate(records):
                fh.seek(at + 8)
                metrics[r] = np.frombuffer(fh.read(8 * head), "<f8").reshape(-1, METRIC_COUNT)
                if dtype is not None:
                    size = config.agents * config.dim * np.dtype(dtype).itemsize
                    models[r] = np.frombuffer(fh.read(size), dtype).reshape(shape[1:])
        recorded = len(records)
    return Resume(session, models, recorded, metrics)

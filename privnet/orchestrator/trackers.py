"""A finished run's metrics in TensorBoard and MLflow (`--tensorboard DIR`, `--mlflow`).

Written after the run from its `Result` (the curves metrics.csv holds and summary.json's
records), not live: the rounds' hot path pays nothing, and a run, a simulation and a
resumed run all export the same way. One tracker run per session, strategy x scheme x
repeat (`atc/local-ghp/0`): every per-round column of metrics.csv with step = round
(`iter`), and the session's summary (bytes, messages, rounds/s, steady-state MSD, the
accountant's epsilon) under `summary/...` at the last round. A round nobody reported
(NaN) is left out, as a gap. Both tools are optional extras, imported only here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privnet.agent.spec import ConfigError

if TYPE_CHECKING:
    from privnet.orchestrator.result import Result

MLFLOW_DB = "mlflow.db"  # the default store, in the run's directory
MLFLOW_BATCH = 1000  # metrics per MlflowClient.log_batch call (the REST API's limit)
MLFLOW_PARAMS = 100  # params per call, likewise


@dataclass(frozen=True)
class Trackers:
    """Where a run's metrics go beside its own files (None: not there)."""

    tensorboard: Path | None  # a TensorBoard log directory: one subdirectory per session
    mlflow: str | None  # an MLflow tracking URI

    @classmethod
    def of(
        cls, tensorboard: str | Path | None, mlflow: bool, mlflow_uri: str | None, out: Path | None
    ) -> Trackers:
        """From the flags (`--tensorboard DIR`, `--mlflow`, `--mlflow-uri URI`): `--mlflow`
        alone stores in `out`/mlflow.db (an SQLite file: MLflow's local store, its plain
        file store being in maintenance mode), or ./mlflow.db with no output directory."""
        if mlflow_uri is not None and not mlflow_uri.strip():
            raise ConfigError("--mlflow-uri '': give a tracking URI, e.g. sqlite:///mlflow.db")
        uri = mlflow_uri
        if uri is None and mlflow:
            uri = f"sqlite:///{((out or Path.cwd()) / MLFLOW_DB).resolve()}"
        return cls(None if tensorboard is None else Path(tensorboard), uri)

    def check(self) -> None:
        """Fail before the run, not after it, when an extra is missing."""
        if self.tensorboard is not None:
            _tensorboard()
        if self.mlflow is not None:
            _mlflow()
            if self.mlflow.startswith("sqlite:"):
                _sqlalchemy()


def export(result: Result, trackers: Trackers) -> list[str]:
    """Write `result` to each tracker asked for; says where each went."""
    said = []
    if trackers.tensorboard is not None:
        to_tensorboard(result, trackers.tensorboard)
        said.append(f"TensorBoard: tensorboard --logdir {trackers.tensorboard}")
    if trackers.mlflow is not None:
        to_mlflow(result, trackers.mlflow)
        said.append(f"MLflow: mlflow ui --backend-store-uri {trackers.mlflow}")
    return said


@dataclass(frozen=True)
class Session:
    """One strategy x scheme x repeat: its per-round series and its summary numbers."""

    strategy: str
    scheme: str
    repeat: int
    rounds: dict[str, list[tuple[int, float]]]  # column -> (round, value), NaN left out
    summary: dict[str, float]  # summary/<name> -> value (the strategy x scheme's record)
    last: int  # the last round

    @property
    def name(self) -> str:
        return f"{self.strategy}/{self.scheme}/{self.repeat}"


def sessions(result: Result) -> Iterator[Session]:
    """Every session of `result`, as the trackers write it."""
    records = {(r["strategy"], r["scheme"]): r for r in result.records}
    for curve in result.curves:
        columns = {"msd_centroid": curve.msd_centroid, "msd_avg": curve.msd_avg, **curve.series}
        summary = dict(_numbers(records.get(curve.key, {}), "summary"))
        repeats, iters = curve.msd_centroid.shape
        for r in range(repeats):
            rounds = {
                name: [(i + 1, float(v)) for i, v in enumerate(values[r]) if not math.isnan(v)]
                for name, values in columns.items()
            }
            yield Session(curve.strategy, curve.scheme, r, rounds, summary, iters)


def _numbers(record: dict[str, Any], prefix: str) -> Iterator[tuple[str, float]]:
    """A summary.json record's numbers, nested keys joined by '/' ("inf" is a number)."""
    for key, value in record.items():
        name = f"{prefix}/{key}"
        if isinstance(value, dict):
            yield from _numbers(value, name)
        elif _number(value):
            yield name, float(value)


def _number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int | float) or value in ("inf", "-inf")


def to_tensorboard(result: Result, logdir: Path) -> None:
    """Event files under `logdir`/<strategy>/<scheme>/<repeat>, one scalar per column."""
    writer_class = _tensorboard()
    for session in sessions(result):
        writer = writer_class(str(logdir / session.strategy / session.scheme / str(session.repeat)))
        try:
            for name, points in session.rounds.items():
                for step, value in points:
                    writer.add_scalar(name, value, step)
            for name, value in session.summary.items():
                writer.add_scalar(name, value, session.last)
        finally:
            writer.close()


def to_mlflow(result: Result, uri: str) -> None:
    """One MLflow run per session in the experiment named as the config is: the config as
    params, the per-round columns as metrics by step, the summary at the last round."""
    mlflow = _mlflow()
    from mlflow.entities import Metric, Param

    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    name = f"privnet/{result.config.name}"
    found = client.get_experiment_by_name(name)
    experiment = found.experiment_id if found else client.create_experiment(name)
    config = sorted(_config(result).items())
    params = [Param(key, _param(value)) for key, value in config if value is not None]
    for session in sessions(result):
        tags = {"strategy": session.strategy, "scheme": session.scheme}
        tags |= {"repeat": str(session.repeat), "engine": result.engine}
        if result.out is not None:
            tags["privnet.out"] = str(result.out)
        run = client.create_run(experiment, run_name=session.name, tags=tags).info.run_id
        stamp = 0  # the timestamps are not the rounds' times (written after the run)
        metrics = [
            Metric(key, value, stamp, step)
            for key, points in session.rounds.items()
            for step, value in points
        ]
        metrics += [Metric(k, v, stamp, session.last) for k, v in session.summary.items()]
        for start in range(0, len(params), MLFLOW_PARAMS):
            client.log_batch(run, params=params[start : start + MLFLOW_PARAMS])
        for start in range(0, len(metrics), MLFLOW_BATCH):
            client.log_batch(run, metrics=metrics[start : start + MLFLOW_BATCH])
        client.set_tag(run, "mlflow.note.content", f"privnet {result.engine}: {session.name}")
        client.set_terminated(run)


def _config(result: Result) -> dict[str, Any]:
    """The config as the run published it: summary.json's, where a secret seed is not shown
    (a Result loaded from a run holds the real one)."""
    summary = None if result.out is None else result.out / "summary.json"
    if summary is not None and summary.is_file():
        config: dict[str, Any] = json.loads(summary.read_text())["config"]
        return config
    return result.config.to_dict()


def _param(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _tensorboard() -> Any:
    """TensorBoard's own numpy-only writer (`tensorboard.summary.Writer`): no TensorFlow,
    no torch, nothing beyond the package that also reads the files."""
    try:
        from tensorboard.summary import Writer
    except ImportError:
        raise ConfigError(
            "--tensorboard needs the tensorboard extra: pip install 'privnet[tensorboard]'"
        ) from None
    return Writer


def _sqlalchemy() -> None:
    """MLflow's SQLite store is SQLAlchemy's (mlflow-skinny leaves it out; the extra has it)."""
    try:
        import alembic  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--mlflow's SQLite store needs sqlalchemy and alembic: pip install 'privnet[mlflow]' "
            "(or give --mlflow-uri of a tracking server)"
        ) from None


def _mlflow() -> Any:
    try:
        import mlflow.tracking
    except ImportError:
        raise ConfigError(
            "--mlflow needs the mlflow extra: pip install 'privnet[mlflow]'"
        ) from None
    return mlflow

"""What a simulation or a run gives back to Python: `Result`.

Per-round metrics, per-agent models, bytes, membership and privacy as numpy arrays and
plain dicts, and (with pandas installed) as data frames; `plot()` draws the figures the
CLI writes. A Result comes from the engines' own curves (`privnet.simulate`) or from a run's
directory (`privnet.run`, `Result.load`): the same files the CLI writes, read back.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import networkx as nx
import numpy as np

from privnet.agent.spec import ConfigError
from privnet.orchestrator.curves import METRICS_HEADER, Curve, expand_models
from privnet.orchestrator.experiment import config as configuration
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.report import (
    AGENTS,
    METRIC_FILES,
    metrics,
    plot_agents,
    plot_metric,
    plot_msd,
    plot_topology,
)

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

KEY_COLUMNS = METRICS_HEADER[:4]  # strategy, scheme, repeat, iter


@dataclass
class Result:
    """One experiment's results.

    `curves` hold every per-round metric of each strategy x scheme, (repeats, iters) each:
    MSD (centroid, average individual), the problem's test metric when it has one, and with
    accounting the privacy loss. `models` (memory and net engines) hold every agent's true
    model after every round of each session (`"atc/local-ghp/0"`: (iters, P, M), NaN where
    an agent was out of the membership view). `records` are summary.json's rows (bytes,
    rounds/s, rejections, privacy by strategy x scheme), `membership` the views of a run.
    """

    config: ExperimentConfig  # as run: dataset, model dimension and seed settled
    engine: str  # oracle, memory or net
    curves: list[Curve]
    records: list[dict[str, Any]]
    graph: nx.Graph
    q: np.ndarray
    models: dict[str, np.ndarray] = field(default_factory=dict)
    membership: list[dict[str, Any]] = field(default_factory=list)
    out: Path | None = None  # where the files are, if any were written

    # ---- numpy ----------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        """The per-round metrics held (msd_centroid, msd_avg, test_error_centroid, ...)."""
        return [*METRICS_HEADER[4:], *sorted({n for c in self.curves for n in c.series})]

    def curve(self, strategy: str | None = None, scheme: str | None = None) -> Curve:
        """The curve of one strategy x scheme; either may be left out when it is the only one."""
        found = [
            c for c in self.curves if strategy in (None, c.strategy) and scheme in (None, c.scheme)
        ]
        if len(found) != 1:
            have = ", ".join(f"{c.strategy}/{c.scheme}" for c in self.curves)
            raise ConfigError(
                f"{len(found)} curves match strategy={strategy}, scheme={scheme}; "
                f"name one of: {have}"
            )
        return found[0]

    def metric(
        self, name: str, strategy: str | None = None, scheme: str | None = None
    ) -> np.ndarray:
        """One per-round metric, (repeats, iters): msd_centroid, msd_avg, or any of `names`."""
        curve = self.curve(strategy, scheme)
        if name in METRICS_HEADER[4:]:
            values: np.ndarray = getattr(curve, name)
            return values
        if name not in curve.series:
            raise ConfigError(f"no metric {name!r}; this result has {', '.join(self.names)}")
        return curve.series[name]

    def epsilon(self, strategy: str | None = None, scheme: str | None = None) -> np.ndarray:
        """The accounted privacy loss epsilon(i) of every agent, (repeats, iters, P)."""
        curve = self.curve(strategy, scheme)
        agents = [curve.series.get(f"epsilon_{p}") for p in range(self.config.agents)]
        if any(e is None for e in agents):
            raise ConfigError("this result was not accounted: run it with account=True")
        return np.stack(agents, axis=-1)  # type: ignore[arg-type]

    @property
    def bytes(self) -> dict[str, dict[str, float]]:
        """Bytes by category per strategy/scheme, and per round (`bytes_per_round`), as the
        agents counted them (memory and net engines)."""
        out = {}
        for r in self.records:
            if "bytes" in r:
                out[f"{r['strategy']}/{r['scheme']}"] = {
                    **r["bytes"],
                    "per_round": r.get("bytes_per_round", float("nan")),
                }
        return out

    # ---- pandas ---------------------------------------------------------------------------

    def frame(self) -> pd.DataFrame:
        """Per round: strategy, scheme, repeat, iter and every metric (metrics.csv)."""
        pd = _pandas()
        return pd.DataFrame(list(self._rows()))

    def summary_frame(self) -> pd.DataFrame:
        """One row per strategy x scheme: steady-state metrics, speed, bytes (summary.json's
        results, nested dicts flattened as `bytes.model`, ...)."""
        return _pandas().json_normalize(self.records)

    def membership_frame(self) -> pd.DataFrame:
        """One row per membership view: session, view, start round, members, why."""
        return _pandas().DataFrame(self.membership)

    def privacy_frame(self) -> pd.DataFrame:
        """epsilon per strategy, scheme, repeat, round and agent (long format)."""
        pd = _pandas()
        parts = []
        for c in self.curves:
            if "epsilon_0" not in c.series:
                continue
            eps = self.epsilon(c.strategy, c.scheme)
            r, i, p = np.indices(eps.shape)
            parts.append(
                pd.DataFrame(
                    {
                        "strategy": c.strategy,
                        "scheme": c.scheme,
                        "repeat": r.ravel(),
                        "iter": i.ravel() + 1,
                        "agent": p.ravel(),
                        "epsilon": eps.ravel(),
                    }
                )
            )
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    def models_frame(self, session: str) -> pd.DataFrame:
        """One session's models: a row per round and agent, a column per parameter."""
        pd = _pandas()
        if session not in self.models:
            raise ConfigError(f"no models of session {session!r}; held: {', '.join(self.models)}")
        models = self.models[session]
        i, p = np.indices(models.shape[:2])
        table = pd.DataFrame(models.reshape(-1, models.shape[-1]))
        table.columns = [f"w{m}" for m in range(models.shape[-1])]
        table.insert(0, "agent", p.ravel())
        table.insert(0, "iter", i.ravel() + 1)
        return table

    def _rows(self) -> Iterator[dict[str, Any]]:
        for c in self.curves:
            columns = {"msd_centroid": c.msd_centroid, "msd_avg": c.msd_avg, **c.series}
            repeats, iters = c.msd_centroid.shape
            for r in range(repeats):
                for i in range(iters):
                    row = {"strategy": c.strategy, "scheme": c.scheme, "repeat": r, "iter": i + 1}
                    yield row | {name: float(v[r, i]) for name, v in columns.items()}

    # ---- figures --------------------------------------------------------------------------

    def plot(self) -> dict[str, Figure]:
        """The CLI's figures, by file name: msd.png (the paper's Fig. 3), agents.png (the
        agents' own metrics, every round), the test metric's (testing_error.png, ...),
        topology.png."""
        figures = {"msd.png": plot_msd(self.curves, None)}
        if any(name.endswith(AGENTS) for c in self.curves for name in c.series):
            figures["agents.png"] = plot_agents(self.curves, None)
        for metric in sorted({m for c in self.curves for m in metrics(c)}):
            figures[METRIC_FILES.get(metric, f"{metric}.png")] = plot_metric(
                self.curves, metric, None
            )
        figures["topology.png"] = plot_topology(self.graph, None, self.q)
        return figures

    # ---- from a run's directory -----------------------------------------------------------

    @classmethod
    def load(cls, out: str | Path, problem: Instance | None = None) -> Result:
        """The Result of a run's (or a simulation's) output directory. `problem` gives the
        graph (and the config: a run whose seed is secret records none); without it the graph
        is built again from summary.json's config."""
        out = Path(out)
        summary = json.loads((out / "summary.json").read_text())
        if problem is None:
            names = {f.name for f in fields(ExperimentConfig)}
            settings = {k: v for k, v in summary["config"].items() if k in names}
            problem = Instance.build(configuration.with_overrides(ExperimentConfig(), settings))
        records = summary["results"]
        curves = _read_curves(out / "metrics.csv", records)
        models: dict[str, np.ndarray] = {}
        if (out / "models.npz").is_file():
            with np.load(out / "models.npz") as held:
                models = expand_models({name: held[name] for name in held.files})
        membership = []
        if (out / "membership.json").is_file():
            membership = json.loads((out / "membership.json").read_text())
        engine = str(records[0].get("engine", "net")) if records else "net"
        return cls(
            problem.config,
            engine,
            curves,
            records,
            problem.graph,
            problem.q,
            models,
            membership,
            out,
        )


def _read_curves(path: Path, records: list[dict[str, Any]]) -> list[Curve]:
    """Every curve of a metrics.csv, every column (empty cells: a series the curve lacks)."""
    columns: dict[tuple[str, str], dict[str, dict[tuple[int, int], float]]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            key = (row["strategy"], row["scheme"])
            cell = (int(row["repeat"]), int(row["iter"]) - 1)
            for name, value in row.items():
                if name not in KEY_COLUMNS and value != "":
                    columns.setdefault(key, {}).setdefault(name, {})[cell] = float(value)
    rates = {(r["strategy"], r["scheme"]): r.get("rounds_per_s", float("nan")) for r in records}
    curves = []
    for (strategy, scheme), series in columns.items():
        arrays = {name: _grid(cells) for name, cells in series.items()}
        cen, avg = arrays.pop("msd_centroid"), arrays.pop("msd_avg")
        rate = float(rates.get((strategy, scheme), float("nan")))
        curves.append(Curve(strategy, scheme, cen, avg, rate, {}, arrays))
    return curves


def _grid(cells: dict[tuple[int, int], float]) -> np.ndarray:
    repeats = 1 + max(r for r, _ in cells)
    iters = 1 + max(i for _, i in cells)
    out = np.full((repeats, iters), np.nan)
    for (r, i), value in cells.items():
        out[r, i] = value
    return out


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ConfigError("data frames need pandas: pip install pandas") from None
    return pandas

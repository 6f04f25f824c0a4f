"""A run's results written and shown: summary.json, metrics.csv, MSD and topology plots,
the results table.

Everything here works on finished curves (`privnet.orchestrator.curves`: linear MSD per
repeat and iteration), so the engines report through the same code and their files can be compared
line by line.
Figures are drawn on bare matplotlib Figures (Agg canvas), never through pyplot's global state.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import networkx as nx
import numpy as np
from rich.table import Table

from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.curves import (
    DPI,
    METRICS_HEADER,
    STRATEGY_ORDER,
    STRATEGY_TITLE,
    Curve,
    diverged,
    scheme_order,
    scheme_style,
    steady_state,
    steady_state_db,
)
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.terminal import console, narrow_table, print_error, table_console

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from privnet.orchestrator.conductor import View

UNIFORM_Q_RTOL = 1e-9  # q entries closer than this (relative) are drawn as uniform

ROWS = (("msd_centroid", "centroid MSD"), ("msd_avg", "avg. individual MSD"))
SCORED = {"_centroid": "centroid", "_avg": "average individual"}  # a test metric's two series
METRIC_FILES = {"test_error": "testing_error.png"}  # others: <metric>.png
AGENTS = "_agents"  # the series of the agents' own metrics (every round) end so


# Everything a command writes into its --out (`privnet run` and co. set an earlier run's
# apart; tests check that a run writes nothing else), in the order `wrote` lists them.
OUTPUTS = (
    "summary.json", "metrics.csv", "msd.png", "agents.png", "topology.png", "testing_error.png",
    "epsilon.png", "membership.json", "models.npz", "secrets.json", "wire.msgpack",
    "telemetry.npz", "link_keys.msgpack", "audit.json", "audit.png", "audit-pcap.json",
    "audit-pcap.png",
    "dp_audit.json", "view.json", "journal", "logs", "checkpoints", "launch",
)  # fmt: skip


def result_record(curve: Curve, settings: dict[str, Any]) -> dict[str, Any]:
    """One row of summary.json: who, under which settings, steady-state MSD (and testing
    error, for classification), speed, costs."""
    errors = {
        f"{metric}{end}_pct": 100 * steady_state(curve.series[metric + end])
        for metric in metrics(curve)
        for end in SCORED
    }
    with np.errstate(all="ignore"):
        centroid, average = steady_state_db(curve.msd_centroid), steady_state_db(curve.msd_avg)
    return {
        "strategy": curve.strategy,
        "scheme": curve.scheme,
        **settings,
        "msd_centroid_db": centroid,
        "msd_avg_db": average,
        "diverged": diverged(curve),
        **errors,
        "rounds_per_s": float(curve.rounds_per_s),
        **curve.extra,
    }


def write_outputs(
    out: Path,
    config: dict[str, Any],
    curves: list[Curve],
    settings: dict[str, Any],
    graph: nx.Graph | None = None,
    q: np.ndarray | None = None,
) -> dict[str, Any]:
    """Write summary.json, metrics.csv, msd.png (and topology.png given a graph) into `out`."""
    _check_unique(curves)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = _jsonable({"config": config, "results": [result_record(c, settings) for c in curves]})
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    write_metrics(out / "metrics.csv", curves)
    plot_msd(curves, out / "msd.png")
    if any(name.endswith(AGENTS) for c in curves for name in c.series):
        plot_agents(curves, out / "agents.png")
    for metric in sorted({m for c in curves for m in metrics(c)}):
        plot_metric(curves, metric, out / METRIC_FILES.get(metric, f"{metric}.png"))
    if graph is not None:
        plot_topology(graph, out / "topology.png", q)
    return summary


def write_metrics(path: Path, curves: list[Curve]) -> None:
    """One row per strategy, scheme, repeat and (1-based) iteration; floats repr-exact.

    The curves' series (testing errors, Delta, epsilon) follow the MSD columns; a curve
    without one leaves its cells empty.
    """
    _check_unique(curves)
    more = sorted({name for c in curves for name in c.series})
    with Path(path).open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(METRICS_HEADER + tuple(more))
        for c in curves:
            columns = [c.msd_centroid, c.msd_avg] + [c.series.get(name) for name in more]
            for r in range(c.msd_centroid.shape[0]):
                for i in range(c.msd_centroid.shape[1]):
                    cells = ("" if col is None else repr(float(col[r, i])) for col in columns)
                    writer.writerow((c.strategy, c.scheme, r, i + 1, *cells))


def load_plotting() -> None:
    """Import matplotlib's figures (a third of the CLI's start-up when done on import): the
    plots import it when they draw; a run calls this while its broker starts, time it would
    spend waiting anyway."""
    import matplotlib.cm
    import matplotlib.figure  # noqa: F401


def metrics(curve: Curve) -> list[str]:
    """The test metrics a curve has per round (test_error, test_accuracy, ...): each as the
    pair of series <metric>_centroid and <metric>_avg."""
    first = next(iter(SCORED))
    found = [name.removesuffix(first) for name in curve.series if name.endswith(first)]
    return [m for m in found if all(m + end in curve.series for end in SCORED)]


def plot_msd(curves: list[Curve], path: Path | None, title: str | None = None) -> Figure:
    """The paper's Fig. 3: strategies as columns, centroid / avg. individual MSD as rows, in dB."""
    from matplotlib.figure import Figure

    if not curves:
        raise ValueError("plot_msd needs at least one curve")
    _check_unique(curves)
    strategies = _ordered({c.strategy for c in curves}, STRATEGY_ORDER)
    fig = Figure(figsize=(5 * len(strategies), 8), dpi=DPI, layout="constrained")
    axes = fig.subplots(2, len(strategies), sharex=True, sharey="row", squeeze=False)
    lines: dict[str, Line2D] = {}
    every = max(int(c.extra.get("models_every", 1)) for c in curves)
    at = f", model rounds (every {every})" if every > 1 else ""  # the agents sent models
    for row, (attr, what) in enumerate(ROWS):
        for col, strategy in enumerate(strategies):
            ax = axes[row, col]
            letter = chr(ord("a") + row * len(strategies) + col)
            ax.set_title(f"({letter}) {STRATEGY_TITLE.get(strategy, strategy)}: {what}{at}")
            lines.update(_plot_panel(ax, [c for c in curves if c.strategy == strategy], attr))
            ax.tick_params(labelleft=True)
        axes[row, 0].set_ylabel(f"{what} (dB)")
    for ax in axes[1]:
        ax.set_xlabel("iteration $i$")
    axes[0, 0].margins(x=0)
    if title:
        fig.suptitle(title, fontsize=14)
    _legend(fig, lines, fontsize=11, handlelength=3)
    return _saved(fig, path)


def _saved(fig: Figure, path: Path | None) -> Figure:
    """The figure, written to `path` first when there is one."""
    if path is not None:
        fig.savefig(path, dpi=DPI)
    return fig


def plot_metric(curves: list[Curve], metric: str, path: Path | None) -> Figure:
    """The paper's Fig. TE for a test metric (testing error, or any other the problem
    scores): centroid and average individual (%), a row per strategy; curves are averaged
    over repeats."""
    from matplotlib.figure import Figure

    what = "testing error" if metric == "test_error" else metric.replace("_", " ")
    with_errors = [c for c in curves if metric in metrics(c)]
    strategies = _ordered({c.strategy for c in with_errors}, STRATEGY_ORDER)
    fig = Figure(figsize=(11, 4.2 * len(strategies) + 0.6), dpi=DPI, layout="constrained")
    axes = fig.subplots(len(strategies), 2, sharex=True, sharey=True, squeeze=False)
    lines: dict[str, Line2D] = {}
    for row, strategy in enumerate(strategies):
        by_scheme = {c.scheme: c for c in with_errors if c.strategy == strategy}
        for col, (end, whose) in enumerate(SCORED.items()):
            ax = axes[row, col]
            letter = chr(ord("a") + 2 * row + col)
            ax.set_title(f"({letter}) {STRATEGY_TITLE.get(strategy, strategy)}: {whose} {what}")
            for z, scheme in enumerate(_ordered(by_scheme, scheme_order())):
                err = 100 * by_scheme[scheme].series[metric + end].mean(axis=0)
                style = scheme_style(scheme)
                (lines[scheme],) = ax.plot(*_held(err), zorder=2 + z, **style)
            ax.grid(True, alpha=0.3)
            ax.tick_params(labelleft=True)
        axes[row, 0].set_ylabel(f"{what} (%)")
    for ax in axes[-1]:
        ax.set_xlabel("iteration $i$")
    axes[0, 0].margins(x=0)
    _legend(fig, lines)
    return _saved(fig, path)


def _legend(fig: Figure, lines: dict[str, Line2D], **style: Any) -> None:
    """One legend for all panels, below them, so it can never hide a curve."""
    order = _ordered(lines, scheme_order())
    fig.legend(
        [lines[s] for s in order],
        [str(lines[s].get_label()) for s in order],
        loc="outside lower center",
        ncols=len(order),
        frameon=False,
        **style,
    )


def _plot_panel(ax: Axes, curves: list[Curve], attr: str) -> dict[str, Line2D]:
    """One strategy's schemes, MSD averaged over repeats then in dB; later schemes on top."""
    by_scheme = {c.scheme: c for c in curves}
    lines = {}
    for z, scheme in enumerate(_ordered(by_scheme, scheme_order())):
        msd = getattr(by_scheme[scheme], attr)
        style = scheme_style(scheme)
        iters, values = _held(_db(msd.mean(axis=0)))
        (lines[scheme],) = ax.plot(iters, values, zorder=2 + z, **style)
        for start, why in by_scheme[scheme].extra.get("views", []):  # membership changes
            color = lines[scheme].get_color()
            ax.axvline(start, color=color, linestyle=":", linewidth=0.8, zorder=1)
            where = ax.get_xaxis_transform()  # x in data, y in axes fractions
            ax.text(start, 0.99, f" {why}", transform=where, rotation=90, va="top", fontsize=7)
    ax.grid(True, alpha=0.3)
    return lines


def plot_topology(graph: nx.Graph, path: Path | None, q: np.ndarray | None = None) -> Figure:
    """Draw the network at its 'pos' coordinates; colour and size nodes by Perron weight q."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize, to_rgba
    from matplotlib.figure import Figure

    if graph.number_of_nodes() == 0:
        raise ValueError("plot_topology needs a graph with at least one node")
    nodes = sorted(graph.nodes)
    pos = nx.get_node_attributes(graph, "pos")
    if len(pos) != len(nodes):
        pos = nx.spring_layout(graph, seed=0)
    pos = _spread(pos)
    plain: nx.Graph[int] = nx.Graph(graph)
    plain.remove_edges_from(nx.selfloop_edges(plain))
    edges = plain.number_of_edges()
    fig = Figure(figsize=(9, 8), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    nx.draw_networkx_edges(plain, pos, ax=ax, edge_color="0.6", width=1.0)
    weights = None if q is None else _check_q(q, len(nodes))
    if weights is None or np.ptp(weights) <= UNIFORM_Q_RTOL * weights.max():
        # No q, or a doubly-stochastic A (q = 1/P): colouring by float noise would mislead.
        colors = np.tile(to_rgba("tab:blue"), (len(nodes), 1))
        sizes = np.full(len(nodes), 320.0)
        note = "" if weights is None else f", uniform $q_p = 1/{len(nodes)}$"
    else:
        mappable = ScalarMappable(Normalize(weights.min(), weights.max()), "viridis")
        colors = mappable.to_rgba(weights)
        sizes = 200 + 600 * weights / weights.max()
        fig.colorbar(mappable, ax=ax, shrink=0.8, label="Perron weight $q_p$ (colour and size)")
        note = ""
    nx.draw_networkx_nodes(
        plain, pos, nodelist=nodes, ax=ax, node_color=colors, node_size=sizes, edgecolors="white"
    )
    for node, rgba in zip(nodes, colors, strict=True):
        x, y = pos[node]
        ax.text(
            x,
            y,
            str(node),
            ha="center",
            va="center",
            fontsize=8,
            color=_text_color(rgba),
            zorder=3,
        )
    mean_degree = 2 * edges / len(nodes)
    ax.set_title(f"P = {len(nodes)} agents, {edges} edges, mean degree {mean_degree:.2f}{note}")
    ax.set_aspect("equal")
    ax.set_axis_off()
    return _saved(fig, path)


NODE_GAP = 0.06  # of the drawing's span: centres closer than this overlap (320 pt^2 nodes)
SPREAD_LIMIT = 1000  # nodes: above this, positions are drawn as they are


def _spread(pos: Mapping[Any, Any], gap: float = NODE_GAP, steps: int = 60) -> dict[Any, Any]:
    """Positions nudged apart until no two nodes are closer than `gap` (a fraction of the
    span), so none hides another; nodes already apart stay where they are."""
    names = list(pos)
    xy = np.array([pos[n] for n in names], dtype=np.float64)
    if len(names) < 2 or len(names) > SPREAD_LIMIT:
        return dict(pos)
    span = max(float(np.ptp(xy, axis=0).max()), 1e-12)
    xy = (xy - xy.min(axis=0)) / span
    jitter = np.random.default_rng(0).normal(0, 1e-6, xy.shape)  # coincident nodes part too
    xy += jitter
    for _ in range(steps):
        delta = xy[:, None, :] - xy[None, :, :]
        dist = np.hypot(delta[..., 0], delta[..., 1])
        np.fill_diagonal(dist, np.inf)
        short = np.maximum(gap - dist, 0.0)
        if not short.any():
            break
        push = (short / (2 * dist))[..., None] * delta
        xy += push.sum(axis=1)
    return {n: (float(x), float(y)) for n, (x, y) in zip(names, xy, strict=True)}


def _text_color(rgba: np.ndarray) -> str:
    """Black on light nodes, white on dark ones (relative luminance, sRGB weights)."""
    return "black" if 0.2126 * rgba[0] + 0.7152 * rgba[1] + 0.0722 * rgba[2] > 0.5 else "white"


PEER_BYTES = (
    "peer B/rd: models and key shares the agents published per round (MQTT PUBLISH bytes), "
    "key set-up spread over the {rounds} rounds: `privnet overhead`'s amortized"
)


def results_table(records: list[dict[str, Any]]) -> Table:
    """A terminal table, one row per strategy x scheme: steady-state MSD, testing error
    (classification), rounds/s and, where the engine counted them, peer bytes per round."""
    with_bytes = any("peer_bytes_per_round" in r for r in records)
    with_errors = any("test_error_centroid_pct" in r for r in records)
    caption = PEER_BYTES.format(rounds=records[0].get("iters")) if with_bytes else None
    table = narrow_table("Steady state (last 20% of rounds)", caption)
    table.add_column("strategy", overflow="fold")
    table.add_column("scheme", overflow="fold")
    names = ["MSD dB\ncentroid", "MSD dB\naverage"]
    names += ["error %\ncentroid", "error %\naverage"] if with_errors else []
    names += ["rounds/s"] + (["peer\nB/rd"] if with_bytes else [])
    for name in names:
        table.add_column(name, justify="right", overflow="fold")
    for r in records:
        cells = [str(r["strategy"]), str(r["scheme"])]
        cells += (
            ["diverged"] * 2
            if r.get("diverged")
            else [_fmt(r.get("msd_centroid_db"), ".2f"), _fmt(r.get("msd_avg_db"), ".2f")]
        )
        if with_errors:
            cells += [_fmt(r.get(f"test_error_{k}_pct"), ".2f") for k in ("centroid", "avg")]
        cells.append(_fmt(r.get("rounds_per_s"), ".1f"))
        if with_bytes:
            cells.append(_fmt(r.get("peer_bytes_per_round"), ",.0f"))
        table.add_row(*cells)
    return table


def _held(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, values) of the rounds that have a value: a metric of the models, with
    --models-every K > 1, exists every K rounds only, drawn joined across the gaps."""
    iters = np.arange(1, len(values) + 1)
    keep = ~np.isnan(values)
    return iters[keep], values[keep]


def plot_agents(curves: list[Curve], path: Path | None) -> Figure:
    """The agents' own metrics, every round (what they send beside their models): the loss
    on their minibatches and their score, averaged over the agents, a column each and a row
    per strategy; on a log scale, as MSD is in dB."""
    from matplotlib.figure import Figure

    told = [c for c in curves if any(n.endswith(AGENTS) for n in c.series)]
    names = sorted({n for c in told for n in c.series if n.endswith(AGENTS)}, key=_loss_first)
    strategies = _ordered({c.strategy for c in told}, STRATEGY_ORDER)
    fig = Figure(figsize=(11, 4.2 * len(strategies) + 0.6), dpi=DPI, layout="constrained")
    axes = fig.subplots(len(strategies), len(names), sharex=True, squeeze=False)
    lines: dict[str, Line2D] = {}
    for row, strategy in enumerate(strategies):
        by_scheme = {c.scheme: c for c in told if c.strategy == strategy}
        for col, name in enumerate(names):
            ax = axes[row, col]
            what = name.removesuffix(AGENTS).replace("_", " ")
            title = STRATEGY_TITLE.get(strategy, strategy)
            ax.set_title(f"{title}: agents' own {what} (every round)")
            for z, scheme in enumerate(_ordered(by_scheme, scheme_order())):
                values = by_scheme[scheme].series.get(name)
                if values is None:
                    continue
                style = scheme_style(scheme)
                (lines[scheme],) = ax.plot(*_held(values.mean(axis=0)), zorder=2 + z, **style)
            if name.startswith(("loss", "risk")):
                ax.set_yscale("log")
            ax.grid(True, alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("iteration $i$")
    _legend(fig, lines)
    return _saved(fig, path)


def _loss_first(name: str) -> tuple[bool, str]:
    return (not name.startswith("loss"), name)


def _fmt(value: Any, spec: str) -> str:
    return "–" if value is None else format(float(value), spec)


def _db(msd: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return 10.0 * np.log10(msd)


def _ordered(names: Iterable[str], canonical: tuple[str, ...]) -> list[str]:
    """Known names in the paper's order, then any others alphabetically."""
    present = set(names)
    return [n for n in canonical if n in present] + sorted(present - set(canonical))


def _check_unique(curves: list[Curve]) -> None:
    seen: set[tuple[str, str]] = set()
    for c in curves:
        if c.key in seen:
            raise ValueError(f"two curves for {c.strategy}/{c.scheme}; merge their repeats first")
        seen.add(c.key)


def _check_q(q: np.ndarray, nodes: int) -> np.ndarray:
    weights = np.asarray(q, dtype=np.float64)
    if weights.shape != (nodes,) or not np.all(weights > 0):
        raise ValueError(
            f"q has shape {weights.shape}; pass the Perron vector, {nodes} positive entries "
            "in node-id order"
        )
    return weights


def _jsonable(value: Any) -> Any:
    """Plain JSON types; non-finite floats become null (strict JSON has no inf or nan)."""
    if isinstance(value, Mapping):
        return {str(_jsonable(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Enum):
        return _jsonable(value.value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"cannot write {type(value).__name__} {value!r} to summary.json")


def settings(config: ExperimentConfig, engine: str) -> dict[str, Any]:
    return {
        "rule": config.rule,
        "mu": config.mu,
        "local_steps": config.local_steps,
        "sigma_g2": config.sigma_g2,
        "agents": config.agents,
        "iters": config.iters,
        "repeats": config.repeats,
        "topology": config.topology,
        "rekey": str(config.rekey),
        "engine": engine,
    }


def finish(
    out: Path,
    config: ExperimentConfig,
    problem: Instance,
    curves: list[Curve],
    engine: str,
    extra: dict[str, Any] | None = None,
    neighbour: int | None = None,
    membership: Sequence[View] | None = None,
    reach: Mapping[int, Mapping[int, int]] | None = None,
    account_of: Callable[..., Any] | None = None,
) -> int:
    """Write and show the results; with `neighbour`, account privacy first (--account),
    under the run's `membership` views (and per session the `reach` of each view on its
    recorded wire), with `account_of` where given (see `accountant.attach`). The exit code:
    1 when a curve diverged (its numbers mean nothing), else 0."""
    if neighbour is not None:
        # Not on the CLI's start-up: the accountant loads matplotlib and the memory engine,
        # session_list the conductor and the agent's wire (cryptography, msgpack).
        from privnet.orchestrator.experiment.specs import session_list
        from privnet.orchestrator.privacy import accountant

        order = session_list(config)
        with console.status(f"accounting: twin runs with agent {neighbour}'s data replaced"):
            for curve in curves:
                sessions = [
                    order.index((Strategy(curve.strategy), Scheme(curve.scheme), r))
                    for r in range(config.repeats)
                ]
                accountant.attach(
                    curve, problem, neighbour, sessions, membership, reach, account_of
                )
    summary = write_outputs(
        out,
        {**config.to_dict(), **(extra or {})},
        curves,
        settings(config, engine),
        graph=problem.graph,
        q=problem.q,
    )
    table_console().print(results_table(summary["results"]))
    if neighbour is not None:
        accountant.plot_epsilon(curves, out / "epsilon.png", neighbour)
        table_console().print(accountant.epsilon_table(summary["results"]))
    console.print(wrote(out))
    ran_away = [f"{r['strategy']}/{r['scheme']}" for r in summary["results"] if r["diverged"]]
    if ran_away:
        print_error(
            f"{', '.join(ran_away)} diverged (the MSD grew without bound or overflowed): a "
            f"step size mu = {config.mu:g} too large makes the recursion unstable; try a "
            f"smaller --mu (the paper's is 0.4), or less noise than sigma_g2 = {config.sigma_g2:g}"
        )
        return 1
    return 0


def wrote(out: Path) -> str:
    """'wrote <out>/: <every output there>' (an earlier run's were set apart first)."""
    names = [f"{n}/" if (out / n).is_dir() else n for n in OUTPUTS if (out / n).exists()]
    return f"wrote {out}/: {', '.join(names)}"

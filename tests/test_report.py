"""privnet.orchestrator.report: steady-state dB, summary.json, metrics.csv round trip, plots,
table."""

from __future__ import annotations

import io
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from probes import load_summary, read_metrics

from privnet.orchestrator.curves import Curve, diverged, steady_state_db
from privnet.orchestrator.report import (
    NODE_GAP,
    _spread,
    plot_msd,
    plot_topology,
    result_record,
    results_table,
    write_metrics,
    write_outputs,
)

STRATEGIES = ("consensus", "atc", "cta")
SCHEMES = ("none", "random", "ghp", "local-ghp")
FLOOR = {"none": 1e-4, "random": 1e-2, "ghp": 2e-4, "local-ghp": 1e-4}
REPEATS, ITERS = 2, 50
SETTINGS = {
    "rule": "metropolis",
    "mu": np.float64(0.4),
    "sigma_g2": 0.01,
    "agents": np.int64(6),
    "iters": ITERS,
    "repeats": REPEATS,
}
CONFIG = {"name": "synthetic", "seed": 7, "weights": np.array([0.5, 0.25]), "out": Path("runs/x")}


def synthetic_curves() -> list[Curve]:
    """Decaying curves with per-scheme floors; values like 1/3 test the float round trip."""
    gen = np.random.default_rng(0)
    i = np.arange(1, ITERS + 1)
    curves = []
    for k, strategy in enumerate(STRATEGIES):
        for scheme in SCHEMES:
            decay = np.exp(-(0.05 + 0.02 * k) * i)
            noise = gen.uniform(0.5, 1.5, (REPEATS, ITERS))
            cen = (decay + FLOOR[scheme]) * noise / 3
            extra = {"peer_bytes_per_round": np.int64(1000 * (k + 1)), "messages": 10 * (k + 1)}
            curves.append(Curve(strategy, scheme, cen, 4 * cen, 50.0 + k, extra))
    return curves


def ring() -> tuple[nx.Graph, np.ndarray]:
    graph = nx.cycle_graph(6)
    graph.add_edges_from((p, p) for p in range(6))  # neighbourhoods include p
    for p in range(6):
        graph.nodes[p]["pos"] = (math.cos(p * math.pi / 3), math.sin(p * math.pi / 3))
    q = np.arange(1.0, 7.0)
    return graph, q / q.sum()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Curve], dict[str, Any]]:
    out = tmp_path_factory.mktemp("run") / "nested" / "out"
    curves = synthetic_curves()
    graph, q = ring()
    summary = write_outputs(out, CONFIG, curves, SETTINGS, graph, q)
    return out, curves, summary


# steady_state_db


def test_constant_msd_gives_its_db_value() -> None:
    assert steady_state_db(np.full((3, 40), 1e-3)) == pytest.approx(-30.0, abs=1e-12)


def test_tail_fraction_selects_the_last_iterations() -> None:
    msd = np.concatenate([np.ones(80), np.full(20, 1e-2)])
    assert steady_state_db(msd) == pytest.approx(-20.0, abs=1e-12)  # default tail 0.2
    assert steady_state_db(msd, tail=0.5) == pytest.approx(10 * math.log10(30.2 / 50), abs=1e-12)
    assert steady_state_db(msd, tail=1.0) == pytest.approx(10 * math.log10(80.2 / 100), abs=1e-12)


def test_tail_keeps_at_least_one_iteration() -> None:
    msd = np.concatenate([np.ones(9), [1e-5]])
    assert steady_state_db(msd, tail=0.01) == pytest.approx(-50.0, abs=1e-12)


def test_mean_is_taken_over_repeats_before_the_log() -> None:
    msd = np.array([[1e-2] * 10, [1e-4] * 10])
    assert steady_state_db(msd) == pytest.approx(10 * math.log10(0.00505), abs=1e-12)


@pytest.mark.parametrize(
    ("msd", "tail", "match"),
    [
        (np.ones(10), 0.0, "tail"),
        (np.ones(10), 1.5, "tail"),
        (np.ones((2, 0)), 0.2, "non-empty"),
        (np.ones((2, 3, 4)), 0.2, "non-empty"),
        (-np.ones(10), 0.2, "negative"),
    ],
)
def test_steady_state_rejects_bad_input(msd: np.ndarray, tail: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        steady_state_db(msd, tail)


# Curve and result_record


def test_curve_rejects_mismatched_or_flat_arrays() -> None:
    with pytest.raises(ValueError, match="same"):
        Curve("atc", "none", np.ones((2, 5)), np.ones((2, 4)), 1.0)
    with pytest.raises(ValueError, match=r"\(repeats, iters\)"):
        Curve("atc", "none", np.ones(5), np.ones(5), 1.0)


def test_result_record_layout() -> None:
    curve = Curve("cta", "ghp", np.full((2, 10), 1e-2), np.full((2, 10), 1e-1), 12.5, {"b": 3})
    record = result_record(curve, {"mu": 0.4, "agents": 30})
    assert list(record) == [
        "strategy", "scheme", "mu", "agents", "msd_centroid_db", "msd_avg_db", "diverged",
        "rounds_per_s", "b",
    ]  # fmt: skip
    assert record["msd_centroid_db"] == pytest.approx(-20.0, abs=1e-12)
    assert record["msd_avg_db"] == pytest.approx(-10.0, abs=1e-12)
    assert (record["strategy"], record["scheme"], record["rounds_per_s"]) == ("cta", "ghp", 12.5)


# write_outputs


def test_write_outputs_creates_all_files(run: tuple[Path, list[Curve], dict[str, Any]]) -> None:
    out, _, _ = run
    for name in ("summary.json", "metrics.csv", "msd.png", "topology.png"):
        assert (out / name).stat().st_size > 0, name


def test_summary_json_holds_config_and_records(
    run: tuple[Path, list[Curve], dict[str, Any]],
) -> None:
    out, curves, summary = run
    on_disk = load_summary(out / "summary.json")
    assert on_disk == summary
    assert on_disk["config"] == {"name": "synthetic", "seed": 7, "weights": [0.5, 0.25],
                                 "out": "runs/x"}  # fmt: skip
    results = on_disk["results"]
    assert [(r["strategy"], r["scheme"]) for r in results] == [c.key for c in curves]
    for record, curve in zip(results, curves, strict=True):
        assert record["msd_centroid_db"] == steady_state_db(curve.msd_centroid)
        assert record["msd_avg_db"] == steady_state_db(curve.msd_avg)
        assert record["rounds_per_s"] == curve.rounds_per_s
        assert record["peer_bytes_per_round"] == int(curve.extra["peer_bytes_per_round"])
        assert record["messages"] == curve.extra["messages"]
        assert {k: record[k] for k in SETTINGS} == {k: SETTINGS[k] for k in SETTINGS}
    # msd_avg = 4 msd_centroid, so the dB gap is 10 log10 4 everywhere.
    gaps = [r["msd_avg_db"] - r["msd_centroid_db"] for r in results]
    assert gaps == pytest.approx([10 * math.log10(4)] * len(results), abs=1e-9)


def test_metrics_csv_round_trips_bit_exactly(
    run: tuple[Path, list[Curve], dict[str, Any]],
) -> None:
    out, curves, _ = run
    lines = (out / "metrics.csv").read_text().splitlines()
    assert lines[0] == "strategy,scheme,repeat,iter,msd_centroid,msd_avg"
    assert lines[1].startswith("consensus,none,0,1,")
    assert lines[ITERS].startswith(f"consensus,none,0,{ITERS},")
    assert len(lines) == 1 + len(curves) * REPEATS * ITERS
    parsed = read_metrics(out / "metrics.csv")
    assert list(parsed) == [c.key for c in curves]
    for curve in curves:
        cen, avg = parsed[curve.key]
        assert cen.view(np.uint64).tolist() == curve.msd_centroid.view(np.uint64).tolist()
        assert avg.view(np.uint64).tolist() == curve.msd_avg.view(np.uint64).tolist()


def test_pngs_are_images_of_the_expected_size(
    run: tuple[Path, list[Curve], dict[str, Any]],
) -> None:
    out, _, _ = run
    msd = mpimg.imread(out / "msd.png")
    topology = mpimg.imread(out / "topology.png")
    assert msd.shape == (960, 1800, 4)  # figsize (15, 8) at 120 dpi
    assert topology.shape == (960, 1080, 4)  # figsize (9, 8) at 120 dpi
    for image in (msd, topology):
        assert image[..., :3].std() > 0.05  # something was drawn


def test_nonfinite_steady_state_is_null_in_json(tmp_path: Path) -> None:
    zero = Curve("atc", "none", np.zeros((1, 4)), np.full((1, 4), np.inf), 1.0)
    summary = write_outputs(tmp_path, {}, [zero], {})
    record = json.loads((tmp_path / "summary.json").read_text())["results"][0]
    assert record["msd_centroid_db"] is None and record["msd_avg_db"] is None
    assert summary["results"][0] == record
    assert not (tmp_path / "topology.png").exists()


def test_duplicate_curves_are_refused_before_writing(tmp_path: Path) -> None:
    twice = [synthetic_curves()[0]] * 2
    with pytest.raises(ValueError, match="two curves for consensus/none"):
        write_outputs(tmp_path / "out", {}, twice, {})
    assert not (tmp_path / "out").exists()


def test_unserializable_settings_are_named(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="object"):
        write_outputs(tmp_path, {"bad": object()}, synthetic_curves()[:1], {})


# read_metrics and load_summary on bad files


@given(
    arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(1, 6)),
           elements=st.floats(allow_nan=False, width=64)),
)  # fmt: skip
@settings(max_examples=25, deadline=None)
def test_any_finite_or_infinite_float_round_trips(values: np.ndarray) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.csv"
        write_metrics(path, [Curve("atc", "ghp", values, values[:, ::-1], 1.0)])
        cen, avg = read_metrics(path)[("atc", "ghp")]
    assert cen.view(np.uint64).tolist() == values.view(np.uint64).tolist()
    assert (
        avg.view(np.uint64).tolist()
        == np.ascontiguousarray(values[:, ::-1]).view(np.uint64).tolist()
    )


def test_read_metrics_rejects_truncated_and_malformed_files(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    write_metrics(path, [Curve("atc", "none", np.ones((2, 3)), np.ones((2, 3)), 1.0)])
    good = path.read_text().splitlines()
    path.write_text("\n".join(good[:-1]) + "\n")
    with pytest.raises(ValueError, match="5 rows, expected 2 repeats x 3 iterations"):
        read_metrics(path)
    path.write_text("\n".join([*good, good[-1]]) + "\n")
    with pytest.raises(ValueError, match="repeated"):
        read_metrics(path)
    path.write_text("\n".join([good[0], "atc,none,zero,1,1.0,1.0"]) + "\n")
    with pytest.raises(ValueError, match=r"m\.csv:2"):
        read_metrics(path)
    path.write_text("a,b\n")
    with pytest.raises(ValueError, match="header"):
        read_metrics(path)


def test_load_summary_rejects_other_json(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text('{"results": []}')
    with pytest.raises(ValueError, match="'config' and 'results'"):
        load_summary(path)


# plots and table


def test_plot_msd_has_one_column_per_strategy_present(tmp_path: Path) -> None:
    curves = [c for c in synthetic_curves() if c.strategy == "cta" and c.scheme != "random"]
    plot_msd(curves, tmp_path / "msd.png", title="CTA only")
    assert mpimg.imread(tmp_path / "msd.png").shape == (960, 600, 4)
    with pytest.raises(ValueError, match="at least one curve"):
        plot_msd([], tmp_path / "empty.png")


def test_plot_topology_without_pos_or_with_uniform_q(tmp_path: Path) -> None:
    plot_topology(nx.path_graph(4), tmp_path / "t.png")
    assert mpimg.imread(tmp_path / "t.png").shape == (960, 1080, 4)
    graph, q = ring()
    doubly_stochastic_q = np.full(6, 1 / 6)
    doubly_stochastic_q[1] *= 1 + 1e-12  # float noise from the eigensolver, drawn as uniform
    plot_topology(graph, tmp_path / "uniform.png", doubly_stochastic_q)
    assert mpimg.imread(tmp_path / "uniform.png").shape == (960, 1080, 4)
    with pytest.raises(ValueError, match="6 positive entries"):
        plot_topology(graph, tmp_path / "bad.png", q[:5])


def test_results_table_rows_and_columns(run: tuple[Path, list[Curve], dict[str, Any]]) -> None:
    _, curves, summary = run
    table = results_table(summary["results"])
    headers = [str(c.header) for c in table.columns]
    assert headers == [
        "strategy", "scheme", "MSD dB\ncentroid", "MSD dB\naverage", "rounds/s", "peer\nB/rd",
    ]  # fmt: skip
    assert "amortized" in str(table.caption)  # named as `privnet overhead` names it
    assert table.row_count == len(curves)
    cells = [list(c.cells) for c in table.columns]
    assert list(zip(cells[0], cells[1], strict=True)) == [c.key for c in curves]
    first = summary["results"][0]
    assert cells[2][0] == f"{first['msd_centroid_db']:.2f}"
    assert cells[5][:3] == ["1,000"] * 3


def test_results_table_omits_bytes_when_not_counted() -> None:
    table = results_table([{"strategy": "atc", "scheme": "none", "msd_centroid_db": -30.0,
                            "msd_avg_db": None, "rounds_per_s": 9.0}])  # fmt: skip
    assert [str(c.header) for c in table.columns][-1] == "rounds/s"
    assert [list(c.cells) for c in table.columns][3] == ["–"]


def test_classification_table_shows_testing_error_in_80_columns() -> None:
    record = {"strategy": "consensus", "scheme": "local-ghp", "iters": 300,
              "msd_centroid_db": -12.3, "msd_avg_db": -11.0, "test_error_centroid_pct": 15.91,
              "test_error_avg_pct": 18.61, "rounds_per_s": 103.2,
              "peer_bytes_per_round": 123_456.0}  # fmt: skip
    table = results_table([record])
    headers = [str(c.header) for c in table.columns]
    assert headers[4:6] == ["error %\ncentroid", "error %\naverage"]
    assert [list(c.cells) for c in table.columns][4:6] == [["15.91"], ["18.61"]]
    lines = _render(table, 80)
    assert max(map(len, lines)) <= 80 and not any("…" in line for line in lines)


def test_a_diverged_curve_is_called_so() -> None:
    grows = np.geomspace(1.0, 1e200, 30)[np.newaxis, :]
    flat = np.full((1, 30), 1e-3)
    noisy = np.random.default_rng(1).exponential(1e-3, (1, 30))
    assert diverged(Curve("atc", "none", grows, grows, 1.0))
    assert diverged(Curve("atc", "none", flat, np.full((1, 30), np.inf), 1.0))
    assert not diverged(Curve("atc", "none", flat, noisy, 1.0))
    unreported = flat.copy()
    unreported[0, 10:20] = np.nan  # rounds nobody reported (a lost agent, a resumed run)
    assert not diverged(Curve("atc", "none", unreported, unreported, 1.0))
    record = result_record(Curve("atc", "none", grows, grows, 1.0), {})
    assert record["diverged"] and [list(c.cells) for c in results_table([record]).columns][2:4] == [
        ["diverged"],
        ["diverged"],
    ]


def test_topology_nodes_never_overlap() -> None:
    """A geometric graph's close nodes are drawn apart by at least NODE_GAP of the span."""
    points = {0: (0.0, 0.0), 1: (0.001, 0.0), 2: (1.0, 1.0), 3: (0.5, 0.52), 4: (0.5, 0.5)}
    drawn = _spread(points)
    xy = np.array(list(drawn.values()))
    gaps = np.hypot(*(xy[:, None] - xy[None]).transpose(2, 0, 1)) + np.eye(len(xy))
    assert gaps.min() >= NODE_GAP - 1e-9
    assert np.allclose(xy[2], (1.0, 1.0), atol=1e-4)  # a node already apart stays put


def _render(table: Any, width: int) -> list[str]:
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text().splitlines()

"""The audit as people read it: the table `privnet inspect` prints (one row per session;
the full per-link detail is in audit.json) and the noise figure of audit.png."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.table import Table

from privnet.agent.spec import Scheme, Strategy

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def audit_table(report: dict[str, Any]) -> Table:
    """One row per session; the full per-link detail is in audit.json."""
    sample = report.get("sample") or {}
    on = f"; a sample of {sample['coordinates']:,} coordinates" if sample.get("sampled") else ""
    table = Table(title=f"wire audit of {report['run']} ({report['source']}{on})")
    for name in ("session", "models", "clear", "mask min", "mask med", "KS p", "var", "cancel"):
        table.add_column(name, justify="right")
    for s in report["sessions"]:
        if s.get("sealed"):
            table.add_row(_session_name(s), f"sealed ({s['sealed_unopened']})", "0", *"-----")
            continue
        resid = s["max_cancellation_residual"]
        leak = s["plaintext_messages"] and s["scheme"] != "none"
        seen, expected = s["model_messages"], s["expected_model_messages"]
        table.add_row(
            _session_name(s),
            f"{seen}" if seen == expected else f"[red]{seen}/{expected}",
            f"[red]{s['plaintext_messages']}" if leak else str(s["plaintext_messages"]),
            fmt(s["masking_strength"]["min"]),
            fmt(s["masking_strength"]["median"]),
            fmt(_p_value(s["noise"])),
            fmt(s["noise"]["variance_ratio"]),
            fmt(resid["max"] if resid else None),
        )
    table.caption = (
        "models: seen on the wire; clear: equal to the sender's true value; mask: "
        "|wire - true| / |true|; KS p, var: wire - true against the scheme's Laplace law (u4 "
        "masks: the uniform law of a 32-bit word); "
        "cancel: max residual of a masked scheme at a hub, each term on the lattice"
    )
    return table


def _p_value(noise: dict[str, Any]) -> float | None:
    """The KS p-value of the table: the Laplace law's, or the u4 masks' uniform law's."""
    p = noise["p_value"]
    return p if p is not None or "masks" not in noise else noise["masks"]["p_value"]


def _session_name(s: dict[str, Any]) -> str:
    return (
        f"{s['strategy']}/{s['scheme']}"
        + (f" r{s['repeat']}" if s["repeat"] else "")
        + (f" ({len(s['views'])} views)" if "views" in s else "")
    )


def redo_line(s: dict[str, Any]) -> str:
    """A session with membership changes: its views and what redone rounds re-released."""
    redo = s["redo"]
    changes = ", ".join(
        f"view {r['view']} from round {r['from_round']} ({r['rounds_begun_before']} begun before)"
        for r in redo["rounds_redone"]
    )
    again = {a: t["same_value"] for a, t in redo["re_releases"].items() if t["same_value"]}
    fresh = sum(t["fresh_masks"] for t in redo["re_releases"].values())
    return (
        f"{s['strategy']}/{s['scheme']}: {len(s['views'])} views ({changes}), each audited "
        f"with its own weights; same values re-released by redone rounds, per agent: {again}"
        f" ({fresh} frames sent again under a fresh mask)"
    )


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def noise_panel(session: tuple[Strategy, Scheme, int], repeats: int, p_value: float | None) -> str:
    """The title of a session's panel in audit.png (the key of `Audit.noise`)."""
    strategy, scheme, repeat = session
    which = f"{strategy}/{scheme}" + (f", repeat {repeat}" if repeats > 1 else "")
    return f"{which}\nKS test against Laplace(0, b): p = {fmt(p_value)}"


def plot_noise(noise: dict[str, np.ndarray], path: Path) -> None:
    noise_figure(noise).savefig(path, dpi=110)


def noise_figure(noise: dict[str, np.ndarray]) -> Figure:
    """Histogram of (wire - true) / b per private session, against the Laplace(0, 1) density:
    what masking added to each model on the wire, in units of the noise scale b."""
    from matplotlib.figure import Figure  # matplotlib loads only to draw

    panels = max(1, len(noise))
    fig = Figure(figsize=(4 * panels, 3.6))
    axes = fig.subplots(1, panels, squeeze=False)[0]
    grid = np.linspace(-6, 6, 400)
    for ax, (name, samples) in zip(axes, noise.items(), strict=False):
        density, edges = np.histogram(samples, bins=60, range=(-6, 6), density=True)
        ax.stairs(density, edges, fill=True, alpha=0.6, label="wire - true")
        ax.plot(grid, 0.5 * np.exp(-np.abs(grid)), "k", lw=1.2, label="Laplace(0, 1)")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("(model on the wire - true model) / b")
        ax.set_ylabel("probability density")
        ax.legend(fontsize=7)
    if not noise:
        axes[0].text(0.5, 0.5, "no private scheme with noise in this run", ha="center")
    fig.tight_layout()
    return fig

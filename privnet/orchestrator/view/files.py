"""A finished run's directory as the page's state (`privnet view RUN_DIR`).

Everything comes from the files a run writes anyway: its experiment (summary.json, or the
journal of a run that did not finish), the curves (metrics.csv: MSD or testing error and,
with --account, epsilon per agent), the membership views (membership.json), the wire audit
(audit.json), the agents' logs; and, when the run was watched (`--view`), view.json with
what only the live view saw (rounds/s and bytes over time, the per-agent table, the
timeline). A directory copied elsewhere shows the same page.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from privnet.agent.spec import ConfigError
from privnet.orchestrator.conductor import View, describe, session_label
from privnet.orchestrator.curves import METRICS_HEADER
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_list, session_plans
from privnet.orchestrator.view.links import link_bytes
from privnet.orchestrator.view.state import AgentRow, ViewState, db

VIEW_FILE = "view.json"
AUDIT_FILE = "audit.json"
SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.csv"
MEMBERSHIP_FILE = "membership.json"


def run_meta(problem: Instance, run: str, labels: Sequence[str], live: bool) -> dict[str, Any]:
    """What the page's header says and how it draws the curves (MSD, or the problem's test
    metric in %)."""
    config = problem.config
    return {
        "run": run,
        "live": live,
        "agents": config.agents,
        "iters": config.iters,
        "sessions": list(labels),
        "metric": problem.metric or "msd",
        "topology": config.topology,
        "scheme": ",".join(str(s) for s in config.schemes),
        "strategy": ",".join(str(s) for s in config.strategies),
    }


def audit_summary(report: dict[str, Any]) -> dict[str, Any]:
    """The audit's verdict per session, as the page shows it: models seen, how many were
    clear, the largest cancellation residual of a masked scheme."""
    checked = []
    for s in report.get("sessions", []):
        residual = s.get("max_cancellation_residual")
        checked.append(
            {
                "label": f"{s['strategy']}/{s['scheme']}/{s['repeat']}",
                "models": s["model_messages"],
                "expected": s["expected_model_messages"],
                "clear": s["plaintext_messages"],
                "residual": residual["max"] if residual else None,
            }
        )
    return {"checked": checked}


def load_run(run_dir: Path) -> ViewState:
    """The page's state of a finished (or interrupted) run; ConfigError saying what is
    missing when `run_dir` is no run's directory."""
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a directory: give a run's --out directory")
    summary = _json(run_dir / SUMMARY_FILE)
    if summary is not None:
        settings = summary.get("config", {})
    else:
        from privnet.orchestrator.engines import journal

        try:
            settings = journal.config(run_dir).to_dict()
        except ValueError:
            raise ConfigError(
                f"{run_dir} has no {SUMMARY_FILE} (nor a journal): give the --out directory "
                "of a `privnet run` or `privnet simulate`"
            ) from None
    names = {f.name for f in fields(ExperimentConfig)}
    from privnet.orchestrator.engines import journal
    from privnet.orchestrator.experiment import config as configuration

    if settings.get("seed") == journal.SECRETS:  # the run drew it: its owner reads it there
        settings = {**settings, "seed": json.loads((run_dir / journal.SECRETS).read_text())["seed"]}

    config = configuration.with_overrides(
        ExperimentConfig(), {k: v for k, v in settings.items() if k in names}
    )
    problem = Instance.build(config)
    labels = [session_label(*session) for session in session_list(config)]
    run = str(settings.get("run", run_dir.name))
    state = ViewState(
        run_meta(problem, run, labels, live=False),
        [problem.graph.nodes[p]["pos"] for p in range(config.agents)],
    )
    state.meta |= {"account": None, "audit": (run_dir / AUDIT_FILE).is_file()}
    state.set_edges(problem.graph.edges)
    views = _views(run_dir / MEMBERSHIP_FILE)
    _curves(state, run_dir / METRICS_FILE, problem)
    _links(state, problem, run, views)
    _agents(state, views, summary)
    extra = _json(run_dir / VIEW_FILE) or {}
    for name in ("rates", "bytes"):
        series = getattr(state, name)
        for row in zip(*(extra.get(name, {}).get(c, []) for c in series.columns), strict=True):
            series.add(*row)
    for n, row in enumerate(extra.get("agents", [])[: config.agents]):
        state.agents[n] = AgentRow(**row)
    for t, label, kind, text in extra.get("timeline", []):
        state.note(t, label, kind, text)
    if not extra.get("timeline"):
        for view in views:
            if view.view > 0 or view.start > 1:
                state.note(0.0, labels[view.session], "view", describe(view))
    state.results = extra.get("results") or _results(summary)
    if extra.get("epsilon") is not None:
        state.epsilon = extra["epsilon"]
    report = _json(run_dir / AUDIT_FILE)
    if report is not None:
        state.audit = audit_summary(report)
    last = labels[-1] if labels else ""
    state.update(
        stage="finished" if summary is not None else "interrupted",
        label=last,
        round=config.iters,
        rounds=config.iters,
        view=views[-1].view if views else 0,
        members=len(views[-1].members) if views else config.agents,
    )
    return state


def _json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc})") from None


def _views(path: Path) -> list[View]:
    if not path.is_file():
        return []
    from privnet.orchestrator.engines.watch import read_membership

    try:
        return read_membership(path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _curves(state: ViewState, path: Path, problem: Instance) -> None:
    """metrics.csv: per session (strategy/scheme/repeat) the page's metric per round, and
    with --account epsilon per agent at the last round."""
    if not path.is_file():
        return
    scored = problem.metric_series
    agents = problem.config.agents
    eps: dict[str, dict[str, Any]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            label = f"{row['strategy']}/{row['scheme']}/{row['repeat']}"
            if scored and all(row.get(k) for k in scored):
                values = [100 * float(row[k]) for k in scored]
            else:
                values = [db(float(row[k])) or math.nan for k in METRICS_HEADER[4:]]
            own = row.get(problem.agent_series[1]) or "nan"  # the agents' own, every round
            mine = 100 * float(own) if scored else db(float(own))
            state.curve(label).add(int(row["iter"]), *values, mine)
            if row.get("epsilon_network"):
                eps[label] = {
                    "round": int(row["iter"]),
                    "agents": [_eps(row.get(f"epsilon_{p}", "")) for p in range(agents)],
                    "network": _eps(row["epsilon_network"]),
                }
    if eps:
        state.epsilon = {"neighbour": None, "sessions": eps}


def _eps(cell: str) -> float | str:
    value = float(cell) if cell else math.nan
    return value if math.isfinite(value) else "inf"


def _links(state: ViewState, problem: Instance, run: str, views: list[View]) -> None:
    """Links by model bytes per round under the run's last view."""
    plans = session_plans(problem, session_list(problem.config)[-1:])
    plan = plans[0]
    view = views[-1] if views else View(0, 0, 1, tuple(range(problem.config.agents)), "start")
    specs = plan.specs
    if len(view.members) != len(specs) and plan.view_specs is not None:
        specs = plan.view_specs(frozenset(view.members))
    sealed = problem.config.seal_links
    sent = link_bytes(run, specs, view.members, view.start, view.view, sealed)
    state.edge_bytes = [sent.get(edge, 0.0) for edge in state.edges]


def _agents(state: ViewState, views: list[View], summary: dict[str, Any] | None) -> None:
    last = views[-1] if views else None
    orchestrator = (summary or {}).get("config", {}).get("orchestrator", {})
    stayed = set(orchestrator.get("agents_not_left", []))
    for agent, row in enumerate(state.agents):
        row.round = state.meta["iters"]
        if last is not None and agent not in last.members:
            row.phase, row.why = "excluded", last.left.get(agent, "left out")
        else:
            row.phase = "finished" if summary is None or agent in stayed else "left"
            row.view = last.view if last is not None else 0


def _results(summary: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per strategy x scheme (all repeats): rounds/s, bytes per round, rejections."""
    return [
        {
            "label": f"{r['strategy']}/{r['scheme']}",
            "rounds_per_s": r.get("rounds_per_s"),
            "bytes_per_round": r.get("bytes_per_round_by_category", {}),
            "rejected": r.get("rejected", {}),
        }
        for r in (summary or {}).get("results", [])
    ]

"""What privacy costs on the wire: bytes and messages per round, per scheme and re-key policy.

The whole protocol runs on the memory engine (the agents' own code, control plane included)
and every frame an agent publishes is tapped and sized as the PUBLISH the agents count, at
its category's QoS: nothing is estimated from formulas, so the figures match a `privnet
run` of the same config (tests check this). The cost is the peer plane's (models, key
shares, key set-up, amortized over the rounds asked for); control and telemetry are counted
apart. Beside the paper's bound on local-ghp's extra messages (Sec. IV-C:
|N_p| + sum_{k in N_p} |N_k| / 2, what p originates) it counts what p forwards as a hub.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from privnet.agent.messages import KeyPlan, KeyShare
from privnet.agent.protocol import Publish, Traffic
from privnet.agent.spec import STRATEGY_STEP, Rekey, Scheme, Strategy
from privnet.agent.wire import Peer
from privnet.orchestrator.engines.memory import CONDUCTOR, Network
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_plans
from privnet.orchestrator.terminal import narrow_table

RUN = "run-00000000"  # as long as the names `privnet run` draws (net.new_run_name)
TOPOLOGIES = ("ring", "geometric", "complete")
CATEGORIES = ("model", "keys", "telemetry", "control")


class Tally(Traffic):
    """PUBLISH bytes and message counts by category, as the agents count them."""

    def as_dict(self, per: float = 1.0) -> dict[str, dict[str, float]]:
        def split(counts: Counter[str]) -> dict[str, float]:
            by = {c: counts[c] / per for c in CATEGORIES}
            return {**by, "total": sum(by.values())}

        return {"bytes": split(self.octets), "messages": split(self.messages)}


@dataclass
class Measured:
    """One scheme on one graph: setup and per-round traffic, DH work, key messages per agent."""

    setup: Tally
    rounds: Tally
    agreements: int
    originated: np.ndarray  # key messages each agent originates (plans + own shares)
    relayed: np.ndarray  # key shares each agent forwards as a hub


def _one_time(msg: Peer, rekey: Rekey) -> bool:
    return isinstance(msg, KeyPlan) or (isinstance(msg, KeyShare) and rekey is Rekey.ONCE)


def measure(problem: Instance, strategy: Strategy, scheme: Scheme) -> Measured:
    """Run the whole protocol in memory and tally every frame an agent publishes."""
    c = problem.config
    setup, rounds = Tally(), Tally()
    originated, relayed = np.zeros(c.agents, int), np.zeros(c.agents, int)

    def tap(publisher: str, frame: Publish) -> None:
        if publisher == CONDUCTOR:
            return
        tally = rounds if frame.category in ("model", "telemetry") else setup
        if frame.category == "keys":  # read as its sender can (the frame may be sealed)
            session = network.nodes[int(publisher.removeprefix("agent-"))].session
            assert session is not None, f"{publisher} published a key frame outside a session"
            msg = session.links.read(frame.payload)
            tally = setup if _one_time(msg, c.rekey) else rounds
            mine = not isinstance(msg, KeyShare) or msg.sender == msg.owner  # else relayed
            (originated if mine else relayed)[msg.sender] += 1
        tally.add(frame.category, frame.topic, frame.payload)

    plans = session_plans(problem, [(strategy, scheme, 0)])
    network = Network.build(plans, tap=tap, run=RUN, seal_links=c.seal_links)
    network.play()
    agreements = sum(n.session.core.counters.agreements for n in network.nodes if n.session)
    return Measured(setup, rounds, agreements, originated, relayed)


def degrees(A: np.ndarray) -> np.ndarray:
    """|N_k| without k itself, for every agent."""
    return np.count_nonzero(A, axis=0) - 1


def paper_bound(A: np.ndarray) -> np.ndarray:
    """|N_p| + sum over neighbours k of |N_k| / 2, per agent p (Sec. IV-C of the paper)."""
    deg = degrees(A)
    neighbours = (A != 0) & ~np.eye(len(A), dtype=bool)
    return deg + (neighbours.astype(float) @ deg) / 2


def row(
    problem: Instance, strategy: Strategy, scheme: Scheme, measured: Measured
) -> dict[str, Any]:
    """One scheme on one graph, measured over its config's rounds."""
    c = problem.config
    step = STRATEGY_STEP[strategy]
    A = problem.matrices(strategy)[(0, 1, 2).index(step)]
    masked = scheme.masked
    every = c.rekey is Rekey.EVERY_ROUND
    epochs = c.iters if every else 1
    per_round, setup = measured.rounds.as_dict(per=c.iters), measured.setup.as_dict()
    models, keys = per_round["bytes"]["model"], per_round["bytes"]["keys"]
    key_setup = setup["bytes"]["keys"]
    result: dict[str, Any] = {
        "topology": c.topology,
        "mean_degree": float(np.mean(degrees(A))),
        "strategy": str(strategy),
        "scheme": str(scheme),
        "rekey": str(c.rekey) if masked else "n/a",
        "agents": c.agents,
        "rounds": c.iters,  # what the figures are measured and amortized over
        "privacy": {  # peer-plane bytes, as the module says
            "models_per_round": models,
            "keys_per_round": keys,
            "key_setup": key_setup,
            "amortized_per_round": models + keys + key_setup / c.iters,
        },
        "setup": setup,
        "per_round": per_round,
        "dh_agreements": measured.agreements,
        "dh_agreements_setup": 0 if every else measured.agreements,
        "dh_agreements_per_round": measured.agreements / c.iters if every else 0.0,
    }
    if masked:
        plans = np.count_nonzero(A, axis=1) - 1  # one plan per neighbour, sent once
        first_epoch = plans + (measured.originated - plans) / epochs
        bound = paper_bound(A)
        result["key_messages_per_agent"] = {
            "originated_first_epoch_mean": float(np.mean(first_epoch)),
            "originated_first_epoch_max": float(np.max(first_epoch)),
            "relayed_per_epoch_mean": float(np.mean(measured.relayed / epochs)),
            "paper_bound_mean": float(np.mean(bound)),
            "agents_over_bound": int(np.sum(first_epoch > bound + 1e-9)),
            "max_originated_over_bound": float(np.max(first_epoch / bound)),
            "max_with_relays_over_bound": float(
                np.max((first_epoch + measured.relayed / epochs) / bound)
            ),
        }
    return result


def _sealing(
    problem: Instance, strategy: Strategy, scheme: Scheme, measured: dict[str, Any]
) -> dict[str, float]:
    """Amortized peer bytes per round with every link sealed and with the visible wire: the
    row's own setting is `measured`, the other one is played too (the same problem: only
    how the links go differs)."""
    c = problem.config
    other = replace(problem, config=replace(c, seal_links=not c.seal_links))
    theirs = row(other, strategy, scheme, measure(other, strategy, scheme))
    mine = measured["privacy"]["amortized_per_round"]
    ours = theirs["privacy"]["amortized_per_round"]
    sealed, visible = (mine, ours) if c.seal_links else (ours, mine)
    return {"sealed_per_round": sealed, "visible_per_round": visible}


# (topology, scheme, rekey) -> summary.json's `config` of a `--runtime docker` run of that
# row: its `nic` and, where the broker counted it, `broker_sys`
WireFigures = dict[tuple[str, str, str], dict[str, Any]]


def runs() -> list[tuple[Scheme, Rekey]]:
    """The rows of a topology: every scheme, the masked ones under both re-key policies."""
    return [(s, r) for s in Scheme for r in (Rekey if s.masked else [Rekey.ONCE])]


def overhead(
    base: ExperimentConfig,
    strategy: Strategy = Strategy.ATC,
    topologies: tuple[str, ...] = TOPOLOGIES,
    progress: Callable[[str], None] | None = None,
    wire: WireFigures | None = None,
) -> list[dict[str, Any]]:
    """Every scheme (the masked ones under both re-key policies) on every topology, over
    `base.iters` rounds; with `wire`, each row also gets what a real run of it carried: the
    agents' interfaces (NIC) and the broker ($SYS)."""
    rows = []
    for topology in topologies:
        none: dict[str, Any] = {}
        for scheme, rekey in runs():
            config = replace(
                base,
                topology=topology,
                strategies=(strategy,),
                schemes=(scheme,),
                rekey=rekey,
                repeats=1,
            )
            problem = Instance.build(config)
            started = time.perf_counter()
            measured = measure(problem, strategy, scheme)
            result = row(problem, strategy, scheme, measured)
            result["sealing"] = _sealing(problem, strategy, scheme, result)
            result["wall_s"] = time.perf_counter() - started
            figures = {"amortized": result["privacy"]["amortized_per_round"]}
            real = (wire or {}).get((topology, str(scheme), str(rekey)), {})
            if "nic" in real:
                result["nic"] = real["nic"]
                figures["nic"] = real["nic"]["agents_tx_per_round"]
            if "broker_sys" in real:
                result["broker_sys"] = real["broker_sys"]
                per = {k: v / base.iters for k, v in real["broker_sys"].items()}
                result["broker_sys_per_round"] = per
                figures["sys"] = per["bytes_received"]
            if not scheme.part.hides:  # the baseline: ratio_to_none
                none = figures
            result["ratio_to_none"] = {
                k: v / none[k] if none.get(k) else None for k, v in figures.items()
            }
            rows.append(result)
            if progress is not None:
                progress(f"{topology}/{scheme}/{result['rekey']}")
    return rows


COST_CAPTION = (
    "Peer-plane MQTT PUBLISH bytes (models and key shares go at QoS 0). models, keys: per "
    "round, over the run; key set-up: once per run; amortized: models + keys + key set-up / "
    "{rounds} rounds, which is `privnet run`'s peer B/rd for this config. x none: amortized "
    "over none's."
)
WIRE_CAPTION = (
    "A real run of each row on containers, divided by its {rounds} rounds, registration, "
    "control and telemetry included. NIC: what the agents' interfaces sent (TCP/IP, MQTT acks, "
    "keepalives); $SYS: what the broker received (MQTT only)."
)


def overhead_tables(rows: list[dict[str, Any]]) -> list[Table]:
    """What privacy costs, one table per topology (each fits 80 columns); what the wire
    carried in real runs, where measured; local-ghp's key messages against the paper's
    bound."""
    tables = []
    topologies = list(dict.fromkeys(r["topology"] for r in rows))
    for topology in topologies:
        mine = [r for r in rows if r["topology"] == topology]
        first = mine[0]
        title = (
            f"What privacy costs: {topology}, {first['agents']} agents, mean degree "
            f"{first['mean_degree']:.1f}, {first['strategy']}"
        )
        last = topology == topologies[-1]  # the caption once, under the last
        table = narrow_table(title, COST_CAPTION.format(rounds=first["rounds"]) if last else None)
        names = ["scheme", "re-key", "models\nB/rd", "keys\nB/rd", "key set-up\nB"]
        names += [f"amortized\nB/rd ({first['rounds']})", "x none"]
        _columns(table, names, labels=2)
        for r in mine:
            cost = r["privacy"]
            table.add_row(
                r["scheme"],
                r["rekey"],
                f"{cost['models_per_round']:,.0f}",
                f"{cost['keys_per_round']:,.0f}",
                f"{cost['key_setup']:,.0f}",
                f"{cost['amortized_per_round']:,.0f}",
                _ratio(r["ratio_to_none"].get("amortized")),
            )
        tables.append(table)
    tables.append(_sealing_table(rows))
    if any("nic" in r or "broker_sys" in r for r in rows):
        tables.append(_wire_table(rows))
    tables.append(_keys_table(rows))
    return tables


def _sealing_table(rows: list[dict[str, Any]]) -> Table:
    table = narrow_table(
        "What sealing costs",
        f"Amortized peer B/rd over {rows[0]['rounds']} rounds, every link sealed "
        "(ChaCha20-Poly1305, the default) and the paper's visible wire (--seal-links off, "
        "an HMAC per frame): both played in full.",
    )
    _columns(table, ["topology", "scheme", "re-key", "sealed", "visible", "x visible"], labels=3)
    for r in rows:
        seal = r["sealing"]
        table.add_row(
            r["topology"],
            r["scheme"],
            r["rekey"],
            f"{seal['sealed_per_round']:,.0f}",
            f"{seal['visible_per_round']:,.0f}",
            _ratio(seal["sealed_per_round"] / seal["visible_per_round"]),
        )
    return table


def _wire_table(rows: list[dict[str, Any]]) -> Table:
    table = narrow_table("What the wire carried", WIRE_CAPTION.format(rounds=rows[0]["rounds"]))
    names = ["topology", "scheme", "re-key", "NIC B/rd", "NIC x none", "$SYS B/rd", "x none"]
    _columns(table, names, labels=3)
    for r in rows:
        nic, sys_per = r.get("nic"), r.get("broker_sys_per_round")
        table.add_row(
            r["topology"],
            r["scheme"],
            r["rekey"],
            f"{nic['agents_tx_per_round']:,.0f}" if nic else "not measured",
            _ratio(r["ratio_to_none"].get("nic")),
            f"{sys_per['bytes_received']:,.0f}" if sys_per else "not measured",
            _ratio(r["ratio_to_none"].get("sys")),
        )
    return table


def _keys_table(rows: list[dict[str, Any]]) -> Table:
    table = narrow_table(
        "Masked schemes: DH agreements, key messages vs the paper's bound",
        "msgs/agent: key plans and shares an agent originates in its first key epoch "
        "(relays not counted); bound: |N_p| + sum_k |N_k| / 2 (Sec. IV-C)",
    )
    names = ["topology", "scheme", "re-key", "DH once", "DH/rd", "msgs/agent\nmean (max)"]
    names += ["bound\nmean", "agents\nover it"]
    _columns(table, names, labels=3)
    for r in rows:
        keys = r.get("key_messages_per_agent")
        if keys is None:
            continue
        table.add_row(
            r["topology"],
            r["scheme"],
            r["rekey"],
            f"{r['dh_agreements_setup']:,}",
            f"{r['dh_agreements_per_round']:,.0f}",
            f"{keys['originated_first_epoch_mean']:.1f} ({keys['originated_first_epoch_max']:.0f})",
            f"{keys['paper_bound_mean']:.1f}",
            f"{keys['agents_over_bound']} of {r['agents']}",
        )
    return table


def _columns(table: Table, names: list[str], labels: int) -> None:
    """The first `labels` columns name the row (left), the others are figures (right);
    cells wrap, never cut."""
    for n, name in enumerate(names):
        table.add_column(name, justify="left" if n < labels else "right", overflow="fold")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def plot_overhead(rows: list[dict[str, Any]], path: Path) -> None:
    """Peer bytes per round against mean degree, one line per scheme (and re-key policy):
    a round's, and amortized over the run with the key set-up."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    fig = Figure(figsize=(10, 4.4), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    panels = (
        ("per_round", "(a) a round (models, every-round's keys)"),
        ("amortized_per_round", f"(b) amortized over {rows[0]['rounds']} rounds (+ key set-up)"),
    )
    where = {r["mean_degree"]: r["topology"] for r in rows}  # a tick per topology
    for ax, (field, title) in zip(axes, panels, strict=True):
        lines: dict[str, list[tuple[float, float]]] = {}
        for r in rows:
            name = r["scheme"] if r["rekey"] == "n/a" else f"{r['scheme']} ({r['rekey']})"
            cost = r["privacy"]
            value = (
                cost["models_per_round"] + cost["keys_per_round"]
                if field == "per_round"
                else cost[field]
            )
            lines.setdefault(name, []).append((r["mean_degree"], value))
        for n, (name, points) in enumerate(lines.items()):
            x, y = zip(*sorted(points), strict=True)
            ax.plot(x, y, "o-", label=name, zorder=2 + n, linewidth=2.5 - 0.3 * n)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sorted(where), [f"{d:.3g}\n{where[d]}" for d in sorted(where)])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("mean degree")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("peer bytes per round, all agents (MQTT PUBLISH)")
    axes[0].legend(fontsize=8, title="lines that coincide cost the same", title_fontsize=7)
    fig.suptitle(
        f"What privacy costs on the wire: {rows[0]['agents']} agents, {rows[0]['strategy']}"
    )
    fig.savefig(path, dpi=110)


def write_overhead(rows: list[dict[str, Any]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead.json").write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    plot_overhead(rows, out / "overhead.png")

"""What privacy costs on the wire: bytes and messages per round, per scheme and re-key policy.

The whole protocol runs on the memory engine (the very code the agents run, control plane
included), and every frame an agent publishes is tapped and sized as an MQTT 3.1.1 PUBLISH
at QoS 1 (agent.topics.mqtt_publish_size). Nothing is estimated from formulas, so the
numbers match a `privnet run` of the same config (tests check this).

One-time setup: the agent's control frames (Hello, Ready, Finished) and the masked
schemes' (local-ghp, masked-ghp) key plans, plus their key shares with re-key `once`.
Per round: models, telemetry (sealed true models, batched as the shell batches them) and,
with `every-round`, that round's key shares.

The paper (Sec. IV-C) bounds the extra communication of agent p under local-ghp by
|N_p| + sum_{k in N_p} |N_k| / 2 (neighbourhoods without the agent itself): one split
announcement per neighbour, one key share per partner at every neighbouring hub. We count
both what p originates (plans + shares) and what it forwards as a hub (relays), which the
bound leaves out and which grows like |N_p|^2 / 2.
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

from agent.messages import KeyPlan, KeyShare
from agent.node import Publish, Traffic
from agent.spec import STRATEGY_STEP, Rekey, Scheme, Strategy
from agent.wire import Peer
from orchestrator.engines.memory import CONDUCTOR, Network
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.problem import Problem
from orchestrator.experiment.specs import session_plans

RUN = "run-00000000"  # as long as the names `privnet run` draws (net.new_run_name)
TOPOLOGIES = ("ring", "geometric", "complete")
CATEGORIES = ("model", "keys", "telemetry", "control")
NIC_CAPTION = (
    "NIC B/rd: what the agents' container interfaces sent (Docker stats) in a real run of the "
    "row, registration and setup included, divided by its rounds: TCP/IP, MQTT acks and "
    "keepalives included"
)


class Tally(Traffic):
    """PUBLISH bytes and message counts by category, as the agents count them."""

    def as_dict(self, per: float = 1.0) -> dict[str, dict[str, float]]:
        def split(counts: Counter[str]) -> dict[str, float]:
            by = {c: counts[c] / per for c in CATEGORIES}
            return {**by, "total": sum(by.values())}

        return {"bytes": split(self.bytes), "messages": split(self.messages)}


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


def measure(problem: Problem, strategy: Strategy, scheme: Scheme) -> Measured:
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


def row(problem: Problem, strategy: Strategy, scheme: Scheme, measured: Measured) -> dict[str, Any]:
    c = problem.config
    step = STRATEGY_STEP[strategy]
    A = problem.matrices(strategy)[(0, 1, 2).index(step)]
    masked = scheme.masked
    epochs = c.iters if c.rekey is Rekey.EVERY_ROUND else 1
    result: dict[str, Any] = {
        "topology": c.topology,
        "mean_degree": float(np.mean(degrees(A))),
        "strategy": str(strategy),
        "scheme": str(scheme),
        "rekey": str(c.rekey) if masked else "n/a",
        "agents": c.agents,
        "rounds": c.iters,
        "setup": measured.setup.as_dict(),
        "per_round": measured.rounds.as_dict(per=c.iters),
        "dh_agreements": measured.agreements,
        "dh_agreements_setup": 0 if c.rekey is Rekey.EVERY_ROUND else measured.agreements,
        "dh_agreements_per_round": measured.agreements / c.iters
        if c.rekey is Rekey.EVERY_ROUND
        else 0.0,
    }
    if masked:
        plans = np.count_nonzero(A, axis=1) - 1  # one plan per neighbour, sent once
        first_epoch = plans + (measured.originated - plans) / epochs
        bound = paper_bound(A)
        result["key_messages_per_agent"] = {
            "originated_first_epoch_mean": float(np.mean(first_epoch)),
            "relayed_per_epoch_mean": float(np.mean(measured.relayed / epochs)),
            "paper_bound_mean": float(np.mean(bound)),
            "agents_over_bound": int(np.sum(first_epoch > bound + 1e-9)),
            "max_originated_over_bound": float(np.max(first_epoch / bound)),
            "max_with_relays_over_bound": float(
                np.max((first_epoch + measured.relayed / epochs) / bound)
            ),
        }
    return result


# (topology, scheme, rekey) -> summary.json's `nic` of a `--runtime docker` run of that row
NicFigures = dict[tuple[str, str, str], dict[str, Any]]


def runs() -> list[tuple[Scheme, Rekey]]:
    """The rows of a topology: every scheme, the masked ones under both re-key policies."""
    return [(s, r) for s in Scheme for r in (Rekey if s.masked else [Rekey.ONCE])]


def overhead(
    base: ExperimentConfig,
    strategy: Strategy = Strategy.ATC,
    topologies: tuple[str, ...] = TOPOLOGIES,
    progress: Callable[[str], None] | None = None,
    nic: NicFigures | None = None,
) -> list[dict[str, Any]]:
    """Every scheme (the masked ones under both re-key policies) on every topology; with `nic`,
    each row also gets the bytes the agents' network interfaces sent per round."""
    rows = []
    for topology in topologies:
        none_bytes = none_nic = None
        for scheme, rekey in runs():
            config = replace(
                base,
                topology=topology,
                strategies=(strategy,),
                schemes=(scheme,),
                rekey=rekey,
                repeats=1,
            )
            problem = Problem.build(config)
            started = time.perf_counter()
            result = row(problem, strategy, scheme, measure(problem, strategy, scheme))
            result["wall_s"] = time.perf_counter() - started
            total = result["per_round"]["bytes"]["total"]
            none_bytes = total if scheme is Scheme.NONE else none_bytes
            result["per_round_ratio_to_none"] = total / none_bytes if none_bytes else None
            measured_nic = (nic or {}).get((topology, str(scheme), str(rekey)))
            if measured_nic is not None:
                sent = measured_nic["agents_tx_per_round"]
                none_nic = sent if scheme is Scheme.NONE else none_nic
                result["nic"] = measured_nic
                result["nic_ratio_to_none"] = sent / none_nic if none_nic else None
            rows.append(result)
            if progress is not None:
                progress(f"{topology}/{scheme}/{result['rekey']}")
    return rows


def overhead_table(rows: list[dict[str, Any]]) -> Table:
    title = "communication per round (MQTT PUBLISH bytes, QoS 1) and one-time setup"
    table = Table(title=title, caption=NIC_CAPTION if any("nic" in r for r in rows) else None)
    for name in (
        "topology", "deg", "scheme", "rekey", "model B/rd", "keys B/rd", "telem B/rd",
        "total B/rd", "x none", "NIC B/rd", "NIC x none", "setup B", "DH setup", "DH/rd",
        "key msgs/agent", "bound",
    ):  # fmt: skip
        table.add_column(name, justify="right")
    for r in rows:
        per = r["per_round"]["bytes"]
        keys_per_agent = r.get("key_messages_per_agent")
        nic = r.get("nic")
        table.add_row(
            r["topology"],
            f"{r['mean_degree']:.1f}",
            r["scheme"],
            r["rekey"],
            f"{per['model']:.0f}",
            f"{per['keys']:.0f}",
            f"{per['telemetry']:.0f}",
            f"{per['total']:.0f}",
            f"{r['per_round_ratio_to_none']:.2f}",
            f"{nic['agents_tx_per_round']:.0f}" if nic else "-",
            f"{r['nic_ratio_to_none']:.2f}" if nic and r["nic_ratio_to_none"] else "-",
            f"{r['setup']['bytes']['total']:.0f}",
            str(r["dh_agreements_setup"]),
            f"{r['dh_agreements_per_round']:.0f}",
            f"{keys_per_agent['originated_first_epoch_mean']:.1f}" if keys_per_agent else "-",
            f"{keys_per_agent['paper_bound_mean']:.1f}" if keys_per_agent else "-",
        )
    return table


def plot_overhead(rows: list[dict[str, Any]], path: Path) -> None:
    """Bytes per round against mean degree, one line per scheme (and re-key policy)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.subplots()
    lines: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        name = r["scheme"] if r["rekey"] == "n/a" else f"{r['scheme']} ({r['rekey']})"
        lines.setdefault(name, []).append((r["mean_degree"], r["per_round"]["bytes"]["total"]))
    for name, points in lines.items():
        x, y = zip(*sorted(points), strict=True)
        ax.plot(x, y, "o-", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    degrees_seen = sorted({r["mean_degree"] for r in rows})
    ax.set_xticks(degrees_seen, [f"{d:.3g}" for d in degrees_seen])  # the topologies measured
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("mean degree")
    ax.set_ylabel("bytes per round (all agents)")
    ax.set_title(f"privacy overhead, {rows[0]['agents']} agents, {rows[0]['strategy']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.text(
        0.98,
        0.02,
        "lines that coincide send the same bytes per round;\n`once` pays its keys at setup",
        transform=ax.transAxes,
        fontsize=7,
        ha="right",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_overhead(rows: list[dict[str, Any]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead.json").write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    plot_overhead(rows, out / "overhead.png")

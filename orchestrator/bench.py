"""`privnet bench`: how fast privnet runs, against what its transport can do, in one sitting.

For every broker x agent count asked for, in this order:
1. the transport ceiling: raw MQTT clients (the agents' own `agent.mqtt.Connection`, with
   the run's credentials and ACL) publish, round after round, the same messages per round
   (one per directed edge of the graph) with the same payload size as privnet's models, and
   wait for their in-neighbours' messages before the next round: no privnet logic at all.
   The clients live in one process per core.
2. privnet itself (`privnet run` as a subprocess) for every scheme, its processes sampled
   for CPU (agents, broker, orchestrator) and peak RSS; with `--against FLAGS`, each repeat
   also runs with those flags added, right after, so the two are compared in one sitting
   (`--against "--seal-links off"`: what sealing costs).
3. the memory engine on the same config (the same nodes, signed and MACed bytes, no sockets).
Each measurement is repeated `--repeats` times, the median kept. The machine may be shared:
compare the ratios within one sitting, not absolute numbers across sittings.

Writes bench.json and bench.png to --out and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
from rich.table import Table

from agent import topics
from agent.mqtt import BrokerAddress, Connection, run
from agent.protocol import PEER_QOS, Publish
from agent.spec import ConfigError, Scheme, Strategy
from broker.credentials import Credentials
from broker.launcher import has_mosquitto, launch
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.problem import Problem
from orchestrator.flags import comma_list, integer
from orchestrator.terminal import console, progress_bar, table_console

if TYPE_CHECKING:
    from matplotlib.figure import Figure

RUN = "bench"
BROKERS = ("mosquitto", "embedded")  # what bench can start: brokers run here


@dataclass
class Row:
    kind: str  # ceiling, privnet, memory
    broker: str
    scheme: str
    agents: int
    rounds_per_s: float
    messages_per_s: float
    runs: list[float] = field(default_factory=list)  # rounds/s of every repeat
    cpu_agents_s: float | None = None
    cpu_broker_s: float | None = None
    cpu_orchestrator_s: float | None = None
    peak_agent_rss_mb: float | None = None
    peak_total_rss_mb: float | None = None
    wall_s: float | None = None
    x_ceiling: float | None = None
    x_memory: float | None = None
    variant: str = ""  # the --against flags this privnet row ran with ("": the baseline)
    x_baseline: float | None = None  # a variant's rounds/s over the baseline's


# ---- 1. the transport ceiling ---------------------------------------------------------------


def _edges(problem: Problem, strategy: Strategy) -> dict[int, list[int]]:
    """Out-neighbours (self excluded) at every communicating step of a round."""
    out: dict[int, list[int]] = {p: [] for p in range(problem.config.agents)}
    for a in problem.matrices(strategy):
        if np.array_equal(a, np.eye(len(a))):
            continue  # a step with A = I sends nothing
        for m in range(len(a)):
            out[m] += [p for p in range(len(a)) if p != m and a[m, p] > 0]
    return out


async def _ceiling_clients(
    address: BrokerAddress,
    credentials: Credentials,
    ids: list[int],
    out: dict[int, list[int]],
    rounds: int,
    size: int,
    ready: Any,
    go: Any,
    result: Any,
) -> None:
    expected = {p: 0 for p in ids}
    for targets in out.values():
        for k in targets:
            if k in expected:
                expected[k] += 1
    conns = {}
    for p in ids:
        conn = Connection(address, credentials.access(str(p)))
        await conn.__aenter__()
        await conn.subscribe(topics.inbox_filter(RUN, p), PEER_QOS)
        conns[p] = conn
    ready.set()
    await asyncio.to_thread(go.wait)
    payload = bytes(size)
    start = time.perf_counter()

    async def agent(p: int) -> None:
        conn, got = conns[p], [0] * (rounds + 2)
        for r in range(rounds):
            head = r.to_bytes(4, "big")
            for k in out[p]:
                conn.publish(topics.peer_topic(RUN, k, p), head + payload, PEER_QOS)
            while got[r] < expected[p]:
                _, data, _ = await conn.get(60.0)
                got[int.from_bytes(data[:4], "big")] += 1

    await asyncio.gather(*(agent(p) for p in ids))
    result.put(time.perf_counter() - start)
    for conn in conns.values():
        await conn.__aexit__(None, None, None)


def _ceiling_worker(*args: Any) -> None:
    run(_ceiling_clients(*args))


def ceiling(
    broker_kind: str, out: dict[int, list[int]], rounds: int, size: int, workers: int
) -> tuple[float, float, float]:
    """(rounds/s, messages/s, broker CPU s) of the raw load on a fresh broker."""
    agents = len(out)
    credentials = Credentials.generate(RUN, agents)
    broker = launch(broker_kind, credentials=credentials)
    broker.start()
    try:
        ctx = mp.get_context("fork")  # no event loop runs here yet; children start their own
        go, result = ctx.Event(), ctx.Queue()
        procs, readies = [], []
        for w in range(workers):
            ready = ctx.Event()
            ids = list(range(w, agents, workers))
            args = (broker.address, credentials, ids, out, rounds, size, ready, go, result)
            proc = ctx.Process(target=_ceiling_worker, args=args, daemon=True)
            proc.start()
            procs.append(proc)
            readies.append(ready)
        for ready in readies:
            if not ready.wait(120):
                raise RuntimeError("ceiling clients did not connect within 120 s")
        cpu0 = _cpu(broker.pid)
        go.set()
        took = max(result.get(timeout=600) for _ in procs)
        cpu = _cpu(broker.pid) - cpu0
        for proc in procs:
            proc.join(10)
    finally:
        broker.stop()
    messages = sum(len(v) for v in out.values())
    return rounds / took, rounds * messages / took, cpu


def _cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


# ---- 2. privnet ----------------------------------------------------------------------------


@dataclass
class Sample:
    """CPU and memory of a process tree, sampled until it exits."""

    cpu: dict[str, float] = field(default_factory=dict)  # role -> CPU s
    peak_agent_rss: int = 0
    peak_total_rss: int = 0


def _role(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline())
        name = proc.name()
    except psutil.Error:
        return "other"
    if "-m agent" in cmd or "-m orchestrator.engines.zygote" in cmd:  # it imports for them
        return "agents"
    if name == "mosquitto" or "broker.embedded" in cmd:
        return "broker"
    return "orchestrator"


def watch(proc: subprocess.Popen[bytes], every: float = 0.25) -> Sample:
    root = psutil.Process(proc.pid)
    last: dict[int, tuple[str, float]] = {}
    sample = Sample()
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            break
        total = 0
        for p in tree:
            try:
                with p.oneshot():
                    known = last.get(p.pid, ("orchestrator", 0.0))[0]
                    # a child seen before its exec looks like the orchestrator: ask again
                    role = known if known != "orchestrator" else _role(p)
                    t = p.cpu_times()
                    rss = p.memory_info().rss
            except psutil.Error:
                continue
            last[p.pid] = (role, t.user + t.system + t.children_user * 0)
            total += rss
            if role == "agents":
                sample.peak_agent_rss = max(sample.peak_agent_rss, rss)
        sample.peak_total_rss = max(sample.peak_total_rss, total)
        time.sleep(every)
    for role, cpu in last.values():
        sample.cpu[role] = sample.cpu.get(role, 0.0) + cpu
    return sample


def privnet_run(
    broker_kind: str, config_args: list[str], schemes: list[str], out: Path, extra: list[str]
) -> tuple[dict[str, dict[str, Any]], Sample, float]:
    """One `privnet run` of every scheme: summary results by scheme, its sample, its wall."""
    command = [
        sys.executable, "-m", "orchestrator.cli", "run", "--broker", broker_kind,
        *config_args, "--scheme", ",".join(schemes), "--out", str(out), *extra,
    ]  # fmt: skip
    start = time.perf_counter()
    with open(out.parent / f"{out.name}.log", "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        sample = watch(proc)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (out.parent / f"{out.name}.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"privnet run on {broker_kind} exited {proc.returncode}: {tail}")
    results = json.loads((out / "summary.json").read_text())["results"]
    return {r["scheme"]: r for r in results}, sample, wall


# ---- 3. the memory engine ------------------------------------------------------------------


def memory_rate(problem: Problem, strategy: Strategy, scheme: Scheme) -> tuple[float, int, int]:
    """(rounds/s, model messages per round, mean model payload bytes) on the memory engine."""
    from orchestrator.engines.memory import Network
    from orchestrator.experiment.specs import session_plans

    sizes: list[int] = []

    def tap(_who: str, frame: Publish) -> None:
        if frame.category == "model":
            sizes.append(len(frame.payload))

    plans = session_plans(problem, [(strategy, scheme, 0)])
    network = Network.build(plans, tap=tap, seal_links=problem.config.seal_links)
    start = time.perf_counter()
    result = network.play()[0]
    took = result.wall or (time.perf_counter() - start)
    rounds = problem.config.iters
    return rounds / took, len(sizes) // rounds, int(statistics.mean(sizes)) if sizes else 0


# ---- the sitting ----------------------------------------------------------------------------


def bench(args: argparse.Namespace) -> int:
    brokers = [b for b in args.brokers.split(",") if b != "mosquitto" or has_mosquitto()]
    schemes = [str(Scheme(s)) for s in args.schemes.split(",")]
    counts = [int(n) for n in str(args.agents).split(",")]
    strategy = Strategy(args.strategy)
    out = args.out or Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    variants = ["", *([args.against] if args.against else [])]
    steps = len(counts) * args.repeats * (len(schemes) + len(brokers) * (1 + len(variants)))
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "python": sys.version.split()[0],
        "iters": args.iters,
        "strategy": str(strategy),
        "repeats": args.repeats,
        "extra": args.extra,
        "against": args.against,
    }
    with progress_bar() as bar, tempfile.TemporaryDirectory() as tmp:
        task = bar.add_task("bench", total=steps, status="")

        def step(what: str) -> None:
            bar.update(task, advance=1, status=what)

        for agents in counts:
            config = ExperimentConfig(
                agents=agents, iters=args.iters, strategies=(strategy,), seed=args.seed
            )
            problem = Problem.build(config)
            config_args = [
                "--agents", str(agents), "--iters", str(args.iters), "--strategy", str(strategy),
                "--repeats", "1", "--seed", str(args.seed),
            ]  # fmt: skip
            memory: dict[str, Row] = {}
            size, per_round = 0, 0
            for scheme in schemes:
                rates = []
                for _ in range(args.repeats):
                    rate, per_round, size = memory_rate(problem, strategy, Scheme(scheme))
                    rates.append(rate)
                    step(f"memory {scheme} {agents}: {rate:.0f} rounds/s")
                median = statistics.median(rates)
                memory[scheme] = Row(
                    "memory", "-", scheme, agents, median, median * per_round, rates
                )
            rows += memory.values()
            edges = _edges(problem, strategy)
            for broker_kind in brokers:
                rates, msgs, cpus = [], [], []
                for _ in range(args.repeats):
                    r, m, c = ceiling(broker_kind, edges, args.iters, size, args.workers)
                    rates.append(r)
                    msgs.append(m)
                    cpus.append(c)
                    step(f"ceiling {broker_kind} {agents}: {r:.0f} rounds/s")
                top = Row(
                    "ceiling", broker_kind, "-", agents, statistics.median(rates),
                    statistics.median(msgs), rates, cpu_broker_s=statistics.median(cpus),
                )  # fmt: skip
                rows.append(top)
                runs: dict[tuple[str, str], list[tuple[dict[str, Any], Sample, float]]] = {}
                for rep in range(args.repeats):
                    for n, variant in enumerate(variants):  # interleaved: one sitting
                        where = Path(tmp) / f"{broker_kind}-{agents}-{rep}-{n}"
                        extra = f"{args.extra} {variant}".split()
                        results, sample, wall = privnet_run(
                            broker_kind, config_args, schemes, where, extra
                        )
                        for scheme in schemes:
                            runs.setdefault((variant, scheme), []).append(
                                (results[scheme], sample, wall)
                            )
                        shown = ", ".join(f"{s} {results[s]['rounds_per_s']:.1f}" for s in schemes)
                        step(f"privnet{variant and ' ' + variant} {broker_kind} {agents}: {shown}")
                for (variant, scheme), got in runs.items():
                    rates = [r["rounds_per_s"] for r, _, _ in got]
                    model = got[0][0]["messages"].get("model", 0) / args.iters
                    median = statistics.median(rates)
                    samples = [s for _, s, _ in got]
                    rows.append(
                        Row(
                            "privnet", broker_kind, scheme, agents, median, median * model, rates,
                            cpu_agents_s=statistics.median(s.cpu.get("agents", 0) for s in samples),
                            cpu_broker_s=statistics.median(s.cpu.get("broker", 0) for s in samples),
                            cpu_orchestrator_s=statistics.median(
                                s.cpu.get("orchestrator", 0) for s in samples
                            ),
                            peak_agent_rss_mb=max(s.peak_agent_rss for s in samples) / 1e6,
                            peak_total_rss_mb=max(s.peak_total_rss for s in samples) / 1e6,
                            wall_s=statistics.median(w for _, _, w in got),
                            x_ceiling=median / top.rounds_per_s,
                            x_memory=median / memory[scheme].rounds_per_s,
                            variant=variant,
                            x_baseline=median / statistics.median(
                                r["rounds_per_s"] for r, _, _ in runs[("", scheme)]
                            ) if variant else None,
                        )
                    )  # fmt: skip
            for row in rows:
                if row.kind == "ceiling" and row.agents == agents:
                    row.x_memory = row.rounds_per_s / max(m.rounds_per_s for m in memory.values())
    meta["load_after"] = os.getloadavg()
    (out / "bench.json").write_text(
        json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n"
    )
    plot(rows, out / "bench.png", meta)
    table_console().print(table(rows, meta))
    console.print(f"wrote {out}/bench.json and bench.png")
    return 0


def table(rows: list[Row], meta: dict[str, Any]) -> Table:
    t = Table(
        title=f"privnet bench {meta['date']}: {meta['cpus']} cores, {meta['strategy']}, "
        f"{meta['iters']} rounds, median of {meta['repeats']}; load "
        f"{meta['load_before'][0]:.1f} -> {meta['load_after'][0]:.1f}"
    )
    columns = [
        "what", "broker", "scheme", "agents", "rounds/s", "messages/s", "x ceiling", "x memory",
        "CPU agents s", "CPU broker s", "CPU orch s", "peak agent MB", "peak total MB",
    ]  # fmt: skip
    if meta.get("against"):
        columns.insert(7, "x baseline")
    for c in columns:
        t.add_column(c, justify="left" if c in ("what", "broker", "scheme") else "right")

    def f(x: float | None, fmt: str = ".1f") -> str:
        return "-" if x is None else format(x, fmt)

    for r in rows:
        what = f"{r.kind} {r.variant}" if r.variant else r.kind
        cells = [what, r.broker, r.scheme, str(r.agents), f(r.rounds_per_s)]
        cells += [f(r.messages_per_s, ",.0f"), f(r.x_ceiling, ".2f")]
        cells += [f(r.x_baseline, ".3f")] if meta.get("against") else []
        cells += [f(r.x_memory, ".3f")]
        cells += [f(r.cpu_agents_s), f(r.cpu_broker_s), f(r.cpu_orchestrator_s)]
        t.add_row(*cells, f(r.peak_agent_rss_mb, ".0f"), f(r.peak_total_rss_mb, ".0f"))
    return t


def plot(rows: list[Row], path: Path, meta: dict[str, Any]) -> None:
    figure(rows, meta).savefig(path, dpi=110)


def figure(rows: list[Row], meta: dict[str, Any]) -> Figure:
    """rounds/s of every measurement as bars from zero on a linear axis, so that a ratio
    reads as a ratio of lengths; whiskers span the repeats (min to max)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    labels = [
        " / ".join(
            x
            for x in (f"{r.agents} agents", r.broker, r.kind, r.variant, r.scheme)
            if x not in ("", "-")
        )
        for r in rows
    ]
    colours = {"ceiling": "#999999", "privnet": "#1f77b4", "memory": "#2ca02c"}
    fig = Figure(figsize=(8.5, 1.4 + 0.42 * len(rows)), layout="constrained")
    ax = fig.subplots()
    y = np.arange(len(rows))[::-1]
    rates = np.array([r.rounds_per_s for r in rows])
    low = np.array([min(r.runs, default=r.rounds_per_s) for r in rows])
    high = np.array([max(r.runs, default=r.rounds_per_s) for r in rows])
    ax.barh(y, rates, color=[colours[r.kind] for r in rows], height=0.7)
    ax.errorbar(rates, y, xerr=[rates - low, high - rates], fmt="none", ecolor="k", capsize=3)
    for at, r, top in zip(y, rows, high, strict=True):
        note = f" {r.rounds_per_s:.0f}"
        if r.x_ceiling is not None:
            note += f" ({r.x_ceiling:.2f} of the ceiling)"
        ax.text(top, at, note, va="center", fontsize=8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlim(0, 1.3 * float(high.max()))
    ax.set_xlabel(f"rounds/s (median of {meta['repeats']}; whiskers: min to max)")
    ax.grid(True, axis="x", alpha=0.3)
    kinds = dict.fromkeys(r.kind for r in rows)
    ax.legend(
        [Patch(color=colours[k]) for k in kinds],
        [{"ceiling": "transport ceiling (raw clients)"}.get(k, k) for k in kinds],
        fontsize=8,
        loc="lower right",
    )
    ax.set_title(
        f"privnet bench, {meta['date']}, {meta['cpus']} cores, {meta['strategy']}, "
        f"{meta['iters']} rounds",
        fontsize=9,
    )
    return fig


def add_parser(
    sub: Any,
    handler: Callable[[argparse.Namespace, None], int],
    cli: Callable[[], argparse.ArgumentParser],
) -> None:
    """`privnet bench` under `sub`; `cli` builds the whole CLI's parser, which checks the
    `privnet run` flags of --extra and --against."""
    p = sub.add_parser("bench", help="rounds/s against the transport ceiling, in one sitting")
    p.add_argument("--brokers", type=comma_list(_broker, "a broker"), default="mosquitto,embedded")
    p.add_argument("--schemes", type=comma_list(Scheme, "a scheme"), default="none,local-ghp")
    p.add_argument(
        "--agents", type=comma_list(integer(2), "agents"), default="30", help="a comma list"
    )
    p.add_argument("--iters", type=integer(1), default=200, help="rounds per measurement")
    p.add_argument("--strategy", choices=[str(s) for s in Strategy], default="atc")
    p.add_argument("--repeats", type=integer(1), default=3, help="median of this many")
    p.add_argument("--seed", type=integer(0, 2**63 - 1), default=1)
    p.add_argument(
        "--workers", type=integer(1), default=os.cpu_count() or 2, help="ceiling processes"
    )
    p.add_argument("--extra", default="", help="more `privnet run` flags, quoted")
    p.add_argument(
        "--against",
        default="",
        help="`privnet run` flags to compare with, quoted: each repeat runs without, then with",
    )
    p.add_argument("--out", type=Path, help="output directory (default runs/bench-<time>)")
    p.set_defaults(func=handler, configure=partial(_check, cli))


def _broker(name: str) -> str:
    if name not in BROKERS:
        raise ValueError(f"choose from {', '.join(BROKERS)}")
    return name


def _check(cli: Callable[[], argparse.ArgumentParser], args: argparse.Namespace) -> None:
    """--extra and --against hold `privnet run` flags: checked as that command checks them."""
    cli().parse_args(["run", *args.extra.split(), *args.against.split()])
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file: give a directory (made if missing)")

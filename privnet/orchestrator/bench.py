"""`privnet bench`: how fast privnet runs, against what its transport can do, in one sitting.

For every broker x agent count asked for, in this order:
1. the transport ceiling: raw MQTT clients (the agents' own `privnet.agent.transport.Connection`,
   with the run's credentials and ACL) publish, round after round, the same frames per round
   as privnet's models (per directed edge of the graph, as many frames as a model takes in
   chunks, each of privnet's mean model frame size: the same bytes), and wait for their
   in-neighbours' frames before the next round: no privnet logic at all. The clients live
   in one process per core.
2. privnet itself (`privnet run` as a subprocess) for every scheme, its processes sampled
   for CPU (agents, broker, orchestrator) and peak RSS; with `--against FLAGS`, each repeat
   also runs with those flags added, right after, so the two are compared in one sitting
   (`--against "--seal-links off"`: what sealing costs).
3. the memory engine on the same config (the same nodes, signed and MACed bytes, no sockets).
With `--params N` every measurement carries a model of about N parameters (`mlp` on digits,
one hidden layer sized to N) instead of the paper's, and the rows say the model bytes a
second moved: privnet's against the raw clients' for the same bytes.
Each measurement is repeated `--repeats` times, the median kept. The machine may be shared:
compare the ratios within one sitting, not absolute numbers across sittings.

Writes bench.json and bench.png to --out and prints the table.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
from rich.table import Table

from privnet.agent.protocol import Publish
from privnet.agent.spec import Scheme, Strategy
from privnet.broker.launcher import has_mosquitto
from privnet.orchestrator.ceiling import ceiling
from privnet.orchestrator.ceiling import edges as ceiling_edges
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.terminal import console, progress_bar, table_console

if TYPE_CHECKING:
    from matplotlib.figure import Figure


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
    params: int = 0  # the model's parameters
    model_mb_per_s: float | None = None  # model bytes a second (1e6), rounds/s x bytes a round


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
    if (
        "-m privnet.agent" in cmd or "-m privnet.orchestrator.engines.zygote" in cmd
    ):  # it imports for them
        return "agents"
    if name == "mosquitto" or "privnet.broker.embedded" in cmd:
        return "broker"
    return "orchestrator"


def watch(
    proc: subprocess.Popen[bytes],
    every: float = 0.25,
    timeline: list[tuple[float, float, float]] | None = None,
) -> Sample:
    """Every process of the run's tree, by role, until it ends (then reaped, so
    `proc.returncode` is set); `timeline` gets (wall time, the agents' and the
    orchestrator's CPU seconds so far) at each look, for CPU over a window of the run.

    Sampling misses what a process spends after its last look (0.25 s at most), which the
    kernel still counts: the run's process is read once more as it exits, before it is
    reaped (its own CPU, whole: the orchestrator's; and its waited-for children's, the
    agents, the broker and their forks, whole), and the agents are charged what the
    children spent beyond the broker and the orchestrator's other children."""
    root = psutil.Process(proc.pid)
    last: dict[int, tuple[str, float]] = {}
    sample = Sample()
    while not _exited(proc):
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
            last[p.pid] = (role, t.user + t.system)
            total += rss
            if role == "agents":
                sample.peak_agent_rss = max(sample.peak_agent_rss, rss)
        sample.peak_total_rss = max(sample.peak_total_rss, total)
        if timeline is not None:
            agents = sum(cpu for role, cpu in last.values() if role == "agents")
            mine = sum(cpu for role, cpu in last.values() if role == "orchestrator")
            timeline.append((time.time(), agents, mine))
        time.sleep(every)
    final = _final_times(root)
    proc.wait()
    for pid, (role, cpu) in last.items():
        if final is None or pid != root.pid:
            sample.cpu[role] = sample.cpu.get(role, 0.0) + cpu
    if final is not None:
        own, children = final
        sample.cpu["orchestrator"] = sample.cpu.get("orchestrator", 0.0) + own
        others = sum(sample.cpu.get(role, 0.0) for role in ("broker", "orchestrator")) - own
        sample.cpu["agents"] = max(sample.cpu.get("agents", 0.0), children - others)
    return sample


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the process has ended, leaving it unreaped (its times still readable)."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped elsewhere (another thread's wait)
        return True


def _final_times(root: psutil.Process) -> tuple[float, float] | None:
    """(its own CPU, its waited-for descendants' CPU) of the ended, unreaped process."""
    try:
        t = root.cpu_times()
    except psutil.Error:
        return None
    return t.user + t.system, t.children_user + t.children_system


def privnet_run(
    broker_kind: str, config_args: list[str], schemes: list[str], out: Path, extra: list[str]
) -> tuple[dict[str, dict[str, Any]], Sample, float]:
    """One `privnet run` of every scheme: summary results by scheme, its sample, its wall."""
    command = [
        sys.executable, "-m", "privnet.orchestrator.cli", "run", "--broker", broker_kind,
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


def memory_rate(problem: Instance, strategy: Strategy, scheme: Scheme) -> tuple[float, int, int]:
    """(rounds/s, model messages per round, mean model payload bytes) on the memory engine."""
    from privnet.orchestrator.engines.memory import Network
    from privnet.orchestrator.experiment.specs import session_plans

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


@dataclass(frozen=True)
class Sitting:
    """What one `privnet bench` measures: its flags (defaults are the CLI's)."""

    brokers: tuple[str, ...]  # mosquitto is left out where it is not installed
    schemes: tuple[Scheme, ...]
    agents: tuple[int, ...]  # agent counts, each measured in turn
    iters: int  # rounds per measurement
    strategy: Strategy
    repeats: int  # the median of this many
    seed: int
    workers: int  # the ceiling's client processes
    extra: str  # more `privnet run` flags (`base` holds them for the memory engine)
    against: str  # `privnet run` flags every repeat also runs with, right after
    out: Path | None  # default runs/bench-<time>
    params: int | None = None  # a model of about this many parameters (mlp on digits)
    base: ExperimentConfig = field(default_factory=ExperimentConfig)  # the `extra` flags


DIGITS_ROWS = 1347  # digits' training rows, dealt out among the agents


def model_fields(params: int, agents: int) -> dict[str, Any]:
    """The experiment fields of `mlp` on digits with one hidden layer as wide as brings it
    nearest `params` parameters, each agent's share of the rows in full."""
    return _mlp(_mlp_width(params), agents)


def _mlp(width: int, agents: int) -> dict[str, Any]:
    return {
        "problem": "mlp",
        "dataset": "digits",
        "params": {"hidden": [width]},
        "samples": max(DIGITS_ROWS // agents, 1),
    }


@functools.cache
def _mlp_width(params: int) -> int:
    """The hidden width nearest `params` parameters: the size is affine in the width (and
    does not depend on the agents), so two sizes, at widths 1 and 2, give it."""

    def dim(width: int) -> int:
        return Instance.build(ExperimentConfig(agents=2, **_mlp(width, 2))).config.dim

    one, two = dim(1), dim(2)
    return max(1, round((params - (one - (two - one))) / (two - one)))


def model_toml(fields: dict[str, Any]) -> str:
    """`model_fields` as a `privnet run --config` file."""
    (width,) = fields["params"]["hidden"]
    return (
        f'problem = "{fields["problem"]}"\ndataset = "{fields["dataset"]}"\n'
        f"samples = {fields['samples']}\nparams = {{ hidden = [{width}] }}\n"
    )


def bench(sitting: Sitting) -> int:
    """The sitting measured, its rows written (bench.json, bench.png) and shown."""
    brokers = [b for b in sitting.brokers if b != "mosquitto" or has_mosquitto()]
    schemes = [str(s) for s in sitting.schemes]
    out = sitting.out or Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    variants = ["", *([sitting.against] if sitting.against else [])]
    per_count = len(schemes) + len(brokers) * (1 + len(variants))
    steps = len(sitting.agents) * sitting.repeats * per_count
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "python": sys.version.split()[0],
        "iters": sitting.iters,
        "strategy": str(sitting.strategy),
        "repeats": sitting.repeats,
        "extra": sitting.extra,
        "against": sitting.against,
        "params": sitting.params,
    }
    with progress_bar() as bar, tempfile.TemporaryDirectory() as tmp:
        task = bar.add_task("bench", total=steps, status="")

        def step(what: str) -> None:
            bar.update(task, advance=1, status=what)

        measure = _Measure(sitting, schemes, variants, Path(tmp), step)
        for agents in sitting.agents:
            rows += measure.count(agents, brokers)
    meta["load_after"] = os.getloadavg()
    (out / "bench.json").write_text(
        json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n"
    )
    plot(rows, out / "bench.png", meta)
    table_console().print(table(rows, meta))
    console.print(f"wrote {out}/bench.json and bench.png")
    return 0


Runs = dict[tuple[str, str], list[tuple[dict[str, Any], Sample, float]]]  # (variant, scheme)


class _Measure:
    """One sitting's measurements of an agent count, in the module's order; `step` says
    each one's figure on the progress bar."""

    def __init__(
        self,
        sitting: Sitting,
        schemes: list[str],
        variants: list[str],
        tmp: Path,
        step: Callable[[str], None],
    ) -> None:
        self.sitting, self.schemes, self.variants = sitting, schemes, variants
        self.tmp, self.step = tmp, step

    def count(self, agents: int, brokers: list[str]) -> list[Row]:
        """The memory engine's rows, then each broker's ceiling and privnet rows."""
        problem = Instance.build(self._config(agents))
        edges = ceiling_edges(problem, self.sitting.strategy)
        links = sum(map(len, edges.values()))
        memory, size, frames = self._memory(problem, agents, links)
        rows = list(memory.values())
        for broker_kind in brokers:
            top = self._ceiling(broker_kind, agents, edges, size, frames)
            rows.append(top)
            rows += self._privnet(broker_kind, agents, top, memory)
        for row in rows:
            row.params = problem.config.dim
            if row.kind == "ceiling":
                row.x_memory = row.rounds_per_s / max(m.rounds_per_s for m in memory.values())
                row.model_mb_per_s = row.rounds_per_s * frames * size * links / 1e6
        return rows

    def _config(self, agents: int) -> ExperimentConfig:
        s = self.sitting
        model = model_fields(s.params, agents) if s.params else {}
        return replace(
            s.base, agents=agents, iters=s.iters, strategies=(s.strategy,), seed=s.seed, **model
        )

    def _memory(
        self, problem: Instance, agents: int, links: int
    ) -> tuple[dict[str, Row], int, int]:
        """The memory engine's row of every scheme, the model frame's mean bytes and the
        frames a link carries a round (more than one: a model in chunks)."""
        memory: dict[str, Row] = {}
        size, per_round = 0, 0
        for scheme in self.schemes:
            rates = []
            for _ in range(self.sitting.repeats):
                rate, per_round, size = memory_rate(problem, self.sitting.strategy, Scheme(scheme))
                rates.append(rate)
                self.step(f"memory {scheme} {agents}: {rate:.0f} rounds/s")
            median = statistics.median(rates)
            memory[scheme] = Row("memory", "-", scheme, agents, median, median * per_round, rates)
            memory[scheme].model_mb_per_s = median * per_round * size / 1e6
        return memory, size, max(per_round // max(links, 1), 1)

    def _ceiling(
        self, broker_kind: str, agents: int, edges: dict[int, list[int]], size: int, frames: int
    ) -> Row:
        s = self.sitting
        rates, msgs, cpus = [], [], []
        for _ in range(s.repeats):
            r, m, c = ceiling(broker_kind, edges, s.iters, size, s.workers, frames)
            rates.append(r)
            msgs.append(m)
            cpus.append(c)
            self.step(f"ceiling {broker_kind} {agents}: {r:.0f} rounds/s")
        return Row(
            "ceiling", broker_kind, "-", agents, statistics.median(rates),
            statistics.median(msgs), rates, cpu_broker_s=statistics.median(cpus),
        )  # fmt: skip

    def _privnet(
        self, broker_kind: str, agents: int, top: Row, memory: dict[str, Row]
    ) -> list[Row]:
        """`privnet run` of every scheme, each repeat with every variant in turn (one
        sitting); a row per variant and scheme."""
        s = self.sitting
        config_args = [
            "--agents", str(agents), "--iters", str(s.iters), "--strategy", str(s.strategy),
            "--repeats", "1", "--seed", str(s.seed),
        ]  # fmt: skip
        if s.params:
            model = self.tmp / f"model-{agents}.toml"
            model.write_text(model_toml(model_fields(s.params, agents)))
            config_args += ["--config", str(model)]
        runs: Runs = {}
        for rep in range(s.repeats):
            for n, variant in enumerate(self.variants):  # interleaved: one sitting
                where = self.tmp / f"{broker_kind}-{agents}-{rep}-{n}"
                extra = f"{s.extra} {variant}".split()
                results, sample, wall = privnet_run(
                    broker_kind, config_args, self.schemes, where, extra
                )
                for scheme in self.schemes:
                    runs.setdefault((variant, scheme), []).append((results[scheme], sample, wall))
                shown = ", ".join(f"{x} {results[x]['rounds_per_s']:.1f}" for x in self.schemes)
                self.step(f"privnet{variant and ' ' + variant} {broker_kind} {agents}: {shown}")
        return [
            self._privnet_row(broker_kind, agents, variant, scheme, runs, top, memory)
            for variant, scheme in runs
        ]

    def _privnet_row(
        self,
        broker_kind: str,
        agents: int,
        variant: str,
        scheme: str,
        runs: Runs,
        top: Row,
        memory: dict[str, Row],
    ) -> Row:
        got = runs[(variant, scheme)]
        rates = [r["rounds_per_s"] for r, _, _ in got]
        model = got[0][0]["messages"].get("model", 0) / self.sitting.iters
        model_bytes = got[0][0].get("model_bytes_per_round") or 0.0
        median = statistics.median(rates)
        samples = [s for _, s, _ in got]
        return Row(
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
            model_mb_per_s=median * model_bytes / 1e6,
            x_baseline=median / statistics.median(
                r["rounds_per_s"] for r, _, _ in runs[("", scheme)]
            ) if variant else None,
        )  # fmt: skip


def table(rows: list[Row], meta: dict[str, Any]) -> Table:
    t = Table(
        title=f"privnet bench {meta['date']}: {meta['cpus']} cores, {meta['strategy']}, "
        f"{meta['iters']} rounds, median of {meta['repeats']}; load "
        f"{meta['load_before'][0]:.1f} -> {meta['load_after'][0]:.1f}"
    )
    columns = [
        "what", "broker", "scheme", "agents", "params", "rounds/s", "model MB/s", "messages/s",
        "x ceiling", "x memory",
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
        cells = [what, r.broker, r.scheme, str(r.agents), f"{r.params:,}", f(r.rounds_per_s)]
        cells += [f(r.model_mb_per_s, ".1f"), f(r.messages_per_s, ",.0f"), f(r.x_ceiling, ".2f")]
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

"""Peak memory of each agent process at a big model (issue 29), against the issue's bound.

One `privnet run` (mlp on digits with one hidden layer, ATC, sealed, mosquitto, `--seed 1`)
whose agent processes are read every 0.25 s from /proc (`smaps_rollup`: RSS, PSS, and USS,
what a process holds alone) and once more for their high-water RSS (`VmHWM`, which the kernel
keeps: no peak is missed between two looks). Each agent is held to its own bound, (its
in-degree + 4) x the model's bytes + 150 MB, the in-degree from the run's graph and the
model's bytes its parameters x the problem's dtype (4 for the float32 torch problems).

With `--extra "--agents-per-process K"` several agents share one process (one torch, one
event loop, each still its own MQTT client, keys and node: a deployment mode of privnet's):
a process is then held to the sum of its agents' bounds, and its figures are also given
divided by its agents. One JSON line; `--rows` adds a line per process; the run's directory
(about 0.7 GB at 1M parameters) is removed unless `--keep`. Run it under
`flock /work/notes/cpu.lock`.

    python scripts/agent_rss.py --agents 16 --hidden 13158 --iters 24   # 1,000,018 parameters
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from privnet.orchestrator.bench import _mlp, model_toml, watch
from privnet.orchestrator.engines import allocator
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance

LOG = re.compile(r"agents?-(\d+)(?:-(\d+))?\.log$")  # agent-N.log, agents-F-L.log


@dataclass
class Peak:
    """One agent process's largest figures, in bytes."""

    agents: list[int]
    rss: int = 0
    uss: int = 0
    pss: int = 0
    hwm: int = 0
    anon: int = 0
    jemalloc: bool = False  # its C allocator (privnet.orchestrator.engines.allocator)


def _rollup(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup's fields, in bytes."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def _hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _agents_of(pid: int) -> list[int] | None:
    """The agents a process runs, from the log its stdout goes to (the launcher's name)."""
    with contextlib.suppress(OSError):
        found = LOG.search(os.readlink(f"/proc/{pid}/fd/1"))
        if found:
            first, last = int(found[1]), int(found[2] or found[1])
            return list(range(first, last + 1))
    return None


def _sample(proc: subprocess.Popen[bytes], peaks: dict[int, Peak], every: float) -> None:
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            for p in root.children(recursive=True):
                with contextlib.suppress(psutil.Error, OSError):
                    if "-m privnet.agent" not in " ".join(p.cmdline()):
                        continue
                    if p.pid not in peaks:
                        agents = _agents_of(p.pid)
                        if agents is None:
                            continue
                        peaks[p.pid] = Peak(agents, jemalloc=allocator.loaded(p.pid))
                    peak, now = peaks[p.pid], _rollup(p.pid)
                    peak.rss = max(peak.rss, now["Rss"])
                    peak.pss = max(peak.pss, now["Pss"])
                    peak.anon = max(peak.anon, now.get("Anonymous", 0))
                    peak.uss = max(peak.uss, now["Private_Clean"] + now["Private_Dirty"])
                    peak.hwm = max(peak.hwm, _hwm(p.pid))
        time.sleep(every)


def summary_of(out: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((out / "run" / "summary.json").read_text())
    return summary


def _in_degrees(instance: Instance) -> dict[int, int]:
    graph = instance.graph
    degree = graph.in_degree if graph.is_directed() else graph.degree
    return {int(n): int(degree(n)) - (2 if graph.has_edge(n, n) else 0) for n in graph.nodes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=13158, help="mlp's hidden width")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--scheme", default="local-ghp")
    parser.add_argument("--topology", default="geometric")
    parser.add_argument("--extra", default="", help="more `privnet run` flags, quoted")
    parser.add_argument("--every", type=float, default=0.25, help="seconds between looks")
    parser.add_argument("--rows", action="store_true", help="a JSON line per process too")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (~0.7 GB)")
    args = parser.parse_args()
    fields = _mlp(args.hidden, args.agents)
    out = Path(tempfile.mkdtemp(prefix="agent-rss-"))
    (out / "model.toml").write_text(model_toml(fields))
    config = ExperimentConfig(
        agents=args.agents, iters=args.iters, topology=args.topology, seed=1, **fields
    )
    instance = Instance.build(config)
    degrees = _in_degrees(instance)
    model_bytes = instance.config.dim * getattr(instance.plugin, "dtype", np.dtype("f8")).itemsize
    cmd = [
        *(sys.executable, "-m", "privnet.orchestrator.cli", "run", "--broker", "mosquitto"),
        *("--config", str(out / "model.toml"), "--agents", str(args.agents)),
        *("--iters", str(args.iters), "--topology", args.topology, "--scheme", args.scheme),
        *("--strategy", "atc", "--seed", "1", "--quiet", "--out", str(out / "run")),
        *shlex.split(args.extra),
    ]
    began, load = time.time(), os.getloadavg()
    proc = subprocess.Popen(cmd, cwd=out, stdout=subprocess.DEVNULL)  # $PYTHONPATH's privnet
    peaks: dict[int, Peak] = {}
    sampler = threading.Thread(target=_sample, args=(proc, peaks, args.every), daemon=True)
    sampler.start()
    sample = watch(proc)
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"the run failed (exit {proc.returncode}); see {out / 'run'}")
    result = summary_of(out)["results"][0]
    mb = lambda b: round(b / 1e6, 1)  # noqa: E731
    rows = []
    for peak in sorted(peaks.values(), key=lambda p: p.agents[0]):
        bound = sum((degrees[a] + 4) * model_bytes + 150e6 for a in peak.agents)
        k = len(peak.agents)
        rows.append(
            {
                "agents": [peak.agents[0], peak.agents[-1]] if k > 1 else peak.agents[0],
                "in_degree": [degrees[a] for a in peak.agents],
                "bound_mb": mb(bound),
                "rss_mb": mb(max(peak.rss, peak.hwm)),
                "uss_mb": mb(peak.uss),
                "pss_mb": mb(peak.pss),
                "anon_mb": mb(peak.anon),
                "per_agent_rss_mb": mb(max(peak.rss, peak.hwm) / k),
                "per_agent_uss_mb": mb(peak.uss / k),
                "per_agent_bound_mb": mb(bound / k),
                "uss_over_bound_mb": mb(peak.uss - bound),
                "pss_over_bound_mb": mb(peak.pss - bound),
                "rss_over_bound_mb": mb(max(peak.rss, peak.hwm) - bound),
            }
        )
    summary = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(began)),
        "load": [round(x, 2) for x in (*load, os.getloadavg()[0])],
        "params": result["params"],
        "agents": args.agents,
        "processes": len(rows),
        "rounds": args.iters,
        "wire_dtype": result["wire_dtype"],
        "allocator": {0: "system", len(peaks): "jemalloc"}.get(
            sum(p.jemalloc for p in peaks.values()), "mixed"
        ),
        "model_bytes": model_bytes,
        "rounds_per_s": round(result["rounds_per_s"], 3),
        "agent_cpu_s_per_round": round(sample.cpu.get("agents", 0.0) / args.iters, 3),
        "orchestrator_session_cpu_s": summary_of(out)["config"]["orchestrator"]["session_cpu_s"],
        "rss_mb": [min(r["rss_mb"] for r in rows), max(r["rss_mb"] for r in rows)],
        "uss_mb": [min(r["uss_mb"] for r in rows), max(r["uss_mb"] for r in rows)],
        "pss_mb": [min(r["pss_mb"] for r in rows), max(r["pss_mb"] for r in rows)],
        "bound_mb": [min(r["bound_mb"] for r in rows), max(r["bound_mb"] for r in rows)],
        "worst_uss_over_bound_mb": max(r["uss_over_bound_mb"] for r in rows),
        "worst_rss_over_bound_mb": max(r["rss_over_bound_mb"] for r in rows),
        "processes_uss_within": sum(r["uss_over_bound_mb"] <= 0 for r in rows),
        "processes_pss_within": sum(r["pss_over_bound_mb"] <= 0 for r in rows),
        "processes_rss_within": sum(r["rss_over_bound_mb"] <= 0 for r in rows),
    }
    if args.keep:
        summary["out"] = str(out)
    else:
        shutil.rmtree(out)
    if args.rows:
        for row in rows:
            print(json.dumps(row))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

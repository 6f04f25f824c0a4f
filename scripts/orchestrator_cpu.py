"""The orchestrator's CPU per round against the agents', for two checkouts in one sitting
(issue 31).

Each measurement is a whole `privnet run` (ATC, `local-ghp`, mosquitto, `--seed 1`) of a
checkout (run with PYTHONPATH set to it, so `/work/main` can stand for "before"). The
orchestrator's CPU is summary.json's `orchestrator.session_cpu_s` (its process, Go to the
session's end) over the rounds; the agents' is their processes' CPU over the same window,
sampled every 0.25 s (`bench.watch`, its agents' role); the orchestrator's share of one core
is its session CPU over the session's wall time. Keying is the launch to Go, and the set-up
CPU each role's CPU by then (the orchestrator's: its process and its children but the
broker and the agents' zygote). Checkouts alternate, so drifting load hits both alike; one
JSON line per run. A big model: `--extra "--config model.toml"` (e.g. bench's mlp).

    python scripts/orchestrator_cpu.py /work/main . --agents 30 --iters 300 --repeats 2
    python scripts/orchestrator_cpu.py /work/main . --agents 1000 --iters 40 --repeats 2 \\
        --extra "--agents-per-process 50"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from privnet.orchestrator.bench import watch


def measure(tree: Path, agents: int, iters: int, topology: str, extra: list[str]) -> dict:
    """One run of the checkout `tree`: keying, rounds/s and both CPUs per round."""
    out = Path(tempfile.mkdtemp(prefix="orch-cpu-")) / "run"
    cmd = [
        *(sys.executable, "-m", "privnet.orchestrator.cli", "run", "--agents", str(agents)),
        *("--iters", str(iters), "--topology", topology, "--scheme", "local-ghp"),
        *("--strategy", "atc", "--broker", "mosquitto", "--seed", "1", "--quiet"),
        *("--out", str(out), *extra),
    ]
    env = dict(os.environ, PYTHONPATH=str(tree))
    began, samples = time.time(), []
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL)
    watch(proc, timeline=samples)  # until it ends (reaped: returncode set)
    if proc.returncode != 0:
        raise SystemExit(f"the run of {tree} failed (exit {proc.returncode}); see {out}")
    summary = json.loads((out / "summary.json").read_text())
    result, orchestrator = summary["results"][0], summary["config"]["orchestrator"]
    end = (out / "journal" / "session-0.json").stat().st_mtime
    go = end - result["wall_s"]

    def cpu_at(t: float, role: int = 1) -> float:
        return min(samples, key=lambda s: abs(s[0] - t))[role]

    return {
        "tree": str(tree),
        "agents": agents,
        "when": time.strftime("%H:%M:%S", time.gmtime(began)),
        "keying_s": round(go - began, 1),
        "setup_cpu_s": {"orchestrator": round(cpu_at(go, 2), 1), "agents": round(cpu_at(go), 1)},
        "rounds_per_s": round(result["rounds_per_s"], 3),
        "orchestrator_ms_per_round": round(1000 * orchestrator["session_cpu_s"] / iters, 2),
        "orchestrator_core_share": round(orchestrator["session_cpu_s"] / result["wall_s"], 4),
        "agents_ms_per_round": round(1000 * (cpu_at(end) - cpu_at(go)) / iters, 1),
        "received": orchestrator["received"],
        "frames_per_round": result["model_frames_per_round"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--agents", type=int, default=30)
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--topology", default="regular:6")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--extra", default="", help="more `privnet run` flags, quoted")
    args = parser.parse_args()
    for _ in range(args.repeats):
        for tree in (args.before.resolve(), args.after.resolve()):
            row = measure(tree, args.agents, args.iters, args.topology, shlex.split(args.extra))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

"""Kill agents of a running `privnet run` from outside, then check the run against its replay.

    python scripts/kill_demo.py --agents 30 --iters 600 --kill 9 --out runs/kill-demo

Starts `privnet run` (ATC, local-ghp, the broker it picks), watches its streamed
metrics.csv, and sends SIGKILL to one agent process (found by its command line, as an
operator would with `ps` and `kill -9`) at each of `--kill` rounds spread over the run,
choosing agents whose loss keeps the survivors' graph connected. Then it replays the run's
membership.json on the memory engine and prints the largest relative gap between the
survivors' trajectories and the replay's, and the views the run went through. Extra
arguments after `--` go to `privnet run` (e.g. `-- --audit`).

Under load, `--repeat` times in a row (issue 30):

    python scripts/kill_demo.py --agents 10 --iters 300 --kill 1 --victim 3 --at 40 \
        --by shell --busy 3 --repeat 10 --out runs/kill-load -- --deadline 2 --broker mosquitto

runs each beside `--busy` busy loops (`python -c "while True: pass"`, killed after) and
prints, per run, its exit code, its last view's members, the replay's gap and the
orchestrator's longest beat gap (summary.json) against `--deadline`.
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import networkx as nx
import numpy as np
import psutil

from privnet.orchestrator.engines.memory import Network
from privnet.orchestrator.engines.watch import read_membership
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_list, session_plans


def rounds_done(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    with metrics.open() as fh:
        return max(0, sum(1 for _ in csv.reader(fh)) - 1)


def victims(config: ExperimentConfig, count: int) -> list[int]:
    """Agents whose loss, one after the other, leaves the rest connected (highest id first)."""
    graph = Instance.build(config).graph.copy()
    chosen: list[int] = []
    for agent in sorted(graph.nodes, reverse=True):
        if len(chosen) == count:
            break
        rest = graph.copy()
        rest.remove_node(agent)
        if nx.is_connected(rest):
            graph, chosen = rest, [*chosen, agent]
    return chosen


def agent_pid(run: psutil.Process, agent: int) -> psutil.Process | None:
    for child in run.children(recursive=True):
        try:
            line = child.cmdline()
        except psutil.Error:
            continue
        if (
            "privnet.agent" in line
            and "--id" in line
            and line[line.index("--id") + 1] == str(agent)
        ):
            return child
    return None


HOG = "while True: pass"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=30)
    parser.add_argument("--iters", type=int, default=600)
    parser.add_argument("--kill", type=int, default=9)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("runs/kill-demo"))
    parser.add_argument("--victim", type=int, help="the agent killed (with --kill 1)")
    parser.add_argument("--at", type=int, help="the round it is killed at (with --kill 1)")
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside each run")
    parser.add_argument("--repeat", type=int, default=1, help="runs in a row")
    parser.add_argument(
        "--by",
        choices=("outside", "shell"),
        default="outside",
        help="who sends the SIGKILLs: this script, found with ps (outside), or privnet run "
        "itself at the exact round (shell: --faults kill:AGENT@ROUND; for runs too short "
        "to catch from outside)",
    )
    parser.add_argument("rest", nargs="*", help="more `privnet run` flags, after --")
    args = parser.parse_args()
    if args.repeat == 1:
        return 0 if one_run(args, args.out)["ok"] else 1
    reports = []
    for k in range(args.repeat):
        report = one_run(args, args.out / f"run-{k}")
        reports.append(report)
        print(json.dumps({"run": k, **{key: report[key] for key in SHOWN}}), flush=True)
    ok = sum(r["ok"] for r in reports)
    gaps = [r["longest_beat_gap"] for r in reports if r["longest_beat_gap"] is not None]
    print(
        f"{ok}/{len(reports)} runs complete (rc 0, {args.agents - args.kill} members, "
        f"replay-equal); longest beat gap {max(gaps, default=float('nan')):.2f} s"
    )
    return 0 if ok == len(reports) else 1


SHOWN = ("ok", "rc", "wall_s", "members", "replay_max_rel_gap", "longest_beat_gap", "deadline")


def one_run(args: argparse.Namespace, out: Path) -> dict:
    """One run with its kills, beside `args.busy` busy loops; its report (printed)."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.busy)]
    try:
        report = killed_run(args, out)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    if args.repeat == 1:
        print(json.dumps(report, indent=1))
    return report


def killed_run(args: argparse.Namespace, out: Path) -> dict:
    config = ExperimentConfig(
        agents=args.agents,
        iters=args.iters,
        strategies=("atc",),
        schemes=("local-ghp",),
        seed=args.seed,
    )
    doomed = victims(config, args.kill) if args.victim is None else [args.victim]
    at = [int(args.iters * (k + 1) / (args.kill + 2)) for k in range(len(doomed))]
    at = at if args.at is None else [args.at]
    command = [
        sys.executable,
        "-m",
        "privnet.orchestrator.cli",
        "run",
        "--agents",
        str(args.agents),
    ]
    command += ["--iters", str(args.iters), "--strategy", "atc", "--scheme", "local-ghp"]
    command += ["--seed", str(args.seed), "--out", str(out), *args.rest]
    if args.by == "shell":
        command += ["--faults", ",".join(f"kill:{v}@{r}" for v, r in zip(doomed, at, strict=True))]
        doomed, at = [], []
    started = time.monotonic()
    privnet = subprocess.Popen(command)
    run = psutil.Process(privnet.pid)
    kills = []
    while privnet.poll() is None:
        done = rounds_done(out / "metrics.csv")
        while doomed and done >= at[0]:
            agent, round_ = doomed.pop(0), at.pop(0)
            process = agent_pid(run, agent)
            if process is not None:
                process.send_signal(signal.SIGKILL)
                kills.append({"agent": agent, "planned": round_, "seen": done})
        time.sleep(0.05)
    wall = time.monotonic() - started
    failed = {"ok": False, "rc": privnet.returncode, "wall_s": round(wall, 1), "members": None}
    failed |= {"replay_max_rel_gap": None, "longest_beat_gap": None, "deadline": None}
    if privnet.returncode != 0:
        print(f"privnet run exited with {privnet.returncode}")
        return failed
    views = read_membership(out / "membership.json")
    problem = Instance.build(config)
    plans = session_plans(problem, session_list(config))
    (replay,) = Network.build(plans, script=views).play()
    real = np.load(out / "models.npz")[replay.label]
    have = ~np.isnan(real[..., 0])
    gap = float(np.max(np.abs(real[have] - replay.models[have])) / np.max(np.abs(real[have])))
    summary = json.loads((out / "summary.json").read_text())["config"]
    orchestrator = summary["orchestrator"]
    members = len(views[-1].members)
    ok = gap < 1e-9 and members == args.agents - args.kill
    report = {**failed, "ok": ok, "members": members, "replay_max_rel_gap": gap}
    report |= {k: orchestrator.get(k) for k in ("longest_beat_gap", "deadline")}
    return {**report, "kills": kills, **summary["membership"]}


if __name__ == "__main__":
    sys.exit(main())

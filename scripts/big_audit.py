"""Issue 29's must-show, end to end: a big model over mosquitto with `--audit`, its checks.

    flock /work/notes/cpu.lock python scripts/big_audit.py                 # 16 agents, 1M
    python scripts/big_audit.py --agents 4 --params 30000 --iters 3       # a quick look

1. `privnet run --audit`: mlp on digits at about --params parameters (bench's width for the
   size), ATC, local-ghp, sealed, a fresh mosquitto, under tcpdump on loopback; every
   process's resident memory sampled (peak RSS per agent against issue 29's bound, (in-degree
   + 4) x the model's bytes + 150 MB, and USS; the orchestrator's), and the orchestrator's
   CPU per round (summary.json's session_cpu_s: the audit's tap runs in its process).
2. The run's models (models.npz: the rounds its telemetry carried, and the last) against the
   memory engine's, every model every round, rounded as the telemetry carried them (float32
   for a float32 problem's model in Parts): equal to the lattice tolerance.
3. Its audit (audit.json, on the sample): no clear model, cancellation residual 0, the
   sample stated.
4. The capture: none of the true models' values (the memory engine's, every round) for a
   seeded sample of coordinates per agent per round, as float64 (8 bytes) or as float32
   (two consecutive coordinates, 8 bytes: one 4-byte value matches random ciphertext by
   chance once in every 4 GB).
5. With --all-schemes, bytes per parameter per model frame (summary.json) under every
   scheme, at --schemes-params parameters and --schemes-iters rounds, no audit.
6. With --plain (first) or --plain-only, the same run without --audit (no tap, no tcpdump),
   of --plain-iters rounds: agents' RSS and the orchestrator's CPU as a user's run has them.

Prints one JSON document of the numbers and the checks (and writes it to OUT/big_audit.json);
exit 1 when a check fails (`bounds`, the memory and CPU figures against the issue's, are
reported apart and do not set the exit code).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from privnet.agent import lattice, wire
from privnet.agent.spec import Scheme, Strategy
from privnet.broker.launcher import launch
from privnet.orchestrator.bench import _mlp, _mlp_width, model_toml
from privnet.orchestrator.curves import ROUNDS_SUFFIX
from privnet.orchestrator.engines.memory import Network
from privnet.orchestrator.experiment import config as configuration
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_plans

PER_BYTE = 4 * 1024 * 1024  # the capture is scanned in blocks of this many bytes


def main() -> int:
    args = _parser().parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    width = _mlp_width(args.params)
    model = out / "model.toml"
    model.write_text(model_toml(_mlp(width, args.agents)))
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    report["load_before"] = os.getloadavg()
    run_dir, pcap = out / "run", out / "run.pcap"
    flags = [
        "--config", str(model), "--agents", str(args.agents), "--strategy", "atc",
        "--scheme", args.scheme, "--seed", str(args.seed),
    ]  # fmt: skip
    if args.plain or args.plain_only:
        iters = str(args.plain_iters or args.iters)
        report["plain"] = plain_run([*flags, "--iters", iters], out / "plain")
        if args.plain_only:
            report["load_after"] = os.getloadavg()
            report["bounds"] = bounds(report["plain"], "plain_run")
            print(json.dumps(report, indent=1))
            return 0
    flags += ["--iters", str(args.iters), "--audit"]
    if args.audit_sample is not None:
        flags += ["--audit-sample", str(args.audit_sample)]
    with launch("mosquitto") as broker, capture(pcap, broker.address.port):
        argv = [*flags, "--broker", str(broker.address), "--out", str(run_dir)]
        code, wall, peaks = watched([sys.executable, "-m", "privnet", "run", *argv])
    report["command"] = "privnet run " + " ".join(flags)
    report |= {"exit_code": code, "wall_s": round(wall, 1)}
    summary = json.loads((run_dir / "summary.json").read_text())
    report["summary"] = _summary(summary)
    report["sealed"] = summary["config"].get("seal_links")
    problem = problem_of(summary)
    report["memory"] = memory(peaks, problem)
    report["orchestrator_cpu"] = orchestrator_cpu(summary)
    truth = memory_models(problem, Scheme(args.scheme))
    report["models"] = compare(run_dir, truth, problem)
    report["audit"] = audit_figures(json.loads((run_dir / "audit.json").read_text()))
    report["capture"] = search_capture(pcap, truth, args.coordinates, args.seed)
    if not args.keep_pcap:
        pcap.unlink()
    if args.all_schemes:
        report["schemes"] = every_scheme(args, out)
    report["load_after"] = os.getloadavg()
    report["checks"] = checks(report, args.all_schemes)
    report["bounds"] = bounds(report) | bounds(report.get("plain"), "plain_run")
    text = json.dumps(report, indent=1)
    (out / "big_audit.json").write_text(text + "\n")
    print(text)
    return 0 if all(report["checks"].values()) else 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--params", type=int, default=1_000_000)
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--scheme", default="local-ghp")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--audit-sample", type=int, default=None, help="default: the run's own")
    p.add_argument("--coordinates", type=int, default=64, help="per agent and round, searched")
    p.add_argument("--out", default="runs/big-audit")
    p.add_argument("--keep-pcap", action="store_true")
    p.add_argument("--plain", action="store_true", help="first, the same run without --audit")
    p.add_argument("--plain-only", action="store_true", help="only the run without --audit")
    p.add_argument("--plain-iters", type=int, default=None, help="its rounds (--iters)")
    p.add_argument("--all-schemes", action="store_true", help="bytes/param under every scheme")
    p.add_argument("--schemes-params", type=int, default=1_000_000)
    p.add_argument("--schemes-iters", type=int, default=2)
    return p


@contextlib.contextmanager
def capture(pcap: Path, port: int) -> Iterator[None]:
    """tcpdump of TCP `port` on loopback into `pcap` for the body of the with block."""
    proc = subprocess.Popen(
        ["tcpdump", "-i", "lo", "-U", "-w", str(pcap), "tcp", "port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    for raw in proc.stderr:
        if b"listening" in raw:
            break
    else:
        raise SystemExit(f"tcpdump could not capture port {port} on lo")
    try:
        yield
    finally:
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


@dataclass
class Peak:
    """One process of the run's tree: its role, its agent's id, and the most memory seen."""

    role: str = "other"
    agent: int | None = None
    rss: int = 0  # resident: its own pages and those it shares (the zygote's, libraries')
    uss: int = 0  # its own only (what ending it would free), looked at every USS_EVERY-th look


USS_EVERY = 10  # a USS look reads the process's smaps: not every look


def watched(argv: list[str], every: float = 0.2) -> tuple[int, float, list[Peak]]:
    """Run `argv`, sampling every process of its tree every `every` s: exit code, wall
    seconds, and each process's peak resident memory."""
    began = time.monotonic()
    proc = subprocess.Popen(argv)
    peaks: dict[int, Peak] = {}
    done = threading.Event()

    def sample() -> None:
        root, looks = psutil.Process(proc.pid), 0
        while not done.is_set():
            with contextlib.suppress(psutil.Error):
                for p in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        peak = peaks.setdefault(p.pid, Peak())
                        if peak.role == "other":  # an exiting one has no argv: keep its role
                            peak.role, peak.agent = _role(p.cmdline())
                            peak.role = "orchestrator" if p.pid == proc.pid else peak.role
                        peak.rss = max(peak.rss, p.memory_info().rss)
                        if looks % USS_EVERY == 0 and peak.role != "other":
                            peak.uss = max(peak.uss, p.memory_full_info().uss)
            looks += 1
            done.wait(every)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    code = proc.wait()
    done.set()
    thread.join()
    return code, time.monotonic() - began, list(peaks.values())


def _role(argv: list[str]) -> tuple[str, int | None]:
    """An agent process (not the zygote that forks them, nor the broker), and its id."""
    if "-m privnet.agent" not in " ".join(argv):
        return "other", None
    at = argv.index("--id") + 1 if "--id" in argv else 0
    return "agent", int(argv[at]) if at else None


def memory(peaks: list[Peak], problem: Instance) -> dict[str, Any]:
    """Each agent's peak RSS against issue 29's bound, (in-degree + 4) x the model's bytes
    + 150 MB, its in-degree the graph's; and the orchestrator's peak."""
    dtype = np.dtype(getattr(problem.plugin, "dtype", np.float64))
    model = problem.config.dim * dtype.itemsize
    rows = []
    for peak in sorted((p for p in peaks if p.role == "agent"), key=lambda p: p.agent or 0):
        degree = None if peak.agent is None else len(set(problem.graph[peak.agent]) - {peak.agent})
        bound = (degree + 4) * model + 150_000_000 if degree is not None else None
        rows.append(
            {
                "agent": peak.agent,
                "in_degree": degree,
                "rss_mb": round(peak.rss / 1e6),
                "uss_mb": round(peak.uss / 1e6),
                "bound_mb": None if bound is None else round(bound / 1e6),
                "over_bound_mb": None if bound is None else round((peak.rss - bound) / 1e6),
            }
        )
    orchestrator = [p for p in peaks if p.role == "orchestrator"]
    over = [r["over_bound_mb"] for r in rows if r["over_bound_mb"] is not None]
    return {
        "model_bytes": model,
        "agent_processes": len(rows),
        "agents": rows,
        "within_bound": bool(rows) and len(over) == len(rows) and max(over) <= 0,
        "worst_over_bound_mb": max(over, default=None),
        "orchestrator_rss_mb": round(max((p.rss for p in orchestrator), default=0) / 1e6),
        "orchestrator_uss_mb": round(max((p.uss for p in orchestrator), default=0) / 1e6),
    }


def orchestrator_cpu(summary: dict[str, Any]) -> dict[str, Any]:
    """The orchestrator's CPU (its process: Go to the session's end, summary.json's
    `session_cpu_s`) per round and as a share of one core over the session's wall time."""
    (result,) = summary["results"]
    cpu, wall = summary["config"]["orchestrator"]["session_cpu_s"], result["wall_s"]
    return {
        "session_cpu_s": cpu,
        "session_wall_s": round(wall, 2),
        "rounds": result["iters"],
        "models_every": result.get("models_every"),
        "cpu_ms_per_round": round(1000 * cpu / result["iters"], 1),
        "share_of_a_core": round(cpu / wall, 4),
    }


def _summary(summary: dict[str, Any]) -> list[dict[str, Any]]:
    keys = ("params", "wire_dtype", "model_bytes_per_round", "model_frames_per_round")
    rows = []
    for r in summary["results"]:
        row = {k: r.get(k) for k in (*keys, "bytes_per_param_per_model_frame")}
        row |= {"scheme": r["scheme"], "rounds_per_s": r.get("rounds_per_s")}
        row["states_all"] = all(r.get(k) is not None for k in keys)
        rows.append(row)
    return rows


def memory_models(problem: Instance, scheme: Scheme) -> np.ndarray:
    """Every agent's true model after every round on the memory engine, (iters, P, M), as
    float64 (its telemetry not rounded to float32: the capture is searched for the true values)."""
    plans = session_plans(problem, [(Strategy.ATC, scheme, 0)])
    plans = [replace(plan, models_f4=False) for plan in plans]
    (result,) = Network.build(plans, models_every=1).play()
    return np.asarray(result.models)


def compare(run_dir: Path, truth: np.ndarray, problem: Instance) -> dict[str, Any]:
    """The run's models (the rounds it has) against the memory engine's, rounded as the run's
    telemetry carried them (float32 for a float32 problem's model in Parts)."""
    with np.load(run_dir / "models.npz") as saved:
        names = sorted(saved.files)
        (label,) = [n for n in names if not n.endswith(ROUNDS_SUFFIX)]
        models = saved[label]
        held = f"{label}{ROUNDS_SUFFIX}"
        rounds = saved[held] - 1 if held in names else None
    dtype = wire.telemetry_dtype(problem.config.dim, problem.float32)
    mine = wire.as_telemetered(truth if rounds is None else truth[rounds], dtype)
    have = ~np.isnan(models)
    gap = float(np.max(np.abs(models[have] - mine[have])))
    step = lattice.grid(problem.config.sigma_g, problem.wire)
    return {
        "rounds_compared": None if rounds is None else [int(r) + 1 for r in rounds],
        "telemetry_dtype": dtype,
        "max_abs_gap": gap,
        "lattice_step": step,
        "equal_to_the_lattice": gap <= step,
    }


def audit_figures(report: dict[str, Any]) -> dict[str, Any]:
    sessions = report["sessions"]
    return {
        "sample": {k: v for k, v in report["sample"].items() if k != "finding"},
        "clear_models": sum(s["plaintext_messages"] for s in sessions),
        "model_messages": sum(s["model_messages"] for s in sessions),
        "expected_model_messages": sum(s["expected_model_messages"] for s in sessions),
        "cancellation_residual": max(
            (
                s["max_cancellation_residual"]["max"]
                for s in sessions
                if s["max_cancellation_residual"]
            ),
            default=None,
        ),
        "hub_rounds_checked": sum(
            s["max_cancellation_residual"]["hub_rounds_checked"]
            for s in sessions
            if s["max_cancellation_residual"]
        ),
        "masks_p_value": [s["noise"].get("masks", {}).get("p_value") for s in sessions],
        "truth_vs_telemetry": [s["truth_vs_telemetry"] for s in sessions],
    }


def patterns(truth: np.ndarray, coordinates: int, seed: int) -> tuple[np.ndarray, int]:
    """8-byte patterns of the true models: per agent and round, `coordinates` seeded
    coordinates as float64, and as float32 with the next coordinate (a model in the clear
    lays its coordinates side by side), as little-endian uint64; and how many values."""
    iters, agents, dim = truth.shape
    rng = np.random.default_rng(seed)
    found = []
    for i in range(iters):
        for p in range(agents):
            at = rng.choice(dim - 1, size=min(coordinates, dim - 1), replace=False)
            w = truth[i, p]
            found.append(w[at].astype("<f8").view("<u8"))
            pairs = np.stack([w[at], w[at + 1]], axis=1).astype("<f4")
            found.append(pairs.view("<u8").ravel())
    values = np.unique(np.concatenate(found))
    nonzero = values[values != 0]
    return nonzero, iters * agents * coordinates


def find_patterns(path: Path, wanted: np.ndarray) -> int:
    """How many times any of the 8-byte `wanted` (uint64, sorted) occurs in the file at any
    byte offset: a 2^24-entry table of their low bits first, exact only on its hits."""
    table = np.zeros(1 << 24, dtype=bool)
    table[wanted & 0xFFFFFF] = True
    hits = 0
    with path.open("rb") as fh:
        tail = b""
        while block := fh.read(PER_BYTE):
            data = tail + block
            for offset in range(8):
                n = (len(data) - offset) // 8
                words = np.frombuffer(data, dtype="<u8", count=n, offset=offset)
                maybe = words[table[words & 0xFFFFFF]]
                if maybe.size:
                    hits += int(np.isin(maybe, wanted).sum())
            tail = data[-7:]  # no 8 bytes fit in it: nothing is counted twice
    return hits


def search_capture(pcap: Path, truth: np.ndarray, coordinates: int, seed: int) -> dict[str, Any]:
    wanted, values = patterns(truth, coordinates, seed)
    control = np.unique(
        np.random.default_rng(seed + 1).integers(0, 2**63, wanted.size, dtype=np.uint64)
    )
    began = time.monotonic()
    hits = find_patterns(pcap, wanted)
    return {
        "pcap_bytes": pcap.stat().st_size,
        "values_searched": values,
        "patterns": int(wanted.size),
        "hits": hits,
        "control_patterns": int(control.size),
        "control_hits": find_patterns(pcap, np.sort(control)),
        "scan_s": round(time.monotonic() - began, 1),
    }


def problem_of(summary: dict[str, Any]) -> Instance:
    """The run's problem, rebuilt from its summary.json's config."""
    names = {f.name for f in fields(ExperimentConfig)}
    settings = {k: v for k, v in summary["config"].items() if k in names}
    return Instance.build(configuration.with_overrides(ExperimentConfig(), settings))


def plain_run(flags: list[str], out: Path) -> dict[str, Any]:
    """The run without --audit (no tap in the orchestrator, no tcpdump), as a user's run
    is: its agents' memory and the orchestrator's CPU."""
    with launch("mosquitto") as broker:
        argv = [*flags, "--broker", str(broker.address), "--out", str(out)]
        code, wall, peaks = watched([sys.executable, "-m", "privnet", "run", *argv])
    summary = json.loads((out / "summary.json").read_text())
    return {
        "command": "privnet run " + " ".join(flags),
        "exit_code": code,
        "wall_s": round(wall, 1),
        "memory": memory(peaks, problem_of(summary)),
        "orchestrator_cpu": orchestrator_cpu(summary),
    }


def every_scheme(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Bytes a parameter a model frame under every scheme (summary.json), no audit."""
    model = out / "schemes-model.toml"
    model.write_text(model_toml(_mlp(_mlp_width(args.schemes_params), args.agents)))
    flags = [
        "--config", str(model), "--agents", str(args.agents), "--iters",
        str(args.schemes_iters), "--strategy", "atc", "--scheme", "all", "--seed", str(args.seed),
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, launch("mosquitto") as broker:
        argv = [*flags, "--broker", str(broker.address), "--out", tmp]
        subprocess.run([sys.executable, "-m", "privnet", "run", *argv], check=True)
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    return _summary(summary)


def checks(report: dict[str, Any], schemes: bool) -> dict[str, bool]:
    a, cap = report["audit"], report["capture"]
    found = {
        "run_completed": report["exit_code"] == 0,
        "links_sealed": report["sealed"] is True,
        "models_equal_memory_engine": report["models"]["equal_to_the_lattice"],
        "audit_sampled_and_says_so": bool(a["sample"].get("sampled")),
        "audit_every_frame": a["model_messages"] == a["expected_model_messages"] > 0,
        "audit_no_clear_model": a["clear_models"] == 0,
        "audit_cancellation_residual_0": a["cancellation_residual"] == 0.0,
        "capture_holds_no_true_value": cap["hits"] == 0,
        "summary_states_size_bytes_frames": all(r["states_all"] for r in report["summary"]),
    }
    rows = report["summary"] + (report.get("schemes") or [])
    found["bytes_per_param_frame_le_4.05"] = all(
        r["bytes_per_param_per_model_frame"] <= 4.05 for r in rows
    )
    if schemes:
        found["every_scheme_measured"] = {r["scheme"] for r in report["schemes"]} == {
            str(s) for s in Scheme
        }
    return found


def bounds(run: dict[str, Any] | None, name: str = "audit_run") -> dict[str, bool]:
    """Issue 29's resource must-show for one run (apart from the audit's checks, and not in
    the exit code): every agent's peak RSS within its bound, the orchestrator below 10 % of
    a core (in the --audit run the tap's thread is in the orchestrator's process)."""
    if run is None:
        return {}
    return {
        f"{name}_agent_rss_within_bound": run["memory"]["within_bound"],
        f"{name}_orchestrator_below_10pct": run["orchestrator_cpu"]["share_of_a_core"] < 0.10,
    }


if __name__ == "__main__":
    sys.exit(main())

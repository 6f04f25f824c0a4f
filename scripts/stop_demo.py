"""Stop `privnet run` with a signal at random times, and check what each stop left.

    python scripts/stop_demo.py --runs 20 --signal TERM --out runs/stop-demo

Each run starts `privnet run` (its own session, as a service manager would start it; ATC,
local-ghp, 10 agents, 3000 rounds, mosquitto unless told otherwise), sends the signal to the
orchestrator's process alone (as `kill` and `docker stop` do) at a time drawn uniformly from
`--window` seconds after its start (start-up, registration, keying and rounds alike), and
checks: the exit code is 128 + the signal, within `--within` s (1); no process of the run
(broker, zygote, agents) outlives it; its outputs are whole: the journal, membership.json,
and metrics.csv holding rounds 1, 2, ... each once (the rounds journaled too). It prints a
line per run and a summary, `--json` writes them, and the exit code is 0 only if every run
passed. Extra arguments after `--` go to `privnet run`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

RUN = ["--agents", "10", "--iters", "3000", "--deadline", "10", "--broker", "mosquitto"]


@dataclass
class Stopped:
    """What one stop did."""

    run: int
    after: float  # s from the start to the signal
    phase: str  # how far the run had got: starting, registered, running, complete
    code: int  # as a shell's $? shows it
    took: float  # s from the signal to the exit
    left: list[str] = field(default_factory=list)  # processes of the run still alive
    problems: list[str] = field(default_factory=list)  # with its outputs

    def passed(self, code: int, within: float) -> bool:
        return self.code == code and self.took <= within and not self.left and not self.problems


def stop_once(n: int, out: Path, signum: int, after: float, flags: list[str]) -> Stopped:
    out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "privnet.orchestrator.cli",
        "run",
        *RUN,
        "--out",
        str(out),
        *flags,
    ]
    with (out / "privnet.err").open("w") as err:
        privnet = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "200"},
        )
    family: dict[int, psutil.Process] = {}
    started = time.monotonic()
    try:
        while time.monotonic() - started < after and privnet.poll() is None:
            _gather(privnet.pid, family)
            time.sleep(0.02)
        _gather(privnet.pid, family)
        phase = _phase(out)
        sent = time.monotonic()
        privnet.send_signal(signum)
        code = privnet.wait(timeout=60)
        took = time.monotonic() - sent
        if code < 0:  # the signal's own action, before privnet's handlers (Python start-up)
            code, phase = 128 - code, "interpreter start-up"
        left = _alive(family.values())
    finally:
        for proc in family.values():  # whatever the run left, this script does not
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if privnet.poll() is None:
            privnet.kill()
            privnet.wait()
    return Stopped(n, round(after, 3), phase, code, round(took, 3), left, _check_outputs(out))


def _gather(pid: int, family: dict[int, psutil.Process]) -> None:
    """Add the run's processes seen now (broker, zygote, agents) to `family`."""
    try:
        for child in psutil.Process(pid).children(recursive=True):
            family.setdefault(child.pid, child)
        for proc in list(family.values()):  # agents are the zygote's: gone with it from view
            for child in proc.children(recursive=True):
                family.setdefault(child.pid, child)
    except psutil.NoSuchProcess:
        pass


def _alive(procs: object) -> list[str]:
    alive = []
    for proc in procs:  # type: ignore[attr-defined]
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{proc.pid} {' '.join(proc.cmdline())}")
        except psutil.NoSuchProcess:
            continue
    return alive


def _phase(out: Path) -> str:
    if (out / "summary.json").exists():
        return "complete"
    if (out / "metrics.csv").exists():
        return "running"
    err = (out / "privnet.err").read_text(errors="replace")
    return "registered" if "agents registered" in err else "starting"


def _check_outputs(out: Path) -> list[str]:
    """What is wrong with what the stopped run left on disk (nothing: whole)."""
    problems = []
    journal = out / "journal"
    if journal.exists():
        for name in ("config.json", "run.json"):
            if not (journal / name).exists():
                problems.append(f"journal/{name} missing")
    membership = out / "membership.json"
    if membership.exists():
        try:
            json.loads(membership.read_text())
        except ValueError as exc:
            problems.append(f"membership.json: {exc}")
    metrics = out / "metrics.csv"
    if metrics.exists():
        with metrics.open(newline="") as fh:
            rows = list(csv.reader(fh))
        header, body = rows[0], rows[1:]
        if any(len(row) != len(header) for row in body):
            problems.append("metrics.csv has a cut row")
        elif [int(row[3]) for row in body] != list(range(1, len(body) + 1)):
            problems.append("metrics.csv does not hold rounds 1, 2, ... each once")
        else:
            config = json.loads((journal / "config.json").read_text())
            rows_bin = journal / "rounds-0.bin"
            size = rows_bin.stat().st_size if rows_bin.exists() else 0
            # a record per round: its flag, the agents' metrics (2 each) and models (K = 1)
            if size != len(body) * 8 * (1 + config["agents"] * (2 + config["dim"])):
                problems.append(f"journal holds {size} bytes for {len(body)} rounds")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--signal", choices=("TERM", "INT"), default="TERM")
    parser.add_argument("--window", type=float, default=8.0, help="s: signals land in [0, this)")
    parser.add_argument("--within", type=float, default=1.0, help="s from signal to exit")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/stop-demo"))
    parser.add_argument("--json", type=Path, help="write every run's result here")
    parser.add_argument("flags", nargs="*", help="after --: more `privnet run` flags")
    args = parser.parse_args()
    signum = getattr(signal, f"SIG{args.signal}")
    draw = random.Random(args.seed)
    results = []
    for n in range(args.runs):
        after = draw.uniform(0.0, args.window)
        result = stop_once(n, args.out / f"run-{n}", signum, after, args.flags)
        results.append(result)
        verdict = "ok" if result.passed(128 + signum, args.within) else "FAILED"
        print(
            f"run {n:2d}: SIG{args.signal} {result.after:5.2f} s after start ({result.phase}): "
            f"exit {result.code} in {result.took:.2f} s, {len(result.left)} left running, "
            f"outputs {'whole' if not result.problems else result.problems}: {verdict}"
        )
    took = [r.took for r in results]
    passed = sum(r.passed(128 + signum, args.within) for r in results)
    print(
        f"{passed}/{len(results)} passed; exit took median {statistics.median(took):.2f} s, "
        f"max {max(took):.2f} s; phases: "
        + ", ".join(
            f"{p} {sum(r.phase == p for r in results)}"
            for p in dict.fromkeys(r.phase for r in results)
        )
    )
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

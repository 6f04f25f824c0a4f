"""Rounds/s of the same experiment on every engine and broker, measured in one sitting.

    python scripts/bench.py [--agents 30] [--iters 200] [--schemes none,local-ghp] [--out DIR]

Runs `privnet run` on mosquitto and on the embedded broker, then `privnet simulate` on the
memory and oracle engines, all with the same config and seed, and prints rounds/s and wall
time per engine x scheme plus the ratio to the memory engine. Timings on a shared machine
are noisy: compare ratios from one sitting, not absolute numbers across sittings.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from broker.launcher import has_mosquitto
from orchestrator.cli import main as privnet


def measure(command: list[str], out: Path) -> tuple[float, list[dict]]:
    start = time.perf_counter()
    code = privnet([*command, "--out", str(out)])
    if code != 0:
        raise SystemExit(f"{' '.join(command)} exited with {code}")
    wall = time.perf_counter() - start
    return wall, json.loads((out / "summary.json").read_text())["results"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=30)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--strategy", default="atc")
    parser.add_argument("--schemes", default="none,local-ghp")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    common = [
        "--agents",
        str(args.agents),
        "--iters",
        str(args.iters),
        "--strategy",
        args.strategy,
        "--scheme",
        args.schemes,
        "--repeats",
        "1",
        "--seed",
        "1",
    ]
    engines = [
        (f"net/{b}", ["run", "--broker", b, *common])
        for b in ("mosquitto", "embedded")
        if b == "embedded" or has_mosquitto()
    ]
    engines += [(f"{e}", ["simulate", "--engine", e, *common]) for e in ("memory", "oracle")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, command in engines:
            wall, results = measure(command, Path(tmp) / name.replace("/", "-"))
            rows += [
                {
                    "engine": name,
                    "scheme": r["scheme"],
                    "rounds_per_s": r["rounds_per_s"],
                    "command_wall_s": wall,
                    "bytes_per_round": r.get("bytes_per_round"),
                }
                for r in results
            ]
    memory = {r["scheme"]: r["rounds_per_s"] for r in rows if r["engine"] == "memory"}
    table = Table(title=f"{args.agents} agents, {args.iters} rounds, {args.strategy}")
    for column in ("engine", "scheme", "rounds/s", "x memory", "command wall (s)", "bytes/round"):
        table.add_column(column, justify="left" if column in ("engine", "scheme") else "right")
    for r in rows:
        r["ratio_to_memory"] = r["rounds_per_s"] / memory[r["scheme"]]
        table.add_row(
            r["engine"],
            r["scheme"],
            f"{r['rounds_per_s']:.1f}",
            f"{r['ratio_to_memory']:.3f}",
            f"{r['command_wall_s']:.1f}",
            f"{r['bytes_per_round']:,.0f}" if r["bytes_per_round"] else "-",
        )
    Console().print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()

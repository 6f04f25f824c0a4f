"""What a WAN's delay and loss do to a run across hosts: `privnet lab` over a grid of link
conditions, each scheme in its own lab run (so each run's veth counters are that scheme's),
the schemes interleaved per condition. Prints the table of docs/tasks/across-machines.md
(rounds/s, the agents' MQTT bytes per round, every veth's bytes per round, packets the loss
rules dropped).

    sudo python scripts/lab_table.py --hosts 3 --agents 30 --iters 200 --out runs/lab-table
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def lab(out: Path, hosts: int, delay: str, loss: str, flags: list[str]) -> dict[str, float]:
    """One `privnet lab` run: its rounds/s and bytes per round."""
    argv = [sys.executable, "-m", "privnet.orchestrator.cli", "lab", "--hosts", str(hosts)]
    argv += ["--delay", delay, "--loss", loss, *flags, "--out", str(out)]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((out / "summary.json").read_text())
    record = json.loads((out / "lab.json").read_text())
    (result,) = summary["results"]
    return {
        "rounds_per_s": result["rounds_per_s"],
        "mqtt_per_round": result["bytes_per_round"],
        "veth_per_round": record["veth_bytes_per_round"],
        "dropped": sum(record["loss_dropped_packets"].values()),
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--agents", type=int, default=30)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--delays", default="0ms,25ms,100ms")
    parser.add_argument("--losses", default="0%,1%")
    parser.add_argument("--schemes", default="none,local-ghp")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/lab-table"))
    args = parser.parse_args()
    rows = []
    for delay in args.delays.split(","):
        for loss in args.losses.split(","):
            for scheme in args.schemes.split(","):
                flags = ["--agents", str(args.agents), "--iters", str(args.iters)]
                flags += ["--strategy", "atc", "--scheme", scheme, "--seed", str(args.seed)]
                where = args.out / f"{delay}-{loss.rstrip('%')}-{scheme}"
                got = lab(where, args.hosts, delay, loss, flags)
                rows.append({"delay": delay, "loss": loss, "scheme": scheme, **got})
                print(json.dumps(rows[-1]), flush=True)
    (args.out / "table.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("| delay (each way) | loss | scheme | rounds/s | MQTT B/round | veth B/round | dropped |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['delay']} | {r['loss']} | {r['scheme']} | {r['rounds_per_s']:.1f} | "
            f"{r['mqtt_per_round']:,.0f} | {r['veth_per_round']:,.0f} | {r['dropped']} |"
        )


if __name__ == "__main__":
    main()

"""What telemetry costs the orchestrator: one `privnet run` in this process, then its
CPU (this process only: the agents are other processes) and its bytes by plane.

    python scripts/telemetry_cost.py --agents 16 --iters 16 --hidden 13000   # ~1M parameters
    python scripts/telemetry_cost.py --agents 16 --iters 200                 # the paper's model

Prints one JSON line: the model's parameters, K (--models-every), rounds, the process's CPU
seconds for the whole run and, where the run records it (summary.json's
config.orchestrator.session_cpu_s), while its sessions ran, per round and as a share of one core
over the sessions' wall time; telemetry bytes and peer (model + keys) bytes per round.
Run it under `flock /work/notes/cpu.lock` on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
from pathlib import Path

import privnet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--iters", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=0, help="mlp on digits (0: regression)")
    parser.add_argument("--scheme", default="local-ghp")
    parser.add_argument("--models-every", type=int, default=None)
    parser.add_argument("--broker", default="mosquitto")
    args = parser.parse_args()
    model: dict[str, object] = {}
    if args.hidden:
        model = {"problem": "mlp", "dataset": "digits", "params": {"hidden": [args.hidden]}}
        model["samples"] = 1347 // args.agents  # digits' training rows, dealt out
    options = {} if args.models_every is None else {"models_every": args.models_every}
    with tempfile.TemporaryDirectory() as out:
        exp = privnet.Experiment(
            agents=args.agents, iters=args.iters, strategies="atc", schemes=args.scheme,
            broker=args.broker, out=out, **model, **options,
        )  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_SELF)
        privnet.run(exp)
        after = resource.getrusage(resource.RUSAGE_SELF)
        summary = json.loads((Path(out) / "summary.json").read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    (record,) = summary["results"]
    rounds = record.get("rounds_counted", args.iters)
    traffic = record["bytes"]
    where = summary["config"].get("orchestrator") or {}
    session_cpu = where.get("session_cpu_s")
    wall = record.get("wall_s")
    report = {
        "dim": summary["config"]["dim"],
        "models_every": record.get("models_every", 1),
        "agents": args.agents,
        "rounds": rounds,
        "rounds_per_s": round(record["rounds_per_s"], 3),
        "process_cpu_s": round(cpu, 2),
        "process_cpu_s_per_round": round(cpu / rounds, 4),
        "session_cpu_s": session_cpu,
        "session_cpu_s_per_round": None if session_cpu is None else round(session_cpu / rounds, 4),
        "session_core_share": None if not (session_cpu and wall) else round(session_cpu / wall, 4),
        "telemetry_bytes_per_round": traffic.get("telemetry", 0) / rounds,
        "peer_bytes_per_round": (traffic.get("model", 0) + traffic.get("keys", 0)) / rounds,
    }
    report["telemetry_share_of_peer"] = round(
        report["telemetry_bytes_per_round"] / max(report["peer_bytes_per_round"], 1), 5
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()

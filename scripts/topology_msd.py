"""MSD against rounds and against the peer plane's bytes, for a static random geometric
graph, regular:6 and one-peer-exponential at the same byte budget (issue 31): the memory
engine (every agent a core, the bytes the MQTT shells would publish), ATC, local-ghp.

Each topology runs as many rounds as the geometric graph's `--rounds` rounds cost in peer
bytes (model frames and the once-per-view key frames), so the curves end at one budget.

    python scripts/topology_msd.py --agents 30 --rounds 100 --mu 0.1 --out docs/topology-msd.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from privnet.orchestrator.engines.memory import run_memory
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance

TOPOLOGIES = ("geometric", "regular:6", "one-peer-exponential")
SCHEME = "local-ghp"
PROBE = 30  # rounds run to learn a topology's key and per-round bytes (a schedule's union)


def run(
    topology: str, agents: int, rounds: int, seed: int, mu: float
) -> tuple[np.ndarray, float, float]:
    """(MSD averaged over the agents per round, key bytes, model bytes per round)."""
    config = ExperimentConfig(
        agents=agents, iters=rounds, seed=seed, topology=topology, mu=mu,
        strategies=("atc",), schemes=(SCHEME,),
    )  # fmt: skip
    (curve,) = run_memory(Instance.build(config))
    traffic = curve.extra["bytes"]
    return curve.msd_avg[0], traffic.get("keys", 0), traffic.get("model", 0) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=100, help="the geometric graph's")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mu", type=float, default=0.1, help="step size")
    parser.add_argument("--out", type=Path, default=Path("docs/topology-msd.png"))
    args = parser.parse_args()
    _, keys, per_round = run("geometric", args.agents, args.rounds, args.seed, args.mu)
    budget = keys + per_round * args.rounds
    fig, (by_round, by_bytes) = plt.subplots(1, 2, figsize=(11, 4.2))
    for topology in TOPOLOGIES:
        _, keys, per_round = run(topology, args.agents, PROBE, args.seed, args.mu)
        rounds = max(1, int((budget - keys) // per_round) + 1)
        msd, keys, per_round = run(topology, args.agents, rounds, args.seed, args.mu)
        spent = keys + per_round * np.arange(1, rounds + 1)
        rounds = max(1, int(np.searchsorted(spent, budget, side="right")))  # within budget
        msd, spent = msd[:rounds], spent[:rounds] / 1e6
        label = f"{topology}: {rounds} rounds, {per_round / 1e3:.1f} kB a round"
        by_round.semilogy(np.arange(1, rounds + 1), msd, label=label)
        by_bytes.semilogy(spent, msd, label=topology)
        print(f"{topology}: {rounds} rounds, keys {keys / 1e6:.3f} MB, "
              f"{per_round / 1e3:.2f} kB/round, final MSD {msd[-1]:.3e}")  # fmt: skip
    by_round.set(xlabel="round", ylabel="MSD (average over agents)")
    by_bytes.set(xlabel="peer-plane bytes, MB (key frames, then model frames)")
    by_round.set_title(f"{args.agents} agents, ATC, {SCHEME}, mu {args.mu}, memory engine")
    by_bytes.set_title(f"the same budget: {budget / 1e6:.2f} MB")
    by_round.legend(fontsize=8)
    by_bytes.legend(fontsize=8)
    for ax in (by_round, by_bytes):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

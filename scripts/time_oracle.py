"""Time the oracle on the `privnet reproduce` workload: 30 agents, 20 repeats, 3 strategies x
4 schemes x 1000 iterations (the paper's section V-A). Each run builds the problem (graph,
data, w^o) and runs the oracle, as `privnet reproduce` does. Prints the median of 3 runs.

    python scripts/time_oracle.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
from time import perf_counter

from orchestrator.config import ExperimentConfig
from orchestrator.oracle import run_oracle
from orchestrator.problem import Problem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs (median is printed)")
    args = parser.parse_args()
    config = ExperimentConfig(repeats=20)
    times = []
    for _ in range(args.runs):
        start = perf_counter()
        run_oracle(Problem.build(config))
        times.append(perf_counter() - start)
    runs = ", ".join(f"{t:.2f}" for t in times)
    print(f"oracle, reproduce-sized: median {statistics.median(times):.2f} s (runs: {runs})")


if __name__ == "__main__":
    main()

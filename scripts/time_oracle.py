"""Time the oracle on the `privnet reproduce` workload: 30 agents, 20 repeats, 3 strategies x
4 schemes x 1000 iterations (the paper's section V-A). Each run builds the problem (graph,
data, w^o) and runs the oracle, as `privnet reproduce` does. Prints the median of 3 runs,
wall clock and this process's CPU time (the two differ when other jobs share the cores).

    python scripts/time_oracle.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
from time import perf_counter, process_time

from privnet.orchestrator.engines.oracle import run_oracle
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs (median is printed)")
    args = parser.parse_args()
    config = ExperimentConfig(repeats=20)
    wall, cpu = [], []
    for _ in range(args.runs):
        start, start_cpu = perf_counter(), process_time()
        run_oracle(Instance.build(config))
        wall.append(perf_counter() - start)
        cpu.append(process_time() - start_cpu)
    runs = ", ".join(f"{t:.2f}" for t in wall)
    print(
        f"oracle, reproduce-sized: median {statistics.median(wall):.2f} s wall (runs: {runs}), "
        f"{statistics.median(cpu):.2f} s CPU"
    )


if __name__ == "__main__":
    main()

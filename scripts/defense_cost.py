"""What a defense costs with no attacker (issue 34): memory-engine rounds/s, paired.

    flock /work/notes/cpu.lock python scripts/defense_cost.py ITERS PAIRS SCHEME DEFENSE...

30 agents, ATC, seed 1. Each pair times `Network.play()` with no defense and with one, in
alternating order (A B, then B A: the second run of a pair is slower whatever it runs) after a
garbage collection; give `none` as a defense for the A/A control (two separate runs). Prints,
per defense, the median rounds/s and the median [min-max] of the pairs' ratios, by the wall
clock and by this process's CPU time (the engine runs in this one thread, so its CPU time is
what the run costs, less the other processes that share the cores), and the ratio of the
fastest runs (the defense's fastest over the fastest of its pairs' no-defense runs: other
work on the machine only ever slows a run, so the fastest is the least disturbed).
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from dataclasses import replace

from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.engines.memory import Network
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_plans


def rates(base: ExperimentConfig, scheme: Scheme, defense: str) -> tuple[float, float]:
    """(rounds per wall-clock second, rounds per CPU second) of one run's `play()`."""
    problem = Instance.build(replace(base, defense=defense))
    network = Network.build(session_plans(problem, [(Strategy.ATC, scheme, 0)]), seal_links=True)
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    network.play()
    return base.iters / (time.perf_counter() - wall), base.iters / (time.process_time() - cpu)


def summary(label: str, rounds: list[float], ratios: list[float]) -> str:
    return (
        f"{label} {statistics.median(rounds):.1f} rounds/s, ratio "
        f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"
    )


def main(argv: list[str]) -> None:
    iters, pairs, scheme, names = int(argv[0]), int(argv[1]), Scheme(argv[2]), argv[3:]
    base = ExperimentConfig(
        agents=30, iters=iters, strategies=(Strategy.ATC,), schemes=(scheme,), seed=1
    )
    rates(base, scheme, "none")  # warm-up
    keys = [(name, clock) for name in names for clock in (0, 1)]  # clock 0: wall, 1: cpu
    raw: dict[tuple[str, int], list[float]] = {key: [] for key in keys}
    ratios: dict[tuple[str, int], list[float]] = {key: [] for key in keys}
    plain: list[tuple[float, float]] = []
    paired: dict[str, list[float]] = {name: [] for name in names}  # its pairs' no-defense runs
    for i in range(pairs):
        for name in names:
            if i % 2 == 0:
                off, on = rates(base, scheme, "none"), rates(base, scheme, name)
            else:
                on, off = rates(base, scheme, name), rates(base, scheme, "none")
            plain.append(off)
            paired[name].append(off[0])
            for clock in (0, 1):
                raw[name, clock].append(on[clock])
                ratios[name, clock].append(on[clock] / off[clock])
    print(f"{scheme}, {iters} rounds, {pairs} pairs a defense")
    print(f"no defense: {statistics.median(p[0] for p in plain):.1f} rounds/s (wall), "
          f"{statistics.median(p[1] for p in plain):.1f} (cpu)")  # fmt: skip
    for name in names:
        print(summary(f"{name} (wall):", raw[name, 0], ratios[name, 0]))
        print(summary(f"{name} (cpu): ", raw[name, 1], ratios[name, 1]))
        fastest, against = max(raw[name, 0]), max(paired[name])
        print(f"{name} (fastest): {fastest:.1f} rounds/s against {against:.1f}, "
              f"ratio {fastest / against:.3f}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])

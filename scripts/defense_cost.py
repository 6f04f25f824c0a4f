"""What a defense costs with no attacker (issue 34): memory-engine rounds/s, paired.

    flock /work/notes/cpu.lock python scripts/defense_cost.py ITERS PAIRS SCHEME DEFENSE...

30 agents, ATC, seed 1. Each pair times `Network.play()` with no defense and with one, in
alternating order (A B, then B A: the second run of a pair is slower whatever it runs) after a
garbage collection; give `none` as a defense for the A/A control. Prints each defense's median
rounds/s and the median [min-max] of the pairs' ratios.
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


def rate(base: ExperimentConfig, scheme: Scheme, defense: str) -> float:
    problem = Instance.build(replace(base, defense=defense))
    network = Network.build(session_plans(problem, [(Strategy.ATC, scheme, 0)]), seal_links=True)
    gc.collect()
    began = time.perf_counter()
    network.play()
    return base.iters / (time.perf_counter() - began)


def main(argv: list[str]) -> None:
    iters, pairs, scheme, names = int(argv[0]), int(argv[1]), Scheme(argv[2]), argv[3:]
    base = ExperimentConfig(
        agents=30, iters=iters, strategies=(Strategy.ATC,), schemes=(scheme,), seed=1
    )
    rate(base, scheme, "none")  # warm-up
    raw: dict[str, list[float]] = {name: [] for name in ["none", *names]}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for i in range(pairs):
        for name in names:
            order = ["none", name] if i % 2 == 0 else [name, "none"]
            got = {which: rate(base, scheme, which) for which in order}
            raw["none"].append(got["none"])
            raw[name].append(got[name])
            ratios[name].append(got[name] / got["none"])
    print(f"{scheme} no defense {statistics.median(raw['none']):.1f} rounds/s")
    for name in names:
        r = ratios[name]
        print(
            f"{name}: {statistics.median(raw[name]):.1f} rounds/s, ratio "
            f"{statistics.median(r):.3f} [{min(r):.3f}-{max(r):.3f}]"
        )


if __name__ == "__main__":
    main(sys.argv[1:])

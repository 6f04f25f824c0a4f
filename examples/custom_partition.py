"""A partition of your own: how a dataset's training rows are dealt out to the agents.

A partition is a function (labels, agents, samples, gen, value) -> one array of row
indices per agent, drawing only from `gen` (seeded from the run's seed, so every engine
deals the same rows) and `value` (the number after a colon, or None). Only the orchestrator
partitions; each agent's sealed Setup carries its own rows. The experiment names it
`custom_partition:majority:0.8` (module:function:value), or by an entry point in
`privnet.partitions`.

    python examples/custom_partition.py [--engine oracle|memory] [--iters N]
"""

from __future__ import annotations

import argparse

import numpy as np

import privnet


def majority(
    labels: np.ndarray, agents: int, samples: int, gen: np.random.Generator, value: float | None
) -> list[np.ndarray]:
    """Agent p holds `samples` rows, a fraction `value` (default 0.8) of them of class
    p mod C and the rest drawn from every class: each agent sees mostly one label."""
    share = 0.8 if value is None else value
    if not 0 <= share <= 1:
        raise privnet.ConfigError(f"majority:SHARE takes a fraction in [0, 1], got {share}")
    classes = int(labels.max()) + 1
    free = np.ones(len(labels), dtype=bool)
    parts = []
    for p in range(agents):
        own = np.flatnonzero(free & (labels == p % classes))
        mine = gen.choice(own, size=min(len(own), round(share * samples)), replace=False)
        free[mine] = False
        rest = gen.choice(np.flatnonzero(free), size=samples - len(mine), replace=False)
        free[rest] = False
        parts.append(np.concatenate([mine, rest]))
    return parts


def main(argv: list[str] | None = None) -> privnet.Result:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("oracle", "memory"), default="oracle")
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args(argv)
    exp = privnet.Experiment(
        problem="logistic",
        dataset="adult",  # shipped with privnet: two classes
        partition="custom_partition:majority:0.9",
        samples=200,
        agents=10,
        iters=args.iters,
        strategies="atc",
        schemes="none,local-ghp",
        seed=7,
    )
    result = privnet.simulate(exp, args.engine)
    error = result.metric("test_error_centroid", "atc", "local-ghp")[0]
    print(f"atc/local-ghp: test error of the centroid {error[0]:.3f} -> {error[-1]:.3f}")
    return result


if __name__ == "__main__":
    main()

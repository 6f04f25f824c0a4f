"""How a dataset's training rows are dealt out to the agents: partitions as plug-ins.

A partition, written `name` or `name:value` (`iid`, `label-skew:2`, `dirichlet:0.5`,
`quantity-skew:1`), is a function `partition(labels, agents, samples, gen, value)` returning
one array of row indices per agent, drawing only from `gen` (seeded from the run's seed:
the same rows in every engine). privnet's own are below; others are an entry point in
`privnet.partitions`, or `module:function[:value]`. Only the orchestrator partitions: each
agent's Setup carries its own rows. Feature noise (section V-B) is `feature_noise`, not a
partition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from privnet.agent import plugins
from privnet.agent.spec import ConfigError

Partition = Callable[[np.ndarray, int, int, np.random.Generator, float | None], Sequence[Any]]
ATTEMPTS = 100  # Dirichlet draws tried until every agent holds a row


def iid(
    labels: np.ndarray, agents: int, samples: int, gen: np.random.Generator, value: float | None
) -> list[np.ndarray]:
    """Disjoint blocks of `samples` rows of the shuffled training split."""
    order = gen.permutation(len(labels))
    return [order[p * samples : (p + 1) * samples] for p in range(agents)]


def label_skew(
    labels: np.ndarray, agents: int, samples: int, gen: np.random.Generator, value: float | None
) -> list[np.ndarray]:
    """Each agent holds about `value` classes (McMahan et al.'s pathological non-iid split):
    the rows sorted by label, cut into agents x value shards, `value` shards each (a shard
    that straddles two classes gives its agent one more)."""
    per = _count(value, "label-skew:C takes C, the classes each agent holds, an integer >= 1")
    order = gen.permutation(len(labels))[: agents * samples]
    order = order[np.argsort(labels[order], kind="stable")]
    shards = np.array_split(order, agents * per)
    deal = gen.permutation(agents * per)
    return [
        np.concatenate([shards[s] for s in deal[p * per : (p + 1) * per]]) for p in range(agents)
    ]


def dirichlet(
    labels: np.ndarray, agents: int, samples: int, gen: np.random.Generator, value: float | None
) -> list[np.ndarray]:
    """Each class's rows split among the agents in proportions ~ Dirichlet(value) (Hsu et
    al. 2019): small values give each agent few classes; drawn again until every agent
    holds a row."""
    alpha = _positive(value, "dirichlet:ALPHA takes the concentration ALPHA > 0")
    order = gen.permutation(len(labels))[: agents * samples]
    for _ in range(ATTEMPTS):
        parts: list[list[np.ndarray]] = [[] for _ in range(agents)]
        for label in np.unique(labels[order]):
            mine = order[labels[order] == label]
            cuts = (np.cumsum(gen.dirichlet(np.full(agents, alpha))) * len(mine)).astype(int)
            for p, rows in enumerate(np.split(mine, cuts[:-1])):
                parts[p].append(rows)
        out = [np.concatenate(p) for p in parts]
        if all(len(rows) for rows in out):
            return out
    raise ConfigError(
        f"dirichlet:{alpha} left an agent without rows in {ATTEMPTS} draws; "
        "raise alpha or samples, or use fewer agents"
    )


def quantity_skew(
    labels: np.ndarray, agents: int, samples: int, gen: np.random.Generator, value: float | None
) -> list[np.ndarray]:
    """Shuffled rows in blocks of sizes ~ Dirichlet(value) (at least one row each): the
    same label mix everywhere, very different amounts of data."""
    beta = _positive(value, "quantity-skew:BETA takes the concentration BETA > 0")
    total = agents * samples
    sizes = 1 + np.floor(gen.dirichlet(np.full(agents, beta)) * (total - agents)).astype(int)
    order = gen.permutation(len(labels))
    return np.split(order[: sizes.sum()], np.cumsum(sizes)[:-1])


BUILTIN = {
    "iid": "privnet.orchestrator.experiment.partition:iid",
    "label-skew": "privnet.orchestrator.experiment.partition:label_skew",
    "dirichlet": "privnet.orchestrator.experiment.partition:dirichlet",
    "quantity-skew": "privnet.orchestrator.experiment.partition:quantity_skew",
}


def parse(text: str) -> tuple[str, float | None]:
    """`name` or `name:value` -> (name, value); a trailing `:number` is the value."""
    head, _, tail = text.rpartition(":")
    try:
        return (head, float(tail)) if head else (text, None)
    except ValueError:
        return text, None


def check(text: str) -> None:
    """ConfigError unless `text` names a partition (privnet's own checked in full)."""
    name, value = parse(text)
    plugins.check_name("partition", name)
    if name in BUILTIN:
        _resolve(name)(np.zeros(1, dtype=np.int64), 1, 1, np.random.default_rng(0), value)


def rows(
    text: str, labels: np.ndarray, agents: int, samples: int, gen: np.random.Generator
) -> list[np.ndarray]:
    """Every agent's rows under the partition `text`, checked."""
    name, value = parse(text)
    if agents * samples > len(labels):
        raise ConfigError(
            f"{agents} agents x {samples} samples exceed the {len(labels)} training rows; "
            f"lower samples to at most {len(labels) // agents}"
        )
    dealt = [
        np.asarray(r, dtype=np.int64) for r in _resolve(name)(labels, agents, samples, gen, value)
    ]
    if len(dealt) != agents:
        raise ConfigError(f"partition {text!r} gave {len(dealt)} parts for {agents} agents")
    for p, part in enumerate(dealt):
        if (
            not len(part)
            or len(np.unique(part)) != len(part)
            or part.min() < 0
            or part.max() >= len(labels)
        ):
            raise ConfigError(
                f"partition {text!r} gave agent {p} {len(part)} rows; each agent needs one or "
                f"more distinct rows in [0, {len(labels)})"
            )
    return dealt


def _resolve(name: str) -> Partition:
    found = plugins.find("partition", name, BUILTIN)
    if not callable(found):
        raise ConfigError(f"partition {name!r} must be a function, got {found!r}")
    partition: Partition = found
    return partition


def _positive(value: float | None, usage: str) -> float:
    if value is None or not value > 0:
        raise ConfigError(usage)
    return value


def _count(value: float | None, usage: str) -> int:
    if value is None or value < 1 or value != int(value):
        raise ConfigError(usage)
    return int(value)

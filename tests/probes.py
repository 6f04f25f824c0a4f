"""What the tests use to look into a run or poke at one, and the sources never need.

One pair's Laplace mask on its own (`pair_noise`, what a hub's `MaskBank` sums),
reading a run's outputs back (`read_metrics`, `load_summary`), matching a topic filter
(`matches`, the MQTT rule), the count of deliveries neither used nor rejected (`uncounted`,
which must stay 0), a frame from outside the run (`inject`), and the options an aiomqtt
client needs to reach a run's broker (`connect_options`).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
from router import Router

from privnet.agent.keys import PairStream, stream_laplace
from privnet.agent.protocol import Deliveries, Output, Publish
from privnet.broker.launcher import Broker
from privnet.orchestrator.curves import METRICS_HEADER

Metrics = dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]


def matches(pattern: str, topic: str) -> bool:
    """MQTT topic-filter matching: `+` is one level, a final `#` any number of levels."""
    want, have = pattern.split("/"), topic.split("/")
    for n, level in enumerate(want):
        if level == "#":
            return True
        if n >= len(have) or (level != "+" and level != have[n]):
            return False
    return len(want) == len(have)


def uncounted(deliveries: Deliveries) -> int:
    """Deliveries neither used, kept for later nor rejected: every one must be one of them
    (and a kept one, used or rejected in the end)."""
    return (
        deliveries.received - deliveries.used - deliveries.kept - sum(deliveries.rejected.values())
    )


def inject(router: Router, topic: str, payload: bytes, publisher: str = "outsider") -> None:
    """A frame from outside the run (an attacker, a replay), queued like any publish."""
    router.send(publisher, Output([Publish(topic, payload, "injected")]))


def connect_options(broker: Broker, user: str | None = None) -> dict[str, Any]:
    """`aiomqtt.Client(**connect_options(broker, "orchestrator"), ...)`: host, port, user,
    password and TLS verification against the run's CA. No client `identifier`: where the
    broker has the run's users, a client's id is its username whatever it sends."""
    return {
        "hostname": broker.address.host,
        "port": broker.address.port,
        **broker.access(user).client_kwargs(),
    }


def load_summary(path: Path) -> dict[str, Any]:
    """Read summary.json, checking it has config and results."""
    summary = json.loads(Path(path).read_text())
    if not isinstance(summary, dict) or not {"config", "results"} <= summary.keys():
        raise ValueError(f"{path} is not a privnet summary: it needs 'config' and 'results' keys")
    return summary


def read_metrics(path: Path) -> Metrics:
    """Parse metrics.csv back: (strategy, scheme) -> (msd_centroid (R, T), msd_avg (R, T))."""
    rows: dict[tuple[str, str], dict[tuple[int, int], tuple[float, float]]] = {}
    with Path(path).open(newline="") as fh:
        reader = csv.reader(fh)
        header = tuple(next(reader, ()))
        if header[: len(METRICS_HEADER)] != METRICS_HEADER:
            raise ValueError(f"{path}: header is {header}, expected {METRICS_HEADER} first")
        for line, row in enumerate(reader, start=2):
            if len(row) != len(header):
                raise ValueError(f"{path}:{line}: {len(row)} fields, expected {len(header)}")
            strategy, scheme, rep, it, cen, avg = row[: len(METRICS_HEADER)]
            try:
                cell, values = (int(rep), int(it) - 1), (float(cen), float(avg))
            except ValueError as err:
                raise ValueError(f"{path}:{line}: {err}; repeat/iter must be integers") from err
            points = rows.setdefault((strategy, scheme), {})
            if cell in points or cell[0] < 0 or cell[1] < 0:
                raise ValueError(f"{path}:{line}: repeat {rep}, iter {it} is repeated or negative")
            points[cell] = values
    return {key: _to_arrays(path, key, points) for key, points in rows.items()}


def _to_arrays(
    path: Path, key: tuple[str, str], points: dict[tuple[int, int], tuple[float, float]]
) -> tuple[np.ndarray, np.ndarray]:
    repeats = 1 + max(r for r, _ in points)
    iters = 1 + max(i for _, i in points)
    if len(points) != repeats * iters:
        raise ValueError(
            f"{path}: {key[0]}/{key[1]} has {len(points)} rows, expected "
            f"{repeats} repeats x {iters} iterations; the file is truncated or edited"
        )
    both = np.empty((2, repeats, iters))
    for (r, i), (cen, avg) in points.items():
        both[0, r, i], both[1, r, i] = cen, avg
    return both[0], both[1]


def pair_noise(
    secret: bytes,
    session: bytes,
    hub: int,
    pair: tuple[int, int],
    round_: int,
    step: int,
    dim: int,
    sigma_g: float,
    *,
    epoch: int,
) -> np.ndarray:
    """The Laplace mask g_{lm,k,i} that both partners of `pair` derive alike at hub `hub`
    in round `round_`: one read of the pair's `PairStream` (see there for why it is safe)."""
    stream = PairStream(secret, session, hub, pair, step, epoch, dim).read(round_)
    return stream_laplace(stream, dim, sigma_g).reshape(dim)  # its one row

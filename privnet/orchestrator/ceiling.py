"""The transport ceiling of `privnet bench`: raw MQTT clients (the agents' own
`privnet.agent.transport.Connection`, with a run's credentials and ACL) moving the same frames
a round as privnet's models over a fresh broker, with no privnet logic at all."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from typing import Any

import numpy as np
import psutil

from privnet.agent import topics
from privnet.agent.access import BrokerAddress
from privnet.agent.loop import run_loop
from privnet.agent.protocol import PEER_QOS
from privnet.agent.spec import Strategy
from privnet.agent.transport import Connection
from privnet.broker.credentials import Credentials
from privnet.broker.launcher import launch
from privnet.orchestrator.experiment.instance import Instance

RUN = "bench"


def edges(problem: Instance, strategy: Strategy) -> dict[int, list[int]]:
    """Out-neighbours (self excluded) at every communicating step of a round (a
    schedule's: round 1's)."""
    out: dict[int, list[int]] = {p: [] for p in range(problem.config.agents)}
    for a in problem.round_matrices(strategy, 1):
        if np.array_equal(a, np.eye(len(a))):
            continue  # a step with A = I sends nothing
        for m in range(len(a)):
            out[m] += [p for p in range(len(a)) if p != m and a[m, p] > 0]
    return out


async def _ceiling_clients(
    address: BrokerAddress,
    credentials: Credentials,
    ids: list[int],
    out: dict[int, list[int]],
    rounds: int,
    size: int,
    frames: int,
    ready: Any,
    go: Any,
    result: Any,
) -> None:
    expected = {p: 0 for p in ids}
    for targets in out.values():
        for k in targets:
            if k in expected:
                expected[k] += frames
    conns = {}
    for p in ids:
        conn = Connection(address, credentials.access(str(p)))
        await conn.__aenter__()
        await conn.subscribe(topics.inbox_filter(RUN, p), PEER_QOS)
        conns[p] = conn
    ready.set()
    await asyncio.to_thread(go.wait)
    payload = bytes(size)
    start = time.perf_counter()

    async def agent(p: int) -> None:
        conn, got = conns[p], [0] * (rounds + 2)
        for r in range(rounds):
            head = r.to_bytes(4, "big")
            for k in out[p]:
                for _ in range(frames):
                    conn.publish(topics.peer_topic(RUN, k, p), head + payload, PEER_QOS)
            while got[r] < expected[p]:
                _, data, _ = await conn.get(60.0)
                got[int.from_bytes(data[:4], "big")] += 1

    await asyncio.gather(*(agent(p) for p in ids))
    result.put(time.perf_counter() - start)
    for conn in conns.values():
        await conn.__aexit__(None, None, None)


def _ceiling_worker(*args: Any) -> None:
    run_loop(_ceiling_clients(*args))


def ceiling(
    broker_kind: str,
    out: dict[int, list[int]],
    rounds: int,
    size: int,
    workers: int,
    frames: int = 1,
) -> tuple[float, float, float]:
    """(rounds/s, messages/s, broker CPU s) of the raw load on a fresh broker: `frames`
    frames of `size` bytes a directed edge a round."""
    agents = len(out)
    credentials = Credentials.generate(RUN, agents)
    broker = launch(broker_kind, credentials=credentials)
    broker.start()
    try:
        ctx = mp.get_context("fork")  # no event loop runs here yet; children start their own
        go, result = ctx.Event(), ctx.Queue()
        procs, readies = [], []
        for w in range(workers):
            ready = ctx.Event()
            ids = list(range(w, agents, workers))
            args = (broker.address, credentials, ids, out, rounds, size, frames, ready, go, result)
            proc = ctx.Process(target=_ceiling_worker, args=args, daemon=True)
            proc.start()
            procs.append(proc)
            readies.append(ready)
        for ready in readies:
            if not ready.wait(120):
                raise RuntimeError("ceiling clients did not connect within 120 s")
        cpu0 = cpu_seconds(broker.pid)
        go.set()
        took = max(result.get(timeout=600) for _ in procs)
        cpu = cpu_seconds(broker.pid) - cpu0
        for proc in procs:
            proc.join(10)
    finally:
        broker.stop()
    messages = sum(len(v) for v in out.values()) * frames
    return rounds / took, rounds * messages / took, cpu


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)

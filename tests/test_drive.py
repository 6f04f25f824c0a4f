"""Pure machines and the one router interface (issue 33, item 2): the orchestrator's `Watch`
decides its files, signals and restarts as effects and does none of them; the memory engine
pumps its parties through the driver over the in-memory link exactly as over MQTT, on a
virtual clock, to the same models and bytes as the tests' plain FIFO router gives."""

from __future__ import annotations

import asyncio
import csv
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from router import Routed

from privnet.agent.driver import PROBE, Machine
from privnet.agent.inmemory import MemoryBroker
from privnet.agent.protocol import Output
from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.curves import METRICS_HEADER
from privnet.orchestrator.engines.memory import CONDUCTOR, Network
from privnet.orchestrator.engines.shell import WatchShell
from privnet.orchestrator.engines.watch import SessionDone, Signal, Watch, WriteRows
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance, msd
from privnet.orchestrator.experiment.specs import session_plans
from privnet.orchestrator.faults import parse_faults

AGENTS, ITERS, SEED = 6, 30, 34


def problem() -> Instance:
    return Instance.build(ExperimentConfig(agents=AGENTS, iters=ITERS, repeats=1, seed=SEED))


@pytest.mark.parametrize("scheme", ["none", "masked-ghp"])
def test_driven_memory_run_equals_the_routed_one(scheme: str) -> None:
    """Every party pumped by the driver on the in-memory link: the same models and bytes as
    the tests' stepping router gives, and every agent drained its inbox with the driver's
    probe before it stopped reading it (what the router never exercised)."""
    shared = problem()
    plans = session_plans(shared, [(Strategy("atc"), Scheme(scheme), 0)])
    routed = Routed.build(plans).play()[0]
    probes: list[str] = []

    def tap(publisher: str, topic: str, payload: bytes) -> None:
        if payload.startswith(PROBE):
            probes.append(publisher)

    driven = asyncio.run(Network.build(plans).drive(wire_tap=tap))[0]
    assert np.array_equal(driven.models, routed.models, equal_nan=True)
    assert not np.isnan(driven.models).any()
    assert driven.totals("bytes") == routed.totals("bytes")
    assert driven.totals("messages") == routed.totals("messages")
    assert sorted(probes) == [f"agent-{p}" for p in range(AGENTS)]


def test_memory_link_routes_at_publish_time() -> None:
    """As an MQTT broker: what was published before an unsubscription still arrives, in
    order; what after, not."""

    async def scenario() -> list[tuple[str, bytes, bool]]:
        broker = MemoryBroker()
        sender, reader = broker.connect("sender"), broker.connect("reader")
        await reader.subscribe("a/#")
        for n in range(3):
            sender.publish(f"a/{n}", bytes([n]))
        await reader.unsubscribe("a/#")
        sender.publish("a/3", b"\3")
        sender.close()  # a party that neither waits nor left would hold virtual time still
        serving = asyncio.get_running_loop().create_task(broker.serve())
        got = [await reader.get(1.0) for _ in range(3)]
        with pytest.raises(TimeoutError):
            await reader.get(0.05)
        serving.cancel()
        return got

    assert asyncio.run(scenario()) == [(f"a/{n}", bytes([n]), False) for n in range(3)]


class Recorder:
    """The watch as a router endpoint, keeping its outputs' effects."""

    def __init__(self, watch: Watch) -> None:
        self.watch, self.effects = watch, []  # type: list[object]

    def _kept(self, out: Output) -> Output:
        self.effects += out.effects
        return out

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output:
        return self._kept(self.watch.receive(topic, payload, now, retained))

    def tick(self, now: float) -> Output:
        return self._kept(self.watch.tick(now))

    def next_tick(self) -> float | None:
        return self.watch.next_tick()

    def unsubscribed(self, topic: str, now: float) -> Output:
        return self._kept(self.watch.unsubscribed(topic, now))

    def deaf(self, now: float) -> Output:
        return self._kept(self.watch.deaf(now))


def test_watch_decides_and_its_shell_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A watched memory run writes nothing and signals nobody by itself: its rows, the
    session's end and a `kill:2@5` fault come out as effects (the kill once round 5 is
    done, as telemetry shows it), and the shell turns the rows into metrics.csv, one row
    a round, the MSDs as the models give them."""
    monkeypatch.chdir(tmp_path)
    shared = problem()
    plans = session_plans(shared, [(Strategy("atc"), Scheme("local-ghp"), 0)])
    net = Routed.build(plans)
    watch = Watch(net.conductor, {}, shared, parse_faults("kill:2@5", AGENTS))
    recorder = Recorder(watch)
    endpoint: Machine = recorder
    net.router.swap(CONDUCTOR, endpoint, net.conductor.subscriptions)
    (result,) = net.play()
    assert os.listdir(tmp_path) == []  # the watch wrote nothing
    signals = [e for e in recorder.effects if isinstance(e, Signal)]  # once
    assert signals == [Signal(2, signal.SIGKILL)]
    (injected,) = watch.injected  # at the first delivery that shows round 5 done
    at = int(injected.removeprefix("kill:2@5 (at round ").removesuffix(")"))
    assert 5 <= at < ITERS
    assert [e for e in recorder.effects if isinstance(e, SessionDone)] == [SessionDone(0, result)]
    rows = [e for e in recorder.effects if isinstance(e, WriteRows)]
    assert rows and rows[0].fresh and not any(r.fresh for r in rows[1:])
    out = tmp_path / "out"
    out.mkdir()
    (out / "journal").mkdir()
    shell = WatchShell(watch, None, None, out)  # type: ignore[arg-type]  # no broker needed
    for effect in rows:
        shell.do(effect)
    with (out / "metrics.csv").open(newline="") as fh:
        table = list(csv.reader(fh))
    assert tuple(table[0][: len(METRICS_HEADER)]) == METRICS_HEADER
    assert [int(r[3]) for r in table[1:]] == list(range(1, ITERS + 1))
    for r in (0, ITERS - 1):
        cen, avg = msd(result.models[r], shared.w_opt[0], shared.q)
        assert table[1 + r][4:6] == [repr(cen), repr(avg)]

"""Broker restarts (issue 10, item 4): `privnet.agent.transport.Connection` reconnects with backoff,
subscribes again and keeps `get`/`publish` working; an agent rides out a restart.

The broker is SIGKILLed (it persists nothing: every session, subscription and queued message
is gone) and started again on the same port with the same configuration and credentials.
Each test runs under mosquitto (skipped without it, unless PRIVNET_REQUIRE_MOSQUITTO=1) and
the embedded amqtt broker, in a few seconds.
"""

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiomqtt
import pytest
from conftest import need_mosquitto, prepared, relay
from probes import connect_options

from privnet.agent.gmqtt_adapter import Inflight
from privnet.agent.transport import Connection, MqttError
from privnet.broker.credentials import INSPECTOR
from privnet.broker.launcher import Broker, launch
from privnet.orchestrator.engines.launch import agent_args

pytestmark = pytest.mark.net
WAIT = 5.0


@pytest.fixture(params=["mosquitto", "embedded"])
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "mosquitto":
        need_mosquitto()
    return str(request.param)


async def until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.01)


async def crash(broker: Broker, *conns: Connection) -> None:
    """SIGKILL the broker and wait until every connection noticed."""
    await asyncio.to_thread(broker.kill)
    await until(lambda: all(c.outages.losses for c in conns), "every client saw the loss")


async def test_connection_rides_out_a_broker_restart(kind: str) -> None:
    """Subscriptions work again at their QoS, QoS 0 sent while down is dropped and counted,
    QoS 1 is held and sent after the reconnect, and `get` only waits meanwhile."""
    async with (
        launch(kind) as broker,
        Connection(broker.address, broker.access(), give_up=20) as a,
        Connection(broker.address, broker.access(), give_up=20) as b,
    ):
        await a.subscribe("t/a", 1)
        await b.subscribe("t/b/#", 0)
        a.publish("t/b/1", b"before", 0)
        assert await b.get(WAIT) == ("t/b/1", b"before", False)

        await crash(broker, a, b)
        a.publish("t/b/1", b"lost", 0)  # nobody would get it: dropped, counted
        a.publish("t/a", b"held", 1)  # to itself: resubscribed before the held ones go
        with pytest.raises(TimeoutError):
            await b.get(0.3)  # an outage is waited through, not an error
        await asyncio.to_thread(broker.restart)

        assert await a.get(WAIT) == ("t/a", b"held", False)
        await until(lambda: b.generation == 1, "b reconnected")
        a.publish("t/b/2", b"after", 0)
        assert await b.get(WAIT) == ("t/b/2", b"after", False)
        b.publish("t/a", b"to a", 1)
        assert await a.get(WAIT) == ("t/a", b"to a", False)
        # a subscription made after the restart, and one dropped: both hold
        await a.subscribe("t/c", 0)
        await b.unsubscribe("t/b/#")
        b.publish("t/c", b"c", 0)
        b.publish("t/b/3", b"unsubscribed", 0)
        assert await a.get(WAIT) == ("t/c", b"c", False)
        with pytest.raises(TimeoutError):
            await b.get(0.3)
    assert (a.outages.losses, a.outages.reconnects, a.generation) == (1, 1, 1)
    assert (a.outages.dropped, a.outages.buffered) == (1, 1)
    assert 0 < a.outages.seconds < 10


async def test_connection_gives_up_after_its_budget(kind: str) -> None:
    async with (
        launch(kind) as broker,
        Connection(broker.address, broker.access(), give_up=1.0) as a,
    ):
        await a.subscribe("t/a", 1)
        await crash(broker, a)
        lost = time.monotonic()
        with pytest.raises(MqttError, match="not made again in 1 s"):
            await a.get(10)
        assert time.monotonic() - lost < 3
        with pytest.raises(MqttError):
            a.publish("t/a", b"x", 1)
        with pytest.raises(MqttError):
            await a.subscribe("t/b", 0)
        assert a.outages.reconnects == 0 and a.outages.attempts >= 3


async def test_a_loss_right_after_the_connack_is_retried_at_once(kind: str) -> None:
    """A connection that drops between the broker's CONNACK and the resubscription (another
    client of its user displacing it, say) fails that attempt then and there: it used to
    wait for acknowledgements that could not come, for the attempt's whole timeout (5 s),
    while the run around it stalled."""
    async with (
        launch(kind) as broker,
        relay(broker.address) as wire,
        Connection(wire.address, broker.access(), give_up=20) as a,
        Connection(broker.address, broker.access()) as b,
    ):
        await a.subscribe("t/a", 0)
        wire.cut_after_connack = 1
        wire.drop()
        await until(lambda: a.outages.reconnects == 1, "a reconnected", timeout=3.0)
        b.publish("t/a", b"after", 0)
        assert await a.get(WAIT) == ("t/a", b"after", False)
    assert a.outages.attempts == 1 and a.outages.seconds < 2


def test_unacknowledged_qos1_publishes_outlive_a_clean_session() -> None:
    """gmqtt `clear`s its store of unacknowledged QoS-1 PUBLISHes when the broker kept no
    session; `Inflight` keeps what they carried, to send them again."""
    store = Inflight()
    for mid, payload in ((1, b"acked"), (2, b"unacked")):
        store.next = ("t", payload, 1)
        store.push_message(mid, b"raw")
    store.push_message(3, b"a PUBREL")  # gmqtt's own (QoS 2): not ours to resend
    store.remove_message_by_mid(1)  # PUBACK
    store.clear()  # CONNACK: session not present
    assert store.orphans == [("t", b"unacked", 1)] and store.is_empty


async def test_agent_registers_across_a_broker_restart(kind: str, tmp_path: Path) -> None:
    """Agents Hello, the broker dies and comes back before any orchestrator is there; the
    agents reconnect, and once the orchestrator appears they register and finish a run."""
    run, agents = f"restart-{kind}", 3
    async with prepared(kind, run, agents, tmp_path) as setup:
        broker = setup.broker
        launches = setup.secrets.launches(str(broker.address), broker.access)
        logs = {p: tmp_path / f"agent-{p}.log" for p in range(agents)}
        procs = []
        for p, launch_ in launches.items():
            with logs[p].open("w") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, *agent_args(p)],
                        env={**os.environ, **launch_.to_env()},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        try:
            async with aiomqtt.Client(**connect_options(broker, INSPECTOR)) as inspector:
                await inspector.subscribe(f"privnet/{run}/ctl/up/+")
                helloed: set[str] = set()
                async with asyncio.timeout(15):
                    async for message in inspector.messages:
                        helloed.add(str(message.topic))
                        if len(helloed) == agents:
                            break
            await asyncio.to_thread(broker.kill)
            await asyncio.sleep(0.5)
            await asyncio.to_thread(broker.restart)
            out = tmp_path / "out"
            argv = [
                *(sys.executable, "-m", "privnet.orchestrator.cli"),
                *("run", "--agents", str(agents), "--iters", "20", "--topology", "complete"),
                *("--strategy", "atc", "--scheme", "local-ghp", "--seed", "3"),
                *("--external-agents", "--deadline", "10", "--out", str(out), *setup.flags()),
            ]
            privnet = await asyncio.to_thread(
                subprocess.run, argv, capture_output=True, text=True, timeout=60
            )
            assert privnet.returncode == 0, privnet.stdout + privnet.stderr
            codes = [await asyncio.to_thread(proc.wait, 30) for proc in procs]
        finally:
            for proc in procs:
                proc.kill()
    text = {p: log.read_text() for p, log in logs.items()}
    assert codes == [0] * agents, text
    assert all("back after" in t for t in text.values()), text

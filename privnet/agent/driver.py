"""The driver: `pump` runs a sans-IO machine (the agent's node, the orchestrator's
conductor) on a `Link` to the others: the MQTT `Connection` (`privnet.agent.transport`) or
the in-memory one (`privnet.agent.inmemory`). It only delivers what arrives, calls `tick`
when the machine asks, and publishes what it returns; every rule lives in the machine."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from privnet.agent.mailbox import Taker
from privnet.agent.protocol import PEER_QOS, QOS, Output, Unsubscribe
from privnet.agent.transport import Outages

log = logging.getLogger("privnet.agent")
OVERRAN = 1.0  # seconds a wait overran by: this process itself was not running
BACKLOG_READ = 0.2  # seconds to let the socket's backlog in after such a pause
PROBE = b"privnet/probe\0"  # never a frame: frames are msgpack arrays
PROBE_TIMEOUT = 30.0


class Machine(Protocol):
    """A sans-IO party: the agent node or the orchestrator's conductor."""

    def receive(self, topic: str, payload: bytes, now: float, retained: bool = False) -> Output: ...
    def tick(self, now: float) -> Output: ...
    def next_tick(self) -> float | None: ...
    def unsubscribed(self, topic: str, now: float) -> Output: ...
    def deaf(self, now: float) -> Output: ...


class Link(Protocol):
    """What the pump needs of its way to the others (the router interface): deliveries in
    order (`get`, or straight to a `taking` callback while it waits), publishes, and
    subscriptions acknowledged. `outages.reconnects` and `generation` change when a
    reconnect may have lost frames; `up`: deliveries can flow. `clock` is the time the
    machine is told and its ticks and waits count in: the monotonic clock over MQTT, a
    virtual one in memory (it moves only when every party waits, so a run is deterministic
    and a slow machine never fires a deadline)."""

    outages: Outages
    generation: int
    clock: Callable[[], float]

    @property
    def queued(self) -> int: ...
    @property
    def up(self) -> bool: ...
    async def get(self, timeout: float | None = None) -> tuple[str, bytes, bool]: ...
    def taking(self, taker: Taker) -> AbstractContextManager[None]: ...
    def interrupt(self) -> None: ...
    def publish(self, topic: str, payload: bytes, qos: int = QOS) -> None: ...
    def corked(self) -> AbstractContextManager[None]: ...
    async def subscribe(self, topic: str, qos: int = QOS, timeout: float = 10.0) -> None: ...
    async def unsubscribe(self, topic: str, timeout: float = 10.0) -> None: ...


def publish(client: Link, out: Output) -> None:
    """Everything a machine returned, each at its category's QoS (`QOS_OF`), in one write."""
    if not out.publish:
        return
    with client.corked():
        for p in out.publish:
            client.publish(p.topic, p.payload, p.qos)


async def pump(
    client: Link,
    machine: Machine,
    until: Callable[[], bool],
    on_output: Callable[[Output], None] | None = None,
    every: float | None = None,
) -> None:
    """Feed `machine` deliveries and time until `until()`; publish what it says.

    `every` bounds the wait, so the caller's `until` (a child process check, say) runs at
    least that often.
    """
    await _Pump(client, machine, until, on_output).run(every)


class _Pump:
    """`pump`, with its one delivery path: the machine receives a delivery, then hears what
    the time says (`_settle`: deaf, tick), and what it returned is published and reported.

    A delivery comes in one of two ways. While the loop (`run`) waits, the transport's
    callback hands it to `take` (`Connection.taking`): no task wakes and no timer is set per
    delivery. `take` does only the plain case; it declines (the delivery is queued for the
    loop) one that may follow a pause of this process or a reconnect, and wakes the loop
    (`interrupt`) once the machine is done, wants a tick before the loop's timer, or asked to
    unsubscribe: the loop alone does what must be awaited (reading the backlog after a
    pause, draining a subscription before it stops)."""

    def __init__(
        self,
        client: Link,
        machine: Machine,
        until: Callable[[], bool],
        on_output: Callable[[Output], None] | None,
    ) -> None:
        self.client, self.machine, self.until, self.on_output = client, machine, until, on_output
        self.reconnects = client.outages.reconnects  # as the machine last heard (`deaf`)
        self.stops: list[Unsubscribe] = []  # asked for in `take`: the loop drains and stops
        self.error: Exception | None = None  # raised in `take`: the loop raises it
        self._timer: float | None = None  # when the loop wakes by itself
        self._paused_after: float | None = None  # a delivery later than this: we were paused
        self._wake: float | None = None  # the machine's next_tick after the last `_settle`

    async def run(self, every: float | None) -> None:
        client, machine, clock = self.client, self.machine, self.client.clock
        last = clock()  # when the machine was last fed
        while not self.until():
            wake = machine.next_tick()
            waits = [w for w in (None if wake is None else wake - clock(), every) if w is not None]
            timeout = max(0.0, min(waits)) if waits else None
            self._arm(None if timeout is None else last + timeout)
            try:
                with client.taking(self.take):
                    topic, payload, retained = await client.get(timeout)
            except TimeoutError:
                out = Output()
            else:
                out = machine.receive(topic, payload, clock(), retained)
            if self.error is not None:
                raise self.error
            if self.stops:  # `take` fed the machine, which asked to unsubscribe
                await self._stop()
                last = clock()
                continue
            # Longer since the last feed than the wait allowed: this process was not running
            # (stopped while waiting or while working), whatever it was doing.
            deaf = client.outages.reconnects != self.reconnects  # silence meanwhile proves nothing
            if timeout is not None and clock() - last > timeout + OVERRAN:
                out += await _backlog(client, machine, self.on_output)
                deaf = True
            self.stops += self._settle(out, deaf or not client.up).unsubscribe
            await self._stop()
            last = clock()

    def take(self, topic: str, payload: bytes, retained: bool) -> bool:
        """Feed one delivery in the transport's callback; False: queue it for the loop."""
        client = self.client
        now = client.clock()
        paused = self._paused_after is not None and now > self._paused_after
        if paused or client.outages.reconnects != self.reconnects or not client.up:
            return False
        try:
            out = self.machine.receive(topic, payload, now, retained)
            if client.clock() - now > OVERRAN:  # stopped while it worked: no tick may count it
                _report(client, out, self.on_output)
                client.interrupt()  # the loop sees the pause, and says so (deaf)
                return True
            self.stops += self._settle(out, False).unsubscribe
        except Exception as exc:  # raised by the loop, as its own work would be
            self.error = exc
            client.interrupt()
            return True
        wake = self._wake
        early = wake is not None and (self._timer is None or wake < self._timer)
        if self.stops or early or self.until():
            client.interrupt()
        return True

    def _settle(self, out: Output, deaf: bool) -> Output:
        """After a delivery or a wait: tell the machine it was `deaf` (no deadline runs out
        while nothing can be heard), tick it if its time has come, publish and report."""
        client, machine, clock = self.client, self.machine, self.client.clock
        if deaf:
            self.reconnects = client.outages.reconnects
            out += machine.deaf(clock())
        wake = machine.next_tick()
        if wake is not None and clock() >= wake:
            out += machine.tick(clock())
            wake = machine.next_tick()
        self._wake = wake
        _report(client, out, self.on_output)
        return out

    def _arm(self, timer: float | None) -> None:
        """The loop waits until `timer` (None: for a delivery)."""
        self._timer = timer
        self._paused_after = None if timer is None else timer + OVERRAN

    async def _stop(self) -> None:
        """Drain and stop every subscription the machine asked to drop."""
        stops, self.stops = self.stops, []
        for stop in stops:
            await _drain_and_stop(self.client, self.machine, stop, self.on_output)


async def _backlog(
    client: Link, machine: Machine, on_output: Callable[[Output], None] | None
) -> Output:
    """This process did not run for a while (SIGSTOP, a suspended host, a machine too busy
    to schedule it): what arrived meanwhile is delivered before time is, so a deadline
    counts the others' silence, not our own absence. Only what had arrived: frames that keep
    coming meanwhile go through the pump as usual, between its ticks. Draining until nothing
    is left never ended where frames came as fast as they were read (a thousand agents'
    telemetry into an orchestrator short of CPU), and a machine that never ticks sends no
    heartbeat: every agent gave up on an orchestrator "silent for 120 s". So the machine
    hears first that it was deaf until now, and is ticked whenever its time comes while the
    backlog is read (its heartbeats go out on time however long the backlog is); what the
    caller gets back is what came after the last tick."""
    await asyncio.sleep(BACKLOG_READ)  # let the transport read what the socket holds
    out, waited, told = Output(), client.queued, False
    ticked = client.clock()
    for _ in range(waited):
        try:
            topic, payload, retained = await client.get(0.0)
        except TimeoutError:  # interrupted: the pump goes on
            break
        now = client.clock()
        out += machine.receive(topic, payload, now, retained)
        wake = machine.next_tick()
        if wake is not None and now >= wake and now - ticked >= BACKLOG_READ:
            if not told:  # before any tick: no deadline counts the pause
                out += machine.deaf(now)
                told = True
            out += machine.tick(now)
            ticked = now
            _report(client, out, on_output)  # unsubscribing stays the loop's, after
            out = Output(unsubscribe=out.unsubscribe)
    log.info("back from a pause: %d deliveries had waited", waited)
    return out


async def _apply(
    client: Link,
    machine: Machine,
    out: Output,
    on_output: Callable[[Output], None] | None,
) -> None:
    """Publish, unsubscribe and report what a machine returned."""
    _report(client, out, on_output)
    for stop in out.unsubscribe:
        await _drain_and_stop(client, machine, stop, on_output)


def _report(client: Link, out: Output, on_output: Callable[[Output], None] | None) -> None:
    """Publish and report what a machine returned."""
    publish(client, out)
    if on_output is not None:
        on_output(out)


async def _drain_and_stop(
    client: Link,
    machine: Machine,
    stop: Unsubscribe,
    on_output: Callable[[Output], None] | None,
) -> None:
    """Stop reading `stop.pattern` only once every frame the broker queued for it is in.

    A broker may deliver queued frames after its UNSUBACK, so: subscribe to the probe topic
    alone, drop the pattern, publish a probe there, and deliver everything until the probe
    comes back: the broker's queue for this client is first in, first out. The probe takes
    the peer plane's QoS, the very path of the frames it flushes. A reconnect on the way may
    have lost the probe (and the broker whatever it held for us): the probe goes again."""
    nonce = PROBE + secrets.token_bytes(16)
    await client.subscribe(stop.probe, PEER_QOS)
    await client.unsubscribe(stop.pattern)
    sent = client.generation
    client.publish(stop.probe, nonce, PEER_QOS)
    end = client.clock() + PROBE_TIMEOUT
    while True:
        if client.generation != sent:
            sent = client.generation
            client.publish(stop.probe, nonce, PEER_QOS)
        try:
            topic, payload, retained = await client.get(min(1.0, end - client.clock()))
        except TimeoutError:
            if client.clock() < end:
                continue
            log.warning("no probe back on %s in %.0f s; stopping anyway", stop.probe, PROBE_TIMEOUT)
            break
        if topic == stop.probe and payload == nonce:
            break
        await _apply(
            client, machine, machine.receive(topic, payload, client.clock(), retained), on_output
        )
    await client.unsubscribe(stop.probe)
    await _apply(client, machine, machine.unsubscribed(stop.pattern, client.clock()), on_output)

"""The in-memory implementation of the pump's link (`privnet.agent.driver.Link`), beside
the MQTT one (`privnet.agent.transport.Connection`), as httpx has its HTTP and mock
transports: a `MemoryBroker` routes what its `MemoryLink`s publish to those subscribed,
by MQTT topic filter, first in, first out per subscriber, and the driver pumps each party
on its link exactly as it does over MQTT (the backlog after a pause, the probe that drains
a subscription before it stops). Time is the broker's `VirtualClock`: it stands still while
any party can run and jumps to the earliest timer once every party waits, so a run in
memory is deterministic and no deadline fires because the machine running it is slow."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from privnet.agent.mailbox import Mailbox, Taker, Timer
from privnet.agent.protocol import QOS
from privnet.agent.transport import Outages

E = TypeVar("E")
_HERE = "\0subscribers"  # no topic level contains a NUL
YIELD_EVERY = 64  # deliveries between the broker's yields to the parties' pumps
_UNCORKED = contextlib.nullcontext()  # nothing to batch: publishes route at once
EPOCH = 1000.0  # a virtual clock's start: not 0.0, which the conductor reads as "not yet"


class Filters(Generic[E]):
    """MQTT topic filters indexed by level, so matching a topic costs its depth, not the
    number of subscriptions (10,000 agents hold 30,000 of them). Matches come back in
    subscription order, once per subscriber, as a broker delivers them."""

    def __init__(self) -> None:
        self._root: dict[str, Any] = {}
        self._seq = 0

    def add(self, pattern: str, name: str, endpoint: E) -> None:
        node = self._root
        for level in pattern.split("/"):
            node = node.setdefault(level, {})
        self._seq += 1
        node.setdefault(_HERE, {}).setdefault(name, (self._seq, endpoint))

    def remove(self, pattern: str, name: str) -> E:
        node = self._root
        for level in pattern.split("/"):
            node = node[level]
        endpoint: E = node[_HERE].pop(name)[1]
        return endpoint

    def match(self, topic: str) -> list[tuple[str, E]]:
        found: dict[str, tuple[int, E]] = {}
        levels = topic.split("/")
        nodes = [self._root]
        for level in levels:
            below = []
            for node in nodes:
                if "#" in node:
                    self._take(node["#"], found)
                if level in node:
                    below.append(node[level])
                if "+" in node:
                    below.append(node["+"])
            nodes = below
        for node in nodes:
            self._take(node, found)
            if "#" in node:  # "a/#" matches "a" too
                self._take(node["#"], found)
        return [(name, ep) for name, (_, ep) in sorted(found.items(), key=lambda x: x[1][0])]

    @staticmethod
    def _take(node: dict[str, Any], found: dict[str, tuple[int, E]]) -> None:
        for name, entry in node.get(_HERE, {}).items():
            if name not in found or entry[0] < found[name][0]:
                found[name] = entry


class _Timer:
    """A virtual timer: `cancel` leaves it in the heap, skipped when its time comes."""

    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback, self.cancelled = callback, False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """Time that moves only when `advance` moves it: to the earliest timer set, firing every
    timer due by then. The broker advances it once no party can run."""

    def __init__(self, now: float = EPOCH) -> None:
        self.now = now
        self._timers: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.now

    def later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """`callback` once the clock reaches now + `delay`; at once if that is now (a wait
        for nothing ends before anything else can happen)."""
        timer = _Timer(callback)
        if delay <= 0:
            callback()
            timer.cancel()
            return timer
        heapq.heappush(self._timers, (self.now + delay, next(self._seq), timer))
        if len(self._timers) > 256 and len(self._timers) > 4 * self.pending():
            self._timers = [t for t in self._timers if not t[2].cancelled]  # waits that ended
            heapq.heapify(self._timers)
        return timer

    def pending(self) -> int:
        return sum(not t[2].cancelled for t in self._timers)

    def advance(self) -> bool:
        """Move to the earliest timer and fire every one due then; False: none is set."""
        timers = self._timers
        while timers and timers[0][2].cancelled:
            heapq.heappop(timers)
        if not timers:
            return False
        self.now = max(self.now, timers[0][0])
        while timers and timers[0][0] <= self.now:
            timer = heapq.heappop(timers)[2]
            if not timer.cancelled:
                timer.cancel()
                timer.callback()
        return True


class MemoryBroker:
    """Routes at publish time, as an MQTT broker does (a frame published before an
    unsubscription still reaches the subscriber); delivers in order from `serve`, the task
    that plays the broker's socket and moves the `clock`. `tap` sees every publish:
    (publisher, topic, payload)."""

    def __init__(
        self,
        tap: Callable[[str, str, bytes], None] | None = None,
        clock: VirtualClock | None = None,
    ) -> None:
        self.tap = tap
        self.clock = clock or VirtualClock()
        self._filters: Filters[MemoryLink] = Filters()
        self._queue: deque[tuple[MemoryLink, str, bytes]] = deque()
        self._ready = asyncio.Event()
        self._links: list[MemoryLink] = []
        self._routes: dict[str, list[tuple[str, MemoryLink]]] = {}  # emptied by (un)subscribe

    def connect(self, name: str) -> MemoryLink:
        """A party's link, known to the broker by `name` (a client id)."""
        link = MemoryLink(self, name)
        self._links.append(link)
        return link

    def stir(self) -> None:
        """A party began to wait, or left: `serve` looks again whether all wait."""
        self._ready.set()

    def route(self, publisher: str, topic: str, payload: bytes) -> None:
        if self.tap is not None:
            self.tap(publisher, topic, payload)
        route = self._routes.get(topic)
        if route is None:
            route = self._routes[topic] = self._filters.match(topic)
        for _, link in route:
            self._queue.append((link, topic, payload))
        self._ready.set()

    def subscribe(self, pattern: str, link: MemoryLink) -> None:
        self._filters.add(pattern, link.name, link)
        self._routes.clear()

    def unsubscribe(self, pattern: str, link: MemoryLink) -> None:
        self._filters.remove(pattern, link.name)
        self._routes.clear()

    async def serve(self) -> None:
        """Deliver what was routed, first in, first out: a task beside the pumps. It yields
        every YIELD_EVERY deliveries, so a pump that queued them (busy in its loop) gets to
        run. Once nothing is left to deliver and every party waits, time moves to the next
        timer; it returns when no timer is left either: nothing can happen any more."""
        queue, delivered = self._queue, 0
        while True:
            while not queue:
                if all(link.idle for link in self._links):
                    if not self.clock.advance():
                        return
                    await asyncio.sleep(0)  # the parties it woke run, then we look again
                    continue
                self._ready.clear()
                await self._ready.wait()
            link, topic, payload = queue.popleft()
            link.deliver(topic, payload)
            delivered += 1
            if delivered % YIELD_EVERY == 0:
                await asyncio.sleep(0)


class MemoryLink:
    """One party's link to a `MemoryBroker`: what the driver's pump needs of a connection
    (`privnet.agent.driver.Link`), never disconnected."""

    def __init__(self, broker: MemoryBroker, name: str) -> None:
        self.broker, self.name = broker, name
        self.outages = Outages()  # none: the broker is this process
        self.generation = 0
        self.clock: Callable[[], float] = broker.clock
        self.closed = False  # its party is done: the broker no longer waits for it
        self._box = Mailbox(broker.clock.later)  # deliveries for `get`, or its taker

    @property
    def idle(self) -> bool:
        """Its party waits for a delivery or its time (or is done): only they can wake it."""
        return self.closed or self._box.waiting

    def close(self) -> None:
        """Its party is done."""
        self.closed = True
        self.broker.stir()

    @property
    def up(self) -> bool:
        return True

    @property
    def queued(self) -> int:
        return len(self._box.queue)

    def deliver(self, topic: str, payload: bytes) -> None:
        """From the broker: to the waiting pump's taker at once, or queued for its `get`."""
        self._box.deliver(topic, payload, False)

    def interrupt(self) -> None:
        """End the `get` under way (or else the next) as if its time had run out."""
        self._box.interrupt()

    def taking(self, taker: Taker) -> contextlib.AbstractContextManager[None]:
        """As `Connection.taking`: deliveries go to `taker` while a `get` waits."""
        return self._box.taking(taker)

    async def get(self, timeout: float | None = None) -> tuple[str, bytes, bool]:
        """The next (topic, payload, retained); TimeoutError after `timeout` s or an
        `interrupt`. One caller at a time."""
        self.broker.stir()
        await self._box.wait(timeout)
        item = self._box.queue.popleft()
        assert item is not None  # never lost: the broker is this process
        return item

    def publish(self, topic: str, payload: bytes, qos: int = QOS) -> None:
        self.broker.route(self.name, topic, payload)

    def corked(self) -> contextlib.AbstractContextManager[None]:
        return _UNCORKED

    async def subscribe(self, topic: str, qos: int = QOS, timeout: float = 10.0) -> None:
        self.broker.subscribe(topic, self)

    async def unsubscribe(self, topic: str, timeout: float = 10.0) -> None:
        self.broker.unsubscribe(topic, self)

"""The tests' stepping router: the memory engine's parties on one FIFO queue the test drains
by hand, under the test's clock, with every frame in flight open to a hook (lose it, hold
it, tamper with it). The engine itself pumps its parties through the driver
(`privnet.orchestrator.engines.memory`); `tests/test_drive.py` shows the two agree."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from privnet.agent.driver import Machine
from privnet.agent.inmemory import Filters
from privnet.agent.protocol import Event, Output, Publish
from privnet.orchestrator.conductor import SessionResult
from privnet.orchestrator.engines.memory import CONDUCTOR, Network, Tap

Edit = Callable[[str, Publish], Publish | None]  # a frame in flight: replaced, or lost (None)
Endpoint = Machine  # what the router delivers to: a party, as the driver pumps it


@dataclass(frozen=True)
class _Unsubscribe:
    """Queued like a frame: what was published before it still reaches the subscriber."""

    topic: str


@dataclass
class Router:
    """Topic routing between named endpoints, FIFO: a broker without the sockets."""

    tap: Tap | None = None
    edit: Edit | None = None  # lose or tamper with frames in flight
    clock: Callable[[], float] = time.perf_counter
    events: list[tuple[str, Event]] = field(default_factory=list)
    _filters: Filters[Endpoint] = field(default_factory=Filters)
    _routes: dict[str, tuple[int, list[tuple[str, Endpoint]]]] = field(default_factory=dict)
    _generation: int = 0  # bumped by every (un)subscription: cached routes go stale
    _queue: deque[tuple[str, Publish | _Unsubscribe]] = field(default_factory=deque)

    def attach(self, name: str, endpoint: Endpoint, subscriptions: Iterable[str]) -> None:
        for pattern in subscriptions:
            self._filters.add(pattern, name, endpoint)
        self._generation += 1

    def swap(self, name: str, endpoint: Endpoint, subscriptions: Iterable[str]) -> None:
        """Whatever reached `name` now reaches `endpoint`."""
        for pattern in subscriptions:
            self._filters.remove(pattern, name)
            self._filters.add(pattern, name, endpoint)
        self._generation += 1

    def send(self, publisher: str, out: Output) -> None:
        """Queue what `publisher` published; note what happened to it."""
        self._queue.extend((publisher, frame) for frame in out.publish)
        self._queue.extend((publisher, _Unsubscribe(u.pattern)) for u in out.unsubscribe)
        if out.events:
            self.events += [(publisher, event) for event in out.events]

    def drain(self) -> None:
        """Deliver until nothing is left to deliver."""
        while self._queue:
            publisher, sent = self._queue.popleft()
            if isinstance(sent, _Unsubscribe):
                self._unsubscribe(publisher, sent.topic)
                continue
            frame = sent if self.edit is None else self.edit(publisher, sent)
            if frame is None:
                continue
            if self.tap is not None:
                self.tap(publisher, frame)
            for name, endpoint in self._subscribers(frame.topic):
                self.send(name, endpoint.receive(frame.topic, frame.payload, self.clock()))

    def _unsubscribe(self, name: str, pattern: str) -> None:
        endpoint = self._filters.remove(pattern, name)
        self._generation += 1
        self.send(name, endpoint.unsubscribed(pattern, self.clock()))

    def _subscribers(self, topic: str) -> list[tuple[str, Endpoint]]:
        cached = self._routes.get(topic)
        if cached is not None and cached[0] == self._generation:
            return cached[1]
        route = self._filters.match(topic)
        self._routes[topic] = (self._generation, route)
        return route


@dataclass
class Routed(Network):
    """A memory-engine network whose parties the tests' `Router` steps (no ticks unless a
    test gives them): `Routed.build` as `Network.build`."""

    router: Router = field(default_factory=Router)

    def __post_init__(self) -> None:
        self.router.tap = self.tap
        self.router.attach(CONDUCTOR, self.conductor, self.conductor.subscriptions)
        for node in self.nodes:
            self.router.attach(f"agent-{node.me}", node, node.subscriptions)

    def start(self) -> None:
        now = self.router.clock()
        self.router.send(CONDUCTOR, self.conductor.start(now))
        for node in self.nodes:
            self.router.send(f"agent-{node.me}", node.start(now))

    def play(self) -> list[SessionResult]:
        """Every session to the end, then Bye; RunFailed if the conductor gave up."""
        self.start()
        self.router.drain()
        self._check()
        self.router.send(CONDUCTOR, self.conductor.bye())
        self.router.drain()
        return self.conductor.results

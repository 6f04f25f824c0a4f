"""Deliveries waiting for one reader: the queue, the waiting `get` and its interrupt, shared by
the MQTT connection (privnet.agent.transport) and the in-memory link (privnet.agent.inmemory),
so both hand frames to the driver's pump by the same rules."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

Taker = Callable[[str, bytes, bool], bool]  # (topic, payload, retained): True taken, False queue


class Timer(Protocol):
    """A wait's timer, as `Mailbox.later` sets it."""

    def cancel(self) -> None: ...


Later = Callable[[float, Callable[[], None]], Timer]  # (delay, callback): a timer
Delivery = tuple[str, bytes, bool]  # (topic, payload, retained)


class Mailbox:
    """A delivery goes to the taker while a `wait` is under way (no task wakes for it), or
    is queued for the next read; `None` in the queue marks a link lost for good. `later`
    sets a wait's timer: the event loop's (real time) unless given (the in-memory link's
    virtual clock)."""

    def __init__(self, later: Later | None = None) -> None:
        self.later = later
        self.queue: deque[Delivery | None] = deque()
        self._waiter: asyncio.Future[None] | None = None  # of the `wait` under way
        self._taker: Taker | None = None
        self._interrupted = False

    def deliver(self, topic: str, payload: bytes, retained: bool) -> None:
        waiter = self._waiter
        if (
            self._taker is None
            or waiter is None
            or waiter.done()  # woken already: what comes meanwhile waits its turn
            or not self._taker(topic, payload, retained)
        ):
            self.put((topic, payload, retained))

    def put(self, item: Delivery | None) -> None:
        """Queued, past the taker (`None`: the link is lost for good)."""
        self.queue.append(item)
        self._wake()

    @property
    def waiting(self) -> bool:
        """A `wait` is under way and nothing has woken it yet."""
        return self._waiter is not None and not self._waiter.done()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def interrupt(self) -> None:
        """End the `wait` under way (or else the next) as if its time had run out, before
        any delivery."""
        self._interrupted = True
        self._wake()

    @contextlib.contextmanager
    def taking(self, taker: Taker) -> Iterator[None]:
        """While a `wait` is under way within this block, a delivery (none being queued) goes
        to `taker` at once. A taker returns False to have it queued instead."""
        self._taker = taker
        try:
            yield
        finally:
            self._taker = None

    async def wait(self, timeout: float | None) -> None:
        """Until something is queued; TimeoutError after `timeout` s or an `interrupt`. One
        caller at a time."""
        if not self.queue and not self._interrupted:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            later = self.later or loop.call_later
            timer = None if timeout is None else later(max(timeout, 0.0), self._wake)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        if self._interrupted or not self.queue:
            self._interrupted = False
            raise TimeoutError

"""Reading an aiomqtt client's messages with a timeout, without losing any.

aiomqtt's `client.messages` loses a message when a wait on it is cancelled in the loop turn
it arrives, which any `wait_for(anext(messages), t)` loop hits under load; so one task
drains the iterator for the connection's life and readers wait on a plain asyncio.Queue,
whose `get` is cancellation-safe. The timeout is `asyncio.timeout`: Python 3.11's
`wait_for` can swallow a cancellation that lands with the result, and lost Ctrl-C so.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self

import aiomqtt


class Inbox:
    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self._queue: asyncio.Queue[aiomqtt.Message | None] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._pump = asyncio.create_task(self._drain())
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)

    async def _drain(self) -> None:
        try:
            async for message in self.client.messages:
                self._queue.put_nowait(message)
        finally:
            self._queue.put_nowait(None)  # wakes a reader, who then sees why we stopped

    async def get(self, timeout: float | None = None) -> aiomqtt.Message:
        """The next message; TimeoutError after `timeout` s; MqttError if the connection died."""
        async with asyncio.timeout(timeout):
            message = await self._queue.get()
        if message is None:
            assert self._pump is not None
            error = self._pump.exception() if self._pump.done() else None
            raise aiomqtt.MqttError(f"connection to the broker ended: {error}")
        return message

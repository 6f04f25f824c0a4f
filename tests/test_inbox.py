"""privnet.agent.inbox: reading with timeouts loses no message and never swallows a cancellation.

The client here is a stand-in for aiomqtt's: an async iterator over a queue, so the loop
turns can be stepped exactly. The real broker path is covered by test_net and test_broker.
"""

import asyncio
from collections.abc import AsyncIterator

import aiomqtt
import pytest

from privnet.agent.inbox import Inbox


class FeedClient:
    """Just what Inbox reads of an aiomqtt.Client: `messages`, an async iterator."""

    def __init__(self) -> None:
        self.feed: asyncio.Queue[str | None] = asyncio.Queue()

    @property
    def messages(self) -> AsyncIterator[str]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[str]:
        while (item := await self.feed.get()) is not None:
            yield item


async def turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.mark.parametrize("delay", range(8))
async def test_cancel_is_never_swallowed_when_a_message_lands_in_the_same_turn(
    delay: int,
) -> None:
    """Ctrl-C cancels the orchestrator's task once. asyncio.wait_for in Python 3.11 returns
    the inner result instead of raising when both land together, and the run went on."""
    client = FeedClient()
    async with Inbox(client) as inbox:  # type: ignore[arg-type]
        reader = asyncio.create_task(inbox.get(30.0))
        await turns(3)
        client.feed.put_nowait("model")
        await turns(delay)
        cancelled = reader.cancel()
        if cancelled:
            with pytest.raises(asyncio.CancelledError):
                await reader
            assert await inbox.get(1.0) == "model", "a cancelled read must not eat the message"
        else:
            assert reader.result() == "model"


async def test_messages_come_in_order_and_timeouts_lose_none() -> None:
    client = FeedClient()
    async with Inbox(client) as inbox:  # type: ignore[arg-type]
        with pytest.raises(TimeoutError):
            await inbox.get(0.01)
        for n in range(100):
            client.feed.put_nowait(str(n))
        got = [await inbox.get(1.0) for _ in range(100)]
    assert got == [str(n) for n in range(100)]


async def test_a_closed_connection_is_an_mqtt_error_not_a_hang() -> None:
    client = FeedClient()
    async with Inbox(client) as inbox:  # type: ignore[arg-type]
        client.feed.put_nowait(None)  # the iterator ends, as when the broker goes away
        with pytest.raises(aiomqtt.MqttError, match="connection to the broker ended"):
            await inbox.get(1.0)

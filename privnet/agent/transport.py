"""The MQTT connection every privnet party makes (`Connection`): subscribe, publish, and
`get` what arrives, across broker restarts. It drives gmqtt through
`privnet.agent.gmqtt_adapter`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Self

from privnet.agent.access import BrokerAddress, ClientAccess
from privnet.agent.gmqtt_adapter import ConnectError, GmqttClient, Inflight, refused_for_good
from privnet.agent.mailbox import Mailbox, Taker
from privnet.agent.protocol import QOS

log = logging.getLogger("privnet.agent")


class MqttError(Exception):
    """The broker refused us, or the connection to it ended for good (the reconnect budget
    was spent, or the broker refused the credentials)."""


class CouldNotConnect(MqttError):
    """The first connection was never made: nothing there, no answer, or no MQTT."""


RECONNECT_FIRST = 0.1  # s: the first pause after a loss, doubled per failed attempt ...
RECONNECT_MAX = 2.0  # ... up to this
RECONNECT_BUDGET = 60.0  # s of outage before a Connection gives up (`give_up`)
ATTEMPT_TIMEOUT = 5.0  # s for one reconnect attempt (TCP, TLS, CONNACK)
OUTAGE_BUFFER = 1000  # QoS-1 publishes kept while disconnected, sent after the reconnect


@dataclass
class Outages:
    """What losing the broker cost one connection (see `Connection`)."""

    losses: int = 0  # connections lost
    reconnects: int = 0  # ... and made again
    attempts: int = 0  # connection attempts that failed
    seconds: float = 0.0  # time without a connection (ended outages)
    dropped: int = 0  # publishes not sent: QoS 0 while disconnected, or QoS 1 beyond the buffer
    buffered: int = 0  # QoS-1 publishes made while disconnected and sent after the reconnect
    resent: int = 0  # QoS-1 publishes unacknowledged at a loss, sent again after it


class _Lost(MqttError):
    """The connection dropped before an acknowledgement: wait for the reconnect."""


class Connection:
    """One MQTT 3.1.1 client on gmqtt: subscribe, publish, and `get` what arrives, across
    broker restarts.

    gmqtt speaks MQTT straight from an asyncio protocol (aiomqtt drives paho's blocking loop,
    at several times the CPU a message). A lost connection is made again, backing off with
    jitter for `give_up` seconds (then MqttError), each held subscription renewed first; a
    refusal of our credentials ends it at once. While disconnected, QoS-0 publishes (the peer
    plane) are dropped and counted, as the broker would have for an absent subscriber, and the
    state machines redo a stalled round; QoS-1 ones (control, telemetry) wait, up to
    OUTAGE_BUFFER, and go after the reconnect with those left unacknowledged. `get` waits
    through an outage, so a machine's ticks go on; `outages` counts it all."""

    def __init__(
        self,
        broker: BrokerAddress,
        access: ClientAccess,
        keepalive: int = 30,
        give_up: float = RECONNECT_BUDGET,
        first_wait: float = 0.0,
        connect_timeout: float | None = None,
    ) -> None:
        self.broker, self.access, self.keepalive, self.give_up = broker, access, keepalive, give_up
        self.first_wait = first_wait
        self.connect_timeout = give_up if connect_timeout is None else connect_timeout
        self._first: asyncio.Future[str] | None = None  # the first connect, closed: why
        self._inflight = Inflight()
        self._client = GmqttClient(self._deliver, self._inflight)
        self._client.on_message = self._on_message
        self._client.on_disconnect = self._on_disconnect
        self._client.on_subscribe = self._on_ack
        self._client.on_unsubscribe = self._on_ack
        if access.username is not None:
            self._client.set_auth_credentials(access.username, access.password)
        self._box = Mailbox()  # deliveries for `get`, or its taker
        self._acks: dict[int, asyncio.Future[None]] = {}  # SUBACKs and UNSUBACKs by mid
        self._lost: str | None = None  # why the connection ended for good
        self._closing = False
        self._up = False  # connected, and every subscription made again
        self._settled = asyncio.Event()  # set while up, and once given up
        self._reconnecting: asyncio.Task[None] | None = None
        self._held: list[tuple[str, bytes, int]] = []  # QoS-1 publishes made while down
        self.outages = Outages()
        self.generation = 0  # successful reconnects so far: a change means frames were lost
        self.clock = time.monotonic  # what the pump tells the machine (`driver.Link.clock`)

    def _ssl(self) -> Any:
        if not self.access.tls:
            return False
        import ssl as ssl_module

        return ssl_module.create_default_context(cafile=self.access.ca_file)

    async def _connect(self) -> None:
        await self._client.connect311(
            self.broker.host, self.broker.port, ssl=self._ssl(), keepalive=self.keepalive
        )

    async def __aenter__(self) -> Self:
        """Connect. For up to `first_wait` s the broker may not be there yet (a host's broker
        that comes up after its agents): attempts back off as reconnects do. Past it, a
        server that refuses, closes, answers in another protocol or says nothing within
        `connect_timeout` ends it with MqttError saying which (nothing was lost, so nothing
        is made again)."""
        end, pauses = time.monotonic() + self.first_wait, _backoff()
        while True:
            try:
                await self._connect_first()
                break
            except MqttError as exc:  # CouldNotConnect: nobody answered; else a refusal
                pause = next(pauses)
                if not isinstance(exc, CouldNotConnect) or time.monotonic() + pause > end:
                    await self._close()
                    raise
                if not self.outages.attempts:
                    log.warning("no broker at %s yet (%s); trying again", self.broker, exc)
                self.outages.attempts += 1
                with contextlib.suppress(Exception):  # what this attempt left half made
                    await self._client.abort()
            await asyncio.sleep(pause)
        self._up = True
        self._settled.set()
        return self

    async def _connect_first(self) -> None:
        """One first attempt within `connect_timeout`: CouldNotConnect when no broker
        answered, MqttError when one refused us for good."""
        loop = asyncio.get_running_loop()
        self._first = closed = loop.create_future()
        attempt = loop.create_task(self._connect())
        try:
            done, _ = await asyncio.wait(
                (attempt, closed), timeout=self.connect_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if attempt in done:
                attempt.result()
            elif closed.done():
                raise ConnectionError(closed.result())
            else:
                raise TimeoutError(f"no answer to CONNECT in {self.connect_timeout:.0f} s")
        except (OSError, ConnectError) as exc:
            attempt.cancel()
            with contextlib.suppress(BaseException):
                await attempt
            if refused_for_good(exc):  # a broker, saying no
                raise MqttError(f"the broker at {self.broker} refused us: {exc}") from None
            raise CouldNotConnect(
                f"could not connect to the broker at {self.broker}: {exc}"
            ) from None
        finally:
            self._first = None

    async def __aexit__(self, *exc_info: object) -> None:
        await self._close()

    async def _close(self) -> None:
        self._closing = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
            with contextlib.suppress(BaseException):
                await self._reconnecting
        with contextlib.suppress(Exception):
            await self._client.disconnect()

    def _on_message(self, _c: Any, topic: str, payload: bytes, _qos: int, props: Any) -> int:
        self._deliver(topic, payload, bool(props.get("retain")))
        return 0  # PUBACK: success

    def _deliver(self, topic: str, payload: bytes, retained: bool) -> None:
        self._box.deliver(topic, payload, retained)

    def interrupt(self) -> None:
        """End the `get` under way (or else the next) as if its time had run out, before
        any delivery."""
        self._box.interrupt()

    def taking(self, taker: Taker) -> contextlib.AbstractContextManager[None]:
        """While a `get` waits within this block, a delivery (none being queued) goes to
        `taker` at once, from the transport's callback: no task wakes for it. A taker
        returns False to have it queued instead, and returns the next `get`."""
        return self._box.taking(taker)

    def _on_disconnect(self, _c: Any, _packet: Any, exc: BaseException | None = None) -> None:
        for waiter in self._acks.values():
            if not waiter.done():
                waiter.set_exception(_Lost("connection lost before an acknowledgement"))
        self._acks.clear()
        if self._first is not None:  # the first connect: it failed, nothing was lost
            if not self._first.done():
                self._first.set_result(self._refusal(exc))
            return
        if self._closing or self._lost is not None:
            return
        if self._reconnecting is not None and not self._reconnecting.done():
            return  # a failed attempt of the reconnect under way: it retries by itself
        self._up = False
        self._settled.clear()
        self.outages.losses += 1
        log.warning("lost the broker at %s (%s); reconnecting", self.broker, exc or "closed")
        self._reconnecting = asyncio.get_running_loop().create_task(self._reconnect())

    def _refusal(self, exc: BaseException | None) -> str:
        """Why the server closed a connection it never acknowledged."""
        heard = None if self._client.protocol is None else self._client.protocol.not_mqtt
        if heard is not None:
            return f"the server there does not speak MQTT (it answered {heard!r})"
        return f"it closed the connection before answering ({exc or 'no reason given'})"

    def _on_ack(self, _c: Any, mid: int, *_rest: Any) -> None:
        waiter = self._acks.pop(mid, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _reconnect(self) -> None:
        """Connect again with backoff, resubscribe, send what waited; or give up."""
        began = time.monotonic()
        end, pauses, attempts, why = began + self.give_up, _backoff(), 0, "none made"
        while (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(next(pauses), left))
            attempts += 1
            try:
                async with asyncio.timeout(min(ATTEMPT_TIMEOUT, max(end - time.monotonic(), 0.5))):
                    await self._connect()
                    await self._resubscribe()
            except ConnectError as exc:
                if refused_for_good(exc):
                    self._give_up(began, f"the broker at {self.broker} refused us: {exc}")
                    return
                why = str(exc)
            except (OSError, TimeoutError, MqttError) as exc:
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                self._resume(began, attempts)
                return
            self.outages.attempts += 1
            with contextlib.suppress(Exception):  # what this attempt left half made
                await self._client.abort()
        self._give_up(
            began,
            f"connection to the broker at {self.broker} lost, and not made again in "
            f"{self.give_up:.0f} s ({attempts} attempts; the last: {why})",
        )

    async def _resubscribe(self) -> None:
        """Every subscription gmqtt holds, at its QoS: a clean session starts with none.

        A loss from here on fails the waiters (`_on_disconnect`); one since the CONNACK (a
        client of our user displacing us, say) must fail the attempt as promptly."""
        if not self._client.is_connected:
            raise _Lost("connection lost right after the CONNACK")
        waits = []
        for sub in list(self._client.subscriptions):
            waiter = asyncio.get_running_loop().create_future()
            self._acks[self._client.resubscribe(sub)] = waiter
            waits.append(waiter)
        await asyncio.gather(*waits)

    def _resume(self, began: float, attempts: int) -> None:
        took = time.monotonic() - began
        o = self.outages
        o.reconnects += 1
        o.seconds += took
        self.generation += 1
        self._up = True
        self._settled.set()
        orphans, self._inflight.orphans = self._inflight.orphans, []
        held, self._held = self._held, []
        for topic, payload, qos in orphans + held:
            self.publish(topic, payload, qos)
        o.resent += len(orphans)
        o.buffered += len(held)
        log.warning(
            "broker at %s back after %.2f s (%d attempts): %d subscriptions made again, "
            "%d unacknowledged and %d held QoS-1 publishes sent; %d publishes dropped so far",
            self.broker,
            took,
            attempts,
            len(self._client.subscriptions),
            len(orphans),
            len(held),
            o.dropped,
        )

    def _give_up(self, began: float, why: str) -> None:
        self._lost = why
        self.outages.seconds += time.monotonic() - began
        self._settled.set()
        self._box.put(None)
        log.error("%s", why)

    async def _wait_up(self) -> None:
        """Until connected (at once if so); MqttError once the budget is spent."""
        while True:
            if self._lost is not None:
                raise MqttError(self._lost)
            if self._up:
                return
            await self._settled.wait()

    async def _acked(self, send: Callable[[], int], timeout: float) -> None:
        """Send a SUBSCRIBE or UNSUBSCRIBE and wait for its acknowledgement; if the connection
        drops first, for the reconnect (which makes gmqtt's list of subscriptions true)."""
        await self._wait_up()
        waiter = asyncio.get_running_loop().create_future()
        self._acks[send()] = waiter
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except _Lost:
            await self._wait_up()
        except TimeoutError:
            raise MqttError(
                f"the broker at {self.broker} did not acknowledge in {timeout:.0f} s"
            ) from None

    async def subscribe(self, topic: str, qos: int = QOS, timeout: float = 10.0) -> None:
        """Subscribe and wait for the SUBACK (through an outage: for the reconnect)."""
        await self._acked(lambda: int(self._client.subscribe(topic, qos=qos)), timeout)

    async def unsubscribe(self, topic: str, timeout: float = 10.0) -> None:
        """Unsubscribe and wait for the UNSUBACK (through an outage: for the reconnect)."""
        await self._acked(lambda: int(self._client.unsubscribe(topic)), timeout)

    @property
    def queued(self) -> int:
        """Deliveries waiting for a `get`."""
        return len(self._box.queue)

    @property
    def up(self) -> bool:
        """Connected, with every subscription made again: deliveries can flow."""
        return self._up and bool(self._client.is_connected)

    def publish(self, topic: str, payload: bytes, qos: int = QOS) -> None:
        """Queue one PUBLISH on the socket (QoS 1: kept until its PUBACK, and across a
        reconnect). While disconnected QoS 0 is dropped and QoS 1 held (see the class)."""
        if self._up and self._client.is_connected:
            if not qos and self._client.protocol is not None:
                self._client.protocol.publish_qos0(topic, payload)
                return
            self._inflight.next = (topic, payload, qos) if qos else None
            try:
                self._client.publish(topic, payload, qos=qos)
            finally:
                self._inflight.next = None
        elif self._lost is not None:
            raise MqttError(self._lost)
        elif qos and len(self._held) < OUTAGE_BUFFER:
            self._held.append((topic, payload, qos))
        else:
            self.outages.dropped += 1

    def corked(self) -> contextlib.AbstractContextManager[None]:
        """Publishes made within it leave in one socket write, when it ends."""
        return self._client.corked()

    async def get(self, timeout: float | None = None) -> tuple[str, bytes, bool]:
        """The next (topic, payload, retained); TimeoutError after `timeout` s (or an
        `interrupt`); MqttError once the connection is lost for good (an outage is waited
        through). One caller at a time."""
        await self._box.wait(timeout)
        item = self._box.queue[0]
        if item is None:  # left in place: every later get sees it too
            raise MqttError(self._lost or "connection to the broker ended")
        self._box.queue.popleft()
        return item


def client(
    broker: BrokerAddress,
    access: ClientAccess,
    give_up: float = RECONNECT_BUDGET,
    *,
    first_wait: float = 0.0,
    connect_timeout: float | None = None,
) -> Connection:
    """A connection as every privnet party makes it (use with `async with`)."""
    return Connection(
        broker, access, give_up=give_up, first_wait=first_wait, connect_timeout=connect_timeout
    )


def _backoff() -> Iterator[float]:
    """Pauses between connection attempts: RECONNECT_FIRST doubling to RECONNECT_MAX, each
    jittered, so a restarted broker is not hit by every client at once."""
    pause = RECONNECT_FIRST
    while True:
        yield pause * random.uniform(0.5, 1.0)
        pause = min(2 * pause, RECONNECT_MAX)

"""`privnet run --faults flap:3@40`: an insider holding agent 3's broker credentials (and
nothing else: no launch token, no identity key) connects again and again for the rest of
the run, or for `+SECONDSs`.

Both brokers make a client's id its username, so each of its connections takes over agent
3's, and agent 3's reconnect takes it back: agent 3 flaps about once a second, as it did
for a credential thief on mosquitto (issue 30). While connected it reads agent 3's inbox
(sealed frames it cannot open) and publishes a forged frame as agent 3 (which the
agents drop). It runs as its own process, `python -m privnet.orchestrator.insider`,
with the broker's address and agent 3's credentials in its environment, never on a
command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from types import FrameType

from privnet.agent import topics
from privnet.agent.access import BrokerAddress, ClientAccess

ENV_BROKER = "PRIVNET_INSIDER_BROKER"  # HOST:PORT
ENV_RUN = "PRIVNET_INSIDER_RUN"
ENV_AGENT = "PRIVNET_INSIDER_AGENT"
HOLD = 0.5  # s each connection is held, unless agent 3's reconnect takes it back first
PAUSE = 0.4  # s between connections


def environment(broker: str, run: str, agent: int, access: ClientAccess) -> dict[str, str]:
    """What the insider process is started with (its secrets stay off the command line)."""
    return {ENV_BROKER: broker, ENV_RUN: run, ENV_AGENT: str(agent), **access.to_env()}


MADE = [0]  # connections made so far (said when it stops)


async def flap(address: BrokerAddress, access: ClientAccess, run: str, agent: int) -> None:
    """Connect as `agent` in a loop, forever (counted in MADE)."""
    import aiomqtt

    # a connection taken back leaves futures aiomqtt never reads: nothing to report
    asyncio.get_running_loop().set_exception_handler(lambda _loop, _context: None)
    while True:
        with contextlib.suppress(aiomqtt.MqttError, OSError):
            async with aiomqtt.Client(
                address.host, address.port, clean_session=True, **access.client_kwargs()
            ) as client:
                MADE[0] += 1
                await client.subscribe(topics.inbox_filter(run, agent))
                forged = topics.peer_topic(run, (agent + 1) % 2**16, agent)
                await client.publish(forged, b"\x93forged by an insider", qos=0)
                await asyncio.sleep(HOLD)
        await asyncio.sleep(PAUSE)


def main() -> int:
    env = os.environ
    try:
        address = BrokerAddress.parse(env[ENV_BROKER])
        run, agent = env[ENV_RUN], int(env[ENV_AGENT])
    except (KeyError, ValueError) as exc:
        print(f"insider: set {ENV_BROKER}, {ENV_RUN} and {ENV_AGENT} ({exc})", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    began = time.monotonic()
    print(f"insider: connecting as agent {agent} to {address} in a loop", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(flap(address, ClientAccess.from_env(), run, agent))
    took = time.monotonic() - began
    print(f"insider: stopped after {took:.1f} s, {MADE[0]} connections made", flush=True)
    return 0


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())

"""An amqtt broker in its own process, for machines without mosquitto.

`python -m broker.embedded --port N` serves plain MQTT on 127.0.0.1:N, anonymous clients
allowed, no $SYS tree, until SIGTERM or SIGINT, then shuts down cleanly and exits 0.
It runs in its own process so a busy broker never competes with the orchestrator's loop.
"""

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

from amqtt.broker import Broker
from amqtt.errors import BrokerError


def amqtt_config(host: str, port: int) -> dict[str, Any]:
    """amqtt 0.12 configuration: one TCP listener and the anonymous-auth plugin only."""
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


async def serve(host: str, port: int) -> None:
    """Run the broker until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    broker = Broker(amqtt_config(host, port))
    await broker.start()
    try:
        await stop.wait()
    finally:
        await broker.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m broker.embedded", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65_536:
        parser.error(f"--port {args.port} is not a TCP port (1-65535)")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        asyncio.run(serve(args.host, args.port))
    except BrokerError as exc:
        sys.exit(f"embedded broker on {args.host}:{args.port} failed: {exc}")


if __name__ == "__main__":
    main()

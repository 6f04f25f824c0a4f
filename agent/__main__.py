"""`python -m agent --broker HOST:PORT [--run NAME] [--id N]`: one privnet agent process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from agent.mqtt import BrokerAddress, run_agent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent", description=__doc__)
    parser.add_argument(
        "--broker",
        default=os.environ.get("PRIVNET_BROKER", "127.0.0.1:1883"),
        help="HOST:PORT of the MQTT broker (env PRIVNET_BROKER)",
    )
    parser.add_argument(
        "--run",
        default=os.environ.get("PRIVNET_RUN", "default"),
        help="run name; topics live under privnet/<run>/ (env PRIVNET_RUN)",
    )
    parser.add_argument(
        "--id", type=int, default=None, help="agent id; assigned at registration when omitted"
    )
    parser.add_argument("--log-level", default=os.environ.get("PRIVNET_LOG", "WARNING"))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s agent[{args.id if args.id is not None else '?'}] "
        "%(levelname)s %(message)s",
    )
    try:
        address = BrokerAddress.parse(args.broker)
    except ValueError as exc:
        parser.error(str(exc))
    return asyncio.run(run_agent(address, args.run, args.id))


if __name__ == "__main__":
    sys.exit(main())

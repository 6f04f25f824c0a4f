"""A TCP relay (`python -m privnet.broker.relay`): every connection to `listen` is joined to a new
one to `target`, each direction's bytes forwarded in order, counted, and held `delay` seconds
where asked.

A site's bridge reaches the core through one (`privnet site`): mosquitto 2.0 sets no
TCP_NODELAY on a bridge's connection, so Nagle's algorithm and a receiver's delayed
acknowledgements stall it. The relay acknowledges what it reads at once (TCP_QUICKACK,
re-armed after every read) and writes with TCP_NODELAY. With a `delay` it is the network
lab's delay where the kernel has no netem; it delays bytes, not packets, so TCP's own
acknowledgements behind it are not delayed (netem's are).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from typing import Any

from privnet.agent.access import BrokerAddress

CHUNK = 1 << 16
QUEUED = 1024  # chunks held per direction before the sender is made to wait
QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only


class Relay:
    """Listens on `listen` (port 0: any free one; `address` says which once started)."""

    def __init__(self, listen: BrokerAddress, target: BrokerAddress, delay: float = 0.0) -> None:
        self.address, self.target, self.delay = listen, target, delay
        self.sent = 0  # bytes from the listening side to the target
        self.received = 0  # ... and back
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()
        self._sockets: set[asyncio.StreamWriter] = set()  # both ends of every connection

    async def start(self) -> None:
        server = await asyncio.start_server(self._join, self.address.host, self.address.port)
        self._server = server
        port = int(server.sockets[0].getsockname()[1])
        self.address = BrokerAddress(self.address.host, port)

    async def close(self) -> None:
        """Stop listening and cut every connection."""
        if self._server is not None:
            self._server.close()
        for writer in self._sockets:
            writer.transport.abort()
        await asyncio.gather(*self._links, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _join(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        self._sockets.add(writer)
        far_writer: asyncio.StreamWriter | None = None
        try:
            far_reader, far_writer = await asyncio.open_connection(
                self.target.host, self.target.port
            )
            self._sockets.add(far_writer)
            near = writer.get_extra_info("socket")
            await asyncio.gather(
                self._pipe(reader, far_writer, True, near),
                self._pipe(far_reader, writer, False, None),
                return_exceptions=True,
            )
        except OSError:  # nobody at the target: the client sees its connection closed
            pass
        finally:
            for end in (writer, far_writer):
                if end is not None:
                    end.close()
                    self._sockets.discard(end)
            self._links.discard(task)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        out: bool,
        ack: Any,
    ) -> None:
        """One direction (`out`: to the target): read, hold each chunk for the delay, write
        in order, count; acknowledge reads at once on `ack` (a socket, or None); at the end
        close the writer."""
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUED)

        async def take() -> None:
            with contextlib.suppress(OSError):  # a reset ends it as an EOF does
                while data := await reader.read(CHUNK):
                    if ack is not None and QUICKACK is not None:
                        ack.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
                    await held.put((loop.time() + self.delay, data))
            await held.put((loop.time() + self.delay, b""))

        taking = loop.create_task(take())
        try:
            while True:
                due, data = await held.get()
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                if not data:
                    break
                writer.write(data)
                if out:
                    self.sent += len(data)
                else:
                    self.received += len(data)
                await writer.drain()
        except OSError:  # the far side is gone: so is this direction
            pass
        finally:
            taking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await taking
            writer.close()


async def serve(listen: BrokerAddress, target: BrokerAddress, delay: float) -> None:
    """Relay until SIGTERM or SIGINT; says `listening` on stdout once it accepts."""
    relay = Relay(listen, target, delay)
    await relay.start()
    print(f"listening on {relay.address}, to {target}, {delay * 1000:g} ms each way", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await relay.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m privnet.broker.relay", description=__doc__)
    parser.add_argument("--listen", type=BrokerAddress.parse, required=True, metavar="HOST:PORT")
    parser.add_argument("--to", type=BrokerAddress.parse, required=True, metavar="HOST:PORT")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds, each direction")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.listen, args.to, args.delay))
    return 0


if __name__ == "__main__":
    sys.exit(main())

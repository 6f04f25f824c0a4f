"""The live view's HTTP side: one page, its files and its event stream, behind a token.

Every URL starts with a random token (`/<token>/`): anything else gets 403, so a page
cannot be found by guessing, on loopback or (with `--view-host`) beyond it. Only GET is
routed: the page reads the run, it has no way to change it. The stream is Server-Sent
Events: a snapshot when the page connects, then twice a second what changed (`delta`),
and `end` when the run is over. Scripts and styles are the package's own files (no CDN);
the Content-Security-Policy lets the page load nothing from anywhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import socket
import threading
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from privnet.agent.spec import ConfigError
from privnet.orchestrator.view.state import Cursor, ViewState

PERIOD = 0.5  # s between deltas on the stream
KEEPALIVE = 10.0  # s between comments on a stream with nothing new
LOG_BYTES = 64 * 1024  # read from the end of an agent's log...
LOG_LINES = 80  # ...and the last lines of it shown
START_TIMEOUT = 30.0  # s for the view's thread to listen, or to stop
STATIC = resources.files(__package__ or "privnet.orchestrator.view") / "static"
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".txt": "text/plain"}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def encode(name: str, data: Any) -> bytes:
    """One Server-Sent Event."""
    body = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return f"event: {name}\ndata: {body}\n\n".encode()


class ViewServer:
    """Serves one `ViewState` (and the agents' logs under `logs`) until `stop`."""

    def __init__(self, state: ViewState, logs: Path | None, token: str | None = None) -> None:
        self.state, self.logs = state, logs
        self.token = token or secrets.token_urlsafe(18)
        self.closing = asyncio.Event()
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        base = f"/{self.token}"
        app.router.add_get(f"{base}/", self._index)
        app.router.add_get(f"{base}/static/{{name}}", self._static)
        app.router.add_get(f"{base}/events", self._events)
        app.router.add_get(f"{base}/state", self._state)
        app.router.add_get(f"{base}/log/{{agent:\\d+}}", self._log)
        return app

    async def start(self, host: str, port: int) -> str:
        """Listen on host:port (0: any free port); the page's URL."""
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.create_server((host, port), family=family)
        except OSError as exc:
            await self._runner.cleanup()
            raise ConfigError(
                f"the view cannot listen on {host}:{port} ({exc.strerror or exc}): give "
                "another port, or 0 for any free one"
            ) from None
        await web.SockSite(self._runner, sock).start()
        bound = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{bound}/{self.token}/"

    async def stop(self) -> None:
        """Tell every page the run is over, then close."""
        self.closing.set()
        if self._runner is not None:
            await asyncio.sleep(0)  # let the streams send `end`
            await self._runner.cleanup()
            self._runner = None

    # ---- the guard ---------------------------------------------------------------------

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        given = request.path.split("/", 2)[1] if request.path.count("/") >= 2 else ""
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return web.Response(
                status=403,
                text="privnet view: wrong or missing token; open the URL the run printed\n",
            )
        response = await handler(request)
        if not response.prepared:
            response.headers.update(HEADERS)
        return response

    # ---- routes ------------------------------------------------------------------------

    async def _index(self, request: web.Request) -> web.Response:
        return self._file("index.html")

    async def _static(self, request: web.Request) -> web.Response:
        return self._file(request.match_info["name"])

    def _file(self, name: str) -> web.Response:
        kind = TYPES.get(Path(name).suffix)
        item = STATIC / name
        if kind is None or "/" in name or name.startswith(".") or not item.is_file():
            raise web.HTTPNotFound()
        return web.Response(body=item.read_bytes(), content_type=kind, charset="utf-8")

    async def _state(self, request: web.Request) -> web.Response:
        with self.state.lock:
            snapshot = self.state.snapshot(Cursor())
        body = json.dumps(snapshot, allow_nan=False)
        return web.Response(text=body, content_type="application/json")

    async def _log(self, request: web.Request) -> web.Response:
        agent = int(request.match_info["agent"])
        if self.logs is None or agent >= len(self.state.agents):
            raise web.HTTPNotFound()
        path = agent_log(self.logs, agent)
        if path is None:
            return web.Response(text=f"(no log of agent {agent} in {self.logs})\n")
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - LOG_BYTES))
            tail = fh.read().decode(errors="replace").splitlines()[-LOG_LINES:]
        return web.Response(text="\n".join(tail) + "\n")

    async def _events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={**HEADERS, "Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}
        )
        cursor, state = Cursor(), self.state
        # A page closed at any point (even while the stream is prepared) ends its stream
        # quietly: aiohttp's ClientConnectionResetError is a ConnectionResetError.
        with contextlib.suppress(ConnectionResetError, asyncio.CancelledError):
            await response.prepare(request)
            with state.lock:
                first = encode("snapshot", state.snapshot(cursor))
            await response.write(first)
            quiet = 0.0
            while not self.closing.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.closing.wait(), PERIOD)
                if cursor.version != state.version:
                    with state.lock:
                        delta = encode("delta", state.delta(cursor))
                    await response.write(delta)
                    quiet = 0.0
                elif (quiet := quiet + PERIOD) >= KEEPALIVE:
                    await response.write(b": keepalive\n\n")
                    quiet = 0.0
            await response.write(encode("end", {"stage": self.state.live.get("stage")}))
        return response


class ServerThread:
    """A `ViewServer` on its own thread and event loop: the page and its stream stay quick
    however busy the orchestrator's loop is (it only pushes into the state, under its
    lock)."""

    def __init__(self, server: ViewServer) -> None:
        self.server = server
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="privnet-view", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def start(self, host: str, port: int) -> str:
        """Listen (ConfigError: cannot); the page's URL."""
        self._thread.start()
        try:
            return asyncio.run_coroutine_threadsafe(
                self.server.start(host, port), self._loop
            ).result(START_TIMEOUT)
        except BaseException:
            self._end()
            raise

    def stop(self) -> None:
        """Tell every page the run is over, close, and end the thread."""
        if self._thread.is_alive():
            with contextlib.suppress(Exception):  # the view never fails a run
                asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(
                    START_TIMEOUT
                )
        self._end()

    def _end(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(START_TIMEOUT)
        if not self._thread.is_alive():
            self._loop.close()


def agent_log(logs: Path, agent: int) -> Path | None:
    """The log an agent writes: its own, or its process's (`--agents-per-process`)."""
    own = logs / f"agent-{agent}.log"
    if own.is_file():
        return own
    for path in logs.glob("agents-*-*.log"):
        first, last = path.stem.removeprefix("agents-").split("-", 1)
        if first.isdigit() and last.isdigit() and int(first) <= agent <= int(last):
            return path
    return None


async def serve_run(run_dir: Path, host: str, port: int) -> int:
    """`privnet view RUN_DIR`: the run's files through the page, until Ctrl-C."""
    from privnet.orchestrator.terminal import console
    from privnet.orchestrator.view.files import load_run

    server = ViewServer(load_run(run_dir), run_dir / "logs")
    url = await server.start(host, port)
    console.print(f"view of {run_dir}: {url}  (Ctrl-C stops it)", soft_wrap=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
    return 0

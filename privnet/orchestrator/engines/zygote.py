"""A zygote for local agent processes (`python -m privnet.orchestrator.engines.zygote`): one process
imports the agent's modules once, then forks a child per agent process, so a run pays those
imports once instead of once per agent.

Every child is still its own process (PID, session and process group, log, MQTT client,
identity, node) and shows in ps as `python -m privnet.agent --id N`. The zygote forks from a clean
state: no event loop, no threads. The launcher (`Zygote`) speaks to it in JSON lines over
stdin and stdout: `ready` once imported, a preload request (a module of privnet's the
run's agents import, e.g. the torch adapter: imported once, before the forks), a spawn
request (argv, environment, log) answered with the child's pid, each exit code as
`Popen.returncode` gives it. Launch secrets travel through the pipe, never on a command
line. At EOF the zygote leaves; running agents end by
themselves, as a dead orchestrator's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import importlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from privnet.orchestrator.engines import allocator

AGENT = ["-m", "privnet.agent"]  # every request's argv starts so: what the child runs


@dataclass(frozen=True)
class Spawn:
    """One agent process to fork: `python <argv>` with `env` added, output to `log`."""

    argv: list[str]
    env: dict[str, str]
    log: str
    append: bool = False


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def lines(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The complete lines in `buffer`, and what is left of it."""
    *complete, rest = buffer.split(b"\n")
    return complete, rest


# ---- the zygote process ----------------------------------------------------------------


def serve(requests: int = 0, replies: int = 1) -> None:
    """Fork a child per request line, report pids and exits, until the launcher goes."""
    importlib.import_module("privnet.agent.__main__")  # what every agent imports: once, here
    with contextlib.suppress(ImportError):  # `privnet.agent.loop.run_loop`'s loop, where installed
        importlib.import_module("uvloop")
    _check_single_threaded()
    os.write(replies, encode({"ready": True}))
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select via wake_w
    buffer = b""
    while True:
        ready, _, _ = select.select([requests, wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            _reap(replies)
        if requests in ready:
            chunk = os.read(requests, 1 << 16)
            if not chunk:
                return
            found, buffer = lines(buffer + chunk)
            for line in found:
                request = json.loads(line)
                if "preload" in request:
                    _preload(request["preload"])
                    continue
                spawn = Spawn(**request)
                ready_r, ready_w = os.pipe()
                gc.freeze()  # the children's collections leave the imported objects' pages shared
                pid = os.fork()
                if pid == 0:
                    _child(spawn, ready_w, [requests, replies, wake_r, wake_w, ready_r])
                os.close(ready_w)
                os.read(ready_r, 1)  # EOF once the child is in its own session, titled
                os.close(ready_r)
                os.write(replies, encode({"pid": pid}))


def _preload(module: str) -> None:
    """Import one of privnet's modules every agent of this run will import (the run's
    problem: the torch adapter imports torch, about 1.3 s of CPU and 180 MB an agent),
    before forking them: once here, and its pages shared by the agents until written. A
    module that fails here is left for the agent to import again and report."""
    if module.startswith("privnet."):
        with contextlib.suppress(Exception):
            importlib.import_module(module)
        _check_single_threaded()


def _check_single_threaded() -> None:
    """A fork copies only the forking thread: a lock another thread held stays held."""
    tasks = Path("/proc/self/task")
    if tasks.is_dir() and len(list(tasks.iterdir())) != 1:
        raise RuntimeError("the agent zygote has threads after its imports: it must not fork")


def _reap(replies: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        os.write(replies, encode({"exited": pid, "code": os.waitstatus_to_exitcode(status)}))


def _child(spawn: Spawn, ready: int, inherited: list[int]) -> NoReturn:
    """In the forked child: become the agent process `spawn` describes, run it, exit.
    Closing `ready` tells the zygote the child has its own session and title: from then on
    the launcher may signal its process group."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if spawn.append else os.O_TRUNC)
        log, stdin = os.open(spawn.log, flags, 0o666), os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in {log, stdin, *inherited} - {0, 1, 2}:
            os.close(fd)
        os.environ.update(spawn.env)
        set_title(spawn.argv)
        os.close(ready)
        code = _run_agent(spawn.argv[len(AGENT) :])
    finally:
        os._exit(code)


def _run_agent(argv: list[str]) -> int:
    """`python -m privnet.agent <argv>`'s exit code, its errors printed as Python prints them."""
    from privnet.agent.__main__ import main

    try:
        return main(argv)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()


def set_title(argv: list[str]) -> bool:
    """Show `python <argv>` in ps and /proc/<pid>/cmdline (written over this process's own
    argument strings, which CPython has copied; the rest padded with NULs). False when it
    does not fit, or this is not Linux: the zygote's own command line stays."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (proc(5))
        with open("/proc/self/cmdline", "rb") as fh:
            program = fh.read().split(b"\0", 1)[0]
    except (OSError, IndexError, ValueError):
        return False
    title = b"\0".join([program, *(a.encode() for a in argv)]) + b"\0"
    if len(title) > end - start:
        return False
    ctypes.memmove(start, title.ljust(end - start, b"\0"), end - start)
    return True


# ---- the launcher's side ---------------------------------------------------------------


@dataclass
class Zygote:
    """The launcher's handle on a zygote process: spawn agents, learn how they ended."""

    proc: subprocess.Popen[bytes] = field(init=False)
    codes: dict[int, int] = field(default_factory=dict, init=False)  # exited pid -> code
    gone: bool = field(default=False, init=False)  # the zygote itself ended
    ready: bool = field(default=False, init=False)  # it has imported the agent's modules
    _buffer: bytes = field(default=b"", init=False)
    _pids: list[int] = field(default_factory=list, init=False)  # answers to spawns, unread

    def __post_init__(self) -> None:
        # Set before numpy loads: OpenBLAS would start a thread pool, and forking a process
        # with threads is unsafe. An agent's vectors are far too small for BLAS threads.
        env = {"OPENBLAS_NUM_THREADS": "1", **allocator.preload(), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            # -P: not the working directory first on the path, where a user's agent.py
            # would shadow privnet's agent package.
            [sys.executable, "-P", "-m", "privnet.orchestrator.engines.zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a Ctrl-C at the terminal is the orchestrator's alone
        )
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)

    def spawn(self, spawn: Spawn) -> int:
        """Fork one agent process; its pid."""
        if spawn.argv[: len(AGENT)] != AGENT:
            raise ValueError(
                f"the zygote runs `python -m privnet.agent ...` only, not {spawn.argv}"
            )
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(encode(asdict(spawn)))
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.gone = True
        while not self._pids:
            if self.gone:
                raise RuntimeError(f"the agent zygote ended (code {self.proc.poll()})")
            self._read(None)
        return self._pids.pop(0)

    def preload(self, module: str) -> None:
        """Have the zygote import `module` (one of privnet's) before the spawns that follow."""
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # gone: the next spawn says so
            self.proc.stdin.write(encode({"preload": module}))
            self.proc.stdin.flush()

    def poll(self, pid: int) -> int | None:
        """The child's exit code, None while it runs (or nobody can tell: the zygote ended)."""
        if pid not in self.codes:
            self._read(0.0)
        return self.codes.get(pid)

    def wait(self, pid: int, timeout: float) -> int | None:
        """Its exit code once it ends, None if it still runs after `timeout` s."""
        end = time.monotonic() + timeout
        while pid not in self.codes and not self.gone and (left := end - time.monotonic()) > 0:
            self._read(left)
        return self.codes.get(pid)

    async def started(self) -> None:
        """Until the zygote has imported the agent's modules (so spawns are quick), or has
        ended; the event loop runs meanwhile (a stop signal is heard at once)."""
        assert self.proc.stdout is not None
        loop, fd = asyncio.get_running_loop(), self.proc.stdout.fileno()
        while not (self.ready or self.gone):
            readable = asyncio.Event()
            loop.add_reader(fd, readable.set)
            try:
                await readable.wait()
            finally:
                loop.remove_reader(fd)
            self._read(0.0)

    def close(self, timeout: float = 5.0) -> None:
        """Let the zygote go (the agents it forked live on), killing it after `timeout` s,
        or at once while it still imports (it has forked nothing, and would read its stdin
        only once done); safe to repeat."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        self._read(0.0)
        try:
            self.proc.wait(timeout if self.ready else 0.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def _read(self, timeout: float | None) -> None:
        """Take in what the zygote said, waiting up to `timeout` s for something."""
        assert self.proc.stdout is not None
        if self.proc.stdout.closed:
            self.gone = True
            return
        fd = self.proc.stdout.fileno()
        if not select.select([fd], [], [], timeout)[0]:
            return
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            self.gone = True
            return
        found, self._buffer = lines(self._buffer + chunk)
        for line in found:
            message = json.loads(line)
            if "pid" in message:
                self._pids.append(message["pid"])
            elif "ready" in message:
                self.ready = True
            else:
                self.codes[message["exited"]] = message["code"]


if __name__ == "__main__":
    serve()

"""The event loop every privnet process runs its shells on (agents, orchestrator, embedded
broker): uvloop where it is installed, for less CPU per message."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on uvloop where it is installed (not on Windows): the same shells,
    about a third less CPU per message on the bench's raw load."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def batch_scheduling() -> bool:
    """Ask the kernel to schedule this process as a batch job (Linux's SCHED_BATCH, which
    any user may choose): it gets its fair share of the CPU as before, but a frame that wakes
    it no longer preempts whoever runs, so it wakes less often and finds more frames at
    each wake. An agent process is throughput work: with 20 processes of 50 agents on 2
    cores, about 15 % less agent CPU a frame and 15 % more rounds/s
    (docs/tasks/benchmarks.md, issue 31); its deadlines are seconds, the delay is a
    scheduler slice. Whether it took (False where the platform has no such policy)."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or a sandbox that refuses it
        return False
    return True


async def beside(main: Awaitable[T], *background: Coroutine[Any, Any, object]) -> T:
    """`main`, with `background` work as its sibling tasks in one `asyncio.TaskGroup`: they
    are cancelled when `main` ends, however it ends, and one that fails ends `main` (no run
    waits on work that died). The error comes out as it was raised, not wrapped in an
    ExceptionGroup, when it is the only one, so callers catch it as they would main's."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(work) for work in background]
            try:
                return await main
            finally:
                for task in tasks:
                    task.cancel()
    except BaseExceptionGroup as errors:
        if len(errors.exceptions) == 1:
            raise errors.exceptions[0] from None
        raise

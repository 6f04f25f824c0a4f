"""The C allocator local agent processes run on: jemalloc where it is installed.

An agent allocates and frees model-sized arrays every step (float64 values, u4 mask rows,
reassembly buffers, sealed chunks). glibc serves them from its heap once one has been freed,
and keeps what is freed there: at a million parameters an agent's heap held 40-65 MB more
than its live arrays. jemalloc sizes its extents by class and hands freed pages back after a
decay, so the same agent holds what it uses (docs/tasks/big-models.md has the measurements,
and the CPU it costs). It is preloaded into the zygote, the agents' parent, so every agent
inherits it; `PRIVNET_ALLOCATOR` chooses: `auto` (jemalloc if installed, else glibc's),
`jemalloc` (refuse to start without it), `system` (glibc's malloc, as a plain `python` has).
"""

from __future__ import annotations

import ctypes.util
import os
from collections.abc import Mapping
from enum import StrEnum

from privnet.agent.spec import ConfigError

ENV = "PRIVNET_ALLOCATOR"
JEMALLOC = "libjemalloc.so.2"  # Debian's libjemalloc2, the name the dynamic loader finds
# Freed pages go back to the system after 1 s unused, not jemalloc's 10 s: at 1M parameters
# that kept 47 of 48 agents (3 runs) within issue 29's bound, the other 2 MB over, at ~20 %
# more agent CPU than glibc's heap (10 s: ~10 %, and up to 3 agents in 16 up to 21 MB over).
# A MALLOC_CONF of the user's wins.
DECAY = "dirty_decay_ms:1000"


class Allocator(StrEnum):
    AUTO = "auto"
    JEMALLOC = "jemalloc"
    SYSTEM = "system"


def chosen(environ: Mapping[str, str]) -> Allocator:
    """The allocator `environ` asks for (`auto` when unset); ConfigError for another word."""
    value = environ.get(ENV, Allocator.AUTO)
    try:
        return Allocator(value)
    except ValueError:
        allowed = ", ".join(a.value for a in Allocator)
        raise ConfigError(f"{ENV}={value!r}: choose one of {allowed}") from None


def installed() -> bool:
    """Whether the dynamic loader can find jemalloc (`apt-get install libjemalloc2`)."""
    return ctypes.util.find_library("jemalloc") is not None


def preload(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment for a process that should run on the allocator `environ` chooses:
    `environ` with jemalloc added to LD_PRELOAD where chosen and found (or already there)."""
    env = dict(environ)
    allocator = chosen(env)
    if allocator is Allocator.SYSTEM:
        return env
    if not installed():
        if allocator is Allocator.JEMALLOC:
            raise ConfigError(
                f"{ENV}=jemalloc but the dynamic loader finds no {JEMALLOC}: install it "
                f"(apt-get install libjemalloc2), or set {ENV}=auto or system"
            )
        return env
    present = env.get("LD_PRELOAD", "").split()
    if not any("jemalloc" in os.path.basename(p) for p in present):
        env["LD_PRELOAD"] = " ".join([JEMALLOC, *present])
    env.setdefault("MALLOC_CONF", DECAY)
    return env


def loaded(pid: int) -> bool:
    """Whether process `pid` has jemalloc mapped (Linux: its /proc maps)."""
    with open(f"/proc/{pid}/maps") as fh:
        return any("libjemalloc" in line for line in fh)

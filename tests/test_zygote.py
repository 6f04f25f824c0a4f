"""Local agent processes forked by the zygote: each its own process, session, log and
command line; exits, signals and restarts seen as `subprocess.Popen` would see them."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from conftest import need_torch

from privnet.agent.launch import AgentLaunch
from privnet.broker.launcher import Broker, launch
from privnet.orchestrator.engines import allocator
from privnet.orchestrator.engines.launch import LocalLauncher
from privnet.orchestrator.engines.lifetime import RunSecrets
from privnet.orchestrator.engines.zygote import Spawn, Zygote

pytestmark = pytest.mark.net


@pytest.fixture(scope="module")
def run_secrets() -> RunSecrets:
    return RunSecrets.generate("zygote", 4)


@pytest.fixture(scope="module")
def broker(run_secrets: RunSecrets) -> Iterator[Broker]:
    with launch("auto", credentials=run_secrets.credentials) as running:
        yield running


def launches(run_secrets: RunSecrets, broker: Broker) -> dict[int, AgentLaunch]:
    return run_secrets.launches(str(broker.address), broker.access)


def ended(launcher: LocalLauncher, count: int, timeout: float = 20.0) -> dict[int, str]:
    """Wait until `count` agents have ended; how each did."""
    end, out = time.monotonic() + timeout, dict[int, str]()
    while len(out) < count and time.monotonic() < end:
        out |= launcher.exited()
        time.sleep(0.05)
    return out


def command(pid: int) -> list[str]:
    """Its command line past the interpreter."""
    return [part for part in psutil.Process(pid).cmdline() if part][1:]


def test_each_agent_is_its_own_process(
    run_secrets: RunSecrets, broker: Broker, tmp_path: Path
) -> None:
    """Own pid, session and process group, `python -m privnet.agent --id N` in ps, no secret on its
    command line; the zygote that forked it has no threads and is not the orchestrator."""
    launcher = LocalLauncher(tmp_path)
    try:
        launcher.start(launches(run_secrets, broker))
        pids = dict(launcher.procs)
        assert len(set(pids.values())) == 4
        zygote = psutil.Process(launcher.zygote.proc.pid)
        assert zygote.num_threads() == 1
        for agent, pid in pids.items():
            proc = psutil.Process(pid)
            assert proc.ppid() == zygote.pid != os.getpid()
            assert os.getsid(pid) == os.getpgid(pid) == pid
            cmd = command(pid)
            assert cmd == ["-m", "privnet.agent", "--id", str(agent)]
            secret = run_secrets.tokens[agent].hex()
            assert secret not in " ".join(cmd) and secret not in str(proc.environ())
            assert (tmp_path / f"agent-{agent}.log").exists()
        time.sleep(0.5)  # connected and registering: nothing has ended
        assert launcher.exited() == {}
        # scheduled as batch work (`loop.batch_scheduling`), the zygote (and so every other
        # party) as usual
        assert {os.sched_getscheduler(pid) for pid in pids.values()} == {os.SCHED_BATCH}
        assert os.sched_getscheduler(zygote.pid) == os.SCHED_OTHER == os.sched_getscheduler(0)
    finally:
        launcher.stop()
    assert not any(psutil.pid_exists(pid) for pid in pids.values())
    assert launcher.zygote.proc.poll() is not None


def test_signals_exits_and_restarts(
    run_secrets: RunSecrets, broker: Broker, tmp_path: Path
) -> None:
    """SIGKILL is reported as such, a failing agent with its exit code and its last words;
    a restart is a new process appending to the same log; a group runs in one process."""
    given = launches(run_secrets, broker)
    given[1] = replace(given[1], token="00")  # refused by the agent itself: exit code 2
    launcher = LocalLauncher(tmp_path, per_process=1)
    try:
        launcher.start({p: given[p] for p in (0, 1)})
        first = launcher.procs[0]
        launcher.signal(0, signal.SIGSTOP)
        end = time.monotonic() + 5.0  # a signal is delivered when the kernel gets to it
        while psutil.Process(first).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < end, "SIGSTOP did not stop the agent"
            time.sleep(0.01)
        launcher.signal(0, signal.SIGKILL)
        how = ended(launcher, 2)
        assert how[0].startswith(f"its process (pid {first}) was killed by SIGKILL")
        assert "exited with code 2" in how[1] and "token must be 32 bytes" in how[1]
        launcher.restart([0], given)
        assert launcher.procs[0] != first
        time.sleep(0.3)
        assert launcher.exited() == {}
    finally:
        launcher.stop()
    group = LocalLauncher(tmp_path, per_process=2)
    try:
        group.start({p: given[p] for p in (2, 3)})
        (pid,) = group.procs.values()
        assert command(pid) == ["-m", "privnet.agent"]
        assert (tmp_path / "agents-2-3.log").exists()
        group.signal(3, signal.SIGTERM)
        assert ended(group, 2) == dict.fromkeys(
            (2, 3), f"its process (pid {pid}) was killed by SIGTERM"
        )
    finally:
        group.stop()


def test_the_zygote_runs_agents_only(tmp_path: Path) -> None:
    zygote = Zygote()
    try:
        with pytest.raises(ValueError, match=r"python -m privnet\.agent"):
            zygote.spawn(Spawn(["-c", "pass"], {}, str(tmp_path / "x.log")))
        pid = zygote.spawn(Spawn(["-m", "privnet.agent"], {}, str(tmp_path / "none.log")))
        assert zygote.wait(pid, 10.0) == 2  # no launch given: argparse's usage error
        assert "no launch" in (tmp_path / "none.log").read_text()
    finally:
        zygote.close()


def test_a_preloaded_module_is_imported_once_before_the_forks(tmp_path: Path) -> None:
    """The run's problem module (the torch adapter: torch) is imported by the zygote before
    it forks, so its children start with it; a module not privnet's is not loaded."""
    need_torch()
    zygote = Zygote()
    try:
        zygote.preload("privnet.agent.torchnet")
        zygote.preload("sqlite3")  # not privnet's: left alone
        pid = zygote.spawn(Spawn(["-m", "privnet.agent"], {}, str(tmp_path / "p.log")))
        assert zygote.wait(pid, 10.0) == 2  # answered after both preloads were taken
        loaded = Path(f"/proc/{zygote.proc.pid}/maps").read_text()
        assert "libtorch_cpu" in loaded and "_sqlite3" not in loaded
    finally:
        zygote.close()


@pytest.mark.parametrize("chosen", ["auto", "system"])
def test_the_agents_allocator_is_the_one_chosen(
    chosen: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """jemalloc is mapped into the zygote, and so into every agent it forks, where it is
    installed (scripts/setup installs it) unless glibc's is asked for."""
    monkeypatch.setenv(allocator.ENV, chosen)
    zygote = Zygote()
    try:
        pid = zygote.spawn(Spawn(["-m", "privnet.agent"], {}, str(tmp_path / "a.log")))
        jemalloc = allocator.loaded(zygote.proc.pid)
        assert zygote.wait(pid, 10.0) == 2
        assert jemalloc == (chosen == "auto" and allocator.installed())
    finally:
        zygote.close()

"""`privnet bench`'s accounting of a run's processes by role (the sitting itself is a
benchmark, run by hand: its numbers are in docs/tasks/benchmarks.md)."""

import subprocess
import sys

from privnet.orchestrator.bench import watch

BURN = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass"


def test_watch_charges_each_process_to_its_role() -> None:
    """A broker and an agent started by the run are charged as such, and the run's own
    process as the orchestrator, even when a child is first seen before its exec (then it
    still looks like the orchestrator)."""
    children = (
        "import subprocess, sys, time\n"
        "time.sleep(0.3)\n"
        f"procs = [subprocess.Popen([sys.executable, '-c', {BURN!r}, *role], "
        "preexec_fn=lambda: time.sleep(0.5)) for role in "
        "(['-m', 'privnet.broker' + '.embedded'], ['-m', 'privnet.' + 'agent'])]\n"  # not ours
        f"{BURN}\n"
        "for p in procs: p.wait()\n"
    )
    sample = watch(subprocess.Popen([sys.executable, "-c", children]), every=0.05)
    assert set(sample.cpu) == {"orchestrator", "broker", "agents"}
    for role in ("orchestrator", "broker", "agents"):
        assert sample.cpu[role] >= 0.3, sample.cpu
    assert sample.peak_agent_rss > 0

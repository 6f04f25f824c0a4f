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


def test_a_model_of_about_n_parameters_is_the_nearest_width() -> None:
    """`--params N` builds mlp on digits at the hidden width whose size is nearest N: one
    width more or less is further from it."""
    from privnet.orchestrator.bench import model_fields
    from privnet.orchestrator.experiment.config import ExperimentConfig
    from privnet.orchestrator.experiment.instance import Instance

    def dim(width: int) -> int:
        fields = model_fields(10, 4) | {"params": {"hidden": [width]}}
        return Instance.build(ExperimentConfig(agents=4, iters=2, **fields)).config.dim

    for target in (5_000, 100_000):
        fields = model_fields(target, 4)
        (width,) = fields["params"]["hidden"]
        near = abs(dim(width) - target)
        assert near <= abs(dim(width - 1) - target) and near <= abs(dim(width + 1) - target)
        assert fields["samples"] == 1347 // 4


def test_the_ceiling_moves_every_frame_of_a_chunked_model() -> None:
    """Raw clients on a real broker send `frames` frames a link a round and wait for all of
    their in-neighbours' before the next round: messages = rounds x links x frames."""
    from privnet.orchestrator.ceiling import ceiling

    out = {0: [1, 2], 1: [0], 2: [0]}
    rate, messages_per_s, _ = ceiling("embedded", out, rounds=6, size=2000, workers=1, frames=3)
    assert rate > 0
    assert abs(messages_per_s / rate - 4 * 3) < 1e-6


def test_watch_counts_what_the_run_spends_after_its_last_look() -> None:
    """The run's process burns its CPU and exits between two looks, and so does a child it
    waits for: the kernel's count, read before the process is reaped, still has both."""
    children = (
        "import subprocess, sys, time\n"
        "time.sleep(0.3)\n"
        f"subprocess.run([sys.executable, '-c', {BURN!r}, '-m', 'privnet.' + 'agent'])\n"
        f"{BURN}\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", children])
    sample = watch(proc, every=3.0)  # one look, at the start: it ends before the next
    assert proc.returncode == 0
    assert sample.cpu["orchestrator"] >= 0.4, sample.cpu
    assert sample.cpu["agents"] >= 0.4, sample.cpu

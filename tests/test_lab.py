"""`privnet lab`: a run across hosts that are network namespaces, over links with delay,
loss, a rate and a partition; and nothing of it left afterwards, whichever way it ends.

Needs root, ip, tc, iptables and mosquitto: skipped without them, except in CI
(PRIVNET_REQUIRE_LAB=1), where it is a failure.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import skip_unless_required
from probes import load_summary, read_metrics

from privnet.broker.launcher import has_mosquitto
from privnet.orchestrator.cli import main
from privnet.orchestrator.engines.watch import read_membership
from privnet.orchestrator.lab import netns

pytestmark = pytest.mark.net

FLAGS = ["--agents", "6", "--iters", "40", "--strategy", "atc", "--scheme", "local-ghp"]
FLAGS += ["--seed", "5"]
LINKS = ["--hosts", "2", "--delay", "10ms", "--loss", "1%", "--rate", "10mbit"]


@pytest.fixture(autouse=True)
def lab_here() -> None:
    reason = netns.missing() or (None if has_mosquitto() else "mosquitto is not installed")
    if reason is not None:
        skip_unless_required("PRIVNET_REQUIRE_LAB", reason)


def lab_inodes() -> dict[str, int]:
    """The network namespace inode of every lab namespace on this machine now."""
    return {ns: os.stat(f"/run/netns/{ns}").st_ino for ns in netns.leftovers()}


def processes_in(inodes: set[int]) -> list[int]:
    """Processes whose network namespace is one of `inodes`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.stat(entry / "ns" / "net").st_ino in inodes:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_run_across_namespaces_with_a_partition(tmp_path: Path) -> None:
    """2 hosts x 3 agents over 10 ms, 1% loss, 10 mbit links, host 2 cut off for 1 s at
    round 10: the run equals the memory engine, misses no round, every veth end carried
    bytes, each agent ran in its host's namespace, and nothing is left."""
    before = set(netns.leftovers())
    out = tmp_path / "lab"
    assert main(["lab", *LINKS, "--partition", "2@10+1s", *FLAGS, "--out", str(out)]) == 0
    assert set(netns.leftovers()) <= before
    record = json.loads((out / "lab.json").read_text())
    assert processes_in({netns_inode for netns_inode in _inodes(record)}) == []

    assert main(["simulate", "--engine", "memory", *FLAGS, "--out", str(tmp_path / "m")]) == 0
    net, memory = read_metrics(out / "metrics.csv"), read_metrics(tmp_path / "m" / "metrics.csv")
    ((centroid, average),) = memory.values()
    assert centroid.shape == (1, 40)  # every round, none missing
    np.testing.assert_allclose(net[("atc", "local-ghp")][0], centroid, rtol=1e-9)
    np.testing.assert_allclose(net[("atc", "local-ghp")][1], average, rtol=1e-9)

    assert set(record["links"]) == {"core/h1", "core/h2", "h1/core", "h2/core"}
    assert all(end["tx_bytes"] > 0 and end["rx_bytes"] > 0 for end in record["links"].values())
    assert record["agents_in_host_namespace"] == {
        "h1": {"agent_processes": 3, "agents": [0, 1, 2], "all_in_namespace": True},
        "h2": {"agent_processes": 3, "agents": [3, 4, 5], "all_in_namespace": True},
    }
    (cut,) = record["partitions"]
    assert cut["host"] == 2 and cut["at_round"] >= 10 and cut["ended"] - cut["began"] >= 1.0
    assert record["lab"]["mechanism"] == {
        "delay": "tcp proxy",
        "loss": "iptables statistic",
        "rate": "tc tbf",
    }
    assert read_membership(out / "membership.json")  # its views, whatever the cut did
    summary = load_summary(out / "summary.json")
    assert summary["lab"]["lab"]["conditions"] == {"delay": 0.01, "loss": 0.01, "rate": "10mbit"}
    assert summary["config"]["bridges"]["h1"]["sent"] > 0


def _inodes(record: dict[str, object]) -> set[int]:
    """The lab's namespaces were gone by the time lab.json was read: the inodes its
    processes were seen in stand for them."""
    processes = record["processes"]
    assert isinstance(processes, dict)
    seen = {p["pid"] for procs in processes.values() for p in procs}
    assert seen, "the lab saw no process in its namespaces"
    return {ino for pid in seen if (ino := _netns_of(pid)) is not None}


def _netns_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None  # gone, as it should be


def test_ctrl_c_and_a_failed_run_leave_nothing(tmp_path: Path) -> None:
    """Interrupted mid-run, and a run that fails at once (a flag `run --hosts` refuses):
    every namespace, and every process in them, is gone."""
    command = [
        sys.executable,
        "-m",
        "privnet.orchestrator.cli",
        "lab",
        "--hosts",
        "2",
        "--agents",
        "4",
    ]
    lab = subprocess.Popen([*command, "--iters", "100000", "--out", str(tmp_path / "c")])
    inodes: dict[str, int] = {}
    deadline = time.monotonic() + 60
    while not (tmp_path / "c" / "metrics.csv").exists() and time.monotonic() < deadline:
        inodes |= lab_inodes()
        time.sleep(0.1)
    inodes |= lab_inodes()
    assert (tmp_path / "c" / "metrics.csv").exists(), "the lab's run never got going"
    lab.send_signal(signal.SIGINT)
    assert lab.wait(60) == 130
    assert not set(inodes) & set(netns.leftovers())
    assert processes_in(set(inodes.values())) == []

    before = set(netns.leftovers())
    failed = subprocess.run([*command, "--faults", "kill:1@5", "--out", str(tmp_path / "f")])
    assert failed.returncode == 2
    assert set(netns.leftovers()) <= before


def test_without_root_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert netns.missing() == (
        "privnet lab needs root (network namespaces, veth links, tc, iptables): sudo"
    )

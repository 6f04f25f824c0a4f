"""`privnet lab`: a run across hosts on this machine, the hosts being network namespaces
joined to a core namespace by links with a WAN's conditions (`privnet.orchestrator.lab.netns`).

It writes a host map and the bundles (`privnet prepare --hosts`), then starts in each
namespace exactly what real hosts run (`privnet run --hosts` in the core's, `privnet site`
in each host's, and the bridge's proxy where the delay is one), and cuts a host's link for
its seconds once the run completes a partition's round. It adds `lab.json` (conditions,
counters, drops, partitions, processes) and a `lab` entry in summary.json. Whatever
happens, every namespace, link, rule and process it made is removed.
"""

from __future__ import annotations

import contextlib
import csv
import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from privnet.agent.spec import ConfigError
from privnet.broker.launcher import has_mosquitto
from privnet.orchestrator.lab.netns import (
    CORE_ADDRESS,
    Conditions,
    Lab,
    Partition,
    leftovers,
    missing,
)
from privnet.orchestrator.sites import Hosts, prepare_hosts
from privnet.orchestrator.terminal import console

MQTT_PORT = 1883  # the core broker's, in the core namespace
PROXY = "127.0.0.1:1884"  # a host's delay proxy, in its namespace
SITES_GRACE = 30.0  # s for the sites to end after the orchestrator
FAILED_GRACE = 2.0  # ... after an orchestrator that failed
TICK = 0.05  # s between looks at the run's progress
PYTHON = [sys.executable, "-m"]


@dataclass
class Progress:
    """The rounds the run has completed, read from its metrics.csv as it grows."""

    path: Path
    round: int = 0
    session: str = ""
    _at: int = 0
    _rest: str = ""

    def update(self) -> int:
        with contextlib.suppress(FileNotFoundError), self.path.open() as fh:
            fh.seek(self._at)
            text = self._rest + fh.read()
            self._at = fh.tell()
            *lines, self._rest = text.split("\n")
            for row in csv.reader(lines):
                if row and row[0] != "strategy":
                    self.session, self.round = "/".join(row[:3]), int(row[3])
        return self.round


@dataclass
class Cut:
    """A partition as it happened."""

    partition: Partition
    at_round: int = 0
    session: str = ""
    began: float = 0.0
    ended: float = 0.0


@dataclass
class Started:
    """The processes a lab started (each in its namespace), by name."""

    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: list[IO[bytes]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], log: Path | None) -> subprocess.Popen[bytes]:
        out = None
        if log is not None:
            out = log.open("wb")
            self.logs.append(out)
        self.procs[name] = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT if out else None, start_new_session=True
        )
        return self.procs[name]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        for log in [*self.logs, *(p.stdout for p in self.procs.values() if p.stdout)]:
            log.close()


def run_lab(
    hosts: int,
    conditions: Conditions,
    partitions: list[Partition],
    agents: int,
    out: Path,
    forward: list[str],
    *,
    tls: bool = False,
    per_process: int = 1,
) -> int:
    """Build the lab, run the experiment across it (`forward`: `privnet run` flags), record
    it, remove everything; the run's exit code."""
    reason = missing() or (None if has_mosquitto() else "privnet lab needs mosquitto")
    if reason is not None:
        raise ConfigError(reason)
    if not 1 <= hosts <= 250:
        raise ConfigError(f"--hosts {hosts}: give 1 to 250 hosts")
    if agents < hosts:
        raise ConfigError(f"{agents} agents cannot fill {hosts} hosts: give --agents >= {hosts}")
    lab_dir = out / "lab"
    lab_dir.mkdir(parents=True, exist_ok=True)
    layout = _host_map(lab_dir / "hosts.toml", hosts, agents)
    started = Started()
    cuts = [Cut(p) for p in partitions]
    record: dict[str, Any] = {"hosts": layout.hosts, "partitions": cuts}
    with Lab(hosts, conditions) as lab:
        console.print(f"lab {lab.id}: {hosts} hosts, {agents} agents; {conditions.describe()}")
        try:
            record |= _run(lab, layout, started, cuts, out, forward, tls, per_process)
        except KeyboardInterrupt:
            orchestrator = started.procs.get("orchestrator")
            if orchestrator is not None and orchestrator.poll() is None:
                orchestrator.send_signal(signal.SIGINT)  # it tells the agents, then stops
                with contextlib.suppress(subprocess.TimeoutExpired):
                    orchestrator.wait(10)
            raise
        finally:
            started.close()
            record["lab"] = lab.to_json()
    if left := [ns for ns in leftovers() if lab.id in ns]:
        raise RuntimeError(f"the lab could not remove namespaces {left}")
    _write(out, record)
    return int(record["exit_codes"]["orchestrator"])


def _host_map(path: Path, hosts: int, agents: int) -> Hosts:
    """Agents split evenly over hosts h1..hN (the first ones get one more)."""
    share, extra = divmod(agents, hosts)
    counts = {f"h{i}": share + (i <= extra) for i in range(1, hosts + 1)}
    lines = [f'core = "{CORE_ADDRESS}:{MQTT_PORT}"']
    lines += [f"[hosts.{name}]\nagents = {count}" for name, count in counts.items()]
    path.write_text("\n".join(lines) + "\n")
    return Hosts.load(path)


def _run(
    lab: Lab,
    layout: Hosts,
    started: Started,
    cuts: list[Cut],
    out: Path,
    forward: list[str],
    tls: bool,
    per_process: int,
) -> dict[str, Any]:
    lab_dir = out / "lab"
    bundles = lab_dir / "bundles"
    prepare_hosts(bundles, layout, f"lab-{lab.id}", () if tls else None)
    if lab.proxied:
        for i in range(1, lab.hosts + 1):
            _proxy(lab, i, started)
    run = ["run", "--hosts", str(lab_dir / "hosts.toml")]
    run += ["--prepared", str(bundles / "core" / "run.json"), *forward, "--out", str(out)]
    orchestrator = started.start("orchestrator", _in(lab.core, run), None)
    for i in range(1, lab.hosts + 1):
        host = f"h{i}"
        site = ["site", str(bundles / host), "--out", str(lab_dir / "sites" / host)]
        site += ["--agents-per-process", str(per_process)]
        site += ["--via", PROXY] if lab.proxied else []
        started.start(host, _in(lab.host(i), site), lab_dir / f"site-{host}.log")
    processes = _watch(lab, orchestrator, cuts, Progress(out / "metrics.csv"))
    codes = {"orchestrator": orchestrator.returncode}
    # after a run that completed, the sites end by themselves; after one that failed, their
    # agents may never have heard of it
    grace = SITES_GRACE if orchestrator.returncode == 0 else FAILED_GRACE
    end = time.monotonic() + grace
    for i in range(1, lab.hosts + 1):
        try:
            codes[f"h{i}"] = started.procs[f"h{i}"].wait(max(end - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            codes[f"h{i}"] = None
    return {
        "exit_codes": codes,
        "links": lab.links(),
        "loss_dropped_packets": lab.lost() if lab.conditions.loss and not lab.netem else {},
        "processes": processes,
    }


def _in(ns: str, command: list[str]) -> list[str]:
    """`privnet <command>` in namespace `ns` (this interpreter, this checkout)."""
    return ["ip", "netns", "exec", ns, *PYTHON, "privnet.orchestrator.cli", *command]


def _proxy(lab: Lab, i: int, started: Started) -> None:
    """Host i's delay proxy, to the core broker; returns once it listens."""
    argv = ["ip", "netns", "exec", lab.host(i), *PYTHON, "privnet.broker.relay"]
    argv += ["--listen", PROXY, "--to", f"{CORE_ADDRESS}:{MQTT_PORT}"]
    argv += ["--delay", repr(lab.conditions.delay)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
    started.procs[f"proxy-h{i}"] = proc
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(b"listening"):
        raise RuntimeError(f"the delay proxy of host h{i} did not start (exit {proc.wait()})")


def _watch(
    lab: Lab, orchestrator: subprocess.Popen[bytes], cuts: list[Cut], progress: Progress
) -> dict[str, Any]:
    """Until the orchestrator ends: cut and heal links at their rounds, and once the first
    round is done, look at which processes run in which namespace."""
    processes: dict[str, Any] = {}
    waiting = sorted(cuts, key=lambda c: c.partition.round)
    cut: list[Cut] = []
    t0 = time.monotonic()
    while orchestrator.poll() is None:
        now = time.monotonic() - t0
        done = progress.update()
        if done and not processes:
            processes = lab.processes()
        while waiting and done >= waiting[0].partition.round:
            c = waiting.pop(0)
            c.at_round, c.session, c.began = done, progress.session, now
            lab.partition(c.partition.host, cut=True)
            console.print(f"[yellow]lab:[/yellow] host h{c.partition.host} cut off at round {done}")
            cut.append(c)
        for c in [c for c in cut if now >= c.began + c.partition.seconds]:
            lab.partition(c.partition.host, cut=False)
            c.ended = now
            cut.remove(c)
            console.print(f"[yellow]lab:[/yellow] host h{c.partition.host} back at {now:.1f} s")
        time.sleep(TICK)
    for c in cut:  # the run ended first
        lab.partition(c.partition.host, cut=False)
        c.ended = time.monotonic() - t0
    return processes


def _write(out: Path, record: dict[str, Any]) -> None:
    """lab.json, and `lab` in summary.json (where the run wrote one)."""
    record["partitions"] = [
        {**asdict(c.partition), **{k: v for k, v in asdict(c).items() if k != "partition"}}
        for c in record["partitions"]
    ]
    record["agents_in_host_namespace"] = _agents_placed(record)
    # every byte crossing a link leaves one of its ends
    record["veth_bytes"] = sum(v["tx_bytes"] for v in record.get("links", {}).values())
    summary_path = out / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        rounds = sum(r["iters"] * r["repeats"] for r in summary["results"])
        record["rounds"] = rounds
        record["veth_bytes_per_round"] = record["veth_bytes"] / max(rounds, 1)
        summary["lab"] = {
            k: record[k]
            for k in ("lab", "hosts", "partitions", "veth_bytes", "veth_bytes_per_round")
        }
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    (out / "lab.json").write_text(json.dumps(record, indent=2) + "\n")


def _agents_placed(record: dict[str, Any]) -> dict[str, Any]:
    """Per host: the agent processes seen in its namespace, and whether each was in it."""
    placed = {}
    for host, procs in record.get("processes", {}).items():
        if host == "core":
            continue
        agents = [p for p in procs if " -m privnet.agent" in p["cmd"]]
        ids = [int(m.group(1)) for p in agents if (m := re.search(r"--id (\d+)", p["cmd"]))]
        placed[host] = {
            "agent_processes": len(agents),
            "agents": sorted(ids),
            "all_in_namespace": bool(agents) and all(p["in_namespace"] for p in agents),
        }
    return placed


def strip_flags(forward: list[str], flags: dict[str, bool]) -> list[str]:
    """`forward` without these flags (name -> takes a value), in either spelling."""
    kept, skip = [], False
    for arg in forward:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in flags:
            skip = flags[name] and "=" not in arg
            continue
        kept.append(arg)
    return kept

"""Hosts as Linux network namespaces: a core namespace joined to each host's by a veth link,
with a WAN's conditions on every link, and partitions (`privnet lab`).

The core answers on 10.77.0.1 (its loopback: the same address from every host); link i is
10.77.i.0/24, the core's end at .1, the host's at .2. Delay, loss and rate apply to both
directions of a link with netem where the kernel has it, else by a TCP proxy in each host
(delay), iptables' random DROP (loss) and tc tbf (rate); a partition is an iptables DROP of
a host's link for its time. Everything a lab makes lives in its namespaces, so `close`
ending their processes and removing them removes the rest.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from privnet.agent.spec import ConfigError

PREFIX = "privnet-lab-"  # every lab namespace's name starts so
CORE_ADDRESS = "10.77.0.1"
CORE_LINK = "core"  # a host's end of its link
TOOLS = ("ip", "tc", "iptables")
STOP_GRACE = 3.0  # s between SIGTERM and SIGKILL for what is left in a namespace
_DELAY = re.compile(r"(\d+(?:\.\d+)?)(ms|s)?")
_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)")
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}  # tc's: SI, bits per second
_PARTITION = re.compile(r"(\d+)@(\d+)\+(\d+(?:\.\d+)?)s")


@dataclass(frozen=True)
class Conditions:
    """A link's conditions, each direction: one-way delay (s), loss probability, rate."""

    delay: float = 0.0
    loss: float = 0.0
    rate: str = ""  # tc's syntax, e.g. 10mbit; "" unlimited

    @classmethod
    def parse(cls, delay: str, loss: str, rate: str) -> Conditions:
        """--delay 25ms (or 0.1s), --loss 1% (or 0.01), --rate 10mbit; ConfigError else."""
        d = _DELAY.fullmatch(delay.strip())
        if d is None:
            raise ConfigError(f"--delay {delay!r}: write milliseconds or seconds, e.g. 25ms")
        seconds = float(d.group(1)) / (1000 if d.group(2) in (None, "ms") else 1)
        text = loss.strip()
        try:
            p = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            p = -1.0
        if not 0 <= p < 1:
            raise ConfigError(f"--loss {loss!r}: write a percentage below 100, e.g. 1%")
        if rate and _RATE.fullmatch(rate.strip().lower()) is None:
            raise ConfigError(f"--rate {rate!r}: write bits per second as tc does, e.g. 10mbit")
        return cls(seconds, p, rate.strip().lower())

    def bits_per_second(self) -> float:
        match = _RATE.fullmatch(self.rate)
        assert match is not None
        return float(match.group(1)) * _UNITS[match.group(2)]

    def describe(self) -> str:
        rate = self.rate or "unlimited"
        return f"delay {self.delay * 1000:g} ms each way, loss {self.loss:.2%}, rate {rate}"


@dataclass(frozen=True)
class Partition:
    """Host `host` (1-based) cut off once the run has completed round `round`, `seconds` long."""

    host: int
    round: int
    seconds: float

    def __str__(self) -> str:
        return f"{self.host}@{self.round}+{self.seconds:g}s"


def parse_partitions(text: str, hosts: int) -> list[Partition]:
    """'2@200+5s,1@400+2s' -> Partitions in round order; ConfigError naming a bad item."""
    found = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _PARTITION.fullmatch(item)
        if match is None:
            raise ConfigError(
                f"--partition {item!r}: write HOST@ROUND+SECONDSs, e.g. 2@200+5s (host 2 cut "
                "off for 5 s once round 200 is done)"
            )
        host, at, seconds = int(match.group(1)), int(match.group(2)), float(match.group(3))
        if not 1 <= host <= hosts:
            raise ConfigError(f"--partition {item!r}: host {host} is not in 1..{hosts}")
        found.append(Partition(host, at, seconds))
    return sorted(found, key=lambda p: p.round)


def missing() -> str | None:
    """Why a lab cannot be built here, or None: it needs root and ip, tc and iptables."""
    if os.geteuid() != 0:
        return "privnet lab needs root (network namespaces, veth links, tc, iptables): sudo"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return f"privnet lab needs {', '.join(absent)} (apt-get install iproute2 iptables)"
    return None


def sh(*argv: str, check: bool = True) -> str:
    """Run a command, its output; a failure says which command and why."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout}")
    return done.stdout


@dataclass
class Lab:
    """One lab's namespaces and links: `with Lab(3, conditions) as lab:` builds them and
    always removes them (and every process in them)."""

    hosts: int
    conditions: Conditions = Conditions()
    id: str = field(default_factory=lambda: secrets.token_hex(3))
    netem: bool = False
    made: list[str] = field(default_factory=list)  # namespaces made, in order
    inodes: dict[str, int] = field(default_factory=dict)  # namespace -> its netns inode

    @property
    def core(self) -> str:
        return f"{PREFIX}{self.id}-core"

    def host(self, i: int) -> str:
        """Host i's namespace (1-based)."""
        return f"{PREFIX}{self.id}-h{i}"

    @property
    def namespaces(self) -> list[str]:
        return [self.core, *(self.host(i) for i in range(1, self.hosts + 1))]

    def __enter__(self) -> Lab:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def proxied(self) -> bool:
        """Whether the links' delay is a proxy's (no netem here)."""
        return self.conditions.delay > 0 and not self.netem

    def build(self) -> None:
        """The namespaces, the links and their conditions."""
        for ns in self.namespaces:
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            self.inodes[ns] = os.stat(f"/run/netns/{ns}").st_ino
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.core, "addr", "add", f"{CORE_ADDRESS}/32", "dev", "lo")
        for i in range(1, self.hosts + 1):
            host, end = self.host(i), f"h{i}"
            peer = ("peer", "name", CORE_LINK, "netns", host)
            sh("ip", "-n", self.core, "link", "add", end, "type", "veth", *peer)
            sh("ip", "-n", self.core, "addr", "add", f"10.77.{i}.1/24", "dev", end)
            sh("ip", "-n", host, "addr", "add", f"10.77.{i}.2/24", "dev", CORE_LINK)
            sh("ip", "-n", self.core, "link", "set", end, "up")
            sh("ip", "-n", host, "link", "set", CORE_LINK, "up")
            sh("ip", "-n", host, "route", "add", "default", "via", f"10.77.{i}.1")
        self.netem = self._netem_works()
        for i in range(1, self.hosts + 1):
            self._condition(i)

    def _ends(self, i: int) -> list[tuple[str, str]]:
        """Link i's two ends: (namespace, interface)."""
        return [(self.core, f"h{i}"), (self.host(i), CORE_LINK)]

    def _netem_works(self) -> bool:
        ns, dev = self._ends(1)[0]
        try:
            sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "netem", "delay", "1ms")
        except RuntimeError:
            return False
        sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root")
        return True

    def _condition(self, i: int) -> None:
        c = self.conditions
        if self.netem:
            netem = [*(("delay", f"{c.delay * 1000:g}ms") if c.delay else ())]
            netem += [*(("loss", f"{c.loss * 100:g}%") if c.loss else ())]
            netem += [*(("rate", c.rate) if c.rate else ())]
            for ns, dev in self._ends(i) if netem else []:
                sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "netem", *netem)
            return
        if c.rate:  # a bucket of 10 ms at the rate, at least two full frames
            burst = str(max(3000, int(c.bits_per_second() / 8 / 100)))
            for ns, dev in self._ends(i):
                tbf = ("tbf", "rate", c.rate, "burst", burst, "latency", "200ms")
                sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *tbf)
        if c.loss:
            random = ("-m", "statistic", "--mode", "random", "--probability", f"{c.loss:.6f}")
            for chain, way in (("INPUT", "-i"), ("OUTPUT", "-o")):
                self._iptables(i, "-A", chain, way, CORE_LINK, *random, "-j", "DROP")

    def _iptables(self, i: int, *rule: str) -> str:
        return sh("ip", "netns", "exec", self.host(i), "iptables", *rule)

    def partition(self, i: int, cut: bool) -> None:
        """Drop everything on host i's link (cut), or stop dropping it."""
        op = "-I" if cut else "-D"
        for chain, way in (("INPUT", "-i"), ("OUTPUT", "-o")):
            self._iptables(i, op, chain, way, CORE_LINK, "-j", "DROP")

    def links(self) -> dict[str, dict[str, int]]:
        """Every veth end's counters, `<namespace>/<interface>` (core/h1, h1/core, ...)."""
        found = {}
        for ns in self.made:
            for item in json.loads(sh("ip", "-n", ns, "-j", "-s", "link", "show")):
                if item["ifname"] == "lo":
                    continue
                rx, tx = item["stats64"]["rx"], item["stats64"]["tx"]
                found[f"{self.short(ns)}/{item['ifname']}"] = {
                    "rx_bytes": rx["bytes"],
                    "tx_bytes": tx["bytes"],
                    "rx_packets": rx["packets"],
                    "tx_packets": tx["packets"],
                    "tx_dropped": tx["dropped"],
                }
        return found

    def lost(self) -> dict[str, int]:
        """Per host, the packets its loss rules dropped (iptables' counters)."""
        found = {}
        for i in range(1, self.hosts + 1):
            rules = self._iptables(i, "-L", "-v", "-x", "-n")
            found[f"h{i}"] = sum(
                int(line.split()[0]) for line in rules.splitlines() if "statistic" in line
            )
        return found

    def short(self, ns: str) -> str:
        """core, h1, h2, ...: a namespace's name in this lab."""
        return ns.removeprefix(f"{PREFIX}{self.id}-")

    def processes(self) -> dict[str, list[dict[str, Any]]]:
        """Per namespace: its processes now, each with its command line and the inode of the
        network namespace it is in (/proc/PID/ns/net), against the namespace's own."""
        found: dict[str, list[dict[str, Any]]] = {}
        for ns in self.made:
            found[self.short(ns)] = []
            for pid in pids(ns):
                with contextlib.suppress(OSError):
                    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                    cmd = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
                    inode = os.stat(f"/proc/{pid}/ns/net").st_ino
                    found[self.short(ns)].append(
                        {"pid": pid, "cmd": cmd, "in_namespace": inode == self.inodes[ns]}
                    )
        return found

    def close(self) -> None:
        """End every process in the lab's namespaces, then remove them (their links, qdiscs
        and iptables rules go with them). Safe to call twice."""
        for ns in self.made:
            for pid in pids(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while any(pids(ns) for ns in self.made) and time.monotonic() < deadline:
            time.sleep(0.05)
        for ns in self.made:
            for pid in pids(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for ns in reversed(self.made):
            sh("ip", "netns", "del", ns, check=False)
        self.made.clear()

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "namespaces": {self.short(ns): ns for ns in self.namespaces},
            "core_address": CORE_ADDRESS,
            "conditions": asdict(self.conditions),
            "mechanism": self.mechanism(),
        }

    def mechanism(self) -> dict[str, str]:
        """How each condition was made here."""
        c = self.conditions
        if self.netem:
            return {
                k: "netem"
                for k, on in (("delay", c.delay), ("loss", c.loss), ("rate", c.rate))
                if on
            }
        how = {"delay": "tcp proxy", "loss": "iptables statistic", "rate": "tc tbf"}
        return {k: v for k, v in how.items() if getattr(c, k)}


def pids(ns: str) -> list[int]:
    """The processes in namespace `ns` (none once it is gone)."""
    out = sh("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in out.split()]


def leftovers() -> list[str]:
    """Lab namespaces on this machine (none once every lab is closed)."""
    return [
        line.split()[0]
        for line in sh("ip", "netns", "list").splitlines()
        if line.startswith(PREFIX)
    ]

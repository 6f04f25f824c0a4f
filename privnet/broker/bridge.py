"""A run across hosts: one mosquitto per host (a *site*), bridged to the run's *core* broker.

Agents talk to their own host's broker; a site's bridge (one TCP connection) carries exactly
what must leave or reach its host, per agent id (`bridge_section`; the table is in
docs/tasks/across-machines.md), so a frame between two agents of one host never leaves it.
The bridge logs in as its own user, `site-<host>`, whose ACL is the union of its agents'
rules, so "agent m writes only as m" holds on every broker a message crosses. Both ends keep
the bridge's session: what is published while it is down arrives when it is back. TLS to
the core is verified against the run's CA, hostname included.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from privnet.agent.access import BrokerAddress
from privnet.agent.topics import run_filter
from privnet.broker.credentials import (
    INSPECTOR,
    ORCHESTRATOR,
    Credentials,
    Rules,
    Users,
    agent_rules,
)
from privnet.broker.launcher import Broker, mosquitto_config, mosquitto_settings
from privnet.broker.tls import TLSFiles

BRIDGE_PREFIX = "site-"  # a bridge's user (and client id) at the core: site-<host>
MONITOR = "monitor"  # the site's own user on its broker: publishes the bridge's TCP counters
COUNTS = "bridge/"  # ... under the site's sys_prefix: bridge/sent, bridge/received ...
RESTART = "1 5"  # s: the bridge reconnects after 1 s, backing off to 5 s (default 5 to 30)
QUEUED = {"queue_qos0_messages": "true"}  # the peer plane (QoS 0) survives a bridge outage


@dataclass(frozen=True)
class Bridge:
    """One host's bridge to the core: the agents it carries, and its credential there."""

    host: str
    agents: tuple[int, ...]
    password: str = field(repr=False)

    @property
    def user(self) -> str:
        return BRIDGE_PREFIX + self.host


def base(run: str) -> str:
    return run_filter(run).removesuffix("/#")


def sys_prefix(run: str, host: str) -> str:
    """Where a site's counters reach the core: `privnet/<run>/sys/<host>/` + `bytes/sent`,
    `messages/received`, `bridge/sent` ..., and `connected` (1 while its bridge is up)."""
    return f"{base(run)}/sys/{host}/"


def bridge_rules(run: str, bridge: Bridge) -> Rules:
    """At the core: what its agents may each do, and its host's counters."""
    rules = [agent_rules(run, m) for m in bridge.agents]
    read = [t for r in rules for t in r.read]
    write = [t for r in rules for t in r.write] + [sys_prefix(run, bridge.host) + "#"]
    return Rules(read=tuple(dict.fromkeys(read)), write=tuple(write))


def core_users(credentials: Credentials, bridges: Iterable[Bridge]) -> Users:
    """The core broker's users across hosts: the orchestrator, the inspector and a bridge
    per host. No agent: agents log in to their own host's broker."""
    run = credentials.run
    users = {u: credentials.passwords[u] for u in (ORCHESTRATOR, INSPECTOR)}
    everything = run_filter(run)
    rules = {
        ORCHESTRATOR: Rules(read=(everything, "$SYS/#"), write=(everything,)),
        INSPECTOR: Rules(read=(everything, "$SYS/#"), write=()),
    }
    for bridge in bridges:
        users[bridge.user] = bridge.password
        rules[bridge.user] = bridge_rules(run, bridge)
    return Users(f"privnet core ACL of run {run!r} across hosts", users, rules)


def site_users(run: str, host: str, passwords: dict[int, str], monitor: str) -> Users:
    """A site broker's users: its agents (each with the usual rules) and the monitor, which
    publishes the bridge's counters."""
    users = {str(m): p for m, p in passwords.items()} | {MONITOR: monitor}
    rules = {str(m): agent_rules(run, m) for m in passwords}
    rules[MONITOR] = Rules(read=(), write=(sys_prefix(run, host) + COUNTS + "+",))
    return Users(f"privnet site {host!r} of run {run!r}", users, rules)


def bridge_section(
    run: str,
    bridge: Bridge,
    agents: int,
    core: BrokerAddress,
    ca_file: Path | None,
) -> str:
    """The `connection` block of a site's mosquitto.conf (see the module docstring)."""
    at = base(run)
    here = set(bridge.agents)
    lines = [
        f"connection {bridge.user}",
        f"address {core}",
        f"remote_clientid {bridge.user}",
        f"remote_username {bridge.user}",
        f"remote_password {bridge.password}",
        "cleansession false",
        f"restart_timeout {RESTART}",
        "notifications true",
        f"notification_topic {sys_prefix(run, bridge.host)}connected",
    ]
    if ca_file is not None:
        lines += [f"bridge_cafile {ca_file}", "bridge_insecure false"]
    for k in range(agents):
        lines.append(f"topic {at}/to/{k}/from/+ {'in' if k in here else 'out'} 0")
    lines += [f"topic {at}/ctl/up/+ out 1", f"topic {at}/telemetry/+ out 1"]
    lines += [f"topic {at}/ctl/down/{k} in 1" for k in bridge.agents]
    lines.append(f"topic {at}/ctl/down/all in 1")
    prefix = sys_prefix(run, bridge.host)
    lines += [f"topic {kind}/+ out 0 $SYS/broker/ {prefix}" for kind in ("bytes", "messages")]
    lines.append(f"topic {prefix}{COUNTS}+ out 0")
    return "\n".join(lines) + "\n"


@dataclass
class CoreBroker(Broker):
    """The run's core mosquitto across hosts: listens where the sites' bridges reach it
    (`bind`, every address when empty), knows the orchestrator, the inspector and one
    bridge user per host, and serves TLS with the certificate `privnet prepare --hosts`
    made (`tls_dir`: ca.crt, server.crt, server.key), which the sites verify."""

    bridges: tuple[Bridge, ...] = ()
    bind: str = ""
    tls_dir: Path | None = None

    def mosquitto_conf(self, directory: Path) -> str:
        assert self.credentials is not None
        tls = None
        if self.tls_dir is not None:
            names = ("ca.crt", "server.crt", "server.key")
            for name in names:
                shutil.copy2(self.tls_dir / name, directory / name)
            tls = TLSFiles(*(directory / name for name in names))
            self.ca_file = tls.ca_cert
        users = core_users(self.credentials, self.bridges)
        settings = mosquitto_settings(directory, users, tls) | QUEUED
        return mosquitto_config(f"{self.address.port} {self.bind}".strip(), settings)


@dataclass
class SiteBroker(Broker):
    """A site's mosquitto: its agents' users on 127.0.0.1, bridged to the core (`core`, or
    `via` a proxy or tunnel to it), verifying it against `ca` where the run has TLS."""

    run: str = ""
    bridge: Bridge | None = None
    agents: int = 0  # in the whole run
    passwords: dict[int, str] = field(default_factory=dict, repr=False)  # its agents'
    monitor: str = field(default="", repr=False)  # the monitor's password
    core: BrokerAddress | None = None
    ca: Path | None = None

    def mosquitto_conf(self, directory: Path) -> str:
        assert self.bridge is not None and self.core is not None
        ca = None
        if self.ca is not None:
            ca = directory / "core-ca.crt"
            shutil.copy2(self.ca, ca)
        users = site_users(self.run, self.bridge.host, self.passwords, self.monitor)
        settings = mosquitto_settings(directory, users, None) | QUEUED
        text = mosquitto_config(f"{self.address.port} 127.0.0.1", settings)
        return text + bridge_section(self.run, self.bridge, self.agents, self.core, ca)

"""A run across machines: agents on several hosts, each host's own mosquitto (a *site*)
bridged to the run's core broker, where the orchestrator runs (`privnet.broker.bridge`).

`privnet prepare --hosts hosts.toml` (the core's address and each host's agents; docs/tasks/
across-machines.md) writes one bundle per host, so secrets travel per host: a host's bundle
holds its agents' launches, its bridge's credential and the run's CA, nothing of any other
host's agents. `privnet site bundles/<host>` starts the host's mosquitto, bridged to the
core through a relay that also counts the bridge's bytes, and its agents; `privnet run
--hosts` starts the core broker with the bridges' users, waits for every agent and runs,
adding each broker's `$SYS` counters and what crossed each bridge to summary.json.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import shutil
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt

from privnet.agent.access import BrokerAddress, ClientAccess
from privnet.agent.launch import AgentLaunch
from privnet.agent.spec import ConfigError
from privnet.agent.transport import client
from privnet.broker.bridge import COUNTS, MONITOR, Bridge, CoreBroker, SiteBroker, sys_prefix
from privnet.broker.credentials import INSPECTOR, write_private
from privnet.broker.launcher import (
    SYS_COUNTERS,
    SYS_PREFIX,
    free_port,
    has_mosquitto,
    read_counters,
)
from privnet.broker.relay import Relay
from privnet.broker.tls import make_tls
from privnet.orchestrator.engines.launch import LocalLauncher
from privnet.orchestrator.engines.lifetime import RunSecrets, Stop
from privnet.orchestrator.terminal import console

CORE = "core"  # the core bundle's directory; no host may have this name
SITE_JSON = "site.json"
SITES_JSON = "sites.json"
BRIDGE_COUNTERS = {"sent": "sent", "received": "received"}  # bytes, as the site's relay moved them
MONITOR_EVERY = 1.0  # s between the monitor's counts (as mosquitto's sys_interval)
LINGER = 2.0  # s a site's broker stays up after its last agent left: what it still forwards
_HOST = re.compile(r"[A-Za-z0-9._-]{1,32}")
_EVERY_ADDRESS = ("", "0.0.0.0", "::")


@dataclass(frozen=True)
class Hosts:
    """hosts.toml: where the core broker is reached and listens, and each host's agents."""

    core: BrokerAddress
    listen: str
    hosts: dict[str, tuple[int, ...]]

    @property
    def agents(self) -> int:
        return sum(len(ids) for ids in self.hosts.values())

    @classmethod
    def load(cls, path: Path) -> Hosts:
        """hosts.toml, checked: ConfigError saying what is wrong and how to write it."""
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read the host map {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from None
        return cls.parse(data, str(path))

    @classmethod
    def parse(cls, data: Mapping[str, Any], where: str) -> Hosts:
        example = 'core = "HOST:PORT" and [hosts.NAME] tables with agents = COUNT or [IDS]'
        unknown = set(data) - {"core", "listen", "hosts"}
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; write {example}")
        try:
            core = BrokerAddress.parse(str(data["core"]))
        except KeyError:
            raise ConfigError(f"{where}: no core address; write {example}") from None
        except ValueError as exc:
            raise ConfigError(f"{where}: core: {exc}") from None
        listen = str(data.get("listen", ""))
        tables = data.get("hosts")
        if not isinstance(tables, dict) or not tables:
            raise ConfigError(f"{where}: no hosts; write {example}")
        listed: dict[str, list[int]] = {}
        counts: dict[str, int] = {}
        for name, table in tables.items():
            if not _HOST.fullmatch(name) or name == CORE:
                raise ConfigError(
                    f"{where}: bad host name {name!r}: 1-32 letters, digits, '.', '_' or '-', "
                    f"not {CORE!r}"
                )
            agents = table.get("agents") if isinstance(table, dict) else None
            if isinstance(agents, list) and agents and all(_is_id(a) for a in agents):
                listed[name] = agents
            elif isinstance(agents, int) and _is_id(agents) and agents > 0:
                counts[name] = agents
            else:
                raise ConfigError(
                    f"{where}: [hosts.{name}] needs agents = a count (> 0) or a list of ids "
                    f"(>= 0), got {agents!r}"
                )
        taken = [a for ids in listed.values() for a in ids]
        if len(set(taken)) != len(taken):
            twice = sorted({a for a in taken if taken.count(a) > 1})
            raise ConfigError(f"{where}: agents {twice} are on more than one host")
        free = (a for a in range(len(taken) + sum(counts.values())) if a not in set(taken))
        hosts = {
            name: tuple(listed[name]) if name in listed else tuple(next(free) for _ in range(n))
            for name in tables
            for n in [counts.get(name, 0)]
        }
        every = sorted(a for ids in hosts.values() for a in ids)
        if every != list(range(len(every))):
            raise ConfigError(
                f"{where}: the agents must be 0..{len(every) - 1} with none left out; "
                f"missing {sorted(set(range(len(every))) - set(every))[:10]}"
            )
        return cls(core, listen, hosts)

    def to_json(self) -> dict[str, Any]:
        return {"core": str(self.core), "listen": self.listen, "hosts": self.hosts}

    def check(self, agents: int, where: str) -> None:
        if agents != self.agents:
            raise ConfigError(
                f"{where} places {self.agents} agents, the run has {agents}: give --agents "
                f"{self.agents}, or change the host map"
            )


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# ---- prepare --hosts: one bundle per host, and the core's --------------------------------


def prepare_hosts(out: Path, hosts: Hosts, run: str, tls_names: tuple[str, ...] | None) -> None:
    """The run's secrets split per host (see the module docstring); `tls_names`: TLS to the
    core with a per-run CA, its certificate naming the core's host and these names."""
    run_secrets = RunSecrets.generate(run, hosts.agents)
    bridges = [Bridge(h, ids, secrets.token_urlsafe(32)) for h, ids in hosts.hosts.items()]
    core = _private_dir(out / CORE)
    tls = None
    if tls_names is not None:
        tls = make_tls(_private_dir(core / "tls"), (hosts.core.host, *tls_names))
    write_private(core / "run.json", run_secrets.to_json())
    sites = {b.host: {"agents": list(b.agents), "password": b.password} for b in bridges}
    layout = {"run": run, **hosts.to_json(), "tls": tls is not None, "sites": sites}
    write_private(core / SITES_JSON, json.dumps(layout, indent=1))
    public = run_secrets.orchestrator.public.to_bytes().hex()
    passwords = run_secrets.credentials.passwords
    for bridge in bridges:
        site = _private_dir(out / bridge.host)
        agents = {
            str(m): {"token": run_secrets.tokens[m].hex(), "password": passwords[str(m)]}
            for m in bridge.agents
        }
        bundle = {
            "run": run,
            "host": bridge.host,
            "agents": hosts.agents,
            "core": str(hosts.core),
            "bridge_password": bridge.password,
            "orchestrator": public,
            "tls": tls is not None,
            "launches": agents,
        }
        write_private(site / SITE_JSON, json.dumps(bundle, indent=1))
        if tls is not None:
            shutil.copyfile(tls.ca_cert, site / "ca.crt")


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


@dataclass(frozen=True)
class SiteBundle:
    """What one host was given: `bundles/<host>/` from `privnet prepare --hosts`."""

    run: str
    bridge: Bridge
    agents: int
    core: BrokerAddress
    orchestrator: str
    tokens: dict[int, str]
    passwords: dict[int, str]
    ca: Path | None

    @classmethod
    def load(cls, directory: Path) -> SiteBundle:
        path = directory / SITE_JSON
        try:
            data = json.loads(path.read_text())
            launches = {int(m): v for m, v in data["launches"].items()}
            ca = directory / "ca.crt" if data["tls"] else None
            if ca is not None and not ca.is_file():
                raise ValueError(f"the run has TLS but {ca} is missing")
            return cls(
                data["run"],
                Bridge(data["host"], tuple(sorted(launches)), data["bridge_password"]),
                int(data["agents"]),
                BrokerAddress.parse(data["core"]),
                data["orchestrator"],
                {m: str(v["token"]) for m, v in launches.items()},
                {m: str(v["password"]) for m, v in launches.items()},
                ca,
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{directory} is not a site bundle ({exc}): give a bundles/<host> directory "
                "that `privnet prepare --hosts` wrote"
            ) from None

    def launches(self, broker: BrokerAddress) -> dict[int, AgentLaunch]:
        """Each agent's launch, to this host's broker on `broker`."""
        return {
            m: AgentLaunch(
                str(broker), self.run, m, self.orchestrator, token, str(m), self.passwords[m]
            )
            for m, token in self.tokens.items()
        }


# ---- privnet site BUNDLE: the host's broker, bridged, and its agents ----------------------


def site(
    bundle_dir: Path,
    via_given: str | None = None,
    port: int | None = None,
    out: Path | None = None,
    per_process: int = 1,
) -> int:
    """Run one host's part (`privnet site BUNDLE`): its broker bridged to the core (through
    `via_given`, HOST:PORT, where given), its agents (`per_process` to a process, logs in
    `out`), until they leave; the exit code (1: an agent failed; 128 + the signal when
    SIGINT or SIGTERM stopped it)."""
    bundle = SiteBundle.load(bundle_dir)
    if not has_mosquitto():
        raise ConfigError("a site needs mosquitto (apt-get install mosquitto): it bridges")
    via = _address(via_given, "--via") if via_given else bundle.core
    host = bundle.bridge.host
    out = out or Path("runs") / f"site-{host}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    pool = LocalLauncher(out / "logs", per_process=per_process)
    ended = asyncio.run(_site(bundle, via, port, pool))
    if isinstance(ended, int):
        console.print(
            f"[yellow]site {host}: interrupted; its broker and agents were stopped[/yellow]"
        )
        return ended
    failed = {a: how for a, how in ended.items() if not re.search(r"exited with code 0\b", how)}
    for agent, how in sorted(failed.items()):
        console.print(f"[red]agent {agent}:[/red] {how}")
    console.print(f"site {host}: {len(ended) - len(failed)} agents left cleanly; logs in {out}")
    return 1 if failed else 0


async def _site(
    bundle: SiteBundle, core: BrokerAddress, port: int | None, pool: LocalLauncher
) -> dict[int, str] | int:
    """The relay to the core, the broker bridged through it, the agents: how each ended, or
    128 + the signal that stopped the site. Whatever was started is stopped on every way
    out (SIGINT and SIGTERM are taken on the loop, as `privnet run` takes them)."""
    task = asyncio.current_task()
    assert task is not None
    stop = Stop(task)
    relay = Relay(BrokerAddress("127.0.0.1", 0), core)
    monitor = secrets.token_urlsafe(32)
    broker = SiteBroker(
        "mosquitto",
        BrokerAddress("127.0.0.1", port or free_port()),
        run=bundle.run,
        bridge=bundle.bridge,
        agents=bundle.agents,
        passwords=bundle.passwords,
        monitor=monitor,
        core=core,
        ca=bundle.ca,
    )
    try:
        await relay.start()
        broker.core = relay.address
        broker.start()  # a tenth of a second: a signal meanwhile is taken at the next await
        console.print(
            f"site {bundle.bridge.host}: agents {_ids(bundle.bridge.agents)} on "
            f"{broker.address}, bridged to {core} as {bundle.bridge.user}"
        )
        await pool.zygote.started()
        pool.start(bundle.launches(broker.address))
        ended = await _serve(bundle, broker, pool, relay, ClientAccess(MONITOR, monitor))
        await asyncio.sleep(LINGER)  # their last frames (Left) leave over the bridge
        return ended
    except asyncio.CancelledError:
        if not stop.stopping:
            raise
        assert stop.signum is not None
        return 128 + stop.signum
    finally:
        pool.stop(0.0)  # they have left, or the site was stopped: no grace to wait out
        broker.stop()
        await relay.close()
        stop.close()


async def _serve(
    bundle: SiteBundle,
    broker: SiteBroker,
    pool: LocalLauncher,
    relay: Relay,
    access: ClientAccess,
) -> dict[int, str]:
    """Publish what crossed the bridge every second until every agent has ended; how each
    ended."""
    ended: dict[int, str] = {}
    prefix = sys_prefix(bundle.run, bundle.bridge.host) + COUNTS
    async with client(broker.address, access) as mqtt:
        while len(ended) < len(bundle.tokens):
            ended |= pool.exited()
            for name in BRIDGE_COUNTERS:  # the relay's counts of the same names
                mqtt.publish(prefix + name, str(getattr(relay, name)).encode(), 0)
            await asyncio.sleep(MONITOR_EVERY)
    return ended


def _ids(agents: tuple[int, ...]) -> str:
    return (
        f"{agents[0]}-{agents[-1]}"
        if agents == tuple(range(agents[0], agents[-1] + 1))
        else str(list(agents))
    )


def _address(text: str, flag: str) -> BrokerAddress:
    try:
        return BrokerAddress.parse(text)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


# ---- privnet run --hosts: the core broker, and what every broker counted -----------------


def core_broker(hosts_file: Path, prepared: Path, run_secrets: RunSecrets) -> CoreBroker:
    """The core broker of a run across hosts, from hosts.toml and the core bundle beside
    `prepared` (run.json); ConfigError where they do not belong together (the options'
    own checks, `RunOptions._check_hosts`, come before)."""
    hosts = Hosts.load(hosts_file)
    path = prepared.parent / SITES_JSON
    try:
        layout = json.loads(path.read_text())
        sites = {h: (tuple(s["agents"]), str(s["password"])) for h, s in layout["sites"].items()}
        tls = bool(layout["tls"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path} is not a core bundle's sites.json ({exc}): use the run.json that "
            "`privnet prepare --hosts` wrote into DIR/core/"
        ) from None
    if {h: ids for h, (ids, _) in sites.items()} != hosts.hosts or layout["core"] != str(
        hosts.core
    ):
        raise ConfigError(
            f"{prepared} was prepared for another host map than {hosts_file}: prepare the run "
            "again with this one (and give the hosts their new bundles)"
        )
    if layout["run"] != run_secrets.run:
        raise ConfigError(f"{path} belongs to run {layout['run']!r}, {prepared} to another")
    if not has_mosquitto():
        raise ConfigError("--hosts needs mosquitto on the core host (the sites bridge to it)")
    local = "127.0.0.1" if hosts.listen in _EVERY_ADDRESS else hosts.listen
    return CoreBroker(
        "mosquitto",
        BrokerAddress(local, hosts.core.port),
        run_secrets.credentials,
        tls,
        bridges=tuple(Bridge(h, ids, password) for h, (ids, password) in sites.items()),
        bind="" if hosts.listen in _EVERY_ADDRESS else hosts.listen,
        tls_dir=prepared.parent / "tls" if tls else None,
    )


async def counters(broker: CoreBroker) -> dict[str, Any]:
    """summary.json's view of every broker of the run: each one's `$SYS` counters (`hosts`:
    the core's and each site's, bridged), their sum (`broker_sys`), and what crossed each
    bridge (`bridges`, the site kernel's TCP counts). Empty where they cannot be read."""
    assert broker.credentials is not None
    run = broker.credentials.run
    prefixes: dict[str, Mapping[str, str]] = {SYS_PREFIX: SYS_COUNTERS}
    for bridge in broker.bridges:
        prefixes[sys_prefix(run, bridge.host)] = SYS_COUNTERS
        prefixes[sys_prefix(run, bridge.host) + COUNTS] = BRIDGE_COUNTERS
    try:
        read = await read_counters(broker.address, prefixes, access=broker.access(INSPECTOR))
    except (TimeoutError, aiomqtt.MqttError):
        return {}
    hosts = {"core": read[SYS_PREFIX]}
    bridges = {}
    for bridge in broker.bridges:
        hosts[bridge.host] = read[sys_prefix(run, bridge.host)]
        bridges[bridge.host] = read[sys_prefix(run, bridge.host) + COUNTS]
    total = {k: sum(h[k] for h in hosts.values()) for k in SYS_COUNTERS.values()}
    return {"broker_sys": total, "hosts": hosts, "bridges": bridges}

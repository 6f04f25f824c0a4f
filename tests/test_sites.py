"""A run across hosts: `privnet prepare --hosts`, `privnet site` per host, `privnet run --hosts`.

The hosts are this machine (sites on loopback, each with its own mosquitto bridged to the
core's), so nothing here needs root; tests/test_lab.py runs the same across network
namespaces. The bridge tests start the brokers themselves: what each broker lets through, and
what a bridge outage loses.
"""

import asyncio
import contextlib
import functools
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import numpy as np
import pytest
from conftest import need_mosquitto
from probes import connect_options, load_summary, read_metrics

from privnet.agent import topics
from privnet.agent.access import BrokerAddress, ClientAccess
from privnet.agent.spec import ConfigError
from privnet.agent.transport import Connection, MqttError
from privnet.broker.bridge import (
    Bridge,
    CoreBroker,
    SiteBroker,
    bridge_rules,
    bridge_section,
    sys_prefix,
)
from privnet.broker.credentials import ORCHESTRATOR, Credentials
from privnet.broker.launcher import accepts, free_port, launch
from privnet.broker.relay import Relay
from privnet.orchestrator.cli import main
from privnet.orchestrator.sites import Hosts, SiteBundle, prepare_hosts

PRIVNET = [sys.executable, "-m", "privnet.orchestrator.cli"]
RUN = "sitetest"


def host_map(
    tmp_path: Path, port: int, text: str = "[hosts.a]\nagents = 3\n[hosts.b]\nagents = 3\n"
) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(f'core = "127.0.0.1:{port}"\nlisten = "127.0.0.1"\n{text}')
    return path


# ---- the host map and the bundles --------------------------------------------------------


def test_host_map_mixes_counts_and_ids() -> None:
    data = {
        "core": "10.0.0.1:1883",
        "hosts": {"x": {"agents": 2}, "y": {"agents": [0, 5]}, "z": {"agents": 2}},
    }
    hosts = Hosts.parse(data, "hosts.toml")
    assert hosts.hosts == {"x": (1, 2), "y": (0, 5), "z": (3, 4)}  # counts take the free ids
    assert (hosts.agents, str(hosts.core), hosts.listen) == (6, "10.0.0.1:1883", "")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"hosts": {"a": {"agents": 1}}}, "no core address"),
        ({"core": "x", "hosts": {"a": {"agents": 1}}}, "core: bad broker address"),
        ({"core": "h:1", "hosts": {}}, "no hosts"),
        ({"core": "h:1", "hosts": {"core": {"agents": 1}}}, "bad host name 'core'"),
        ({"core": "h:1", "hosts": {"a b": {"agents": 1}}}, "bad host name"),
        ({"core": "h:1", "hosts": {"a": {"agents": 0}}}, "needs agents = a count"),
        ({"core": "h:1", "hosts": {"a": {"agents": [0]}, "b": {"agents": [0]}}}, "more than one"),
        ({"core": "h:1", "hosts": {"a": {"agents": [0, 2]}}}, "missing [1]"),
        ({"core": "h:1", "hosts": {"a": {"agents": 1}}, "port": 3}, "unknown keys ['port']"),
    ],
)
def test_host_map_errors_say_what_is_wrong(data: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=r"^hosts\.toml: ") as err:
        Hosts.parse(data, "hosts.toml")
    assert says in str(err.value)


def test_each_bundle_holds_only_its_hosts_secrets(tmp_path: Path) -> None:
    hosts = Hosts.load(host_map(tmp_path, 8883))
    prepare_hosts(tmp_path / "bundles", hosts, RUN, ("core.example",))
    run = json.loads((tmp_path / "bundles" / "core" / "run.json").read_text())
    passwords = run["credentials"]["passwords"]
    for host, mine in hosts.hosts.items():
        directory = tmp_path / "bundles" / host
        text = "".join(p.read_text() for p in directory.iterdir())
        for m in range(hosts.agents):
            for secret in (run["tokens"][str(m)], passwords[str(m)]):
                assert (secret in text) == (m in mine), (host, m)
        assert run["orchestrator"] not in text  # the orchestrator's private key stays
        assert oct(directory.stat().st_mode & 0o777) == "0o700"
        assert oct((directory / "site.json").stat().st_mode & 0o777) == "0o600"
        bundle = SiteBundle.load(directory)
        assert bundle.bridge.agents == mine and bundle.ca is not None
    core = tmp_path / "bundles" / "core"
    assert oct((core / "tls" / "server.key").stat().st_mode & 0o777) == "0o600"
    assert {p.name for p in core.iterdir()} == {"run.json", "sites.json", "tls"}


def test_a_bridge_carries_what_crosses_its_host_and_may_write_only_as_its_agents() -> None:
    bridge = Bridge("a", (0, 2), "x" * 32)
    lines = bridge_section(RUN, bridge, 4, BrokerAddress("core", 1883), None).splitlines()
    base = f"privnet/{RUN}"
    assert f"topic {base}/to/0/from/+ in 0" in lines and f"topic {base}/to/1/from/+ out 0" in lines
    assert f"topic {base}/to/2/from/+ in 0" in lines and f"topic {base}/to/3/from/+ out 0" in lines
    assert f"topic {base}/ctl/down/0 in 1" in lines and f"topic {base}/ctl/down/1 in 1" not in lines
    assert "cleansession false" in lines and f"remote_username {bridge.user}" in lines
    rules = bridge_rules(RUN, bridge)
    writes = [t for t in rules.write if "/to/" in t]
    assert writes == [f"{base}/to/+/from/0", f"{base}/to/+/from/2"]
    assert f"{base}/telemetry/1" not in rules.write and sys_prefix(RUN, "a") + "#" in rules.write


def test_agent_waits_for_a_broker_that_comes_up_after_it() -> None:
    need_mosquitto()
    broker = launch("mosquitto")  # its address is picked; it starts later

    async def connect(first_wait: float) -> float:
        began = time.monotonic()
        async with Connection(broker.address, ClientAccess(), first_wait=first_wait):
            return time.monotonic() - began

    with pytest.raises(MqttError, match="could not connect"):
        asyncio.run(connect(0.0))  # as before: no broker, no wait

    async def late() -> float:
        async def start() -> None:
            await asyncio.sleep(0.8)
            await asyncio.to_thread(broker.start)

        starting = asyncio.create_task(start())
        took = await connect(10.0)
        await starting
        return took

    try:
        assert 0.8 <= asyncio.run(late()) < 5.0
    finally:
        broker.stop()


# ---- the brokers: what a bridge lets through, what an outage loses -----------------------


@dataclass
class Bridged:
    """A core broker with bridges a (agents 0, 1) and b (2, 3), and a's site broker, bridged
    through a relay; `client(...)` logs in to either."""

    core: CoreBroker
    site: SiteBroker
    relay: Relay
    passwords: dict[str, str]

    def client(self, broker: str, user: str) -> aiomqtt.Client:
        address = (self.core if broker == "core" else self.site).address
        return aiomqtt.Client(
            address.host, address.port, username=user, password=self.passwords[user]
        )


@contextlib.asynccontextmanager
async def bridged(run: str) -> AsyncIterator[Bridged]:
    need_mosquitto()
    credentials = Credentials.generate(run, 4)
    bridges = (Bridge("a", (0, 1), "pw-a" * 8), Bridge("b", (2, 3), "pw-b" * 8))
    core = CoreBroker(
        "mosquitto", BrokerAddress("127.0.0.1", free_port()), credentials, bridges=bridges
    )
    relay = Relay(BrokerAddress("127.0.0.1", 0), core.address)
    await relay.start()
    site = SiteBroker(
        "mosquitto",
        BrokerAddress("127.0.0.1", free_port()),
        run=run,
        bridge=bridges[0],
        agents=4,
        passwords={m: credentials.passwords[str(m)] for m in (0, 1)},
        monitor="m" * 32,
        core=relay.address,
    )
    passwords = {**credentials.passwords, **{b.user: b.password for b in bridges}}
    try:
        async with core, aiomqtt.Client(**connect_options(core, ORCHESTRATOR)) as watcher:
            await watcher.subscribe(sys_prefix(run, "a") + "connected")
            async with site:
                async with asyncio.timeout(10):  # the bridge is up: its notification
                    async for message in watcher.messages:
                        if message.payload == b"1":
                            break
                yield Bridged(core, site, relay, passwords)
    finally:
        await relay.close()


async def received(client: aiomqtt.Client, until: float, count: int) -> list[tuple[str, bytes]]:
    """What arrives within `until` s, up to `count` messages."""
    got: list[tuple[str, bytes]] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(until):
            async for message in client.messages:
                got.append((message.topic.value, bytes(message.payload)))
                if len(got) == count:
                    break
    return got


async def through(lab: Bridged, broker: str, user: str, *frames: str) -> list[str]:
    """Which of `frames` (peer topics), published by `user` on `broker`, reach the core."""
    async with lab.client("core", ORCHESTRATOR) as watcher, lab.client(broker, user) as sender:
        await watcher.subscribe("privnet/acl/to/+/from/+")
        for topic in frames:
            await sender.publish(topic, b"frame")
        return [topic for topic, _ in await received(watcher, 1.5, len(frames))]


async def test_every_broker_keeps_an_agent_to_its_own_name() -> None:
    """Agent m writes only `from/m` on its site; a bridge writes only as its agents at the
    core (here its credential used by hand): a site that forges another host's agent gets
    nothing through."""
    peer = functools.partial(topics.peer_topic, "acl")
    async with bridged("acl") as lab:
        assert await through(lab, "site", "0", peer(2, 1), peer(2, 0)) == [peer(2, 0)]
        assert await through(lab, "core", "site-a", peer(3, 2), peer(3, 1)) == [peer(3, 1)]


async def test_a_bridge_outage_loses_nothing() -> None:
    """Published on either side while the bridge is down, models (QoS 0) and control
    (QoS 1) alike arrive once it is back: both ends keep its session."""
    async with bridged("gap") as lab:
        core, agent = lab.client("core", ORCHESTRATOR), lab.client("site", "0")
        async with core, agent:
            await core.subscribe("privnet/gap/to/2/from/+")
            await core.subscribe("privnet/gap/ctl/up/+", qos=1)
            await agent.subscribe(topics.inbox_filter("gap", 0))
            await agent.subscribe(topics.ctl_down("gap", 0), qos=1)
            address = lab.relay.address
            await lab.relay.close()  # the link goes: both brokers see their end drop
            await asyncio.sleep(0.5)
            await agent.publish(topics.peer_topic("gap", 2, 0), b"model up")
            await agent.publish(topics.ctl_up("gap", 0), b"control up", qos=1)
            await core.publish(topics.peer_topic("gap", 0, 2), b"model down")
            await core.publish(topics.ctl_down("gap", 0), b"control down", qos=1)
            await asyncio.sleep(1.0)
            lab.relay = Relay(address, lab.core.address)  # the link is back
            await lab.relay.start()
            up = await received(core, 15.0, 2)
            down = await received(agent, 5.0, 2)
        assert sorted(payload for _, payload in up) == [b"control up", b"model up"]
        assert sorted(payload for _, payload in down) == [b"control down", b"model down"]


# ---- the three commands, end to end --------------------------------------------------------

FLAGS = ["--agents", "6", "--iters", "30", "--strategy", "atc", "--scheme", "none,local-ghp"]
FLAGS += ["--seed", "7"]


def test_run_across_two_sites_equals_the_memory_engine(tmp_path: Path) -> None:
    """prepare --hosts --tls, the core's run, then a site per host: the run completes, its
    trajectories are the memory engine's, and summary.json has every broker's counts and
    each bridge's bytes."""
    need_mosquitto()
    port = free_port()
    hosts = host_map(tmp_path, port)
    bundles, out = tmp_path / "bundles", tmp_path / "out"
    prepare = ["prepare", "--hosts", str(hosts), "--out", str(bundles), "--run-name", RUN]
    assert main([*prepare, "--tls"]) == 0
    run = [*PRIVNET, "run", "--hosts", str(hosts), "--prepared", str(bundles / "core" / "run.json")]
    core = subprocess.Popen([*run, *FLAGS, "--out", str(out)])
    deadline = time.monotonic() + 30
    while not accepts(BrokerAddress("127.0.0.1", port)) and time.monotonic() < deadline:
        time.sleep(0.1)  # the core broker is up: the sites' bridges find it at once
    sites = [
        subprocess.Popen([*PRIVNET, "site", str(bundles / h), "--out", str(tmp_path / h)])
        for h in ("a", "b")
    ]
    try:
        assert core.wait(120) == 0
        assert [site.wait(30) for site in sites] == [0, 0]
    finally:
        for proc in (core, *sites):
            proc.kill()
    assert main(["simulate", "--engine", "memory", *FLAGS, "--out", str(tmp_path / "m")]) == 0
    net, memory = read_metrics(out / "metrics.csv"), read_metrics(tmp_path / "m" / "metrics.csv")
    assert net.keys() == memory.keys() == {("atc", "none"), ("atc", "local-ghp")}
    for key, (centroid, average) in memory.items():
        np.testing.assert_allclose(net[key][0], centroid, rtol=1e-9, err_msg=f"{key} centroid")
        np.testing.assert_allclose(net[key][1], average, rtol=1e-9, err_msg=f"{key} average")
    config = load_summary(out / "summary.json")["config"]
    assert config["runtime"] == "sites" and config["orchestrator"]["agents_not_left"] == []
    counted = config["hosts"]
    assert set(counted) == {"core", "a", "b"} and all(h["bytes_sent"] > 0 for h in counted.values())
    for key, total in config["broker_sys"].items():
        assert total == sum(h[key] for h in counted.values())
    assert all(b["sent"] > 0 and b["received"] > 0 for b in config["bridges"].values())


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ([], "--hosts (hosts) needs the run's secrets"),
        (["--tls"], "--hosts (hosts): drop --tls (tls)"),
        (["--faults", "kill:1@5"], "kill and stop faults need the agents here"),
    ],
)
def test_run_across_hosts_refuses_what_it_cannot_do(
    tmp_path: Path, flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = host_map(tmp_path, free_port())
    main(["prepare", "--hosts", str(hosts), "--out", str(tmp_path / "b"), "--run-name", RUN])
    prepared = [] if not flags else ["--prepared", str(tmp_path / "b" / "core" / "run.json")]
    argv = [
        "run",
        "--hosts",
        str(hosts),
        *prepared,
        *flags,
        "--agents",
        "6",
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(argv) == 2
    assert says in " ".join(capsys.readouterr().err.split())


def test_prepare_hosts_refuses_compose_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = host_map(tmp_path, 8883)
    argv = ["prepare", "--hosts", str(hosts), "--out", str(tmp_path / "b"), "--run-name", RUN]
    assert main([*argv, "--broker", "broker:1884", "--client-uid", "1000"]) == 2
    assert "drop --broker, --client-uid (compose's)" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "b").exists()

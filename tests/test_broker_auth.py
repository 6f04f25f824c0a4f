"""Broker access control on both brokers: per-run users, the ACL, TLS, the packet size limit.

Real brokers and real MQTT clients. MQTT 3.1.1 brokers drop a denied PUBLISH silently (and
may grant a denied SUBSCRIBE), so denial is tested by observation: a subscriber that may see
everything of the run sees nothing arrive, and messages end with a sentinel.
"""

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import pwd
import shutil
import ssl
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import psutil
import pytest
from conftest import need_mosquitto, relay
from probes import connect_options
from pwdlib import PasswordHash
from pwdlib.hashers.argon2 import Argon2Hasher

from privnet.agent import topics as T
from privnet.agent.access import ClientAccess
from privnet.agent.transport import Connection
from privnet.broker.credentials import INSPECTOR, ORCHESTRATOR, Credentials, acl_rules
from privnet.broker.launcher import (
    Broker,
    BrokerAddress,
    accepts,
    free_port,
    launch,
    read_sys_bytes,
    write_compose_files,
)
from privnet.broker.tls import make_tls

RUN = "auth-1"
AGENTS = 5
CREDS = Credentials.generate(RUN, AGENTS)
WAIT = 15.0  # generous: a loaded machine moves 1 MiB through amqtt slowly
QUIET = 0.3  # seconds without a message after the sentinel: nothing more is coming
BIG = 64 * 1024 * 1024


@pytest.fixture(scope="module", params=["mosquitto", "embedded"])
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """One secured broker of each kind for the whole module (starting one costs ~1 s)."""
    if request.param == "mosquitto":
        need_mosquitto()
    with launch(request.param, credentials=CREDS) as started:
        yield started


def client(broker: Broker, user: str | None, **kwargs: object) -> aiomqtt.Client:
    return aiomqtt.Client(**connect_options(broker, user), **kwargs)  # type: ignore[arg-type]


async def collect(sub: aiomqtt.Client, last_topic: str, n: int = 1) -> list[tuple[str, bytes]]:
    """Messages up to the n-th on `last_topic` (a sentinel), then any that come within QUIET
    seconds more, sorted: amqtt does not keep the order of messages from different clients."""
    got: list[tuple[str, bytes]] = []
    deadline = asyncio.timeout(WAIT)
    with contextlib.suppress(TimeoutError):
        async with deadline:
            async for message in sub.messages:
                got.append((message.topic.value, bytes(message.payload)))  # type: ignore[arg-type]
                if sum(t == last_topic for t, _ in got) == n:
                    deadline.reschedule(asyncio.get_running_loop().time() + QUIET)
    assert sum(t == last_topic for t, _ in got) >= n, f"not {n} on {last_topic}: {got}"
    return sorted(got)


# --- who may connect ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("username", "password"),
    [(None, None), ("3", "wrong password"), ("3", None), ("99", CREDS.passwords["3"]),
     ("", CREDS.passwords["3"]), ("anonymous", "x")],
)  # fmt: skip
async def test_only_the_runs_users_connect(
    broker: Broker, username: str | None, password: str | None
) -> None:
    address = broker.address
    with pytest.raises(aiomqtt.MqttError, match=r"Not authorized|Bad user name or password"):
        async with aiomqtt.Client(address.host, address.port, username=username, password=password):
            pass
    async with client(broker, "3"), client(broker, ORCHESTRATOR), client(broker, INSPECTOR):
        pass


# --- client ids: bound to users --------------------------------------------------------------
# Client ids travel in the clear in CONNECT. Both brokers make a client's id its username, so
# whatever id an impostor names it can displace no other user's connection, and a refused
# one displaces nothing. The parties connect as privnet's do (`privnet.agent.transport.Connection`,
# which sends a random id) through a relay that reads their CONNECTs off the wire.

INBOX = {"4": T.inbox_filter(RUN, 4), ORCHESTRATOR: T.ctl_up(RUN, 1)}  # what each victim reads
SENT_BY_1 = {"4": T.peer_topic(RUN, 4, 1), ORCHESTRATOR: T.ctl_up(RUN, 1)}  # agent 1 writes it
REFUSED = r"Not authorized|Bad user name or password"


@contextlib.asynccontextmanager
async def party(broker: Broker, via: BrokerAddress, user: str) -> AsyncIterator[Connection]:
    """`user`'s connection as privnet's parties make it, subscribed to what it reads."""
    async with Connection(via, broker.access(user), give_up=WAIT) as connection:
        if user in INBOX:
            await connection.subscribe(INBOX[user])
        yield connection


async def still_receives(broker: Broker, victim: Connection, user: str) -> None:
    """Agent 1 writes to `user`, and `victim` gets it without ever having lost the broker."""
    async with client(broker, "1") as sender:
        await sender.publish(SENT_BY_1[user], b"still here", qos=1)
    assert await victim.get(WAIT) == (SENT_BY_1[user], b"still here", False)
    assert victim.outages.losses == 0, "the victim's connection was closed"


async def impostor(broker: Broker, **login: Any) -> None:
    """Connect with `login` (username, password, identifier), hold the connection a moment."""
    address = broker.address
    async with aiomqtt.Client(address.host, address.port, **login):
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("victim", ["4", ORCHESTRATOR])
async def test_a_refused_impostor_under_a_partys_client_id_disturbs_nothing(
    broker: Broker, victim: str
) -> None:
    """Wrong password or none, under the client id the wire showed or the party's name:
    refused, and the party keeps its connection (amqtt 0.12 alone dropped its session)."""
    async with relay(broker.address) as wire, party(broker, wire.address, victim) as v:
        for identifier in [*wire.ids[victim], victim]:
            for username, password in ((victim, "wrong"), (None, None), ("3", "wrong")):
                with pytest.raises(aiomqtt.MqttError, match=REFUSED):
                    await impostor(
                        broker, username=username, password=password, identifier=identifier
                    )
        await still_receives(broker, v, victim)


@pytest.mark.parametrize("victim", ["4", ORCHESTRATOR])
async def test_agent3s_credentials_under_another_partys_client_id_take_agent3s(
    broker: Broker, victim: str
) -> None:
    """Agent 3's valid credentials under the victim's client id (from the wire, or its name):
    the broker gives the impostor agent 3's own id, so agent 3's connection is the one it
    displaces, never the victim's."""
    async with (
        relay(broker.address) as wire,
        party(broker, wire.address, victim) as v,
        party(broker, wire.address, "3") as agent3,
    ):
        taken = [*wire.ids[victim], victim]
        for identifier in taken:
            with contextlib.suppress(aiomqtt.MqttError):  # agent 3 comes back: it displaces us
                await impostor(broker, identifier=identifier, **broker.access("3").client_kwargs())
            async with asyncio.timeout(WAIT):
                while not agent3.up:
                    await asyncio.sleep(0.05)
        await still_receives(broker, v, victim)
        assert agent3.outages.losses == len(taken), "each impostor had agent 3's own id"


# --- what each user may do ----------------------------------------------------------------------


async def test_an_agent_writes_only_as_itself_and_reads_only_its_own(broker: Broker) -> None:
    async with (
        client(broker, ORCHESTRATOR) as orch,
        client(broker, "3") as agent3,
        client(broker, "4") as agent4,
    ):
        await orch.subscribe(T.run_filter(RUN))
        await agent4.subscribe(T.inbox_filter(RUN, 4))
        await agent4.subscribe(T.ctl_down(RUN, 4))
        await agent3.subscribe(T.inbox_filter(RUN, 3))
        await agent3.subscribe(T.ctl_down(RUN, 3))
        await agent3.subscribe(T.ctl_down(RUN, "all"))
        for stolen in (T.inbox_filter(RUN, 4), T.ctl_down(RUN, 4), "#", T.run_filter(RUN),
                       f"privnet/{RUN}/to/+/from/+", "$SYS/#"):  # fmt: skip
            await agent3.subscribe(stolen)
        forged = [T.peer_topic(RUN, 1, 4), T.peer_topic(RUN, 3, 4), T.ctl_up(RUN, 4),
                  T.telemetry(RUN, 4), T.ctl_down(RUN, "all"), T.ctl_down(RUN, 4),
                  T.ctl_down(RUN, 3), T.peer_topic("other-run", 1, 3), "privnet/x"]  # fmt: skip
        own = [T.peer_topic(RUN, 1, 3), T.ctl_up(RUN, 3), T.telemetry(RUN, 3)]
        # Twice each, and 4 in between on a topic 3 forged: a verdict the broker remembers
        # (the embedded one memoizes its ACL's) is the same the second time, and per user.
        for _ in range(2):
            for topic in forged:
                await agent3.publish(topic, b"forged by 3", qos=1)
            await agent4.publish(T.peer_topic(RUN, 1, 4), b"4", qos=1)
            for topic in own:
                await agent3.publish(topic, b"3", qos=1)
        for k in (3, 4):
            await orch.publish(T.peer_topic(RUN, k, 1), f"1 to {k}".encode(), qos=1)
            await orch.publish(T.ctl_down(RUN, k), b"ctl", qos=1)
        await orch.publish(T.ctl_down(RUN, "all"), b"end", qos=1)

        seen_by_orch, seen_by_3, seen_by_4 = await asyncio.gather(
            collect(orch, T.ctl_down(RUN, "all")),
            collect(agent3, T.ctl_down(RUN, "all")),
            collect(agent4, T.ctl_down(RUN, 4)),
        )

    assert seen_by_orch == sorted(
        2 * [(t, b"3") for t in own]
        + 2 * [(T.peer_topic(RUN, 1, 4), b"4")]
        + [(T.peer_topic(RUN, k, 1), f"1 to {k}".encode()) for k in (3, 4)]
        + [(T.ctl_down(RUN, k), b"ctl") for k in (3, 4)]
        + [(T.ctl_down(RUN, "all"), b"end")]
    )
    # each message once: the ACL turns every stolen subscription into nothing
    assert seen_by_3 == sorted(
        [(T.peer_topic(RUN, 3, 1), b"1 to 3"), (T.ctl_down(RUN, 3), b"ctl"),
         (T.ctl_down(RUN, "all"), b"end")]
    )  # fmt: skip
    assert seen_by_4 == sorted([(T.peer_topic(RUN, 4, 1), b"1 to 4"), (T.ctl_down(RUN, 4), b"ctl")])


async def test_the_inspector_reads_everything_and_writes_nothing(broker: Broker) -> None:
    async with (
        client(broker, ORCHESTRATOR) as orch,
        client(broker, INSPECTOR) as inspector,
        client(broker, "2") as agent2,
    ):
        for c in (orch, inspector):
            await c.subscribe(T.run_filter(RUN))
        await agent2.subscribe(T.inbox_filter(RUN, 2))
        await agent2.subscribe(T.ctl_down(RUN, "all"))
        for topic in (T.peer_topic(RUN, 2, 0), T.ctl_down(RUN, "all"), T.ctl_up(RUN, 0)):
            await inspector.publish(topic, b"inspector", qos=1)
        await agent2.publish(T.peer_topic(RUN, 0, 2), b"2 to 0", qos=1)
        await orch.publish(T.ctl_down(RUN, "all"), b"end", qos=1)
        expected = [(T.ctl_down(RUN, "all"), b"end"), (T.peer_topic(RUN, 0, 2), b"2 to 0")]
        seen = await asyncio.gather(
            *(collect(c, T.ctl_down(RUN, "all")) for c in (inspector, orch, agent2))
        )
        assert seen == [expected, expected, [expected[0]]]


async def test_sys_counters_for_orchestrator_and_inspector_only(broker: Broker) -> None:
    reads = [read_sys_bytes(broker.address, 2.5, access=broker.access(user))
             for user in (ORCHESTRATOR, INSPECTOR, "1")]  # fmt: skip
    orch, inspector, agent = await asyncio.gather(*reads, return_exceptions=True)
    assert isinstance(agent, TimeoutError), "an agent may not read $SYS"
    if broker.kind == "mosquitto":
        assert isinstance(orch, dict) and orch["bytes_received"] > 0
        assert isinstance(inspector, dict) and inspector["bytes_received"] > 0
    else:  # amqtt publishes no $SYS counters, to anyone
        assert isinstance(orch, TimeoutError) and isinstance(inspector, TimeoutError)


# --- packet size --------------------------------------------------------------------------------


def rss(broker: Broker) -> int:
    assert broker.pid is not None
    return int(psutil.Process(broker.pid).memory_info().rss)


async def test_an_oversized_publish_is_refused_without_growing_the_broker(
    broker: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = T.peer_topic(RUN, 1, 3)  # the sender may write here: only the size is wrong
    async with client(broker, ORCHESTRATOR) as orch:
        await orch.subscribe(T.run_filter(RUN))
        before = rss(broker)
        async with client(broker, "3") as pub:
            # paho may still be writing when the broker hangs up: watch the connection
            publishing = asyncio.create_task(pub.publish(topic, b"\x00" * BIG, timeout=WAIT))
            with pytest.raises(aiomqtt.MqttError, match=r"Disconnected|Connection lost"):
                async with asyncio.timeout(WAIT):
                    await anext(pub.messages)
            publishing.cancel()
            await asyncio.gather(publishing, return_exceptions=True)
        after = rss(broker)
        async with client(broker, "3") as pub:  # the broker still serves
            await pub.publish(topic, b"small", qos=1)
        assert await collect(orch, topic) == [(topic, b"small")]
    with capsys.disabled():
        print(f"\n{broker.kind} RSS {before / 2**20:.1f} -> {after / 2**20:.1f} MiB")
    assert after - before < 4 * 2**20
    assert "oversize packet" in broker.log_tail(50)


async def test_both_brokers_draw_the_size_line_in_the_same_place(
    broker: Broker,
) -> None:
    topic = T.peer_topic(RUN, 1, 3)
    fits = b"\x01" * (T.MAX_PACKET_SIZE - T.mqtt_publish_size(topic, 0, qos=1) - 2)
    assert T.mqtt_publish_size(topic, len(fits), qos=1) == T.MAX_PACKET_SIZE  # 3-byte length
    slack = fits + b"\x01" * 3  # both compare remaining length + 1 with the limit
    too_big = fits + b"\x01" * 4
    async with client(broker, ORCHESTRATOR) as orch:
        await orch.subscribe(T.inbox_filter(RUN, 1))
        async with client(broker, "3") as pub:
            await pub.publish(topic, fits, qos=1)
            await pub.publish(topic, slack, qos=1)
        assert await collect(orch, topic, 2) == sorted([(topic, fits), (topic, slack)])
        async with client(broker, "3") as pub:
            publishing = asyncio.create_task(pub.publish(topic, too_big, qos=1, timeout=WAIT))
            with pytest.raises(aiomqtt.MqttError, match="Disconnected"):
                async with asyncio.timeout(WAIT):
                    await anext(pub.messages)
            publishing.cancel()
            await asyncio.gather(publishing, return_exceptions=True)


# --- TLS ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mosquitto", "embedded"])
async def test_tls_clients_verify_the_broker_against_the_run_ca(kind: str) -> None:
    if kind == "mosquitto":
        need_mosquitto()
    async with launch(kind, credentials=CREDS, tls=True) as broker:
        assert broker.ca_file is not None and broker.ca_file.is_file()
        key = broker.ca_file.with_name("server.key")
        assert key.stat().st_mode & 0o777 == 0o600
        async with client(broker, ORCHESTRATOR) as orch:
            await orch.subscribe(T.ctl_up(RUN, 1))
            async with client(broker, "1") as agent:
                await agent.publish(T.ctl_up(RUN, 1), b"over TLS", qos=1)
            assert await collect(orch, T.ctl_up(RUN, 1)) == [(T.ctl_up(RUN, 1), b"over TLS")]
        address, password = broker.address, CREDS.passwords["1"]
        system_cas = aiomqtt.TLSParameters()  # the run's CA is in no system trust store
        with pytest.raises((aiomqtt.MqttError, ssl.SSLError)):
            async with aiomqtt.Client(
                address.host, address.port, username="1", password=password, tls_params=system_cas
            ):
                pass
        with pytest.raises(aiomqtt.MqttError):  # plain MQTT on a TLS-only listener
            async with aiomqtt.Client(
                address.host, address.port, username="1", password=password, timeout=0.5
            ):
                pass


def test_the_certificate_names_localhost_and_the_given_hosts(tmp_path: Path) -> None:
    files = make_tls(tmp_path, ["broker", "10.0.0.7"])
    context = ssl.create_default_context(cafile=str(files.ca_cert))
    context.load_verify_locations(cafile=str(files.ca_cert))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(files.cert, files.key)
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(map(str, san.get_values_for_type(x509.DNSName))) == {"localhost", "broker"}
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    assert ips == {"127.0.0.1", "::1", "10.0.0.7"}
    assert files.key.stat().st_mode & 0o777 == 0o600
    assert not list(tmp_path.glob("ca.key")), "the CA key is never written"
    with pytest.raises(ValueError, match="bad TLS hostname"):
        make_tls(tmp_path / "x", ["a b"])


# --- the files: credentials, password files, ACLs, compose --------------------------------------


def test_credentials_are_fresh_complete_and_round_trip() -> None:
    creds = Credentials.generate(RUN, 3)
    assert set(creds.passwords) == {"0", "1", "2", ORCHESTRATOR, INSPECTOR}
    assert len(set(creds.passwords.values())) == 5
    assert Credentials.generate(RUN, 3).passwords["0"] != creds.passwords["0"]
    assert Credentials.from_json(creds.to_json()) == creds
    assert creds.passwords["0"] not in repr(creds)
    access = creds.access("2", ca_file="/x/ca.crt")
    assert access == ClientAccess("2", creds.passwords["2"], tls=True, ca_file="/x/ca.crt")
    assert ClientAccess.from_env(access.to_env()) == access
    assert ClientAccess.from_env({}) == ClientAccess()
    kwargs = access.client_kwargs()
    assert kwargs["username"] == "2" and kwargs["tls_params"].ca_certs == "/x/ca.crt"


@pytest.mark.parametrize(
    ("make", "message"),
    [(lambda: Credentials.generate(RUN, 0), "at least 1 agent"),
     (lambda: Credentials.generate("a/#", 2), "bad run name"),
     (lambda: Credentials.from_json("{}"), "not privnet credentials"),
     (lambda: Credentials.from_json("[1]"), "not privnet credentials"),
     (lambda: Credentials(RUN, 1, {"0": "x" * 20}), "missing"),
     (lambda: Credentials(RUN, 1, {"0": "short", ORCHESTRATOR: "x" * 20, INSPECTOR: "x" * 20}),
      ">= 16 characters"),
     (lambda: CREDS.access("7"), "no broker user '7'"),
     (lambda: ClientAccess.from_env({"PRIVNET_MQTT_TLS": "yes"}), "PRIVNET_MQTT_TLS")],
)  # fmt: skip
def test_bad_credentials_say_what_is_wrong(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


def test_password_files_hold_hashes_each_broker_verifies() -> None:
    mosquitto = dict(line.split(":", 1) for line in CREDS.mosquitto_password_file().splitlines())
    amqtt = dict(line.split(":", 1) for line in CREDS.amqtt_password_file().splitlines())
    assert set(mosquitto) == set(amqtt) == set(CREDS.passwords)
    checker = PasswordHash((Argon2Hasher(),))
    for user, password in CREDS.passwords.items():
        assert password not in mosquitto[user] and password not in amqtt[user]
        _, seven, rounds, salt, digest = mosquitto[user].split("$")
        assert seven == "7" and len(base64.b64decode(salt)) == 12
        expected = hashlib.pbkdf2_hmac(
            "sha512", password.encode(), base64.b64decode(salt), int(rounds)
        )
        assert base64.b64decode(digest) == expected
        assert amqtt[user].startswith("$argon2id$") and checker.verify(password, amqtt[user])


def test_both_acls_say_the_same_and_nothing_is_anonymous() -> None:
    rules = acl_rules(RUN, 2)
    text = CREDS.mosquitto_acl()
    assert "pattern" not in text and "anonymous" not in text
    assert "user 4\ntopic read privnet/auth-1/to/4/from/+\n" in text
    assert f"user {ORCHESTRATOR}\ntopic readwrite privnet/{RUN}/#\ntopic read $SYS/#\n" in text
    assert f"user {INSPECTOR}\ntopic read privnet/{RUN}/#\ntopic read $SYS/#\n\n" in text
    amqtt = Credentials.generate(RUN, 2).amqtt_acl()
    assert amqtt["acl"] == {u: list(r.read) for u, r in rules.items()}
    assert amqtt["publish_acl"] == {u: list(r.write) for u, r in rules.items()}
    assert amqtt["publish_acl"][INSPECTOR] == []
    assert rules["1"].write == (f"privnet/{RUN}/to/+/from/1", T.ctl_up(RUN, 1), T.telemetry(RUN, 1))
    assert rules["1"].read == (T.inbox_filter(RUN, 1), T.ctl_down(RUN, 1), T.ctl_down(RUN, "all"))


def test_compose_files(tmp_path: Path) -> None:
    out = write_compose_files(tmp_path / "c", CREDS, tls_hostnames=("broker",))
    conf = (out / "broker" / "mosquitto.conf").read_text().splitlines()
    at = "/privnet/broker"
    for line in ("listener 1883", "allow_anonymous false", f"password_file {at}/passwd",
                 f"acl_file {at}/acl", f"certfile {at}/server.crt", f"keyfile {at}/server.key",
                 f"max_packet_size {T.MAX_PACKET_SIZE}"):  # fmt: skip
        assert line in conf
    assert "allow_anonymous true" not in conf
    assert Credentials.from_json((out / "credentials.json").read_text()) == CREDS
    env = dict(line.split("=", 1) for line in (out / "users" / "3.env").read_text().splitlines())
    assert ClientAccess.from_env(env) == CREDS.access("3", ca_file="/privnet/ca.crt")
    assert (out / "ca.crt").read_bytes() == (out / "broker" / "ca.crt").read_bytes()
    private = [out / "credentials.json", out / "broker" / "passwd", out / "broker" / "server.key",
               *(out / "users").iterdir()]  # fmt: skip
    assert {p.stat().st_mode & 0o777 for p in private} == {0o600}
    assert json.loads((out / "credentials.json").read_text())["run"] == RUN


def test_launch_rejects_contradictions(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="makes its own CA"):
        launch("embedded", ca_file=tmp_path / "ca.crt")
    with pytest.raises(ValueError, match="whoever runs it"):
        launch("127.0.0.1:1883", hostnames=("broker",))
    with pytest.raises(FileNotFoundError, match="no CA certificate"):
        launch("127.0.0.1:1883", ca_file=tmp_path / "missing.crt")
    with pytest.raises(ValueError, match="has no credentials"):
        launch("embedded").access("1")
    with pytest.raises(RuntimeError, match="start the broker first"):
        launch("embedded", credentials=CREDS, tls=True).access("1")


def test_an_external_broker_gets_the_credentials_passed_through(tmp_path: Path) -> None:
    ca = make_tls(tmp_path).ca_cert
    external = launch("mqtt.example:8883", credentials=CREDS, ca_file=ca)
    options = connect_options(external, "3")
    assert (options["hostname"], options["port"]) == ("mqtt.example", 8883)
    assert (options["username"], options["password"]) == ("3", CREDS.passwords["3"])
    assert options["tls_params"].ca_certs == str(ca)


def env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


async def test_the_compose_config_runs_on_mosquitto() -> None:
    """The generated privnet/broker/ directory, as mosquitto in a container would read it (here the
    mount point is the directory itself, and the listener a free local port)."""
    need_mosquitto()
    base = Path(tempfile.mkdtemp(prefix="privnet-compose-test-"))
    base.chmod(0o755)  # mosquitto started as root reads privnet/broker/ as user "mosquitto"
    root = os.geteuid() == 0
    uid = pwd.getpwnam("mosquitto").pw_uid if root else None
    out = write_compose_files(
        base / "c",
        CREDS,
        tls_hostnames=("broker",),
        mount=base / "c",
        broker_uid=uid,
        client_uid=1000 if root else None,
    )
    if root:
        assert (out / "users" / "3.env").stat().st_uid == 1000
        assert (out / "credentials.json").stat().st_uid == 1000
    port = free_port()
    conf = (out / "broker" / "mosquitto.conf").read_text()
    conf = conf.replace("listener 1883\n", f"listener {port} 127.0.0.1\n")
    (base / "test.conf").write_text(conf)
    try:
        async with serving(base / "test.conf", port):
            access = ClientAccess.from_env(env_file(out / "users" / "3.env"))
            async with aiomqtt.Client("localhost", port, **access.client_kwargs()) as agent:
                await agent.publish(T.ctl_up(RUN, 3), b"from compose", qos=1)
            anonymous = ClientAccess(tls=True, ca_file=access.ca_file)
            with pytest.raises(aiomqtt.MqttError, match="Not authorized"):
                async with aiomqtt.Client("localhost", port, **anonymous.client_kwargs()):
                    pass
    finally:
        shutil.rmtree(base)


@contextlib.asynccontextmanager
async def serving(conf: Path, port: int) -> AsyncIterator[None]:
    """mosquitto started on `conf` (as this user: root drops to "mosquitto") while the block
    runs, answering on `port`."""
    proc = subprocess.Popen(
        [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)],
        stderr=subprocess.PIPE,
    )
    try:
        while not accepts(BrokerAddress("127.0.0.1", port), timeout=0.2):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            await asyncio.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait(5)


async def test_prepare_serves_mosquitto_at_its_broker_port_as_it_starts() -> None:
    """`privnet prepare --broker H:P`: the broker's config listens on P, and a mosquitto
    started on it as is (as root too, without --broker-uid) reads its password file: an
    agent logs in with its launch file."""
    from privnet.orchestrator.cli import main

    need_mosquitto()
    base = Path(tempfile.mkdtemp(prefix="privnet-prepare-test-"))
    base.chmod(0o755)  # as root mosquitto reads privnet/broker/ as user "mosquitto"
    port = free_port()
    flags = ["--out", str(base), "--agents", "2", "--run-name", RUN]
    assert main(["prepare", *flags, "--broker", f"127.0.0.1:{port}", "--mount", str(base)]) == 0
    conf = base / "broker" / "mosquitto.conf"
    assert f"listener {port}\n" in conf.read_text()
    try:
        async with serving(conf, port):
            launch = json.loads((base / "agents" / "agent-1.json").read_text())
            access = ClientAccess(launch["username"], launch["password"])
            async with aiomqtt.Client("127.0.0.1", port, **access.client_kwargs()) as agent:
                await agent.publish(T.ctl_up(RUN, 1), b"from prepare", qos=1)
    finally:
        shutil.rmtree(base)


def test_cli_writes_credentials_and_serves_them(tmp_path: Path) -> None:
    broker_cli = [sys.executable, "-m", "privnet.broker"]

    def credentials(out: str, agents: str) -> subprocess.CompletedProcess[str]:
        args = ["credentials", "--out", str(tmp_path / out), "--agents", agents, "--run", RUN]
        return subprocess.run([*broker_cli, *args], capture_output=True, text=True)

    bad = credentials("x", "0")
    assert bad.returncode == 2 and "at least 1 agent" in bad.stderr
    done = credentials("c", "2")
    assert done.returncode == 0, done.stderr
    creds = Credentials.from_json((tmp_path / "c" / "credentials.json").read_text())
    assert (creds.run, creds.agents) == (RUN, 2)
    served = subprocess.Popen(
        [*broker_cli, "--kind", "embedded", "--credentials", str(tmp_path / "c/credentials.json")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = served.stdout.readline() if served.stdout else ""
        address = BrokerAddress.parse(line.split(" listening on ")[1].split()[0])

        async def connect(access: ClientAccess) -> None:
            async with aiomqtt.Client(address.host, address.port, **access.client_kwargs()):
                pass

        asyncio.run(connect(creds.access(ORCHESTRATOR)))
        with pytest.raises(aiomqtt.MqttError, match="Not authorized"):
            asyncio.run(connect(ClientAccess()))
    finally:
        served.terminate()
        assert served.wait(10) == 0

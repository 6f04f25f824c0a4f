"""Start (and always stop) the MQTT broker a run talks through.

`launch("auto")` picks mosquitto when it is on PATH, else an embedded amqtt broker in its own
process; `launch("HOST:PORT")` uses a broker someone else runs. Local brokers listen on
127.0.0.1 and a free port in their own process group, and stop by SIGTERM, then SIGKILL
(an atexit hook stops any left running). Given a run's `Credentials` they refuse anonymous
clients and enforce its ACL, with `tls=True` over TLS only (a per-run CA). Every client
connects with the `ClientAccess` of `broker.access(user)`.
"""

import asyncio
import atexit
import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import ssl as ssl_module
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from importlib.resources import files
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import aiomqtt

from privnet.agent.access import BrokerAddress, ClientAccess
from privnet.agent.inbox import Inbox
from privnet.agent.spec import ConfigError
from privnet.agent.topics import MAX_PACKET_SIZE
from privnet.broker.credentials import ORCHESTRATOR, Credentials, Users, write_private
from privnet.broker.tls import TLSFiles, make_tls

Kind = Literal["mosquitto", "embedded", "external"]  # a running broker's


class BrokerKind(StrEnum):
    """The brokers a run starts here, as users name them (`--broker`, `broker=`, `--kind`);
    any other broker is named by its HOST:PORT."""

    AUTO = "auto"  # mosquitto if installed, else embedded
    MOSQUITTO = "mosquitto"
    EMBEDDED = "embedded"


LOCAL_KINDS = (BrokerKind.MOSQUITTO, BrokerKind.EMBEDDED)  # what a run (or bench) starts
KINDS = tuple(BrokerKind)
BASE_CONFIG = files("privnet.broker") / "mosquitto.conf"
SYS_PREFIX = "$SYS/broker/"
SYS_COUNTERS = {  # topic under SYS_PREFIX -> key
    "bytes/received": "bytes_received",
    "bytes/sent": "bytes_sent",
    "messages/received": "messages_received",
    "messages/sent": "messages_sent",
}
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 5.0

_running: dict[int, "Broker"] = {}  # id -> a broker this process started and has not stopped


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS just handed out (bind to port 0), so it is free unless someone races us."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def accepts(address: BrokerAddress, timeout: float = 1.0) -> bool:
    """Whether a TCP connect to the address succeeds."""
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout):
            return True
    except OSError:
        return False


def mosquitto_config(listener: str, settings: Mapping[str, str] | None = None) -> str:
    """The shipped mosquitto.conf with `listener <listener>` and `settings` (key -> value):
    a setting the file has is replaced where it stands, the others are appended in order."""
    settings = {"listener": listener, **(settings or {})}
    out = []
    for line in BASE_CONFIG.read_text().splitlines():
        key = line.split(maxsplit=1)[0] if line.strip() and not line.startswith("#") else ""
        out.append(f"{key} {settings.pop(key)}" if key in settings else line)
    out += [f"{key} {value}" for key, value in settings.items()]
    return "\n".join(out) + "\n"


def mosquitto_settings(
    directory: Path,
    credentials: Credentials | Users | None,
    tls: TLSFiles | None,
    *,
    at: Path | None = None,
) -> dict[str, str]:
    """mosquitto.conf settings for auth (password file and ACL, written into `directory`) and
    TLS, naming the files as seen from `at` (where a container mounts `directory`).

    With users, each client's id is its username (`use_username_as_clientid`): whatever id
    a CONNECT names, a client can only displace a connection of its own user."""
    at = directory if at is None else at
    settings = {}
    if credentials is not None:
        write_private(directory / "passwd", credentials.mosquitto_password_file())
        write_private(directory / "acl", credentials.mosquitto_acl())
        settings = {
            "allow_anonymous": "false",
            "use_username_as_clientid": "true",
            "password_file": str(at / "passwd"),
            "acl_file": str(at / "acl"),
        }
    if tls is not None:
        settings |= {"certfile": str(at / tls.cert.name), "keyfile": str(at / tls.key.name)}
    return settings


@dataclass
class Broker:
    """A broker for one run; `with launch(...) as broker:` starts it and always stops it.

    Usable from asyncio code too: `async with` runs start/stop in a worker thread.
    """

    kind: Kind
    address: BrokerAddress
    credentials: Credentials | None = None
    """The run's users: a local broker enforces them, an external one is assumed to."""
    tls: bool = False
    hostnames: tuple[str, ...] = ()
    """Extra names the TLS certificate of a local broker carries (besides localhost)."""
    ca_file: Path | None = None
    """CA that clients verify the broker against: made at start (local), or given (external)."""
    exit_code: int | None = field(default=None, init=False)
    """How the broker process ended: 0 after a clean shutdown, -9 if it had to be killed."""
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _tmp: Path | None = field(default=None, init=False, repr=False)
    _argv: list[str] | None = field(default=None, init=False, repr=False)

    def access(self, user: str | None = None) -> ClientAccess:
        """How `user` connects: an agent id as text, "orchestrator" or "inspector";
        None connects anonymously (refused wherever there are credentials)."""
        if self.tls and self.ca_file is None and self.kind != "external":
            raise RuntimeError("start the broker first: its TLS CA is made at start")
        ca = str(self.ca_file) if self.ca_file is not None else None
        if user is None:
            return ClientAccess(tls=self.tls, ca_file=ca)
        if self.credentials is None:
            raise ValueError(
                f"this broker has no credentials, so no user {user!r}: launch it with "
                "credentials=Credentials.generate(run, agents)"
            )
        return self.credentials.access(user, tls=self.tls, ca_file=ca)

    def start(self) -> None:
        """Start the broker (or check an external one answers) and wait until it accepts."""
        if self.kind == "external":
            if not accepts(self.address, timeout=3.0):
                raise ConnectionError(
                    f"no MQTT broker answers at {self.address}: start one there, "
                    "or use --broker auto to let privnet start its own"
                )
            self._check_packet_limit()
            return
        if self._proc is not None:
            raise RuntimeError(f"the {self.kind} broker at {self.address} is already running")
        try:
            self._spawn()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _check_packet_limit(self) -> None:
        """Refuse an external broker that states (MQTT 5) a packet limit below privnet's
        largest packet: it would drop the connection of whoever sends one, mid-run."""
        from privnet.agent import gmqtt_adapter  # here: the broker's processes never load gmqtt

        access = self.access(ORCHESTRATOR) if self.credentials is not None else self.access()
        ssl = ssl_module.create_default_context(cafile=access.ca_file) if access.tls else False
        probe = gmqtt_adapter.stated_packet_limit(
            self.address.host, self.address.port, ssl, access.username, access.password, 3.0
        )
        stated = asyncio.run(probe)
        if stated is not None and stated < MAX_PACKET_SIZE:
            raise ConfigError(
                f"the broker at {self.address} takes packets of at most {stated:,} bytes (its "
                f"Maximum Packet Size) and privnet sends up to {MAX_PACKET_SIZE:,}: set "
                f"`max_packet_size {MAX_PACKET_SIZE}` in its mosquitto.conf (or its equivalent)"
            )

    def stop(self) -> None:
        """SIGTERM, wait, SIGKILL if it will not go; remove the temp dir. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            self.exit_code = _terminate(proc)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
            self.ca_file = None  # it was in the temp dir
        _running.pop(id(self), None)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the broker process wrote (empty for an external broker)."""
        log = self._tmp / "broker.log" if self._tmp is not None else None
        if log is None or not log.exists():
            return ""
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    @property
    def pid(self) -> int | None:
        """Process id of a broker this object started and that is running."""
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)

    def _command(self) -> list[str]:
        assert self._tmp is not None
        if self.kind == "mosquitto":
            conf = write_private(self._tmp / "mosquitto.conf", self.mosquitto_conf(self._tmp))
            _give_to_mosquitto_user(self._tmp)
            return [_mosquitto_path(), "-c", str(conf)]
        tls = make_tls(self._tmp, self.hostnames) if self.tls else None
        self.ca_file = tls.ca_cert if tls is not None else None
        # -P: a module of the user's in the working directory must not shadow broker's
        command = [
            sys.executable,
            "-P",
            "-m",
            "privnet.broker.embedded",
            "--port",
            str(self.address.port),
        ]
        if self.credentials is not None:
            passwd = write_private(self._tmp / "passwd", self.credentials.amqtt_password_file())
            acl = write_private(self._tmp / "acl.json", json.dumps(self.credentials.amqtt_acl()))
            command += ["--password-file", str(passwd), "--acl-file", str(acl)]
        if tls is not None:
            command += ["--certfile", str(tls.cert), "--keyfile", str(tls.key)]
        return [*command, "--max-packet-size", str(MAX_PACKET_SIZE)]

    def mosquitto_conf(self, directory: Path) -> str:
        """mosquitto.conf for this broker, its password file, ACL and TLS files written into
        `directory` (a subclass configures another kind of mosquitto: `privnet.broker.bridge`)."""
        tls = make_tls(directory, self.hostnames) if self.tls else None
        self.ca_file = tls.ca_cert if tls is not None else None
        settings = mosquitto_settings(directory, self.credentials, tls)
        return mosquitto_config(f"{self.address.port} 127.0.0.1", settings)

    def kill(self) -> None:
        """SIGKILL the broker (a crash): its clients lose their connections, and it loses
        every session, subscription and queued message (it persists nothing)."""
        if self._proc is None:
            raise RuntimeError(f"the {self.kind} broker at {self.address} is not running")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self.exit_code = self._proc.wait()

    def restart(self) -> None:
        """Start a killed broker again on the same address with the same configuration,
        credentials and TLS certificate (a supervisor restarting it), and wait until it
        accepts."""
        if self._proc is None or self._proc.poll() is None or self._argv is None:
            raise RuntimeError(f"the {self.kind} broker at {self.address} was not killed")
        self._spawn(self._argv)
        self._wait_ready()

    def _spawn(self, argv: list[str] | None = None) -> None:
        if argv is None:
            self._tmp = Path(tempfile.mkdtemp(prefix=f"privnet-{self.kind}-"))
            argv = self._argv = self._command()
        assert self._tmp is not None
        with open(self._tmp / "broker.log", "ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        _running[id(self)] = self

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while not accepts(self.address, timeout=0.5):
            code = self._proc.poll()
            if code is not None or time.monotonic() > deadline:
                what = f"exited with code {code}" if code is not None else "did not listen"
                raise RuntimeError(
                    f"the {self.kind} broker {what} at {self.address} "
                    f"(waited up to {READY_TIMEOUT:.0f} s). Its log ends:\n{self.log_tail()}"
                )
            time.sleep(0.02)


def _terminate(proc: subprocess.Popen[bytes]) -> int:
    """Stop a broker process group: SIGTERM, then SIGKILL after STOP_TIMEOUT; its exit code."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


@atexit.register
def _stop_leftovers() -> None:
    for broker in list(_running.values()):
        broker.stop()


def _mosquitto_path() -> str:
    path = shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)),
        None,
    )
    if path is None:
        raise FileNotFoundError(
            "mosquitto is not installed: install it (apt-get install mosquitto, "
            "brew install mosquitto) or use the embedded broker (--broker embedded)"
        )
    return path


def _give_to_mosquitto_user(directory: Path) -> None:
    """mosquitto started as root drops to user "mosquitto" before it reads its password file,
    ACL and TLS key: hand them (0600, in a 0700 directory) to that user rather than open them
    to everyone. Nothing to do when we are not root: then mosquitto runs as us."""
    if os.geteuid() != 0:
        return
    try:
        user = pwd.getpwnam("mosquitto")
    except KeyError:
        return  # no such user: mosquitto stays root, or says in its log why it cannot start
    _chown_files(directory, user.pw_uid, user.pw_gid)


def _chown_files(directory: Path, uid: int, gid: int) -> None:
    """`directory` and the files in it (not the log we write) to uid:gid."""
    for path in [directory, *directory.iterdir()]:
        if path.name != "broker.log":
            os.chown(path, uid, gid)


def write_compose_files(
    out: str | Path,
    credentials: Credentials,
    *,
    tls_hostnames: tuple[str, ...] | None = None,
    mount: Path = Path("/privnet"),
    broker_uid: int | None = None,
    client_uid: int | None = None,
    port: int = 1883,
) -> Path:
    """A run's broker files for docker-compose, written into `out`, mounted at `mount`:

    - `privnet/broker/`: mosquitto.conf (listener `port`, anonymous refused, the run's password file
      and ACL, TLS if `tls_hostnames` is given: server cert for those names), passwd, acl,
      server.crt, server.key.
    - `credentials.json`: every user (the orchestrator's copy); `users/<user>.env`: one
      client's access as environment lines (`ClientAccess.from_env`), for `env_file:`.
    - `ca.crt` (TLS): what clients verify the broker against.

    Everything private is 0600: run as root with `broker_uid` (1883 in eclipse-mosquitto) and
    `client_uid` (1000, privnet in the image) to hand each part to the user who reads it.
    As root without `broker_uid`, privnet/broker/ goes to this host's `mosquitto` user, if any: a
    mosquitto started here as root reads it as that user.
    """
    out = Path(out)
    broker_dir, users = out / "broker", out / "users"
    for directory, mode in ((out, 0o755), (broker_dir, 0o700), (users, 0o700)):
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(mode)  # out/ holds only 0600 files and the public ca.crt
    tls = make_tls(broker_dir, tls_hostnames) if tls_hostnames is not None else None
    ca_file = None
    if tls is not None:
        shutil.copyfile(tls.ca_cert, out / "ca.crt")
        ca_file = mount / "ca.crt"
    settings = mosquitto_settings(broker_dir, credentials, tls, at=mount / "broker")
    (broker_dir / "mosquitto.conf").write_text(mosquitto_config(str(port), settings))
    write_private(out / "credentials.json", credentials.to_json())
    for user in credentials.passwords:
        env = credentials.access(user, tls=tls is not None, ca_file=ca_file).to_env()
        write_private(users / f"{user}.env", "".join(f"{k}={v}\n" for k, v in env.items()))
    if broker_uid is not None:
        _chown_files(broker_dir, broker_uid, broker_uid)
    else:
        _give_to_mosquitto_user(broker_dir)
    if client_uid is not None:
        _chown_files(users, client_uid, client_uid)
        os.chown(out / "credentials.json", client_uid, client_uid)
    return out


def has_mosquitto() -> bool:
    """Whether mosquitto can be started here."""
    try:
        _mosquitto_path()
    except FileNotFoundError:
        return False
    return True


def launch(
    choice: str = "auto",
    *,
    credentials: Credentials | None = None,
    tls: bool = False,
    hostnames: tuple[str, ...] = (),
    ca_file: str | Path | None = None,
) -> Broker:
    """A broker, not yet started: "auto", "mosquitto", "embedded", or "HOST:PORT" (external).

    With `credentials` a local broker refuses anonymous clients and enforces the run's ACL;
    `tls` makes it TLS-only, with a per-run CA whose certificate names localhost, 127.0.0.1
    and `hostnames`. An external broker is configured by whoever runs it: `credentials` are
    only handed to clients, and `ca_file` (implies TLS) is what they verify it against.
    """
    if choice not in KINDS:
        if ":" not in choice:
            raise ConfigError(f"unknown broker {choice!r}: use {', '.join(KINDS)} or HOST:PORT")
        if hostnames:
            raise ValueError("an external broker's certificate is made by whoever runs it")
        ca = Path(ca_file) if ca_file is not None else None
        if ca is not None and not ca.is_file():
            raise FileNotFoundError(f"no CA certificate at {ca}: give the PEM file of the CA")
        address = BrokerAddress.parse(choice)
        return Broker("external", address, credentials, tls or ca is not None, ca_file=ca)
    if ca_file is not None:
        raise ValueError("a local broker makes its own CA: use tls=True, not ca_file")
    if choice == BrokerKind.EMBEDDED:
        kind: Kind = "embedded"
    elif choice == BrokerKind.MOSQUITTO:
        _mosquitto_path()
        kind = "mosquitto"
    else:
        kind = "mosquitto" if has_mosquitto() else "embedded"
    address = BrokerAddress("127.0.0.1", free_port())
    return Broker(kind, address, credentials, tls, tuple(hostnames))


async def read_sys_bytes(
    address: BrokerAddress, timeout: float = 5.0, *, access: ClientAccess | None = None
) -> dict[str, int]:
    """mosquitto's $SYS byte and message counters, no older than this call.

    mosquitto publishes each counter (retained) every sys_interval = 1 s if it changed. We
    take the retained values, wait for the first live update (our own connection changes the
    byte counts, so one comes within a tick), then for the end of that tick's burst. A counter
    never published is still at its initial 0. Keys: bytes_received, bytes_sent,
    messages_received, messages_sent. Where the broker has credentials, `access` must be the
    orchestrator's or the inspector's (`broker.access("orchestrator")`).
    """
    counters = await read_counters(address, {SYS_PREFIX: SYS_COUNTERS}, timeout, access=access)
    return counters[SYS_PREFIX]


async def read_counters(
    address: BrokerAddress,
    prefixes: Mapping[str, Mapping[str, str]],
    timeout: float = 5.0,
    *,
    access: ClientAccess | None = None,
) -> dict[str, dict[str, int]]:
    """Counters published under several topic prefixes (a broker's `$SYS/broker/`, a bridged
    site's), each no older than this call, read over one connection: per prefix, `names`
    maps a topic under it to a key. The retained values first, then every prefix's first live
    update, then the end of that burst (see `read_sys_bytes`)."""
    values = {prefix: dict.fromkeys(names.values(), 0) for prefix, names in prefixes.items()}
    keys = {
        prefix + name: (prefix, key)
        for prefix, names in prefixes.items()
        for name, key in names.items()
    }
    stale = set(prefixes)
    try:
        async with (
            asyncio.timeout(timeout),
            aiomqtt.Client(
                address.host, address.port, **(access or ClientAccess()).client_kwargs()
            ) as client,
            Inbox(client) as inbox,
        ):
            for topic in keys:
                await client.subscribe(topic)
            while True:
                try:
                    message = await inbox.get(None if stale else 0.2)
                except TimeoutError:
                    return values
                prefix, key = keys[message.topic.value]
                values[prefix][key] = int(bytes(message.payload))
                if not message.retain:
                    stale.discard(prefix)
    except TimeoutError:
        raise TimeoutError(
            f"no live $SYS counters under {sorted(stale)} from {address} within {timeout} s: is it "
            "mosquitto with sys_interval set, and may this client read them?"
        ) from None


def sys_bytes(
    address: BrokerAddress, timeout: float = 5.0, *, access: ClientAccess | None = None
) -> dict[str, int]:
    """Blocking `read_sys_bytes`, for code outside an event loop."""
    return asyncio.run(read_sys_bytes(address, timeout, access=access))

"""Fixtures shared by the tests that need a real broker or a real packet capture."""

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import NoReturn

import aiomqtt
import pytest

from broker.launcher import Broker, has_mosquitto, launch
from orchestrator.engines.net import RunSecrets

BROKER_KINDS = ("mosquitto", "embedded")


def skip_unless_required(env: str, reason: str) -> NoReturn:
    """Skip for `reason`, except where `env`=1 (CI) requires the thing: there it fails."""
    if os.environ.get(env) == "1":
        pytest.fail(f"{env}=1 but {reason}")
    pytest.skip(reason)


def need_mosquitto() -> None:
    """Skip without mosquitto, except in CI (PRIVNET_REQUIRE_MOSQUITTO=1), where it is a failure."""
    if not has_mosquitto():
        skip_unless_required(
            "PRIVNET_REQUIRE_MOSQUITTO",
            "mosquitto is not installed (apt-get install mosquitto); embedded variants run",
        )


@pytest.fixture(scope="module", params=BROKER_KINDS)
def broker_kind(request: pytest.FixtureRequest) -> str:
    """Each broker privnet can launch (module scope: pytest groups a module's tests by broker)."""
    if request.param == "mosquitto":
        need_mosquitto()
    return str(request.param)


@pytest.fixture
def needs_mosquitto() -> None:
    """For tests about mosquitto itself (its $SYS counters, say)."""
    need_mosquitto()


def docker_unreachable() -> str | None:
    """Why no Docker engine can be used here, or None when `docker info` answers."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 30 s"
    if info.returncode != 0:
        last = (info.stderr.strip().splitlines() or ["no output"])[-1]
        return f"`docker info` failed: {last}"
    return None


def need_docker() -> None:
    """Skip without a Docker engine, except in CI (PRIVNET_REQUIRE_DOCKER=1): a failure there."""
    reason = docker_unreachable()
    if reason is not None:
        skip_unless_required("PRIVNET_REQUIRE_DOCKER", f"no Docker engine: {reason}")


def capture_tools() -> bool:
    """Whether tcpdump and tshark are here; in CI (PRIVNET_REQUIRE_PCAP=1) they must be."""
    found = shutil.which("tcpdump") is not None and shutil.which("tshark") is not None
    if not found and os.environ.get("PRIVNET_REQUIRE_PCAP") == "1":
        pytest.fail("PRIVNET_REQUIRE_PCAP=1 but tcpdump or tshark is missing: scripts/setup")
    return found


@contextlib.contextmanager
def tcpdump(pcap: Path, port: int, interface: str = "lo") -> Iterator[None]:
    """Capture TCP `port` on `interface` into `pcap` for the body of the with block."""
    proc = subprocess.Popen(
        ["tcpdump", "-i", interface, "-U", "-w", str(pcap), "tcp", "port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    line = "tcpdump exited"
    for raw in proc.stderr:  # "listening on <interface> ..." once it captures
        line = raw.decode()
        if "listening" in line:
            break
    else:
        proc.wait(5)
        skip_unless_required(
            "PRIVNET_REQUIRE_PCAP", f"tcpdump cannot capture on {interface}: {line.strip()}"
        )
    try:
        yield
    finally:
        time.sleep(0.5)  # the last packets of the run
        proc.send_signal(signal.SIGINT)
        proc.wait(10)


@dataclasses.dataclass
class Prepared:
    """A run whose secrets the test holds: the broker it started, and the run file."""

    broker: Broker
    run: str
    run_json: Path
    secrets: RunSecrets

    def flags(self) -> list[str]:
        """`privnet run` flags for this broker and these secrets."""
        return ["--broker", str(self.broker.address), "--prepared", str(self.run_json)]

    def client(self, user: str) -> aiomqtt.Client:
        """A client logged in as `user` (an agent id, orchestrator or inspector)."""
        return aiomqtt.Client(**self.broker.connect_options(user))


@contextlib.asynccontextmanager
async def prepared(kind: str, run: str, agents: int, out: Path) -> AsyncIterator[Prepared]:
    """A broker enforcing the run's credentials, and the run's secrets in a file."""
    run_secrets = RunSecrets.generate(run, agents)
    run_json = out / "run.json"
    run_json.write_text(run_secrets.to_json())
    async with launch(kind, credentials=run_secrets.credentials) as broker:
        yield Prepared(broker, run, run_json, run_secrets)


# Where a run keeps true models, keys, seeds and passwords: never readable by group or others.
SECRET_DIRS = ("journal", "checkpoints", "launch")
SECRET_FILES = ("models.npz", "telemetry.npz", "wire.msgpack", "link_keys.msgpack", "secrets.json")


def assert_private_run(out: Path, *others: str) -> None:
    """The permissions walk: `out` is 0700; every file under it that holds a true model, a
    key, a seed or a password is 0600 (or stricter); no file others could read (were the
    directory opened) holds the run's secret seed; and nothing there is unknown (but the
    test's own `others`)."""
    from orchestrator.report import OUTPUTS

    assert out.stat().st_mode & 0o077 == 0, f"{out} is {oct(out.stat().st_mode & 0o777)}"
    secrets_json = out / "secrets.json"
    seed = json.loads(secrets_json.read_text())["seed"] if secrets_json.exists() else None
    for path in out.rglob("*"):
        where = path.relative_to(out)
        if where.parts[0] in others:
            continue
        assert where.parts[0] in OUTPUTS, f"{where}: a file privnet does not list in OUTPUTS"
        mode = path.stat().st_mode & 0o777
        secret = where.parts[0] in SECRET_DIRS or where.name in SECRET_FILES
        if path.is_dir():
            assert not secret or mode & 0o077 == 0, f"{where} is {oct(mode)}"
        elif secret:
            assert mode & 0o077 == 0, f"{where} holds secrets and is {oct(mode)}"
        elif seed is not None:
            assert str(seed).encode() not in path.read_bytes(), f"{where} holds the seed"

"""`privnet run --runtime docker`: the Docker SDK puts the broker and every agent in containers.

One short run of 10 agents must compute what the memory engine computes, report NIC, MQTT
and $SYS bytes, and leave no container nor network behind; a run whose agent dies and a run
interrupted with Ctrl-C must leave nothing behind either. The broker container enforces the
run's credentials, as every broker of a run does. Skips without a Docker engine
(`../shared/tools/docker-sandbox up`), fails instead where PRIVNET_REQUIRE_DOCKER=1.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np
import pytest
from conftest import assert_private_run, need_docker
from probes import read_metrics

from privnet.agent.access import ClientAccess
from privnet.broker.credentials import ORCHESTRATOR, Credentials
from privnet.orchestrator.cli import main
from privnet.orchestrator.engines.docker import DockerBroker, NicBytes, nic_of, nic_window

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
AGENTS, ITERS, SEED, STRATEGY, SCHEME = 10, 5, 3, "atc", "local-ghp"
LABEL = "privnet.run"


@pytest.fixture(scope="module")
def client() -> Any:
    need_docker()
    docker = pytest.importorskip("docker", reason="pip install 'privnet[docker]'")
    return docker.from_env()


def test_nic_window_per_agent(tmp_path: Path) -> None:
    """No engine needed: the stats answer's counters, and one window into summary.json."""
    stats = {
        "networks": {
            "eth0": {"rx_bytes": 10, "tx_bytes": 20},
            "eth1": {"rx_bytes": 1, "tx_bytes": 2},
        }
    }
    assert nic_of(stats) == NicBytes(11, 22)
    assert nic_of({}) == NicBytes(0, 0)  # a container that has stopped
    broker = DockerBroker(Credentials.generate("r1", 2), tmp_path)
    before = {"privnet-r1-broker": NicBytes(7, 9)}  # agents start later: from zero
    after = {
        "privnet-r1-agent-0": NicBytes(100, 300),
        "privnet-r1-agent-1": NicBytes(100, 300),
        "privnet-r1-broker": NicBytes(607, 209),
    }
    nic = nic_window(broker, before, after, rounds=4)
    assert nic["per_agent"] == {"0": {"rx": 100, "tx": 300}, "1": {"rx": 100, "tx": 300}}
    assert (nic["agents_tx"], nic["agents_rx"], nic["broker_rx"]) == (600, 200, 600)
    assert nic["agents_tx_per_round"] == 150 and nic["agents_total_per_round"] == 200


@pytest.mark.parametrize("flags", [["--tls"], ["--broker", "embedded"], ["--external-agents"]])
def test_flags_the_docker_runtime_cannot_honour(flags: list[str], tmp_path: Path) -> None:
    """A configuration error (exit 2) before anything starts; no engine needed."""
    run = ["run", "--runtime", "docker", "--agents", "2", "--iters", "1", "--out", str(tmp_path)]
    assert main([*run, *flags]) == 2


async def test_docker_broker_enforces_the_run_credentials(client: Any, tmp_path: Path) -> None:
    """Anonymous and wrong-password clients are refused; the orchestrator's user connects."""
    credentials = Credentials.generate(f"test-{secrets.token_hex(4)}", 2)
    broker = DockerBroker(credentials, tmp_path / "logs", client=client)
    try:
        broker.start()
        host, port = broker.address.host, broker.address.port
        wrong = ClientAccess(ORCHESTRATOR, "not-the-password-of-this-run")
        for refused in (ClientAccess(), wrong):
            with pytest.raises(aiomqtt.MqttError):
                async with aiomqtt.Client(host, port, **refused.client_kwargs()):
                    pass
        async with aiomqtt.Client(host, port, **broker.access(ORCHESTRATOR).client_kwargs()):
            pass
    finally:
        broker.stop()
    assert leftovers(client, credentials.run) == ([], [])


def leftovers(client: Any, run: str) -> tuple[list[str], list[str]]:
    """Names of the run's containers and networks still there."""
    label = {"label": f"{LABEL}={run}"}
    containers = [c.name for c in client.containers.list(all=True, filters=label)]
    return containers, [n.name for n in client.networks.list(filters=label)]


def test_exit_without_stop_leaves_nothing(client: Any, tmp_path: Path) -> None:
    """A process that started a run's broker and exits without stopping it: the atexit hook
    removes its container and network (it used to fail there: an executor takes no work
    once the interpreter exits)."""
    run = f"test-exit-{secrets.token_hex(3)}"
    start = (
        "from pathlib import Path; from privnet.broker.credentials import Credentials; "
        "from privnet.orchestrator.engines.docker import BROKER_IMAGE, DockerBroker; "
        f"DockerBroker(Credentials.generate({run!r}, 2), Path({str(tmp_path)!r}), "
        "image=BROKER_IMAGE).start()"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", start], cwd=ROOT, env=env, timeout=300, check=True)
    assert leftovers(client, run) == ([], [])


def test_docker_run_equals_memory_and_counts_three_ways(client: Any, tmp_path: Path) -> None:
    run = f"test-{secrets.token_hex(4)}"
    flags = ["--agents", str(AGENTS), "--iters", str(ITERS), "--seed", str(SEED)]
    flags += ["--strategy", STRATEGY, "--scheme", SCHEME]
    out = tmp_path / "docker"
    code = main(["run", "--runtime", "docker", "--run-name", run, *flags, "--out", str(out)])
    assert code == 0
    assert leftovers(client, run) == ([], []), "containers or network left after success"
    assert_private_run(out)

    assert main(["simulate", "--engine", "memory", *flags, "--out", str(tmp_path / "mem")]) == 0
    net, memory = read_metrics(out / "metrics.csv"), read_metrics(tmp_path / "mem" / "metrics.csv")
    for got, want in zip(net[STRATEGY, SCHEME], memory[STRATEGY, SCHEME], strict=True):
        assert got.shape == (1, ITERS)
        np.testing.assert_allclose(got, want, rtol=1e-9)

    summary = json.loads((out / "summary.json").read_text())
    (result,) = summary["results"]
    mqtt = sum(result["bytes"].values())  # PUBLISH bytes the agents sent, every category
    nic, sys_bytes = summary["config"]["nic"], summary["config"]["broker_sys"]  # one window
    assert summary["config"]["runtime"] == "docker"
    assert sorted(nic["per_agent"]) == sorted(str(p) for p in range(AGENTS))
    assert all(a["tx"] > 0 and a["rx"] > 0 for a in nic["per_agent"].values())
    assert nic["agents_tx"] >= mqtt > 0, "the wire carries at least the MQTT packets"
    assert sys_bytes["bytes_received"] >= mqtt, "the broker received at least what agents sent"
    assert nic["broker_rx"] >= sys_bytes["bytes_received"]
    assert nic["rounds"] == ITERS
    logs = sorted(p.name for p in (out / "logs").iterdir())
    assert logs == sorted([*(f"agent-{p}.log" for p in range(AGENTS)), "broker.log"])
    assert "mosquitto version" in (out / "logs" / "broker.log").read_text()


def _start(run: str, out: Path) -> subprocess.Popen[bytes]:
    """A long docker run in a child process (so it can be interrupted)."""
    flags = ["--runtime", "docker", "--run-name", run, "--agents", "4", "--iters", "100000"]
    return subprocess.Popen(
        [sys.executable, "-m", "privnet.orchestrator.cli", "run", *flags, "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _wait_for_rounds(client: Any, run: str, proc: subprocess.Popen[bytes]) -> None:
    """Until the agents' containers run and the orchestrator has written rounds (metrics)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        running = client.containers.list(filters={"label": f"{LABEL}={run}", "status": "running"})
        if len(running) == 5:  # 4 agents and the broker
            time.sleep(3.0)  # into the rounds
            return
        time.sleep(0.5)
    out = proc.stdout.read().decode(errors="replace") if proc.poll() is not None else ""
    pytest.fail(f"the docker run never got its 5 containers running:\n{out[-3000:]}")


@pytest.mark.parametrize("how", ["ctrl-c", "agents-die"])
def test_nothing_left_on_interrupt_or_failure(client: Any, tmp_path: Path, how: str) -> None:
    """Ctrl-C, or three of the four agent containers killed (one agent is no network: the
    run fails, naming them): no container, network or volume is left behind."""
    run = f"test-{how}-{secrets.token_hex(3)}"
    proc = _start(run, tmp_path / "out")
    try:
        _wait_for_rounds(client, run, proc)
        if how == "ctrl-c":
            proc.send_signal(signal.SIGINT)
        else:
            for agent in (1, 2, 3):
                client.containers.get(f"privnet-{run}-agent-{agent}").kill()
        output = proc.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
    if how == "ctrl-c":
        assert proc.returncode == 130, output[-3000:]
    else:
        assert proc.returncode == 1, output[-3000:]
        assert "a network needs two" in output and "agent 2" in output, output[-3000:]
    assert leftovers(client, run) == ([], []), f"left after {how}:\n{output[-2000:]}"


def test_overhead_gains_a_nic_column(client: Any, tmp_path: Path) -> None:
    """`privnet overhead --runtime docker` runs each row on containers too."""
    flags = ["--agents", "4", "--iters", "3", "--topologies", "ring", "--out", str(tmp_path)]
    assert main(["overhead", "--runtime", "docker", *flags]) == 0
    rows = json.loads((tmp_path / "overhead.json").read_text())["rows"]
    assert [(r["scheme"], r["rekey"]) for r in rows] == [
        ("none", "n/a"), ("random", "n/a"), ("ghp", "n/a"),
        ("local-ghp", "once"), ("local-ghp", "every-round"),
        ("masked-ghp", "once"), ("masked-ghp", "every-round"),
    ]  # fmt: skip
    for r in rows:
        assert r["nic"]["agents_tx_per_round"] >= r["per_round"]["bytes"]["total"] > 0
    assert rows[0]["ratio_to_none"]["nic"] == 1.0
    assert rows[-1]["ratio_to_none"]["nic"] > rows[0]["ratio_to_none"]["nic"]  # keys every round
    assert all(r["broker_sys_per_round"]["bytes_received"] > 0 for r in rows)  # $SYS column
    summaries = sorted(tmp_path.glob("docker-ring-*/summary.json"))
    assert len(summaries) == len(rows), "one docker run per row"
    for path in summaries:
        run = json.loads(path.read_text())["config"]["run"]
        assert leftovers(client, run) == ([], [])

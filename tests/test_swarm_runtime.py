"""`privnet run --runtime swarm` on a real two-node Docker Swarm (`scripts/swarm-pair`).

Two dockerd, each in a network namespace of its own, joined by one veth link: the module's
fixture starts them, forms the swarm, loads the image built from this tree into both, and
tears it all down afterwards. One short run must compute what the memory engine computes
with agents on both nodes and VXLAN (UDP 4789) bytes on the link; a run whose agents are
killed and a run stopped with SIGTERM must leave, like it, no service, secret, config nor
network behind. Needs root, dockerd and a Docker engine to build the image on
(`../shared/tools/docker-sandbox up`); skips without them, fails instead where
PRIVNET_REQUIRE_SWARM=1.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import docker_unreachable, skip_unless_required
from probes import read_metrics

from privnet.agent.__main__ import slot
from privnet.orchestrator.cli import main

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "scripts" / "swarm-pair"
IMAGE = "privnet-swarm-test:dev"
AGENTS, ITERS, SEED, STRATEGY, SCHEME = 6, 20, 3, "atc", "local-ghp"
LABEL = "privnet.run"
SWARM_RUN = ["run", "--runtime", "swarm", "--image", IMAGE]


def need_swarm_pair() -> None:
    """Skip (fail under PRIVNET_REQUIRE_SWARM=1) where the pair cannot be made here."""
    missing = [tool for tool in ("dockerd", "ip", "nsenter", "iptables") if not shutil.which(tool)]
    reason = (
        "needs root (network namespaces, dockerd)"
        if os.geteuid() != 0
        else f"needs {', '.join(missing)}"
        if missing
        else docker_unreachable()
    )
    if reason is not None:
        skip_unless_required("PRIVNET_REQUIRE_SWARM", f"no two-node swarm here: {reason}")


def pair(*args: str) -> str:
    """`scripts/swarm-pair ARGS` with the engine the tests run against as its image source."""
    source = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    done = subprocess.run(
        [str(PAIR), *args],
        env={**os.environ, "SWARM_PAIR_SOURCE": source},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"swarm-pair {' '.join(args)}: {done.stderr[-2000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def manager() -> Iterator[str]:
    """The swarm manager's DOCKER_HOST; the pair, with this tree's image on both nodes."""
    need_swarm_pair()
    docker = pytest.importorskip("docker", reason="pip install 'privnet[docker]'")
    from privnet.orchestrator.engines.docker import build_image

    build_image(docker.from_env(), ROOT, IMAGE)
    try:
        host = pair("up").strip().removeprefix("export DOCKER_HOST=")
        pair("load", IMAGE, "eclipse-mosquitto:2.0")
        yield host
    finally:
        pair("down")
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "privnet-swarm" not in left, f"namespaces left: {left}"


@pytest.fixture
def client(manager: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The manager's client; privnet run in this process talks to it too."""
    import docker

    monkeypatch.setenv("DOCKER_HOST", manager)
    return docker.DockerClient(base_url=manager)


def leftovers(client: Any, run: str) -> dict[str, list[str]]:
    """Names of the run's services, secrets, configs and networks still there."""
    label = {"label": f"{LABEL}={run}"}
    kinds = {
        "services": client.services,
        "secrets": client.secrets,
        "configs": client.configs,
        "networks": client.networks,
    }
    return {kind: [x.name for x in found.list(filters=label)] for kind, found in kinds.items()}


NOTHING: dict[str, list[str]] = {"services": [], "secrets": [], "configs": [], "networks": []}


def test_flags_the_swarm_runtime_cannot_honour(tmp_path: Path) -> None:
    """Configuration errors (exit 2) before anything starts; no engine needed."""
    run = ["run", "--runtime", "swarm", "--agents", "3", "--iters", "1", "--out", str(tmp_path)]
    assert main([*run, "--tls"]) == 2
    assert main([*run, "--faults", "stop:1@2+1s"]) == 2  # a swarm cannot pause a task
    assert main([*run, "--faults", "broker@2"]) == 2  # nor restart its broker
    assert main([*run, "--run-name", "r" * 60]) == 2  # service names past Docker's 63


def test_prepare_stack_hands_each_slot_its_launch(tmp_path: Path) -> None:
    """`privnet prepare --stack`: one 0600 launches.json in id order, no claim files; the
    agent of slot N (from 1) runs agent N-1's launch. No engine needed."""
    out = tmp_path / "stack"
    assert main(["prepare", "--stack", "--out", str(out), "--agents", "3", "--run-name", "s"]) == 0
    path = out / "launches.json"
    assert path.stat().st_mode & 0o777 == 0o600 and not (out / "agents").exists()
    assert [slot(path, n).agent for n in (1, 2, 3)] == [0, 1, 2]
    assert slot(path, 2).broker == "broker:1883" and slot(path, 2).password
    with pytest.raises(ValueError, match="holds launches 1 to 3"):
        slot(path, 4)


def test_swarm_run_equals_memory_across_two_nodes(client: Any, tmp_path: Path) -> None:
    run = f"test-{secrets.token_hex(4)}"
    flags = ["--agents", str(AGENTS), "--iters", str(ITERS), "--seed", str(SEED)]
    flags += ["--strategy", STRATEGY, "--scheme", SCHEME]
    out = tmp_path / "swarm"
    vxlan_before = int(pair("vxlan"))
    code = main([*SWARM_RUN, "--run-name", run, *flags, "--out", str(out)])
    vxlan = int(pair("vxlan")) - vxlan_before
    assert code == 0
    assert leftovers(client, run) == NOTHING, "left after success"

    assert main(["simulate", "--engine", "memory", *flags, "--out", str(tmp_path / "mem")]) == 0
    got, want = read_metrics(out / "metrics.csv"), read_metrics(tmp_path / "mem" / "metrics.csv")
    for a, b in zip(got[STRATEGY, SCHEME], want[STRATEGY, SCHEME], strict=True):
        assert a.shape == (1, ITERS)
        np.testing.assert_allclose(a, b, rtol=1e-9)

    summary = json.loads((out / "summary.json").read_text())["config"]
    assert summary["runtime"] == "swarm"
    nodes = summary["swarm"]["nodes"]
    assert len(nodes) == 2 and all(node["agents"] for node in nodes), nodes  # both ran agents
    assert sorted(p for node in nodes for p in node["agents"]) == list(range(AGENTS))
    assert [node["role"] for node in nodes if node["broker"]] == ["manager"]
    # the agents on the worker reached the broker on the manager through the overlay
    assert vxlan > 10_000, f"{vxlan} VXLAN bytes crossed the link"
    assert summary["broker_sys"]["bytes_received"] > 0
    assert "mosquitto version" in (out / "logs" / "broker.log").read_text()
    assert sorted(p.name for p in (out / "logs").iterdir()) == sorted(
        ["broker.log", *(f"agent-{p}.log" for p in range(AGENTS))]
    )


def test_killed_agents_fail_the_run_and_leave_nothing(
    client: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Two of three agents killed (`--faults kill`: their services scaled to 0): the run
    sees their tasks end, fails naming them, and everything of it is removed."""
    run = f"test-kill-{secrets.token_hex(3)}"
    flags = ["--agents", "3", "--iters", "100000", "--faults", "kill:1@20,kill:2@20"]
    flags += ["--deadline", "5"]  # the conductor waits for a cut vertex to come back
    code = main([*SWARM_RUN, "--run-name", run, *flags, "--out", str(tmp_path)])
    output = " ".join(capfd.readouterr().err.split())
    assert code == 1, output[-3000:]
    assert re.search(r"lost: agent 1: its task (on node \w+ ended|is gone)", output), output[-3000:]
    assert "a network needs two" in output, output[-3000:]
    assert leftovers(client, run) == NOTHING, "left after failure"


def test_sigterm_leaves_nothing(client: Any, manager: str, tmp_path: Path) -> None:
    """`privnet run` stopped with SIGTERM mid-run (as `docker stop` or a scheduler does):
    exit 143 (128 + SIGTERM), and every service, secret, config and network of the run
    removed."""
    run = f"test-term-{secrets.token_hex(3)}"
    flags = ["--run-name", run, "--agents", "3", "--iters", "100000", "--out", str(tmp_path)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "privnet.orchestrator.cli", *SWARM_RUN, *flags],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DOCKER_HOST": manager},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "metrics.csv").exists():  # rounds are being written
            assert proc.poll() is None and time.monotonic() < deadline, "no round ran"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert leftovers(client, run) == NOTHING, f"left after SIGTERM:\n{output[-2000:]}"


def test_docker_stack_deploy_as_its_header_says(client: Any, manager: str, tmp_path: Path) -> None:
    """docker-stack.yml, deployed as its header says beside a `privnet prepare --stack`:
    the orchestrator completes what the memory engine computes, the agents spread at most
    PRIVNET_PER_NODE to a node, and `docker stack rm` leaves nothing of the stack."""
    shutil.copy(ROOT / "docker-stack.yml", tmp_path)  # its paths are relative to it
    prepare = ["prepare", "--stack", "--out", str(tmp_path / "stack"), "--run-name", "stack"]
    assert main([*prepare, "--agents", str(AGENTS)]) == 0
    (tmp_path / "runs").mkdir()
    stack = f"privnet-{secrets.token_hex(3)}"
    settings = {
        "PRIVNET_AGENTS": str(AGENTS),
        "PRIVNET_ITERS": str(ITERS),
        "PRIVNET_SEED": str(SEED),
        "PRIVNET_PER_NODE": "3",
    }
    env = {**os.environ, **settings, "DOCKER_HOST": manager, "PRIVNET_IMAGE": IMAGE}

    def docker_cli(*args: str) -> None:
        done = subprocess.run(
            ["docker", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]

    docker_cli("stack", "deploy", "--detach", "-c", "docker-stack.yml", stack)
    try:
        orchestrator = client.services.get(f"{stack}_orchestrator")
        deadline = time.monotonic() + 300
        while (state := _state(orchestrator)) not in ("complete", "failed", "rejected"):
            assert time.monotonic() < deadline, f"the orchestrator is still {state}"
            time.sleep(1.0)
        logs = b"".join(orchestrator.logs(stdout=True, stderr=True)).decode(errors="replace")
        assert state == "complete", logs[-3000:]
        agents = client.api.tasks(filters={"service": f"{stack}_agent"})
        per_node: dict[str, int] = {}
        for task in agents:
            per_node[task["NodeID"]] = per_node.get(task["NodeID"], 0) + 1
        assert sorted(per_node.values()) == [3, 3], per_node
    finally:
        docker_cli("stack", "rm", stack)
    got = read_metrics(tmp_path / "runs" / "stack" / "metrics.csv")
    flags = ["--agents", str(AGENTS), "--iters", str(ITERS), "--seed", str(SEED)]
    assert main(["simulate", "--engine", "memory", *flags, "--out", str(tmp_path / "mem")]) == 0
    want = read_metrics(tmp_path / "mem" / "metrics.csv")
    for a, b in zip(got[STRATEGY, SCHEME], want[STRATEGY, SCHEME], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9)
    label = {"label": f"com.docker.stack.namespace={stack}"}
    deadline = time.monotonic() + 60
    while left := [
        x.name
        for kind in (client.services, client.secrets, client.configs, client.networks)
        for x in kind.list(filters=label)
    ]:
        assert time.monotonic() < deadline, f"left after docker stack rm: {left}"
        time.sleep(1.0)


def _state(service: Any) -> str:
    """The state of a one-task service's task ("new" before it has one)."""
    tasks = service.tasks()
    return str(tasks[0]["Status"]["State"]) if tasks else "new"

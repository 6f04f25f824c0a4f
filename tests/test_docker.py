"""`docker compose up` of the whole network: broker, orchestrator and 30 agent containers.

Builds the image (cached layers make rebuilds take seconds), runs one short audited session
under a project name of its own with outputs in a temp dir while tcpdump captures the compose
bridge, checks what lands on the host, audits the capture, and always tears the project down.
Skips only when no Docker engine answers; PRIVNET_REQUIRE_DOCKER=1 turns that skip into a
failure (and PRIVNET_REQUIRE_PCAP=1 a missing tcpdump or tshark).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt
import networkx as nx
import numpy as np
import pytest
from conftest import capture_tools, need_docker, tcpdump
from probes import read_metrics

from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.cli import main
from privnet.orchestrator.engines.memory import Network
from privnet.orchestrator.engines.watch import read_membership
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_list, session_plans

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[1]
AGENTS, ITERS, SEED, STRATEGY, SCHEME = 30, 30, 1, "atc", "local-ghp"
BUILD_TIMEOUT = 1200.0  # a cold build downloads numpy, scipy, matplotlib, ...
RUN_TIMEOUT = 600.0


def compose_command() -> list[str]:
    """`docker compose` (v2, or the v1 plugin shim), else the standalone docker-compose."""
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60)
    if probe.returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("a Docker engine answers but there is no `docker compose` nor `docker-compose`")


@dataclass
class ComposeRun:
    exit_code: int
    log: str
    outputs: Path
    agent_exit_codes: list[int]
    pcap: Path | None  # the compose bridge, captured during `up` (None without tcpdump)
    logins: dict[str, bool]  # who the compose broker let in, tried after the run


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )


def _agent_exit_codes(project: str) -> list[int]:
    ids = subprocess.run(
        [
            "docker",
            "ps",
            "--all",
            "--quiet",
            "--filter",
            f"label=com.docker.compose.project={project}",
            "--filter",
            "label=com.docker.compose.service=agent",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not ids:
        return []
    codes = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.ExitCode}}", *ids],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [int(code) for code in codes]


@pytest.fixture(scope="module")
def compose_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeRun]:
    need_docker()
    compose = compose_command()
    project = f"privnet-test-{secrets.token_hex(4)}"
    outputs = tmp_path_factory.mktemp("compose-runs")
    env = {
        **os.environ,
        "PRIVNET_AGENTS": str(AGENTS),
        "PRIVNET_ITERS": str(ITERS),
        "PRIVNET_SEED": str(SEED),
        "PRIVNET_STRATEGY": STRATEGY,
        "PRIVNET_SCHEME": SCHEME,
        "PRIVNET_RUN": project,
        "PRIVNET_RUNS": str(outputs),
        "PRIVNET_AUDIT": "yes",
    }
    base = [*compose, "--project-name", project, "--file", str(ROOT / "docker-compose.yml")]
    try:
        start = time.perf_counter()
        build = _run([*base, "build"], env, BUILD_TIMEOUT)
        build_s = time.perf_counter() - start
        assert build.returncode == 0, f"image build failed:\n{build.stdout[-4000:]}"
        # The secrets service first: it creates the bridge, to tap it before the run.
        created = _run([*base, "up", "--detach", "secrets"], env, 300)
        assert created.returncode == 0, f"`up secrets` failed:\n{created.stdout[-4000:]}"
        pcap = tmp_path_factory.mktemp("capture") / "bridge.pcap" if capture_tools() else None
        capture = tcpdump(pcap, 1883, _bridge(project)) if pcap else contextlib.nullcontext()
        start = time.perf_counter()
        with capture:
            up = _run(
                [*base, "up", "--no-color", "--exit-code-from", "orchestrator"], env, RUN_TIMEOUT
            )
        up_s = time.perf_counter() - start
        print(f"compose: build {build_s:.1f} s, up ({AGENTS} agents, {ITERS} rounds) {up_s:.1f} s")
        codes = _agent_exit_codes(project)
        logins = _try_logins(base, env, project)
        yield ComposeRun(up.returncode, up.stdout, outputs / "compose", codes, pcap, logins)
    finally:
        _tear_down(base, env, project)


def _try_logins(base: list[str], env: dict[str, str], project: str) -> dict[str, bool]:
    """The broker again (fresh secrets), reached from the host over the bridge: who gets in."""
    assert _run([*base, "up", "--detach", "broker"], env, 300).returncode == 0
    name = f"{project}_broker_1"
    address = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
    host = subprocess.run(
        ["docker", "inspect", "--format", address, name], capture_output=True, text=True, check=True
    ).stdout.strip()
    secret = _run([*base, "exec", "-T", "secrets", "cat", "/privnet/users/inspector.env"], env, 60)
    inspector = dict(line.split("=", 1) for line in secret.stdout.split())

    def login(**auth: str) -> bool:
        async def connect() -> None:
            async with aiomqtt.Client(host, 1883, timeout=10, **auth):
                pass

        try:
            asyncio.run(connect())
        except aiomqtt.MqttError:
            return False
        return True

    return {
        "anonymous": login(),
        "wrong password": login(username="inspector", password="guess"),
        "inspector": login(
            username=inspector["PRIVNET_MQTT_USERNAME"],
            password=inspector["PRIVNET_MQTT_PASSWORD"],
        ),
    }


def _networks(project: str) -> list[str]:
    label = f"label=com.docker.compose.project={project}"
    return subprocess.run(
        ["docker", "network", "ls", "--quiet", "--filter", label],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()


def _bridge(project: str) -> str:
    """The host interface of the project's network: Docker names it br-<network id[:12]>."""
    ids = _networks(project)
    assert len(ids) == 1, f"expected one network for {project}, got {ids}"
    return f"br-{ids[0][:12]}"


def _tear_down(base: list[str], env: dict[str, str], project: str) -> None:
    """`down -v`, then retry removing the network: Docker 20.10 can keep a stale endpoint for
    a moment after many containers go at once, and leaked networks use up address pools."""
    down = _run([*base, "down", "--volumes", "--remove-orphans"], env, 300)
    for _ in range(10):
        left = _networks(project)
        if not left:
            return
        subprocess.run(["docker", "network", "rm", *left], capture_output=True, check=False)
        time.sleep(1.0)
    warnings.warn(f"docker network of {project} not removed:\n{down.stdout[-2000:]}", stacklevel=1)


def test_compose_run_completes(compose_run: ComposeRun) -> None:
    tail = "\n".join(compose_run.log.splitlines()[-40:])
    code = compose_run.exit_code
    assert code == 0, f"`docker compose up --exit-code-from orchestrator` exited {code}:\n{tail}"
    summary = json.loads((compose_run.outputs / "summary.json").read_text())
    assert summary["config"]["agents"] == AGENTS
    assert summary["config"]["iters"] == ITERS
    (result,) = summary["results"]
    assert (result["strategy"], result["scheme"], result["engine"]) == (STRATEGY, SCHEME, "net")
    assert result["bytes"]["model"] > 0
    assert compose_run.agent_exit_codes == [0] * AGENTS, "every agent container exits 0 on Bye"
    # The operator sees the results in `up`'s own output: they are written before Bye, and
    # the first agent to leave ends compose's log stream.
    assert "wrote /app/runs/compose/: summary.json" in compose_run.log, tail


def test_compose_broker_refuses_anonymous_clients(compose_run: ComposeRun) -> None:
    """Compose runs with the run's credentials and ACL too: only known users get in."""
    assert compose_run.logins == {"anonymous": False, "wrong password": False, "inspector": True}


def test_compose_msd_equals_memory_engine(compose_run: ComposeRun, tmp_path: Path) -> None:
    """The containers compute what the in-process engine computes, round for round."""
    flags = ["--agents", str(AGENTS), "--strategy", STRATEGY, "--scheme", SCHEME]
    flags += ["--iters", str(ITERS), "--seed", str(SEED), "--repeats", "1"]
    assert main(["simulate", "--engine", "memory", *flags, "--out", str(tmp_path)]) == 0
    net = read_metrics(compose_run.outputs / "metrics.csv")
    memory = read_metrics(tmp_path / "metrics.csv")
    assert net.keys() == memory.keys() == {(STRATEGY, SCHEME)}
    net_centroid, net_avg = net[STRATEGY, SCHEME]
    mem_centroid, mem_avg = memory[STRATEGY, SCHEME]
    assert net_centroid.shape == (1, ITERS)
    np.testing.assert_allclose(net_centroid, mem_centroid, rtol=1e-9)
    np.testing.assert_allclose(net_avg, mem_avg, rtol=1e-9)


def test_compose_audit_finds_no_model_in_the_clear(compose_run: ComposeRun) -> None:
    """PRIVNET_AUDIT=yes: the orchestrator's tap saw every model masked, and the masks cancel."""
    report = json.loads((compose_run.outputs / "audit.json").read_text())
    (session,) = report["sessions"]
    assert session["scheme"] == SCHEME
    assert session["model_messages"] == session["expected_model_messages"] > 0
    assert session["plaintext_messages"] == 0
    assert session["max_cancellation_residual"]["max"] < 1e-9


def test_compose_bridge_capture_audits_like_the_live_tap(compose_run: ComposeRun) -> None:
    """What tcpdump saw on the compose bridge is what the orchestrator's tap recorded."""
    if compose_run.pcap is None:
        pytest.skip("needs tcpdump and tshark (apt-get install tcpdump tshark)")
    run = compose_run.outputs
    assert main(["inspect", "--run", str(run), "--pcap", str(compose_run.pcap)]) == 0
    live = json.loads((run / "audit.json").read_text())["sessions"]
    captured = json.loads((run / "audit-pcap.json").read_text())["sessions"]
    keys = ("model_messages", "key_messages", "plaintext_messages", "expected_model_messages")
    assert [{k: s[k] for k in keys} for s in captured] == [{k: s[k] for k in keys} for s in live]


# ---- an agent container killed mid-run and started again --------------------------------

FAULT_AGENTS, FAULT_ITERS, FAULT_DEADLINE = 10, 800, 3  # the run lasts past the rejoin
CHECKPOINT_EVERY = 25  # privnet run's default


def _wait_for(what: str, ready: Callable[[], object], timeout: float) -> None:
    end = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < end, f"no {what} within {timeout:.0f} s"
        time.sleep(0.2)


def _views(out: Path) -> list[dict[str, Any]]:
    """membership.json as the orchestrator streams it (replaced whole, atomically)."""
    path = out / "membership.json"
    return list(json.loads(path.read_text())) if path.exists() else []


def _rounds(out: Path) -> int:
    """Rounds in metrics.csv, which the orchestrator streams as every member completes one."""
    path = out / "metrics.csv"
    return len(path.read_text().splitlines()) - 1 if path.exists() else 0


def _victim(project: str, spare: set[int]) -> tuple[str, int]:
    """A running agent container, and the agent it claimed (in its claim memory,
    /tmp/privnet-claim.json), one of `spare`: whose loss leaves a connected graph."""
    labels = [f"label=com.docker.compose.{k}" for k in (f"project={project}", "service=agent")]
    ps = ["docker", "ps", "--quiet", "--filter", labels[0], "--filter", labels[1]]
    read = """sed -n 's/.*"agent": \\([0-9]*\\).*/\\1/p' /tmp/privnet-claim.json"""
    for container in subprocess.run(ps, capture_output=True, text=True, check=True).stdout.split():
        exec_ = ["docker", "exec", container, "sh", "-c", read]
        agent = int(subprocess.run(exec_, capture_output=True, text=True, check=True).stdout)
        if agent in spare:
            return container, agent
    raise AssertionError(f"no agent container of {project} runs an agent of {sorted(spare)}")


def test_compose_agent_killed_then_started_rejoins(tmp_path: Path) -> None:
    """One agent container killed mid-run, then started again: the orchestrator leaves it
    out after PRIVNET_DEADLINE s, it comes back with the claim it remembers and rejoins
    from its checkpoint, and the run completes. `docker kill` and `docker start` of that
    container (compose v1's `kill` and `start` take whole services). Detached: `up
    --exit-code-from` would stop every container as soon as the killed one exits."""
    need_docker()
    compose = compose_command()
    project = f"privnet-fault-{secrets.token_hex(4)}"
    config = ExperimentConfig(
        agents=FAULT_AGENTS,
        iters=FAULT_ITERS,
        strategies=(Strategy(STRATEGY),),
        schemes=(Scheme(SCHEME),),
        seed=SEED,
    )
    problem = Instance.build(config)
    spare = set(range(FAULT_AGENTS)) - set(nx.articulation_points(problem.graph))
    env = {
        **os.environ,
        "PRIVNET_AGENTS": str(FAULT_AGENTS),
        "PRIVNET_ITERS": str(FAULT_ITERS),
        "PRIVNET_SEED": str(SEED),
        "PRIVNET_STRATEGY": STRATEGY,
        "PRIVNET_SCHEME": SCHEME,
        "PRIVNET_RUN": project,
        "PRIVNET_RUNS": str(tmp_path),
        "PRIVNET_DEADLINE": str(FAULT_DEADLINE),
        "PRIVNET_IMAGE": f"privnet:{project}",  # this tree's code, whatever else builds
    }
    base = [*compose, "--project-name", project, "--file", str(ROOT / "docker-compose.yml")]
    out = tmp_path / "compose"
    try:
        build = _run([*base, "build"], env, BUILD_TIMEOUT)
        assert build.returncode == 0, f"image build failed:\n{build.stdout[-4000:]}"
        t0 = time.perf_counter()
        up = _run([*base, "up", "--detach"], env, 300)
        assert up.returncode == 0, f"`up --detach` failed:\n{up.stdout[-4000:]}"
        orchestrator = _run([*base, "ps", "--quiet", "orchestrator"], env, 60).stdout.strip()
        _wait_for("checkpoint", lambda: _rounds(out) > 2 * CHECKPOINT_EVERY, 120)
        container, victim = _victim(project, spare)
        t_kill = time.perf_counter()
        subprocess.run(["docker", "kill", container], capture_output=True, check=True)
        _wait_for(f"view without agent {victim}", lambda: len(_views(out)) > 1, 60)
        t_out = time.perf_counter()
        subprocess.run(["docker", "start", container], capture_output=True, check=True)
        _wait_for(f"view with agent {victim} back", lambda: len(_views(out)) > 2, 60)
        t_back = time.perf_counter()
        wait = ["docker", "wait", orchestrator]
        code = subprocess.run(wait, capture_output=True, text=True, timeout=RUN_TIMEOUT).stdout
        t_done = time.perf_counter()
        codes = _agent_exit_codes(project)
    finally:
        log = _run([*base, "logs", "--no-color", "orchestrator"], env, 60).stdout
        print("\n".join(line for line in log.splitlines() if "━" not in line))
        _tear_down(base, env, project)
        subprocess.run(["docker", "rmi", env["PRIVNET_IMAGE"]], capture_output=True, check=False)
    print(
        f"compose fault: up to the first round {t_kill - t0:.1f} s, kill -> left out "
        f"{t_out - t_kill:.1f} s, start -> back {t_back - t_out:.1f} s, back -> done "
        f"{t_done - t_back:.1f} s"
    )
    assert code.strip() == "0", f"the orchestrator exited {code.strip()}"
    assert codes == [0] * FAULT_AGENTS, "every agent, the one killed too, exits 0 on Bye"
    first, without, back, *more = _views(out)
    assert not more, f"views the one fault does not explain: {more}"
    assert without["reason"] == "lost"
    assert without["left"] == {str(victim): f"silent for {FAULT_DEADLINE} s"}
    assert victim not in without["members"]
    assert back["reason"] == "returned"
    assert back["members"] == first["members"] == list(range(FAULT_AGENTS))
    assert without["start"] < back["start"] <= FAULT_ITERS
    resumed = back["resume"][str(victim)]  # from its checkpoint in the container's /tmp
    assert 0 < resumed < without["start"] and resumed % CHECKPOINT_EVERY == 0
    membership = json.loads((out / "summary.json").read_text())["config"]["membership"]
    assert membership["views"] == 3
    left_out, came_back = membership["changes"]
    assert f"out: {victim} (silent for {FAULT_DEADLINE} s)" in left_out
    assert f"back: {victim} (from round {resumed})" in came_back
    missed = membership["missed_rounds"][f"{STRATEGY}/{SCHEME}/0"][str(victim)]
    assert missed >= back["start"] - without["start"]
    assert f"lost: agent {victim}: silent for {FAULT_DEADLINE} s" in log
    assert f"restarted: agent {victim}" in log
    # Every model reported, the rejoiner's from its return on, is the memory engine's replay
    # of membership.json (its last telemetry batch before the kill is lost with it).
    script = read_membership(out / "membership.json")
    (replayed,) = Network.build(session_plans(problem, session_list(config)), script=script).play()
    real = np.load(out / "models.npz")[replayed.label]
    have = ~np.isnan(real[..., 0])
    assert have[back["start"] - 1 :].all() and np.delete(have, victim, axis=1).all()
    gap = np.max(np.abs(real[have] - replayed.models[have])) / np.max(np.abs(real[have]))
    assert gap < 1e-9

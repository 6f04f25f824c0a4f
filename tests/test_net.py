"""The `net` engine end to end: real agent processes, a real broker, no mocks.

Each test runs under mosquitto and under the embedded amqtt broker (mosquitto missing: skip,
or fail when PRIVNET_REQUIRE_MOSQUITTO=1). Runs are small (6-10 agents, 20-100 rounds) and one
`privnet run` serves several sessions (strategy x scheme) with the same agent processes, so
the file fits a CI budget of about three minutes on two cores.
"""

import asyncio
import contextlib
import csv
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import msgpack
import numpy as np
import psutil
import pytest
from conftest import assert_private_run, insider_run, prepared
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from probes import load_summary, read_metrics

import privnet
from privnet.agent import topics, wire
from privnet.agent.control import Telemetry
from privnet.agent.messages import Model
from privnet.agent.process import checkpoint_path, load_checkpoint
from privnet.agent.protocol import PATIENCE, QOS_OF
from privnet.agent.spec import Scheme
from privnet.broker.credentials import INSPECTOR
from privnet.orchestrator.cli import main
from privnet.orchestrator.engines.memory import Network, results_curve
from privnet.orchestrator.engines.watch import read_membership
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_list, session_plans

pytestmark = pytest.mark.net

PRIVNET = [sys.executable, "-m", "privnet.orchestrator.cli", "run"]  # `privnet run` as a subprocess
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"

EQUIVALENCE = ["--agents", "10", "--iters", "20", "--seed", "11"]
# mosquitto runs every strategy x scheme; the embedded broker (slower) every scheme under ATC
COMBOS = {"mosquitto": ("all", "all"), "embedded": ("atc", "all")}


def privnet_argv(kind: str, *flags: str) -> list[str]:
    strategy, scheme = COMBOS[kind]
    return [*EQUIVALENCE, "--strategy", strategy, "--scheme", scheme, *flags]


@pytest.fixture(scope="module")
def net_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`privnet run` once per broker kind (cached): its --out directory."""
    done: dict[str, Path] = {}

    def run(kind: str) -> Path:
        if kind not in done:
            out = tmp_path_factory.mktemp(f"net-{kind}")
            assert main(["run", *privnet_argv(kind, "--broker", kind, "--out", str(out))]) == 0
            done[kind] = out
        return done[kind]

    return run


# ---- 1. the network computes what the in-memory engine computes ------------------------------


def test_net_run_equals_memory_engine(
    broker_kind: str, net_run: Callable[[str], Path], tmp_path: Path
) -> None:
    net = read_metrics(net_run(broker_kind) / "metrics.csv")
    argv = ["simulate", "--engine", "memory", *privnet_argv(broker_kind, "--out", str(tmp_path))]
    assert main(argv) == 0
    memory = read_metrics(tmp_path / "metrics.csv")
    strategies = 3 if COMBOS[broker_kind][0] == "all" else 1
    assert len(memory) == strategies * len(Scheme)
    assert net.keys() == memory.keys()
    for key, (centroid, average) in memory.items():
        assert centroid.shape == (1, 20)
        np.testing.assert_allclose(net[key][0], centroid, rtol=1e-9, err_msg=f"{key} centroid")
        np.testing.assert_allclose(net[key][1], average, rtol=1e-9, err_msg=f"{key} average")


@pytest.mark.parametrize("topology", ["regular:4", "exponential"])
def test_flat_degree_topologies_run_as_in_memory(
    needs_mosquitto: None, topology: str, tmp_path: Path
) -> None:
    """regular:K and exponential (issue 31) over mosquitto: the masked schemes' models are
    the memory engine's and the oracle's, bit for bit."""
    assert_masked_runs_replay(tmp_path, topology, agents=12, iters=15, seed=5)


def assert_masked_runs_replay(
    out: Path, topology: str, *, agents: int, iters: int, seed: int, audit: bool = False
) -> None:
    """`privnet run` of ATC local-ghp and masked-ghp on `topology` over mosquitto: its
    models are the memory engine's and the oracle's, bit for bit."""
    flags = ["--agents", str(agents), "--iters", str(iters), "--seed", str(seed)]
    flags += ["--topology", topology, "--strategy", "atc", "--scheme", "local-ghp,masked-ghp"]
    flags += ["--audit"] if audit else []
    assert main(["run", *flags, "--broker", "mosquitto", "--out", str(out)]) == 0
    net = np.load(out / "models.npz")
    exp = privnet.Experiment(
        agents=agents, iters=iters, seed=seed, topology=topology, strategies="atc",
        schemes="local-ghp,masked-ghp",
    )  # fmt: skip
    assert sorted(net.keys()) == ["atc/local-ghp/0", "atc/masked-ghp/0"]
    for engine in ("memory", "oracle"):
        replayed = privnet.simulate(exp, engine).models
        assert replayed.keys() == set(net.keys())
        for key, models in replayed.items():
            np.testing.assert_array_equal(net[key], models, err_msg=f"{topology} {engine} {key}")


@pytest.mark.parametrize("topology", ["one-peer-exponential", "random-matching:2"])
def test_time_varying_topologies_run_as_in_memory(
    needs_mosquitto: None, topology: str, tmp_path: Path
) -> None:
    """A graph a round (issue 31): every agent expands the schedule itself, keys its union
    once and masks per round; over mosquitto the masked schemes' models are the memory
    engine's and the oracle's, bit for bit, and the audit finds every round's hubs clean."""
    assert_masked_runs_replay(tmp_path, topology, agents=9, iters=8, seed=4, audit=True)
    # No round stalled: a peer rounds ahead (it met others since) is held, not refused.
    views = json.loads((tmp_path / "membership.json").read_text())
    assert [v["reason"] for v in views] == ["start", "start"]
    for s in json.loads((tmp_path / "audit.json").read_text())["sessions"]:
        assert s["model_messages"] == s["expected_model_messages"] > 0
        assert s["plaintext_messages"] == s["unmatched"] == 0
        resid = s["max_cancellation_residual"]
        assert resid["max"] == 0 and resid["hub_rounds_checked"] > 0


def test_u4_wire_runs_as_in_memory_at_4_bytes_a_parameter(
    needs_mosquitto: None, tmp_path: Path
) -> None:
    """--wire-dtype u4 over mosquitto, a model of 23k parameters (2 chunks): the models are
    the memory engine's bit for bit and the oracle's (masked: bit for bit; none: to the
    lattice's rounding), and a model frame costs at most 4.05 bytes a parameter."""
    settings: dict[str, Any] = {
        "agents": 6, "iters": 3, "seed": 5, "strategies": "atc",
        "schemes": "none,local-ghp,masked-ghp", "problem": "mlp", "dataset": "digits",
        "params": {"hidden": [300]}, "mu": 0.05, "wire_dtype": "u4", "topology": "regular:2",
    }  # fmt: skip
    exp = privnet.Experiment(**settings, broker="mosquitto", out=tmp_path)
    privnet.run(exp)
    net = np.load(tmp_path / "models.npz")
    memory = privnet.simulate(privnet.Experiment(**settings), "memory").models
    oracle = privnet.simulate(privnet.Experiment(**settings), "oracle").models
    for key, models in memory.items():
        np.testing.assert_array_equal(net[key], models, err_msg=f"memory {key}")
        np.testing.assert_allclose(net[key], oracle[key], rtol=0, atol=1e-9, err_msg=key)
    for record in load_summary(tmp_path / "summary.json")["results"]:
        assert record["wire_dtype"] == "u4" and record["params"] == 22_810
        assert record["model_frames_per_round"] == 2 * 6  # ring of 6: two out-links each
        assert 4.0 < record["bytes_per_param_per_model_frame"] <= 4.05, record["scheme"]


def test_local_steps_run_as_in_memory(needs_mosquitto: None, tmp_path: Path) -> None:
    """--local-steps 2 (issue 29) over mosquitto, minibatches of 10: every agent's two local
    steps a round give the memory engine's models bit for bit and the oracle's to 1e-12,
    and they are not one step's."""
    settings: dict[str, Any] = {
        "agents": 6, "iters": 8, "seed": 3, "strategies": "atc", "schemes": "none,local-ghp",
        "batch": 10, "mu": 0.2, "local_steps": 2, "topology": "regular:2",
    }  # fmt: skip
    privnet.run(privnet.Experiment(**settings, broker="mosquitto", out=tmp_path))
    net = np.load(tmp_path / "models.npz")
    memory = privnet.simulate(privnet.Experiment(**settings), "memory").models
    oracle = privnet.simulate(privnet.Experiment(**settings), "oracle").models
    one = privnet.simulate(privnet.Experiment(**settings | {"local_steps": 1}), "memory").models
    assert sorted(net.keys()) == sorted(memory) == ["atc/local-ghp/0", "atc/none/0"]
    for key, models in memory.items():
        np.testing.assert_array_equal(net[key], models, err_msg=f"memory {key}")
        np.testing.assert_allclose(net[key], oracle[key], rtol=0, atol=1e-12, err_msg=key)
        assert np.abs(net[key][-1] - one[key][-1]).max() > 1e-3
    for record in load_summary(tmp_path / "summary.json")["results"]:
        assert record["local_steps"] == 2


# ---- 2. what the agents count against what mosquitto counts ----------------------------------

PUBACK = 4  # bytes of an MQTT 3.1.1 PUBACK: what a QoS-1 subscriber returns per delivery
# Bookkeeping no party counts as traffic: CONNECT, SUBSCRIBEs and UNSUBSCRIBEs, the closing
# probe (a PUBLISH of ~70 B and its PUBACK), DISCONNECT, PINGREQs.
PER_CLIENT = 512


def not_counted_by_agents(summary: dict[str, Any]) -> tuple[int, int]:
    """PUBLISH bytes and QoS-1 deliveries outside the agents' session counts: what the
    orchestrator published before the counters were read (Welcome, Setups, Go, Close), as
    the conductor tallied it, and how many deliveries that made, plus the agents' Left."""
    orchestrator = summary["config"]["orchestrator"]
    published = orchestrator["published_bytes"] + orchestrator["agents_left_bytes"]
    deliveries = orchestrator["deliveries_of_published"] + orchestrator["agents_left_messages"]
    return published, deliveries


@pytest.mark.usefixtures("needs_mosquitto")
def test_agent_byte_counts_match_mosquitto_sys(net_run: Callable[[str], Path]) -> None:
    """$SYS bytes_received = what the agents count (every PUBLISH of theirs, Hellos charged
    to the first session) + what the orchestrator publishes + a PUBACK per QoS-1 delivery
    (an agent's message has exactly one subscriber; models go at QoS 0, without one) +
    per-client bookkeeping."""
    summary = load_summary(net_run("mosquitto") / "summary.json")
    received = summary["config"]["broker_sys"]["bytes_received"]
    results = summary["results"]
    sent = sum(sum(r["bytes"].values()) for r in results)
    messages = sum(n for r in results for c, n in r["messages"].items() if QOS_OF[c])  # QoS 1
    others, deliveries = not_counted_by_agents(summary)
    explained = sent + others + PUBACK * (messages + deliveries)
    clients = summary["config"]["agents"] + 3  # the orchestrator and two $SYS readers
    print(
        f"\nagent PUBLISH bytes {sent} / $SYS bytes_received {received} = {sent / received:.4f}; "
        f"orchestrator {others}, PUBACKs {PUBACK * (messages + deliveries)}, "
        f"unexplained {received - explained} (bound {PER_CLIENT * clients})"
    )
    assert 0 <= received - explained <= PER_CLIENT * clients


# ---- 3. an attacker on the wire changes nothing but the rejection counters -------------------


ATTACK = ["--agents", "6", "--iters", "400", "--seed", "5", "--strategy", "atc", "--scheme", "ghp"]
EXPECTED_REJECTIONS = {"malformed": 1, "oversized": 1, "bad-seal": 4, "replay": 1, "spoofed": 1}
# 400 rounds: the run must outlast the injection (frames after Left are never delivered)


def peek(payload: bytes) -> tuple[str, dict[str, Any]]:
    """Type and clear head of a sealed peer frame, read as any eavesdropper can: who, to
    whom, which view, round and step; the model stays in the sealed box."""
    _, name, head, _ = msgpack.unpackb(payload)
    return name, msgpack.unpackb(head)


def target() -> tuple[int, int, int]:
    """The victim (the first agent with two in-neighbours besides itself) and those two: m,
    whose operator injects into the victim's inbox, and another."""
    config = ExperimentConfig(agents=6, iters=400, strategies=("atc",), schemes=("ghp",), seed=5)
    a = Instance.build(config).A
    for k in range(len(a)):
        senders = [m for m in range(len(a)) if m != k and a[m, k] > 0]
        if len(senders) >= 2:
            return k, senders[0], senders[1]
    raise AssertionError("no agent has two in-neighbours")


Captured = dict[int, tuple[str, bytes, dict[str, Any]]]  # sender -> (topic, payload, body)


async def eavesdrop(
    client: aiomqtt.Client, victim: int, senders: tuple[int, int]
) -> tuple[int, Captured]:
    """Record the round-1 models `senders` send the victim until it reports round 2 or later.

    Returns the round it is in, and those messages by sender.
    """
    captured: Captured = {}
    async for message in client.messages:
        topic, payload = message.topic.value, bytes(message.payload)  # type: ignore[arg-type]
        peer = topics.parse_peer_topic(topic)
        if peer is not None:
            name, body = peek(payload)
            if name == "model" and body["i"] == 1 and peer[1] == victim:
                captured[peer[2]] = (topic, payload, body)
            continue
        report = wire.decode_signed(payload).msg  # signed, not secret
        assert isinstance(report, Telemetry)
        if report.agent == victim and report.round >= 2 and set(senders) <= captured.keys():
            return report.round + 1, captured
    raise AssertionError("the subscription ended before the run reached round 2")


def attacks(
    run: str, victim: int, m: int, other: int, now: int, captured: Captured
) -> list[tuple[str, bytes]]:
    """What m's operator publishes into the victim's inbox as m, in EXPECTED_REJECTIONS
    order (`other`: another of the victim's neighbours)."""
    topic, replay, body = captured[m]
    step, wrong_key = body["j"], ChaCha20Poly1305(secrets.token_bytes(32))

    ahead = now + 10**9  # past any place the victim's link has taken: the seal is checked

    def forged(vector: list[float]) -> bytes:
        model = Model(sender=m, receiver=victim, round=ahead, step=step, vector=np.array(vector))
        return wire.seal_peer(model, wrong_key, run)

    _, name, head, box = msgpack.unpackb(replay)
    head = msgpack.packb(msgpack.unpackb(head) | {"i": ahead})
    tampered = msgpack.packb([wire.VERSION, name, head, box])
    return [
        (topic, b"\xc1 this is not msgpack"),  # malformed
        (topic, b"\x00" * (wire.MAX_PEER_BYTES + 1)),  # oversized
        (topic, forged([float("nan"), 0.0])),  # bad-seal: NaN never gets past the seal
        (topic, forged([1.0, 2.0, 3.0])),  # bad-seal: nor does a wrong shape
        (topic, replay),  # replay: a real round-1 frame, replayed later
        (topic, captured[other][1]),  # spoofed: another neighbour's frame on m's topic
        (topic, forged([0.5, -0.5])),  # bad-seal: right topic and sender, wrong key
        (topic, tampered),  # bad-seal: the real frame's round changed in its clear head
    ]


async def test_injected_messages_are_counted_and_change_nothing(
    broker_kind: str, tmp_path: Path
) -> None:
    """The broker operator reads everything (the inspector's view); the operator of one of
    the victim's neighbours, m, injects into the victim's inbox over m's own connection (its
    credentials have one at a time: a second would displace m)."""
    run = f"attack-{broker_kind}"
    victim, m, other = target()
    async with (
        prepared(broker_kind, run, 6, tmp_path) as setup,
        setup.client(INSPECTOR) as operator,
    ):
        await operator.subscribe(f"{topics.PREFIX}/{run}/to/+/from/+", qos=1)
        await operator.subscribe(f"{topics.PREFIX}/{run}/telemetry/+", qos=1)
        async with insider_run(setup, tmp_path, m, ATTACK) as attack:
            async with asyncio.timeout(60):
                now, captured = await eavesdrop(operator, victim, (m, other))
            for topic, payload in attacks(run, victim, m, other, now, captured):
                attack.insider.publish(topic, payload, 1)
            assert attack.privnet.poll() is None, "the run ended before the injection"
            code = await asyncio.to_thread(attack.privnet.wait, 120)
    assert code == 0, (tmp_path / "privnet.err").read_text()
    (result,) = load_summary(tmp_path / "summary.json")["results"]
    assert result["rejected"] == EXPECTED_REJECTIONS
    clean = tmp_path / "memory"
    assert main(["simulate", "--engine", "memory", *ATTACK, "--out", str(clean)]) == 0
    attacked, expected = read_metrics(tmp_path / "metrics.csv"), read_metrics(clean / "metrics.csv")
    assert attacked.keys() == expected.keys() == {("atc", "ghp")}
    for key in expected:
        np.testing.assert_array_equal(attacked[key], expected[key])


# ---- 4, 5. a dead agent or a Ctrl-C ends the run, and nothing is left behind -----------------

LONG_RUN = ["--agents", "6", "--iters", "5000", "--deadline", "10", "--strategy", "atc"]


def start_privnet(broker: str, out: Path, *flags: str) -> subprocess.Popen[bytes]:
    """`privnet run` in its own process group (as a shell's foreground job), stderr to a file."""
    with (out / "privnet.err").open("w") as err:
        return subprocess.Popen(
            [*PRIVNET, *LONG_RUN, "--broker", broker, "--out", str(out), *flags],
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "400"},
        )


def wait_for_rounds(privnet: subprocess.Popen[bytes], out: Path) -> list[psutil.Process]:
    """Block until the agents registered and rounds run; the run's processes (broker, agents)."""
    deadline = time.monotonic() + 60
    while "agents registered" not in (out / "privnet.err").read_text():
        assert privnet.poll() is None, (out / "privnet.err").read_text()
        assert time.monotonic() < deadline, "the agents did not register within 60 s"
        time.sleep(0.1)
    time.sleep(1.0)  # a few rounds in
    return psutil.Process(privnet.pid).children(recursive=True)


def alive(procs: list[psutil.Process]) -> list[str]:
    return [
        " ".join(p.cmdline())
        for p in procs
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]


@contextlib.contextmanager
def stopped(privnet: subprocess.Popen[bytes]) -> Iterator[None]:
    """Whatever happens in the test, no process of this run outlives it."""
    try:
        yield
    finally:
        if privnet.poll() is None:
            family = psutil.Process(privnet.pid).children(recursive=True)
            privnet.kill()
            privnet.wait()
            for proc in family:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()


def agent_process(procs: list[psutil.Process], agent: int) -> psutil.Process:
    def is_agent(cmd: list[str]) -> bool:
        return "-m" in cmd and cmd[cmd.index("-m") + 1] == "privnet.agent"

    (proc,) = [
        p
        for p in procs
        if is_agent(cmd := p.cmdline()) and cmd[cmd.index("--id") + 1] == str(agent)
    ]
    return proc


async def flood(attacker: aiomqtt.Client, topic: str, privnet: subprocess.Popen[bytes]) -> int:
    """Publish junk on `topic` every 50 ms until privnet exits; how many went out."""
    sent = 0
    with contextlib.suppress(aiomqtt.MqttError):  # the run may end first
        while privnet.poll() is None:
            await attacker.publish(topic, b"junk")
            sent += 1
            await asyncio.sleep(0.05)
    return sent


async def test_a_killed_agent_is_left_out_and_the_run_completes(
    broker_kind: str, tmp_path: Path
) -> None:
    """SIGKILL one agent mid-run, then an attacker with agent 3's credentials floods agent
    3's upward topic with junk: the run goes on without it under a new membership view,
    completes, names it in membership.json, and its survivors' models equal the memory
    engine's replay of that file; nothing is left running."""
    run = f"kill-{broker_kind}"
    async with prepared(broker_kind, run, 6, tmp_path) as setup:
        privnet = start_privnet(
            str(setup.broker.address),
            tmp_path,
            "--prepared",
            str(setup.run_json),
            *("--iters", "4000", "--scheme", "local-ghp", "--seed", "5"),
        )
        with stopped(privnet):
            family = await asyncio.to_thread(wait_for_rounds, privnet, tmp_path)
            killed = agent_process(family, 3)
            killed.send_signal(signal.SIGKILL)
            await asyncio.to_thread(killed.wait, 10)
            # Its credentials now: while agent 3 lived, they would only have displaced it.
            async with setup.client("3") as attacker:
                junk = asyncio.create_task(flood(attacker, topics.ctl_up(run, 3), privnet))
                code = await asyncio.to_thread(privnet.wait, 60)
                junked = await junk
    stderr = (tmp_path / "privnet.err").read_text()
    assert code == 0, stderr
    assert junked >= 5
    views = read_membership(tmp_path / "membership.json")
    assert [sorted(v.left) for v in views] == [[], [3]], views
    assert "killed by SIGKILL" in views[1].left[3]
    assert 3 not in views[1].members and views[1].start > 1
    assert alive(family) == []
    config = ExperimentConfig(
        agents=6, iters=4000, strategies=("atc",), schemes=("local-ghp",), seed=5
    )
    problem = Instance.build(config)
    (replayed,) = Network.build(session_plans(problem, session_list(config)), script=views).play()
    real = np.load(tmp_path / "models.npz")[replayed.label]
    have = ~np.isnan(real[..., 0])
    assert have[:, [0, 1, 2, 4, 5]].all()  # every survivor reported every round
    gap = np.max(np.abs(real[have] - replayed.models[have])) / np.max(np.abs(real[have]))
    assert gap < 1e-9


def test_a_run_keeps_its_secrets_to_itself_and_logs_what_agents_did(
    broker_kind: str,
    net_run: Callable[[str], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The permissions walk over a run's directory (`conftest.assert_private_run`), one with
    a secret seed too: kept in secrets.json, nowhere others may read it; each agent's log
    says what it did at INFO, the default; the console (a pipe here) says when set-up
    phases ended and ends each progress line on its session's last round."""
    assert_private_run(net_run(broker_kind))
    capsys.readouterr()  # the fixture's run
    flags = ["--agents", "4", "--iters", "12", "--scheme", "none,local-ghp"]
    assert main(["run", *flags, "--broker", broker_kind, "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "connected at" in err and "4 agents registered at" in err, err
    bars = [line for line in err.splitlines() if line.startswith("atc/")]
    assert len(bars) == 2 and all(" 12/12 " in b and "set-up" in b for b in bars), bars
    metrics = read_metrics(tmp_path / "metrics.csv").values()
    for bar, (centroid, _) in zip(bars, metrics, strict=True):
        assert f"MSD {10 * np.log10(centroid[0, -1]):.2f} dB" in bar  # the last round's
        assert len(bar) <= 80 and "…" not in bar
    assert_private_run(tmp_path)
    seed = json.loads((tmp_path / "secrets.json").read_text())["seed"]
    assert load_summary(tmp_path / "summary.json")["config"]["seed"] == "secrets.json" != seed
    log = (tmp_path / "logs" / "agent-2.log").read_text()
    for did in ("registered", "configured session 1", "keyed", "finished session 1", "left"):
        assert f"agent 2 {did}" in log, log


def test_ctrl_c_stops_everything(broker_kind: str, tmp_path: Path) -> None:
    privnet = start_privnet(broker_kind, tmp_path)
    with stopped(privnet):
        family = wait_for_rounds(privnet, tmp_path)
        os.killpg(privnet.pid, signal.SIGINT)
        code = privnet.wait(timeout=30)
    assert code == 130, (tmp_path / "privnet.err").read_text()
    assert "interrupted" in (tmp_path / "privnet.err").read_text()
    assert alive(family) == []


def test_sigterm_at_random_times_stops_the_run_at_once(tmp_path: Path) -> None:
    """SIGTERM to the orchestrator at 5 random times (start-up, registration, rounds):
    every run exits 143 promptly, leaves no process behind and leaves its outputs whole
    (`scripts/stop_demo.py`, which reports the 20-run figures). The signal is taken on the
    event loop, never raised inside a protocol callback: it once landed in the transport's
    read callback, and the run reconnected and went on to the end."""
    report = tmp_path / "stops.json"
    command = [sys.executable, str(SCRIPTS / "stop_demo.py"), "--runs", "5", "--window", "6"]
    command += ["--within", "2", "--seed", "14", "--out", str(tmp_path), "--json", str(report)]
    done = subprocess.run([*command, "--", "--agents", "6"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    stops = json.loads(report.read_text())
    assert [s["code"] for s in stops] == [143] * 5 and not any(s["left"] for s in stops)


def test_sigint_stops_a_run_started_in_the_background(tmp_path: Path) -> None:
    """`privnet run &` in a script starts with SIGINT ignored (POSIX, for asynchronous
    lists without job control); `kill -INT` still stops it, with 130."""
    script = f"{' '.join(PRIVNET)} {' '.join(LONG_RUN)} --out {tmp_path} 2>{tmp_path}/err & "
    script += f"echo $! > {tmp_path}/pid; wait $!"
    shell = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    try:
        err = tmp_path / "err"
        while not err.exists() or "agents registered" not in err.read_text():
            assert shell.poll() is None, err.read_text()
            time.sleep(0.1)
        time.sleep(1.0)  # a few rounds in
        pid = int((tmp_path / "pid").read_text())
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        family = psutil.Process(pid).children(recursive=True)
        os.kill(pid, signal.SIGINT)
        code = shell.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
    assert code == 130, (tmp_path / "err").read_text()
    assert alive(family) == []


def test_a_killed_orchestrator_leaves_no_agent_running(broker_kind: str, tmp_path: Path) -> None:
    """SIGKILL the orchestrator mid-run: its Beats stop, and every agent stops within
    PATIENCE deadlines (10 s each): its neighbours still talking make it wait past one.
    The broker, a child the SIGKILL leaves behind, is stopped here whatever happens."""
    privnet = start_privnet(broker_kind, tmp_path)
    family: list[psutil.Process] = []
    try:
        family = wait_for_rounds(privnet, tmp_path)
        agents = [p for p in family if "privnet.agent" in p.cmdline()]
        assert len(agents) == 6
        privnet.kill()
        killed = time.monotonic()
        gone, left = psutil.wait_procs(agents, timeout=PATIENCE * 10 + 15)
        took = time.monotonic() - killed
    finally:
        privnet.kill()
        for proc in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
    assert left == [], f"still running {took:.0f} s after the orchestrator died: {alive(left)}"
    assert took <= PATIENCE * 10.0 + 5.0, f"the agents took {took:.1f} s; the deadline is 10 s"
    assert len(gone) == 6
    logs = [(tmp_path / "logs" / f"agent-{p}.log").read_text() for p in range(6)]
    assert all("orchestrator has been silent" in log for log in logs), logs[0]


def test_a_run_whose_orchestrator_died_resumes(tmp_path: Path) -> None:
    """SIGKILL the orchestrator mid-run: metrics.csv already holds every round all agents
    completed. The agents run on, checkpointing, until their deadline (3 s); `privnet run
    --resume` rewinds them to their latest checkpoint that the first run recorded, so no
    round goes without a model (before, the rounds they ran on alone had none: NaN rows),
    and the resumed session's bytes and rounds/s cover the rounds the resumed run did."""
    flags = ("--iters", "3000", "--checkpoint-every", "50", "--seed", "3", "--deadline", "3")
    privnet = start_privnet("mosquitto", tmp_path, *flags)
    family: list[psutil.Process] = []
    try:
        family = wait_for_rounds(privnet, tmp_path)
        time.sleep(1.0)
        privnet.kill()
        psutil.wait_procs([p for p in family if "privnet.agent" in p.cmdline()], timeout=30)
    finally:
        for proc in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
    with (tmp_path / "metrics.csv").open() as fh:
        streamed = [int(row[3]) for row in list(csv.reader(fh))[1:]]
    assert streamed and streamed == list(range(1, len(streamed) + 1))
    held = [load_checkpoint(checkpoint_path(tmp_path / "checkpoints", p)) for p in range(6)]
    ran_on = min(max(c.models) for c in held if c is not None)
    assert ran_on > len(streamed) + 50, "the agents did not outlive their orchestrator"
    resumed = subprocess.run(
        [*PRIVNET, "--resume", str(tmp_path), "--broker", "mosquitto", "--deadline", "10"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_private_run(tmp_path, "privnet.err")
    assert "Mean of empty slice" not in resumed.stderr
    (view,) = read_membership(tmp_path / "membership.json")
    assert view.reason == "resumed" and len(streamed) - 50 < view.start <= len(streamed) + 1
    ((centroid, average),) = read_metrics(tmp_path / "metrics.csv").values()
    assert centroid.shape == (1, 3000) and not np.isnan(average).any()
    models = np.load(tmp_path / "models.npz")["atc/local-ghp/0"]
    assert not np.isnan(models).any()  # every agent's model after every round
    (record,) = load_summary(tmp_path / "summary.json")["results"]
    counted = 3000 - (view.start - 1)
    assert record["rounds_counted"] == counted
    assert record["rounds_per_s"] == pytest.approx(counted / record["wall_s"])
    # The peer plane sends as many frames every round: per round as many as in memory.
    config = ExperimentConfig(
        agents=6, iters=20, strategies=("atc",), schemes=("local-ghp",), seed=3
    )
    problem = Instance.build(config)
    (whole,) = Network.build(session_plans(problem, session_list(config))).play()
    memory = results_curve(problem, "atc", "local-ghp", [whole]).extra
    assert record["messages"]["model"] / counted == memory["messages"]["model"] / 20
    assert record["bytes_per_round"] * counted == pytest.approx(
        sum(n for kind, n in record["bytes"].items() if kind != "control")
    )

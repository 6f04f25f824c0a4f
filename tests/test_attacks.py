"""Attacks on a real run (real broker with the run's credentials and ACL, real processes).

- Agent 3's operator (agent 3 runs in the test, over the one connection its credentials
  allow) forges every control frame type and replays the genuine frames agent 3 reads, on
  every topic agent 3 may write: the run's result does not change, each frame is counted
  under a reason, no telemetry goes astray.
- An insider with agent 3's credentials connecting under every other party's client id:
  only agent 3 can be displaced; nobody else loses the broker, the result does not change.
- 10,000 hostile frames into the agents' inboxes during a run: no crash, identical MSD,
  every delivery counted.
- A passive recording of a whole run (every packet, Setups included) lets an eavesdropper
  who knows the code and the public configuration rebuild no model.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np
import pytest
from conftest import insider_run, need_mosquitto, prepared, relay
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from probes import load_summary, read_metrics

from privnet.agent import control, keys, topics, wire
from privnet.agent.messages import Model, Rejected
from privnet.broker.credentials import INSPECTOR
from privnet.orchestrator import audit
from privnet.orchestrator.cli import main
from privnet.orchestrator.engines.memory import run_session
from privnet.orchestrator.experiment.instance import Instance

pytestmark = pytest.mark.net

PRIVNET = [sys.executable, "-m", "privnet.orchestrator.cli", "run"]
ATTACKER = 3
REL = 1e-9


async def watch(operator: aiomqtt.Client, run: str) -> None:
    """The operator reads the agents' telemetry, and what agent 3 reads of the orchestrator's
    frames (the inspector reads all of the run)."""
    await operator.subscribe(f"{topics.PREFIX}/{run}/telemetry/+", qos=1)
    await operator.subscribe(topics.ctl_down(run, ATTACKER), qos=1)
    await operator.subscribe(topics.ctl_down(run, "all"), qos=1)


async def wait_until_running(
    operator: aiomqtt.Client, rounds: int, down: list[bytes] | None = None
) -> None:
    """Until some agent's telemetry says it is `rounds` rounds in (`watch` first); the
    orchestrator's frames agent 3 reads meanwhile go to `down`."""
    async for message in operator.messages:
        payload = bytes(message.payload)  # type: ignore[arg-type]
        frame = wire.decode_signed(payload)
        if isinstance(frame.msg, control.Telemetry):
            if frame.msg.round >= rounds:
                return
        elif down is not None:
            down.append(payload)


def assert_same_as_memory(out: Path, flags: list[str]) -> None:
    clean = out / "memory"
    assert main(["simulate", "--engine", "memory", *flags, "--out", str(clean)]) == 0
    got, want = read_metrics(out / "metrics.csv"), read_metrics(clean / "metrics.csv")
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(got[key][0], want[key][0], rtol=REL, err_msg=str(key))
        np.testing.assert_allclose(got[key][1], want[key][1], rtol=REL, err_msg=str(key))


def rejected_by_agents(summary: dict[str, Any]) -> int:
    """Everything the agents dropped: per session, and after their last Finished."""
    after = summary["config"]["orchestrator"]["agents_rejected_after_finish"]
    return sum(sum(r["rejected"].values()) for r in summary["results"]) + sum(after.values())


# ---- an outsider with agent 3's credentials -----------------------------------------------

FORGE = ["--agents", "6", "--iters", "300", "--seed", "7", "--strategy", "atc"]


def forged_frames(run: str, agents: int) -> list[bytes]:
    """Every control frame type, signed by a key that is not the run's."""
    stranger = keys.Identity.generate()
    identity = stranger.public.to_bytes()
    messages: list[control.Control] = [
        control.Hello(ATTACKER, identity, bytes(32)),
        control.Ready(ATTACKER, 0, 0),
        control.Telemetry(ATTACKER, 0, 0, 5, keys.seal(stranger.public.static, b"x", b"y")),
        control.Finished(ATTACKER, 0, 0, {}, {}, {}, 0.0),
        control.Failed(ATTACKER, "forged"),
        control.Progress(ATTACKER, 0, 0, 5, True, ()),
        control.Rejoin(ATTACKER, 0, (0,)),
        control.Welcome(ATTACKER, rejoin=True),
        control.Setup(ATTACKER, 1, 0, bytes(64)),
        control.Go(0, 0, 300),
        control.Hold(0, 1),
        control.Excluded(ATTACKER, 0, 1),
        control.Abort("forged"),
        control.Bye(),
    ]
    other_run = [wire.encode_signed(m, f"{run}-other", 10**6, stranger) for m in messages[:3]]
    return [wire.encode_signed(m, run, 10**6, stranger) for m in messages] + other_run


@pytest.mark.parametrize("kind", ["mosquitto", "embedded"])
async def test_agent3s_operator_forges_every_control_frame(kind: str, tmp_path: Path) -> None:
    """Agent 3's operator, running agent 3 with its credentials (one connection: a second
    would displace the agent), also publishes forged and replayed control frames on every
    topic agent 3 may write, and where it may not."""
    run = f"forge-{kind}"
    flags = [*FORGE, "--scheme", "local-ghp"]
    genuine: list[bytes] = []  # what agent 3 reads of the orchestrator's frames: to replay
    async with prepared(kind, run, 6, tmp_path) as setup, setup.client(INSPECTOR) as operator:
        await watch(operator, run)
        async with insider_run(setup, tmp_path, ATTACKER, flags) as attack:
            async with asyncio.timeout(60):
                await wait_until_running(operator, 20, genuine)
            frames = forged_frames(run, 6) + genuine
            writable = [topics.ctl_up(run, ATTACKER), topics.telemetry(run, ATTACKER)]
            inboxes = [topics.peer_topic(run, k, ATTACKER) for k in range(6) if k != ATTACKER]
            for topic in writable + inboxes:
                for frame in frames:
                    attack.insider.publish(topic, frame, 1)
            # Where agent 3 may not write: the broker drops these (never delivered).
            for topic in (topics.ctl_down(run, "all"), topics.ctl_up(run, 4)):
                attack.insider.publish(topic, frames[0], 1)
            assert attack.privnet.poll() is None, "the run ended before the forgeries"
            code = await asyncio.to_thread(attack.privnet.wait, 120)
    assert code == 0, (tmp_path / "privnet.err").read_text()
    assert genuine, "agent 3 read no orchestrator frame to replay"
    summary = load_summary(tmp_path / "summary.json")
    orchestrator = summary["config"]["orchestrator"]
    sent_up = 2 * len(frames)
    assert orchestrator["received"] - orchestrator["used"] == sent_up
    assert sum(orchestrator["rejected"].values()) == sent_up
    assert "bad-seal" not in orchestrator["rejected"]  # no telemetry it could not open
    assert rejected_by_agents(summary) == len(inboxes) * len(frames)
    assert_same_as_memory(tmp_path, flags)


# ---- an insider under everyone's client ids ------------------------------------------------

INSIDER = ["--agents", "6", "--iters", "600", "--seed", "4", "--strategy", "atc", "--scheme", "ghp"]


@pytest.mark.parametrize("kind", ["mosquitto", "embedded"])
async def test_an_insider_under_every_partys_client_id_changes_nothing(
    kind: str, tmp_path: Path
) -> None:
    """Agent 3's credentials, connecting again and again under every other party's client id
    (as the wire shows it, and by name), with the right password and a wrong one: each
    valid connect gets agent 3's own id and can only displace agent 3 itself. Nobody else
    ever loses the broker, and the run completes with the memory engine's result (agent 3's
    lost frames only stall rounds, which are redone)."""
    if kind == "mosquitto":
        need_mosquitto()
    run = f"insider-{kind}"
    async with (
        prepared(kind, run, 6, tmp_path) as setup,
        relay(setup.broker.address) as wire,
    ):
        with (tmp_path / "privnet.err").open("w") as err:
            where = ["--broker", str(wire.address), "--prepared", str(setup.run_json)]
            privnet = subprocess.Popen(
                [*PRIVNET, *INSIDER, "--deadline", "2", *where, "--out", str(tmp_path)],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        try:
            async with setup.client(INSPECTOR) as operator, asyncio.timeout(60):
                await watch(operator, run)
                await wait_until_running(operator, 20)
            address, own = setup.broker.address, setup.broker.access(str(ATTACKER))
            connects = 0
            for identifier in wire.others(str(ATTACKER)):
                for password in (own.password, "wrong"):
                    with contextlib.suppress(aiomqtt.MqttError):
                        async with aiomqtt.Client(
                            address.host,
                            address.port,
                            username=own.username,
                            password=password,
                            identifier=identifier,
                        ):
                            connects += 1
            assert privnet.poll() is None, "the run ended before the insider: more rounds"
            code = await asyncio.to_thread(privnet.wait, 120)
        finally:
            if privnet.poll() is None:
                privnet.kill()
    assert code == 0, (tmp_path / "privnet.err").read_text()
    assert connects >= 12  # 6 parties, each by name and by the id the wire showed
    summary = load_summary(tmp_path / "summary.json")
    assert summary["config"]["broker_outages"]["losses"] == 0, "the orchestrator was displaced"
    for p in (0, 1, 2, 4, 5):
        log = (tmp_path / "logs" / f"agent-{p}.log").read_text()
        assert "lost the broker" not in log, f"agent {p} was displaced"
    assert_same_as_memory(tmp_path, INSIDER)


# ---- 10,000 hostile frames ------------------------------------------------------------------

# Long enough that the flood is over well before the run (the assertion below checks).
FLOOD = ["--agents", "6", "--iters", "4000", "--seed", "8", "--strategy", "atc", "--scheme", "ghp"]
HOSTILE = 10_000


def hostile(run: str, n: int, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    """Junk of every kind agent 3 can put in the other agents' inboxes."""
    out = []
    for i in range(n):
        k = int(rng.choice([p for p in range(6) if p != ATTACKER]))
        kind = i % 5
        if kind == 0:
            payload = rng.bytes(int(rng.integers(1, 200)))
        elif kind == 1:  # sealed under a key that is not the link's: NaN, or a later view
            model = Model(ATTACKER, k, i, 2, np.array([np.nan, 1.0]), view=i % 2)
            payload = wire.seal_peer(model, ChaCha20Poly1305(secrets.token_bytes(32)), run)
        elif kind == 2:
            # a frame with an empty head
            payload = b"\x94" + bytes([wire.VERSION]) + b"\xa5model\xc4\x00\xc4\x00"
        elif kind == 3:  # the visible wire's frame, MACed
            model = Model(ATTACKER, k, i, 2, np.array([1.0, 1.0]))
            payload = wire.encode_peer(model, secrets.token_bytes(32))
        else:
            payload = bytes(wire.MAX_PEER_BYTES + 1)
        out.append((topics.peer_topic(run, k, ATTACKER), payload))
    return out


async def test_ten_thousand_hostile_frames_change_nothing(tmp_path: Path) -> None:
    run = "flood"
    async with (
        prepared("mosquitto", run, 6, tmp_path) as setup,
        setup.client(INSPECTOR) as operator,
    ):
        await watch(operator, run)
        async with insider_run(setup, tmp_path, ATTACKER, FLOOD) as attack:
            async with asyncio.timeout(60):
                await wait_until_running(operator, 10)
            frames = hostile(run, HOSTILE, np.random.default_rng(0))
            for start in range(0, HOSTILE, 500):  # paced: agent 3's own frames go between
                for topic, payload in frames[start : start + 500]:
                    attack.insider.publish(topic, payload, 1)
                await asyncio.sleep(0.1)
            assert attack.privnet.poll() is None, "the run ended before the flood: more rounds"
            code = await asyncio.to_thread(attack.privnet.wait, 300)
    assert code == 0, (tmp_path / "privnet.err").read_text()
    summary = load_summary(tmp_path / "summary.json")
    (result,) = summary["results"]
    assert rejected_by_agents(summary) == HOSTILE, result["rejected"]
    # a frame on the topic of a non-neighbour finds no link key: unknown-sender
    assert set(result["rejected"]) <= {
        "malformed",
        "bad-seal",
        "replay",  # placed before the link's last frame: refused before its seal is checked
        "unsealed",
        "oversized",
        "unknown-sender",
        "no-session",  # of a later view: kept for a Setup that never comes
        "overflow",  # of a later view, beyond what an agent keeps for one
    }
    assert_same_as_memory(tmp_path, FLOOD)


# ---- a passive eavesdropper ----------------------------------------------------------------


def test_passive_recording_rebuilds_no_model(tmp_path: Path) -> None:
    """A default-style run (secret seed) recorded whole; the eavesdropper knows the code and
    every setting but the seed. It can read every envelope, open no Setup, and no simulation
    with a guessed seed comes anywhere near the true trajectory."""
    out = tmp_path / "run"
    flags = ["--agents", "8", "--iters", "40", "--broker", "mosquitto", "--audit", "--out"]
    assert main(["run", *flags, str(out)]) == 0
    recording = audit.load_recording(out)
    (truth,) = audit.load_telemetry(out) or [None]
    assert truth is not None and not np.isnan(truth).any()
    eavesdropper = keys.Identity.generate()
    setups = 0
    for record in recording.records:
        if topics.parse_peer_topic(record.topic) is not None:
            continue
        frame = wire.decode_signed(record.payload)  # envelopes are signed, not secret
        if isinstance(frame.msg, control.Setup):
            setups += 1
            with pytest.raises(Rejected):
                wire.decode_config(frame.msg.sealed)
            with pytest.raises(keys.BadKey):
                keys.open_sealed(eavesdropper.static, frame.msg.sealed, b"")
    assert setups == 8
    public = dataclasses.replace(recording.config, seed=0)
    scale = float(np.max(np.abs(truth)))
    for guess in [1, *range(2, 12)]:  # the old default seed, and a few more
        problem = Instance.build(dataclasses.replace(public, seed=guess))
        models = run_session(problem, public.strategies[0], public.schemes[0], 0).models
        assert np.max(np.abs(models - truth)) > 0.05 * scale, f"seed {guess} rebuilds the run"

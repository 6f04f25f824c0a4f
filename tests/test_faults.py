"""Faults on a real network (`privnet run --faults`), each checked against the memory replay
of the run's membership.json: a stalled agent excluded and readmitted, a broker restart
redone under a new view, a crashed agent restarted from its checkpoint, a killed agent whose
last telemetry batch died with it. Each runs beside as many busy loops as the machine has
cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_private_run, need_mosquitto
from probes import read_metrics
from runs import assert_whole_rounds

from privnet.orchestrator.conductor import View
from privnet.orchestrator.engines.memory import Network
from privnet.orchestrator.engines.watch import read_membership
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance, msd
from privnet.orchestrator.experiment.specs import session_list, session_plans

AGENTS, SEED = 10, 34
# Long enough that agents at full speed (~300 rounds/s here) are still running when a busy
# orchestrator, reading their telemetry late, reaches a fault's round.
ITERS = 3000
pytestmark = pytest.mark.usefixtures("hogs")  # on a machine busy with other work (issue 30)


def run(out: Path, iters: int, *flags: str, broker: str = "mosquitto") -> tuple[list[View], dict]:
    """`privnet run` on mosquitto, ATC local-ghp, deadline 3 s; its views and summary."""
    command = [sys.executable, "-m", "privnet.orchestrator.cli", "run", "--broker", broker]
    command += ["--agents", str(AGENTS), "--iters", str(iters), "--seed", str(SEED)]
    command += ["--deadline", "3", "--out", str(out), *flags]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=420, env={**os.environ, "COLUMNS": "300"}
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())["config"]
    return read_membership(out / "membership.json"), summary


def changes(views: list[View]) -> list[View]:
    """The first view and those that changed its members: on a busy machine a round may
    also stall past the deadline, and a view with the same members redoes it (the replay
    checks those too)."""
    return [v for i, v in enumerate(views) if i == 0 or v.members != views[i - 1].members]


def assert_replayed(out: Path, iters: int, views: list[View], topology: str = "geometric") -> None:
    """Every round that stands has every member's report, and the run's models equal the
    memory replay of its views; so does every row of metrics.csv."""
    config = ExperimentConfig(
        agents=AGENTS, iters=iters, strategies=("atc",), schemes=("local-ghp",), seed=SEED,
        topology=topology,
    )  # fmt: skip
    problem = Instance.build(config)
    plans = session_plans(problem, session_list(config))
    (replay,) = Network.build(plans, script=views).play()
    real = np.load(out / "models.npz")[replay.label]
    assert_whole_rounds(real, views)
    have = ~np.isnan(real[..., 0])
    assert not (have & np.isnan(replay.models[..., 0])).any()
    gap = np.max(np.abs(real[have] - replay.models[have])) / np.max(np.abs(real[have]))
    assert gap < 1e-9
    ((centroid, average),) = read_metrics(out / "metrics.csv").values()
    present = np.where(have[..., None], replay.models, np.nan)  # the members of each round
    want = np.array([msd(w, problem.w_opt[0], problem.q) for w in present]).T
    np.testing.assert_allclose(np.vstack([centroid, average]), want, rtol=1e-9)


def assert_out_and_back(views: list[View], agent: int) -> None:
    """`agent` was left out (silent; or, on a machine so busy that a stall is called
    first, for not answering its Hold), then let back from a round before it left; only
    it came and went."""
    _, lost, returned, *later = changes(views)
    others = tuple(m for m in range(AGENTS) if m != agent)
    assert lost.members == others and list(lost.left) == [agent], views
    assert lost.left[agent] in ("silent for 3 s", "did not stop for a view change in 3 s"), views
    back = returned.resume[agent]
    assert 0 < back < lost.start and agent in returned.members
    assert all(set(v.members) >= set(others) for v in later), views


def test_a_stopped_agent_is_excluded_then_readmitted(tmp_path: Path) -> None:
    """SIGSTOP agent 6 for 3x the deadline: left out, back when it wakes (4000 rounds:
    the run outlasts the stop however fast the machine)."""
    views, summary = run(tmp_path, 4000, "--faults", "stop:6@60+9s")
    assert_out_and_back(views, 6)
    assert summary["membership"]["missed_rounds"]["atc/local-ghp/0"]["6"] > 0
    assert_replayed(tmp_path, 4000, views)


def test_a_stopped_agent_drops_from_every_later_round_of_a_schedule(tmp_path: Path) -> None:
    """The same on one-peer-exponential (issue 31): while agent 6 is out, no round links
    it (its peers of those rounds keep their own models), and the run is its views'
    memory replay."""
    flags = ("--faults", "stop:6@60+9s", "--topology", "one-peer-exponential")
    views, _ = run(tmp_path, 4000, *flags)
    assert_out_and_back(views, 6)
    assert_replayed(tmp_path, 4000, views, "one-peer-exponential")


def test_a_broker_restart_is_redone_under_a_new_view(tmp_path: Path) -> None:
    """kill -9 the broker mid-run and start it again: everyone reconnects, a round whose
    frames were in flight stalls, and a view with the same members redoes it; no round is
    missed. (With the members held at the end of the conductor's grant, a busy orchestrator
    reading behind, nothing is in flight: they go on under the same view, and the reports
    the broker went down with are redone at the session's end, under a last view.)"""
    views, summary = run(tmp_path, ITERS, "--faults", "broker@100")
    reasons = [v.reason for v in views[1:]]
    assert set(reasons) <= {"stalled", "lost reports"}, views
    assert "lost reports" not in reasons[:-1], views
    assert all(v.members == views[0].members for v in views)
    assert summary["broker_outages"]["reconnects"] == 1
    assert summary["membership"]["missed_rounds"] == {}
    pauses = summary["membership"]["pauses"]
    assert len(pauses) == len(views) - 1
    assert all(p["seconds_lost"] >= 3.0 for p in pauses)  # a stall waits its deadline
    assert_replayed(tmp_path, ITERS, views)


def test_a_crashed_agent_restarts_from_its_checkpoint(tmp_path: Path) -> None:
    """kill -9 agent 3 with --restart on-failure: started again, it rejoins from its
    checkpoint (or, when a view change comes first, as soon as it is back)."""
    flags = ("--faults", "kill:3@80", "--restart", "on-failure", "--checkpoint-every", "20")
    views, summary = run(tmp_path, ITERS, *flags)
    assert summary["membership"]["faults"] == ["kill:3@80 (at round 80)"]  # not at a poll
    assert_private_run(tmp_path)
    assert summary["membership"]["restarts"] == {"3": 1}
    assert all(3 in v.members or 3 in v.left for v in changes(views))
    back = [v for v in changes(views)[1:] if 3 in v.members]
    assert back and back[-1].resume[3] % 20 == 0 and back[-1].resume[3] > 0
    assert_replayed(tmp_path, ITERS, views)


def test_a_killed_agents_unsealed_rounds_are_redone_without_it(tmp_path: Path) -> None:
    """kill -9 agent 3 (no restart): the reports it had not sealed yet (up to 9 rounds: it
    seals 10 per Telemetry, and all at the end of a grant) die with it. Those rounds are
    redone by the view without it, so none stands with only the survivors' reports, and
    metrics.csv is the replay's MSD."""
    views, summary = run(tmp_path, ITERS, "--faults", "kill:3@95")
    start, lost = changes(views)
    assert [start.reason, lost.reason] == ["start", "lost"], views
    assert 3 not in lost.members and "killed by SIGKILL" in lost.left[3]
    # Where its last sealed batch ended: every 10 rounds, or where it held at the end of
    # the conductor's grant (it flushes there); past round 95, which the conductor read.
    assert lost.start - 1 >= 95
    missed = summary["membership"]["missed_rounds"]["atc/local-ghp/0"]
    assert missed == {"3": ITERS + 1 - lost.start}
    assert_replayed(tmp_path, ITERS, views)


@pytest.mark.parametrize("broker", ["mosquitto", "embedded"])
def test_an_insider_flapping_agent_3_is_left_out_and_the_run_completes(
    tmp_path: Path, broker: str
) -> None:
    """An insider with agent 3's broker credentials connects again and again for 20 s
    from round 40 (`--faults flap:3@40+20s`): each connection takes agent 3's over, and
    agent 3's reconnect takes it back. The stalls it causes name agent 3 (or its Progress
    stops for a deadline); it is left out,
    let back once its quarantine ends (out again while the insider goes on), and the run
    completes: every round that stands equals the memory replay, no agent failed, and
    every one of them (agent 3 too) closed normally."""
    if broker == "mosquitto":
        need_mosquitto()
    views, summary = run(tmp_path, 4000, "--faults", "flap:3@40+20s", broker=broker)
    reasons = [v.reason for v in views]
    assert reasons[0] == "start" and "lost" in reasons, views
    out = [v for v in views if 3 in v.left]
    # Its stalls name it; or, the insider holding its connection, its Progress stops, or
    # its answer to a Hold does not come.
    outage = ("stalled the network", "silent for 3 s", "did not stop for a view change")
    assert out and all(v.left[3].startswith(outage) for v in out), views
    assert all(v.members == tuple(m for m in range(AGENTS) if m != 3) for v in out)
    assert summary["orchestrator"]["agents_not_left"] == []  # every agent closed
    logs = {p: (tmp_path / "logs" / f"agent-{p}.log").read_text() for p in range(AGENTS)}
    assert not [p for p, log in logs.items() if " ERROR " in log], "an agent failed"
    assert logs[3].count("lost the broker") >= 5  # it did flap
    assert "connections made" in (tmp_path / "logs" / "insider-3.log").read_text()
    assert_replayed(tmp_path, 4000, views)

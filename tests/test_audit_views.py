"""The wire audit of runs whose membership changed: an agent lost mid-run, a stalled round.

Each run is the whole protocol on the memory engine under a fake clock, recorded as the live
tap records it (every frame that reaches the broker, on its MQTT topic), and audited with the
run's membership views: no model in the clear, masks that cancel at every hub under each
view's own weights, a replay that matches the run's telemetry, and the rounds a new view
redid counted per agent. One test does the same for `privnet run --audit --faults kill:...`
on a real broker.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import need_mosquitto
from router import Routed
from runs import Clock, model_place

from privnet.agent.node import AgentNode
from privnet.agent.protocol import Publish
from privnet.agent.spec import STRATEGY_STEP, Scheme, Strategy
from privnet.orchestrator import audit, replay
from privnet.orchestrator.cli import main
from privnet.orchestrator.conductor import Conductor, Stage, View
from privnet.orchestrator.engines.memory import CONDUCTOR
from privnet.orchestrator.experiment import topology
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import session_list, session_plans, view_matrix
from privnet.orchestrator.privacy.accountant import Adversary, account

RUN = "run-views"
AGENTS, ITERS, SEED = 10, 40, 34  # a sparse graph: local-ghp pairs and fallback hubs
VICTIM, DIES_AFTER = 3, 50  # agent 3 is gone after its 50th model frame
STALLED = 12  # every model frame of this round is lost
DEADLINE = 30.0
CANCEL = 1e-12
Edit = Callable[[Routed, str, Publish], Publish | None]


def config(scheme: Scheme = Scheme.LOCAL_GHP) -> ExperimentConfig:
    return ExperimentConfig(
        agents=AGENTS,
        iters=ITERS,
        seed=SEED,
        strategies=(Strategy.ATC,),
        schemes=(scheme,),
        repeats=1,
    )


@dataclass
class Faulty:
    recording: audit.Recording
    telemetry: list[np.ndarray]
    views: list[View]


def play(c: ExperimentConfig, edit: Edit, seen_before_edit: bool = False) -> Faulty:
    """A memory-engine run whose frames pass `edit` (None: lost), pumped under a fake clock
    (ticks as the shells tick: Beats, Progress, deadlines); recorded as the tap records
    what reaches the broker, or with `seen_before_edit` what left the agents (an
    eavesdropper on the way to a broker that lost it)."""
    problem = Instance.build(c)
    records: list[audit.WireRecord] = []

    def tap(_publisher: str, frame: Publish) -> None:
        records.append(audit.WireRecord(0.0, frame.topic, frame.payload))

    plans = session_plans(problem, session_list(c))
    net = Routed.build(plans, run=RUN, deadline=DEADLINE, escrow=True)
    clock = Clock()
    net.router.clock = clock

    def edited(publisher: str, frame: Publish) -> Publish | None:
        if seen_before_edit:
            tap(publisher, frame)
        return edit(net, publisher, frame)

    net.router.edit = edited
    net.router.tap = None if seen_before_edit else tap
    parties: list[tuple[str, Conductor | AgentNode]] = [(CONDUCTOR, net.conductor)]
    parties += [(f"agent-{node.me}", node) for node in net.nodes]
    net.start()
    net.router.drain()
    for _ in range(10_000):
        if net.conductor.stage in (Stage.DONE, Stage.FAILED):
            break
        wakes = [t for _, party in parties if (t := party.next_tick()) is not None]
        clock.now = max(clock.now, min(wakes))
        for name, party in parties:
            wake = party.next_tick()
            if wake is not None and wake <= clock.now:
                net.router.send(name, party.tick(clock.now))
        net.router.drain()
    assert net.conductor.stage is Stage.DONE, net.conductor.failure
    net.router.send(CONDUCTOR, net.conductor.bye())
    net.router.drain()
    telemetry = [result.models for result in net.conductor.results]
    recording = audit.Recording(
        RUN, "127.0.0.1:1883", c, records, net.conductor.collection.link_keys
    )
    return Faulty(recording, telemetry, list(net.conductor.membership.views))


def killing(victim: int, after: int) -> Edit:
    """The victim's process ends after its `after`-th model frame: nothing more of it
    reaches the broker, and the shell tells the conductor (as `Watch` does)."""
    sent = {"models": 0}

    def edit(net: Routed, publisher: str, frame: Publish) -> Publish | None:
        if publisher != f"agent-{victim}":
            return frame
        if sent["models"] >= after:
            return None
        if frame.category == "model":
            sent["models"] += 1
            if sent["models"] == after:
                now = net.router.clock()
                net.router.send(CONDUCTOR, net.conductor.lost(victim, "crashed", now))
                return None
        return frame

    return edit


def losing_round(round_: int) -> Edit:
    """Every model frame of `round_` under the first view is lost (a broker that dropped
    them): nobody completes the round, the network stands still, a new view redoes it."""

    def edit(_net: Routed, _publisher: str, frame: Publish) -> Publish | None:
        if model_place(frame) == (0, round_):
            return None
        return frame

    return edit


def audited(run: Faulty) -> dict:
    (session,) = audit.audit(run.recording, run.telemetry, "memory", membership=run.views).report[
        "sessions"
    ]
    return session


def assert_private(s: dict, views: int) -> None:
    """Nothing in the clear, every mask cancelled, the truth the run's own, every model of
    the rounds that stand on the wire, each view's frames matched to its clear values."""
    assert len(s["views"]) == views
    assert s["plaintext_messages"] == 0 and s["clear_links"] == []
    assert s["unmatched"] == 0 and s["duplicates"] == 0 and s["undecodable"] == 0
    assert s["model_messages"] == s["expected_model_messages"]
    assert s["truth_vs_telemetry"] is not None and s["truth_vs_telemetry"] <= audit.TRUTH_TOL
    resid = s["max_cancellation_residual"]
    assert resid["max"] < CANCEL and resid["hub_rounds_missing_messages"] == 0
    assert resid["hub_rounds_checked"] > 0
    for view in s["views"]:
        assert view["plaintext_messages"] == 0
        assert view["model_messages"] == view["expected_model_messages"]
        assert view["max_cancellation_residual"]["max"] < CANCEL
    assert s["noise"]["p_value"] > 1e-4  # the masks still follow their Laplace law


@pytest.fixture(scope="module")
def lost() -> Faulty:
    return play(config(), killing(VICTIM, DIES_AFTER))


def test_a_lost_agent_leaves_nothing_clear_and_every_view_cancels(lost: Faulty) -> None:
    first, second = lost.views
    assert VICTIM in first.members and VICTIM not in second.members and second.start > 1
    s = audited(lost)
    assert_private(s, views=2)
    assert [v["members"] for v in s["views"]] == [list(first.members), list(second.members)]
    assert s["views"][1]["end"] == ITERS and s["views"][0]["end"] == second.start - 1
    # the expected counts are each view's own: its rounds times its matrix's links
    problem = Instance.build(config())
    step = (0, 1, 2).index(STRATEGY_STEP[Strategy.ATC])
    a = view_matrix(problem, frozenset(second.members))
    links = int(np.count_nonzero(topology.strategy_matrices(Strategy.ATC, a)[step])) - AGENTS
    assert s["views"][1]["expected_model_messages"] == (ITERS - second.start + 1) * links
    # the victim's rounds after it left are NaN in the telemetry and not compared
    assert np.isnan(lost.telemetry[0][second.start - 1 :, VICTIM]).all()


def test_a_redone_round_is_reported_per_agent(lost: Faulty) -> None:
    """The round the new view starts from was begun under the old one: its values go out
    again under fresh masks, counted per agent; none of it in the clear."""
    redo = audited(lost)["redo"]
    (change,) = redo["rounds_redone"]
    assert change["view"] == 1 and change["rounds_begun_before"] >= 1
    again = redo["re_releases"]
    assert again and VICTIM not in again  # it never sent again: it was gone
    assert sum(t["same_value"] for t in again.values()) > 0
    for tally in again.values():
        assert tally["fresh_masks"] == tally["frames"] > 0  # local-ghp: a mask per view
    assert "fresh mask" in redo["learns"]["eavesdropper"]


def test_random_resends_the_same_vector_and_none_is_flagged() -> None:
    """Detection still bites under views: scheme none puts every frame in the clear, the
    redone ones too; random's seeded noise repeats, so a value sent again is the very
    same frame, and each redone round's other value (a round begun on the old view's
    weights, run again on the new view's) a new vector under the same draw."""
    clear = audited(play(config(Scheme.NONE), killing(VICTIM, DIES_AFTER)))
    assert clear["plaintext_messages"] == sum(
        v["model_messages"] + v["redone_model_messages"] for v in clear["views"]
    )
    noisy = audited(play(config(Scheme.RANDOM), killing(VICTIM, DIES_AFTER)))
    assert noisy["plaintext_messages"] == 0 and noisy["truth_vs_telemetry"] <= audit.TRUTH_TOL
    again = noisy["redo"]["re_releases"].values()
    assert sum(t["same_value"] for t in again) > 0 and sum(t["another_value"] for t in again) > 0
    for t in again:  # each round and step went to every out-neighbour of the new view
        out, rest = divmod(t["frames"], t["same_value"] + t["another_value"])
        assert rest == 0 and t["frames"] - t["fresh_masks"] == t["same_value"] * out


def test_a_stalled_round_is_redone_under_a_new_view_with_fresh_masks() -> None:
    """Every frame of one round lost on its way: the network stands still for a deadline,
    the conductor starts a view of the same members from that round; an eavesdropper who
    saw the lost frames sees each agent's value of it once more, under a fresh mask."""
    run = play(config(), losing_round(STALLED), seen_before_edit=True)
    first, second = run.views
    assert second.reason == "stalled" and second.start == STALLED
    assert second.members == first.members == tuple(range(AGENTS))
    s = audited(run)
    assert_private(s, views=2)
    assert s["views"][0]["redone_model_messages"] == s["views"][0]["expected_model_messages"] / (
        STALLED - 1
    )
    # the eavesdropper saw the whole lost round: its masks are checked (and cancel) too
    assert s["views"][0]["hub_rounds_not_combined"] == 0
    again = s["redo"]["re_releases"]
    problem = Instance.build(config())
    A = problem.matrices(Strategy.ATC)[(0, 1, 2).index(STRATEGY_STEP[Strategy.ATC])]
    for agent in range(AGENTS):
        out = int(np.count_nonzero(A[agent])) - 1
        assert again[agent] == {
            "same_value": 1,
            "another_value": 0,
            "frames": out,
            "fresh_masks": out,
        }


def test_views_come_from_membership_json_and_the_wire(lost: Faulty) -> None:
    """A first view missing from membership.json is read off the signed Setups; a later
    view on the wire that membership.json lacks stops the audit, saying so."""
    (seen,) = audit.split_sessions(lost.recording.records, RUN, config().dim)
    assert replay.session_views(lost.views[1:], 0, seen, AGENTS) == lost.views
    everyone = replay.SessionWire(setups={0: set(range(AGENTS))})
    assert replay.session_views(None, 0, everyone, AGENTS) is None  # no change: as before
    with pytest.raises(replay.AuditError, match="view 1 of session 0 is on the wire"):
        audit.audit(lost.recording, lost.telemetry, "memory")


def test_a_killed_agent_on_a_real_broker(tmp_path: Path, hogs: list[Any]) -> None:
    """`privnet run --audit --faults kill:...` on mosquitto, beside as many busy loops as
    the machine has cores: the run completes under a new view and its own audit finds
    nothing clear and every mask cancelled."""
    need_mosquitto()
    out = tmp_path / "run"
    argv = [
        "run", "--audit", "--broker", "mosquitto", "--agents", str(AGENTS), "--iters", "1000",
        "--strategy", "atc", "--scheme", "local-ghp", "--seed", str(SEED), "--deadline", "2",
        "--faults", f"kill:{VICTIM}@40", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    (s,) = json.loads((out / "audit.json").read_text())["sessions"]
    # 1000 rounds, not 300: agents at full speed would finish before a busy orchestrator reads
    # round 40. A stall on the busy machine may add a view with the same members.
    assert len(s["views"]) >= 2 and VICTIM not in s["views"][-1]["members"]
    assert s["plaintext_messages"] == 0 and s["unmatched"] == 0
    assert s["max_cancellation_residual"]["max"] < CANCEL
    assert s["truth_vs_telemetry"] <= audit.TRUTH_TOL
    assert s["model_messages"] == s["expected_model_messages"]


@pytest.mark.parametrize("scheme", [Scheme.LOCAL_GHP, Scheme.MASKED_GHP])
def test_a_redone_round_is_charged_in_epsilon_exactly(scheme: Scheme) -> None:
    """The stalled round goes out twice: under view 0 (lost on its way, seen by the
    eavesdropper) and again under view 1, the same value under fresh masks. With the wire's
    reach the twins replay both, and each agent's epsilon on its links grows by exactly
    what those re-sent frames cost, sum_k a_pk ||y - y'||_1 / b; the ghp release under
    masked-ghp's masks is the same draw of the same value, so the whole wire pays nothing
    more there."""
    c = config(scheme)
    run = play(c, losing_round(STALLED), seen_before_edit=True)
    (seen,) = audit.split_sessions(run.recording.records, RUN, c.dim, run.recording.link_keys)
    views = replay.session_views(run.views, 0, seen, AGENTS)
    problem = Instance.build(c)
    charged = account(problem, Strategy.ATC, scheme, 0, views=views, reach=audit.view_reach(seen))
    script = account(problem, Strategy.ATC, scheme, 0, views=views)  # no round redone
    assert charged.charges is not None
    ours, theirs = charged.charges.ours, charged.charges.theirs
    step = STRATEGY_STEP[Strategy.ATC]
    A = problem.matrices(Strategy.ATC)[step]
    b = c.sigma_g / np.sqrt(2)
    growth = charged.epsilon[-1] - script.epsilon[-1]
    for p in range(AGENTS):
        y = ours.views[(0, p, STALLED, step)]
        np.testing.assert_array_equal(y, ours.views[(1, p, STALLED, step)])  # the same value
        cost = np.abs(y - theirs.views[(0, p, STALLED, step)]).sum() / b
        links = sum(A[p, k] for k in range(AGENTS) if k != p and A[p, k] > 0)
        expected = links * cost if scheme is Scheme.LOCAL_GHP else min(cost, 2 * links * cost)
        once = min(cost, links * cost)  # masked-ghp: the bound without the re-release
        expected -= 0 if scheme is Scheme.LOCAL_GHP else once
        assert growth[p] == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert growth.sum() > 0
    assert audited(run)["redo"]["re_releases"][0]["frames"] == int(np.count_nonzero(A[0])) - 1
    wire = Adversary("wire")
    if scheme is Scheme.MASKED_GHP:
        np.testing.assert_allclose(charged.against(wire), script.against(wire), rtol=1e-12)

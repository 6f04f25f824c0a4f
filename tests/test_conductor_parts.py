"""The conductor's parts (privnet/orchestrator/conductor/), driven directly: pure, no broker and no
nodes. The registry's checks and silences, membership's resume points, collection's gaps,
the outbox's counts, and a resumed run's first view, which whole runs reach only through
`privnet run --resume`."""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from runs import AGENTS, RUN, problem

from privnet.agent import control, keys, topics, wire
from privnet.agent.messages import Reason, Rejected
from privnet.agent.protocol import Event, Output, hello_proof
from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.conductor import Conductor, Resume, Stage, View
from privnet.orchestrator.conductor.collection import Collection, Outbox
from privnet.orchestrator.conductor.membership import Membership
from privnet.orchestrator.conductor.registry import Registry
from privnet.orchestrator.experiment.specs import session_plans

ROUNDS = 3
ME = keys.Identity.generate()


class Agents:
    """The agents' side of the upward wire: identities, tokens, signed frames."""

    def __init__(self, count: int = AGENTS) -> None:
        self.ids = [keys.Identity.generate() for _ in range(count)]
        self.tokens = {a: os.urandom(32) for a in range(count)}
        self.seq = [0] * count

    def up(self, agent: int, msg: control.Control, run: str = RUN) -> tuple[str, bytes]:
        self.seq[agent] += 1
        payload = wire.encode_signed(msg, run, self.seq[agent], self.ids[agent])
        return topics.ctl_up(RUN, agent), payload

    def hello(self, agent: int, token: bytes | None = None) -> control.Hello:
        public = self.ids[agent].public.to_bytes()
        proof = hello_proof(token or self.tokens[agent], RUN, agent, public)
        return control.Hello(agent, public, proof)


def conductor(
    agents: Agents, resume: Resume | None = None, script: list[View] | None = None
) -> Conductor:
    plans = session_plans(problem(ROUNDS), [(Strategy.ATC, Scheme.NONE, 0)])
    c = Conductor(RUN, ME, agents.tokens, plans, resume=resume, script=script)
    c.start(0.0)
    return c


def feed(c: Conductor, frames: Iterable[tuple[str, bytes]], now: float = 1.0) -> Output:
    out = Output()
    for topic, payload in frames:
        out += c.receive(topic, payload, now)
    return out


def downs(out: Output) -> list[control.Control]:
    return [wire.decode_signed(p.payload).msg for p in out.publish]


def rejected(c: Conductor) -> dict[str, int]:
    return {k: n for k, n in c.deliveries.rejected.items() if n}


# ---- a resumed run --------------------------------------------------------------------------


def test_a_resumed_run_goes_on_after_the_latest_round_every_agent_holds_and_was_recorded() -> None:
    """Agent 4 holds rounds 0 and 1 only: the session goes on from round 2, with round 1's
    recorded models restored and round 2 on left to redo."""
    agents = Agents()
    recorded = np.full((ROUNDS, AGENTS, problem(ROUNDS).config.dim), np.nan)
    recorded[:2] = np.arange(2 * AGENTS * recorded.shape[2]).reshape(recorded[:2].shape)
    c = conductor(agents, Resume(0, recorded, recorded=2))
    out = feed(c, [agents.up(a, agents.hello(a)) for a in range(AGENTS)])
    assert c.stage is Stage.REGISTERING and c.current is None
    welcomes = downs(out)
    assert welcomes == [control.Welcome(a, True) for a in range(AGENTS)]  # late: Rejoin
    holds = {a: (0, 1) if a == 4 else (0, 1, 2) for a in range(AGENTS)}
    feed(c, [agents.up(a, control.Rejoin(a, 0, holds[a])) for a in range(AGENTS - 1)])
    assert c.stage is Stage.REGISTERING  # one offer to come
    feed(c, [agents.up(0, control.Rejoin(0, 0, (0, 1, 2)))])
    assert rejected(c) == {Reason.DUPLICATE.value: 1}
    last = AGENTS - 1
    out = feed(c, [agents.up(last, control.Rejoin(last, 0, holds[last]))])
    assert c.stage is Stage.CONFIGURING and c.session == 0
    (view,) = c.membership.views
    assert (view.reason, view.start, view.members) == ("resumed", 2, tuple(range(AGENTS)))
    assert view.resume == dict.fromkeys(range(AGENTS), 1)
    np.testing.assert_array_equal(c.collection.models[0], recorded[0])
    assert np.isnan(c.collection.models[1:]).all() and c.collection.counts.tolist() == [1] * AGENTS
    assert (
        out.events[0] == Event("view", out.events[0].detail) and "resumed" in out.events[0].detail
    )
    setups = [m for m in downs(out) if isinstance(m, control.Setup)]
    assert sorted(s.agent for s in setups) == list(range(AGENTS))
    assert c.resume is None and c.membership.offers == {}


def test_an_agent_of_another_session_rewinds_a_resumed_run_to_the_start() -> None:
    agents = Agents()
    recorded = np.full((ROUNDS, AGENTS, problem(ROUNDS).config.dim), 0.5)
    c = conductor(agents, Resume(0, recorded, recorded=ROUNDS))
    feed(c, [agents.up(a, agents.hello(a)) for a in range(AGENTS)])
    offers = [control.Rejoin(a, -1 if a == 2 else 0, (0, 1, 2)) for a in range(AGENTS)]
    feed(c, [agents.up(a, offers[a]) for a in range(AGENTS)])
    assert c.membership.view is not None and (
        c.membership.view.start,
        c.membership.view.reason,
    ) == (1, "resumed")
    assert np.isnan(c.collection.models).all() and not c.collection.counts.any()


# ---- registration ---------------------------------------------------------------------------


def test_a_failed_agent_during_registration_fails_the_run() -> None:
    agents = Agents()
    c = conductor(agents)
    feed(c, [agents.up(3, agents.hello(3)), agents.up(3, control.Failed(3, "no data"))])
    assert c.stage is Stage.FAILED and c.failure == "agent 3 failed: no data"
    assert c.next_tick() is None


def test_an_agent_lost_during_registration_fails_the_run() -> None:
    agents = Agents()
    c = conductor(agents)
    feed(c, [agents.up(3, agents.hello(3))])
    assert c.lost(4, "never came", 2.0) == Output()  # not registered: nothing to lose
    out = c.lost(3, "exited 1", 2.0)
    assert c.stage is Stage.FAILED and c.failure == "agent 3 lost during registration: exited 1"
    assert downs(out) == [control.Abort(c.failure)]


def test_a_replay_leaves_a_lost_member_to_its_script() -> None:
    """A replay applies recorded views and decides nothing itself: no Hold for a loss."""
    agents = Agents()
    plan = session_plans(problem(ROUNDS), [(Strategy.ATC, Scheme.NONE, 0)])[0]
    leaf = next(s.agent for s in plan.specs if len(s.neighbours) == 1)
    members = tuple(a for a in range(AGENTS) if a != leaf)  # the recorded view left it out
    c = conductor(agents, script=[View(0, 0, 1, members, "start")])
    feed(c, [agents.up(a, agents.hello(a)) for a in range(AGENTS)])
    assert c.stage is Stage.CONFIGURING and c.membership.views[0].members == members
    assert (
        c.lost(leaf, "exited 1", 2.0) == Output() and leaf not in c.membership.alive
    )  # not a member
    lost = members[0]
    out = c.lost(lost, "exited 1", 2.0)
    assert out.events == [Event("lost", f"agent {lost}: exited 1")] and not out.publish
    assert c.stage is Stage.CONFIGURING and c.membership.lost == {lost: "exited 1"}


def test_what_each_member_completed_counts_heartbeats_and_reports() -> None:
    agents = Agents()
    c = conductor(agents)
    feed(c, [agents.up(a, agents.hello(a)) for a in range(AGENTS)])
    feed(c, [agents.up(a, control.Ready(a, 0, 0)) for a in range(AGENTS)])
    assert c.stage is Stage.RUNNING
    feed(c, [agents.up(1, control.Progress(1, 0, 0, 2, False, ()))])
    c.collection.counts[2] = 1  # its telemetry of round 1 is in
    assert c.completed.tolist() == [0, 2, 1] + [0] * (AGENTS - 3) and c.rounds_done == 0


def test_the_read_only_face_before_any_session() -> None:
    c = conductor(Agents())
    assert c.next_tick() == c.liveness.deadline_at() == c.register_deadline
    assert c.membership.view is None and c.current is None and c.rounds_done == 0
    assert (
        c.membership.ids.size == 0
        and c.collection.counts.size == 0
        and c.collection.models.size == 0
    )
    completed = c.completed
    completed[0] = 5  # a copy: the conductor's own stays
    assert not c.completed.any() and len(c.completed) == AGENTS
    assert (
        not c.collection.farewell_traffic.messages
        and not c.outbox.traffic.messages
        and c.outbox.recipients == 0
    )
    assert c.subscriptions == topics.up_filters(RUN)


def test_the_registry_checks_a_frame_in_order_and_names_one_reason() -> None:
    agents = Agents(3)
    registry = Registry(RUN, agents.tokens)

    def reason(call: object) -> str:
        with pytest.raises(Rejected) as caught:
            assert callable(call)
            call()
        return caught.value.reason.value

    assert reason(lambda: registry.sender(topics.ctl_up("other", 0))) == "wrong-topic"
    assert reason(lambda: registry.sender(topics.ctl_up(RUN, 3))) == "unknown-sender"
    assert registry.sender(topics.ctl_up(RUN, 2)) == 2
    _, other_run = agents.up(0, agents.hello(0), run="other")
    assert reason(lambda: registry.frame(0, other_run)) == "wrong-run"
    _, hello = agents.up(0, agents.hello(0))
    assert reason(lambda: registry.frame(1, hello)) == "spoofed"
    frame = registry.frame(0, hello)
    assert isinstance(frame.msg, control.Hello)
    forged = agents.hello(0, token=bytes(32))
    forged_frame = registry.frame(0, agents.up(0, forged)[1])
    assert reason(lambda: registry.introduced(forged_frame, forged, False)) == "bad-proof"
    assert reason(lambda: registry.verified(0, frame)) == "unregistered"
    identity = registry.introduced(frame, frame.msg, False)
    registry.pin(0, identity, frame.seq, 5.0)
    assert registry.heard == {0: 5.0} and not registry.complete
    assert registry.missing() == [1, 2]
    assert reason(lambda: registry.introduced(frame, frame.msg, True)) == "duplicate"
    assert reason(lambda: registry.verified(0, frame)) == "replay"
    agents.ids[0] = keys.Identity.generate()  # started again: a new identity
    again = agents.hello(0)
    again_frame = registry.frame(0, agents.up(0, again)[1])
    assert reason(lambda: registry.introduced(again_frame, again, False)) == "identity-change"
    assert registry.introduced(again_frame, again, True).to_bytes() == again.identity


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 7), st.floats(0, 10)), max_size=40),
    st.lists(st.frozensets(st.integers(0, 7)), min_size=1, max_size=4),
)
def test_the_oldest_silence_is_the_least_recent_of_the_expected(
    hearings: list[tuple[int, float]], asked: list[frozenset[int]]
) -> None:
    """Heard times only grow (the conductor hears with `max`); asking about some agents
    never loses the others."""
    registry = Registry(RUN, {})
    for agent, later in hearings:
        registry.hear(agent, registry.heard.get(agent, 0.0) + later)
    for expected in asked:
        times = [registry.heard[a] for a in expected if a in registry.heard]
        assert registry.oldest(expected.__contains__) == (min(times) if times else None)
    registry.deaf(50.0)
    everyone = set(registry.heard)
    assert registry.oldest(everyone.__contains__) == (50.0 if everyone else None)


# ---- membership and collection --------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-1, 1), st.sets(st.integers(0, 9))), min_size=1, max_size=6),
    st.integers(2, 10),
    st.integers(0, 10),
    st.booleans(),
)
def test_a_resume_point_is_held_by_every_agent_and_recorded(
    offers: list[tuple[int, set[int]]], rounds: int, recorded: int, telemetry: bool
) -> None:
    group = Membership(len(offers))
    group.offers = {a: control.Rejoin(a, s, tuple(sorted(r))) for a, (s, r) in enumerate(offers)}
    point = group.resume_point(0, rounds, recorded, telemetry)
    last = min(rounds - 1, recorded) if telemetry else rounds - 1
    held = [r if s == 0 else {0} for s, r in offers]
    assert point == 0 or (point <= last and all(point in h for h in held))
    better = [r for r in range(point + 1, last + 1) if all(r in h for h in held)]
    assert not better
    group.offers = {}
    assert group.resume_point(0, rounds, recorded, telemetry) == 0  # nobody said: the start


@settings(max_examples=80, deadline=None)
@given(st.data(), st.integers(1, 6), st.integers(1, 5))
def test_the_first_gap_is_the_first_round_a_member_did_not_report(
    data: st.DataObject, rounds: int, agents: int
) -> None:
    collection = Collection(RUN, ME)
    collection.new_session(rounds, agents, 2)
    reported = data.draw(
        st.lists(st.booleans(), min_size=rounds * agents, max_size=rounds * agents)
    )
    mask = np.array(reported).reshape(rounds, agents)
    collection.done[mask] = True
    members = data.draw(st.sets(st.integers(0, agents - 1), min_size=1))
    first = data.draw(st.integers(1, rounds))
    start = data.draw(st.integers(first, rounds + 1))
    gap = collection.first_gap(first, start, members)
    assert first <= gap <= start
    assert all(mask[r - 1, m] for r in range(first, gap) for m in members)
    if gap < start:
        assert not all(mask[gap - 1, m] for m in members)


def test_redo_and_restore_keep_the_counts_in_step_with_the_models() -> None:
    collection = Collection(RUN, ME)
    collection.new_session(4, 3, 2)
    collection.models[:3] = 1.0
    collection.metrics[:3] = 0.5
    collection.done[:3] = collection.reported[:3] = True
    collection.redo(3)
    assert collection.counts.tolist() == [2, 2, 2] and np.isnan(collection.models[2:]).all()
    assert np.isnan(collection.metrics[2:]).all() and not collection.done[2:].any()
    collection.restore(np.zeros((4, 3, 2)), None, 2)  # a journal without metrics: the models
    assert collection.counts.tolist() == [2, 2, 2] and (collection.models[0] == 0).all()
    metrics = np.full((4, 3, 2), np.nan)
    metrics[:2] = 1.0
    collection.restore(np.full((4, 3, 2), np.nan), metrics, 3)  # rounds with metrics alone
    assert collection.counts.tolist() == [2, 2, 2] and (collection.metrics[:2] == 1.0).all()


def test_the_outbox_numbers_signs_and_counts_what_it_sends() -> None:
    outbox = Outbox(RUN, ME, agents=5)
    frames = [outbox.down("all", control.Beat()), outbox.down(3, control.Bye())]
    assert outbox.recipients == 5 + 1 and outbox.seq == 2
    assert outbox.traffic.messages["control"] == 2
    assert [f.topic for f in frames] == [topics.ctl_down(RUN, "all"), topics.ctl_down(RUN, 3)]
    for seq, frame in enumerate(frames, 1):
        signed = wire.decode_signed(frame.payload)
        signed.verify(ME.public, "the orchestrator")
        assert (signed.run, signed.seq) == (RUN, seq)


def test_membership_owns_who_is_alive_and_a_lost_member_is_out_of_the_next_view() -> None:
    membership = Membership(4, alive={0, 1, 2, 3})
    membership.members = frozenset({0, 1, 2})
    membership.joining[3] = control.Rejoin(3, 0, (1,))
    assert membership.expected() == {0, 1, 2} and membership.expects(2)
    assert not membership.may_join(3)  # asked already
    assert not membership.lose(3, "exited 1")  # not a member: just gone
    assert membership.alive == {0, 1, 2} and 3 not in membership.joining
    assert membership.lose(2, "silent") and membership.lost == {2: "silent"}
    assert membership.expected() == {0, 1} and not membership.expects(2)
    assert not membership.may_join(2)  # not alive
    membership.alive.add(2)  # a valid frame again
    assert membership.may_join(2) and membership.expected() == {0, 1}


def test_membership_stalls_count_up_to_the_limit_and_progress_resets_them() -> None:
    group = Membership(3)
    group.members = frozenset({0, 1, 2})
    counts = np.zeros(3, dtype=np.int64)
    assert [group.stalled(float(t)) for t in range(5)] == [False, False, False, True, True]
    for agent in range(3):
        group.progress(agent, 2, counts, 9.0)
    assert group.stalls == 0 and (group.moved.rounds, group.moved.since) == (2, 9.0)
    assert group.rounds_done(counts) == 2 and sorted(group.ids.tolist()) == [0, 1, 2]

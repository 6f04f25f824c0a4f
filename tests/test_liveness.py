"""Liveness under a member that keeps stalling the network (issue 30), on the memory engine
with a fake clock: who a stall names, when a member is left out for it, its quarantine and
its way back in; and what the conductor measures of its own beats.

The same on real brokers with an insider process: tests/test_faults.py."""

from __future__ import annotations

import pytest
from runs import ROUNDS, RUN, Harness, assert_same_models, assert_whole_rounds, model_place
from test_conductor import EVERYONE, assert_replay_matches, views

from privnet.agent import control, topics
from privnet.agent.phases import Phase
from privnet.agent.protocol import Publish
from privnet.orchestrator.conductor.blame import FLAPS, Blame, suspects

DEADLINE = 30.0
FLAPPER = 8
OTHERS = tuple(m for m in EVERYONE if m != FLAPPER)


def test_a_stall_names_the_agent_on_every_wait_or_both_ends_of_one_or_nobody() -> None:
    waiting = {8: (2, 6, 7), 2: (8,), 6: (8,), 5: (3,)}
    assert suspects(waiting, [8]) == {8}  # it waits for all of its neighbours
    assert suspects(waiting, [2, 6]) == {8}  # they all wait for it
    assert suspects({8: (2,)}, [8]) == {2, 8}  # one link: either end
    assert suspects(waiting, [2, 6, 5]) == set()  # two stalls at once: nobody
    assert suspects({1: (2, 3), 2: (1, 3), 3: (1, 2)}, [1, 2, 3]) == set()  # everyone
    assert suspects({}, [1, 2]) == set()


def test_a_member_named_twice_in_the_window_is_out_with_a_doubling_quarantine() -> None:
    blame = Blame(deadline=2.0)
    assert FLAPS == 2
    assert blame.stall({3}, 0.0) is None
    assert blame.stall({3}, 100.0) is None  # the first fell out of the window (40 s)
    assert blame.stall({3}, 101.0) == 3 and blame.until[3] == 103.0
    rejoin = control.Rejoin(3, 0, (5,))
    assert blame.park(rejoin, 102.0) and blame.next_due() == 103.0
    assert blame.due(102.9) == [] and blame.due(103.0) == [rejoin]
    assert blame.stall({3}, 110.0) == 3 and blame.until[3] == 114.0  # at once, twice as long
    assert not blame.park(rejoin, 114.0)  # quarantine over: in as any Rejoin
    assert blame.stall({3, 4}, 200.0) == 3  # 4 was named once: 3 alone is due
    assert blame.stall({4, 5}, 201.0) == 4 and blame.stall({5, 6}, 202.0) == 5


def losing(places: dict[int, tuple[int, int]]) -> object:
    """Lose the models to agent a of view v's round r, for v: (a, r) in `places`."""

    def selected(_: str, frame: Publish) -> bool:
        place = model_place(frame)
        if place is None or place[0] not in places:
            return False
        agent, round_ = places[place[0]]
        inbox = topics.inbox_filter(RUN, agent)
        return frame.topic.startswith(inbox[:-1]) and place[1] == round_

    return selected


def next_view(h: Harness) -> None:
    """Advance until the next view is recorded (a stall: within a deadline and a beat)."""
    seen, end = len(h.conductor.membership.views), h.clock.now + 2 * DEADLINE
    while len(h.conductor.membership.views) == seen:
        assert h.clock.now < end, "no new view"
        h.advance(1.0)


def test_a_member_that_keeps_stalling_the_network_is_left_out_then_let_back() -> None:
    """Agent 8's models are lost in view 0 and again in view 1: the first stall is redone
    with everyone, the second leaves agent 8 out (the others run on without waiting for
    it); its Rejoin waits out a deadline's quarantine (the others meanwhile stuck on a
    frame lost to agent 2), then it is back through the normal rejoin path, and the run
    completes with every round whole."""
    h = Harness.build(rounds=12, deadline=DEADLINE)
    h.lose = losing({0: (FLAPPER, 2), 1: (FLAPPER, 4), 2: (2, 6)})
    h.start()
    next_view(h)
    assert views(h)[1] == (1, 2, EVERYONE, "stalled")
    next_view(h)
    (*_, out) = h.conductor.membership.views
    assert (out.view, out.members, out.reason) == (2, OTHERS, "lost")
    assert out.left == {FLAPPER: "stalled the network (left out 1 time(s) for it)"}
    assert h.nodes[FLAPPER].phase is Phase.EXCLUDED
    assert FLAPPER in h.conductor.blame.parked  # asked back at once, parked
    parked_at = h.clock.now
    next_view(h)
    assert h.clock.now - parked_at <= DEADLINE + 1.0
    (*_, back) = h.conductor.membership.views
    assert (back.view, back.members, back.reason) == (3, EVERYONE, "returned")
    assert 0 < back.resume[FLAPPER] < back.start - 1  # from its own last model that stands
    (result,) = got = h.finish()
    assert_whole_rounds(result.models, h.conductor.membership.views)
    assert_replay_matches(h, got)
    assert result.missed[FLAPPER] > 0 and not h.conductor.blame.parked
    assert h.conductor.pacing.beats.longest <= DEADLINE / 3 + 1e-9  # Beats every deadline / 3


@pytest.mark.parametrize("rounds", [ROUNDS])
def test_one_stall_is_redone_with_everyone_as_before(rounds: int) -> None:
    """A single stall naming agent 8 (a frame lost once) leaves nobody out."""
    h = Harness.build(rounds=rounds, deadline=DEADLINE)
    h.lose = losing({0: (FLAPPER, 2)})
    h.start()
    next_view(h)
    assert views(h) == [(0, 1, EVERYONE, "start"), (1, 2, EVERYONE, "stalled")]
    assert_same_models(h.finish(), Harness.build(rounds=rounds, deadline=DEADLINE).play())

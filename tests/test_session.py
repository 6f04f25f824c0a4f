"""What an agent holds of a session (privnet/agent/session.py), unit by unit: the early-frame
buffer's bounds, which models a Setup may resume from, what a next view carries over, and the frames
sealed to the orchestrator, opened the way the conductor opens them."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privnet.agent import keys, wire
from privnet.agent.messages import Reason, Rejected, Report
from privnet.agent.protocol import Checkpoint, Traffic, escrow_context, telemetry_context
from privnet.agent.session import (
    EARLY_BYTES,
    EARLY_COUNT,
    MAX_TELEMETRY_BATCH,
    TELEMETRY_BATCH,
    Early,
    Sealing,
    Session,
    history_for,
    telemetry_batch,
    telemetry_rounds,
)

FUZZ = settings(derandomize=True, max_examples=60, deadline=None)
ORCHESTRATOR = keys.Identity.generate()
SEALING = Sealing("unit-run", 3, ORCHESTRATOR.public)


def session(
    number: int = 0, view: int = 0, reports: list[Report] | None = None, **more: Any
) -> Session:
    """A Session whose config, core and links are stand-ins: bookkeeping reads none of them
    but `links.keys`."""
    links: Any = SimpleNamespace(keys={1: b"k" * 32, 4: b"l" * 32})
    history = more.pop("history", {0: np.zeros(2)})
    return Session(number, view, None, None, links, history, reports=reports or [], **more)


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=50))
def test_early_keeps_frames_in_order_and_take_empties_it(payloads: list[bytes]) -> None:
    early = Early()
    for n, payload in enumerate(payloads):
        early.keep(n, payload)
    assert early.size == sum(map(len, payloads))
    taken = early.take()
    assert [(f.sender, f.payload) for f in taken] == list(enumerate(payloads))
    assert early.take() == [] and early.size == 0


def test_early_refuses_past_its_count_and_keeps_what_it_had() -> None:
    early = Early()
    for n in range(EARLY_COUNT):
        early.keep(n, b"")
    with pytest.raises(Rejected) as caught:
        early.keep(0, b"")
    assert caught.value.reason is Reason.OVERFLOW and len(early.frames) == EARLY_COUNT


@FUZZ
@given(st.integers(1, 1 << 20))
def test_early_refuses_past_its_bytes_exactly_at_the_bound(last: int) -> None:
    early = Early()
    early.keep(0, bytes(EARLY_BYTES - last))
    early.keep(1, bytes(last))  # exactly at the bound: kept
    assert early.size == EARLY_BYTES
    with pytest.raises(Rejected):
        early.keep(2, b"x")
    assert early.size == EARLY_BYTES and len(early.frames) == 2


def spec(dim: int = 2, w0: tuple[float, ...] = ()) -> Any:
    return SimpleNamespace(dim=dim, w0=w0)


def test_history_is_this_sessions_then_the_checkpoints_then_the_initial_model() -> None:
    mine = session(number=2, history={0: np.zeros(2), 5: np.ones(2)})
    saved = Checkpoint("unit-run", 3, 2, {0: np.zeros(2), 4: np.full(2, 4.0)})
    assert history_for(mine, saved, 2, spec()) is mine.history  # the live branch, not a copy
    from_disk = history_for(None, saved, 2, spec())
    assert sorted(from_disk) == [0, 4] and from_disk is not saved.models
    assert sorted(history_for(mine, saved, 3, spec())) == [0]  # another session: start over
    (w0,) = history_for(None, None, 0, spec(w0=(1.5, -2.0))).values()
    assert w0.dtype == np.float64 and w0.tolist() == [1.5, -2.0]
    assert history_for(None, None, 0, spec(dim=3))[0].tolist() == [0.0, 0.0, 0.0]


@FUZZ
@given(st.lists(st.integers(1, 40), unique=True, max_size=20), st.integers(0, 40))
def test_a_next_view_carries_what_stands_and_drops_what_it_redoes(
    rounds: list[int], resume: int
) -> None:
    traffic = Traffic()
    traffic.add("model", "t", b"payload")
    reports = [Report(3, r, np.zeros(2)) for r in sorted(rounds)]
    old = session(number=1, view=2, reports=reports, began=7.5, traffic=traffic)
    config: Any = SimpleNamespace(resume=resume)
    new = old.next_view(5, config, None, None, {0: np.zeros(2)})
    assert (new.number, new.view, new.began) == (1, 5, 7.5)
    assert new.traffic is traffic and new.finished == {}
    assert [r.round for r in new.reports] == [r for r in sorted(rounds) if r <= resume]
    assert len(old.reports) == len(rounds)  # the old view's list is left alone


def test_telemetry_is_sealed_to_the_orchestrator_for_its_place_and_empties_the_batch() -> None:
    reports = [Report(3, r, np.array([r, -r], dtype=float)) for r in (4, 5, 6)]
    held = session(number=1, view=2, reports=list(reports))
    (msg,) = held.telemetry(SEALING)
    assert (msg.agent, msg.session, msg.view, msg.round) == (3, 1, 2, 6) and held.reports == []
    context = telemetry_context("unit-run", 3, 1, 2, 6)
    opened = wire.decode_reports(keys.open_sealed(ORCHESTRATOR.static, msg.sealed, context), 2)
    assert [(r.round, r.w.tolist()) for r in opened] == [(r.round, r.w.tolist()) for r in reports]
    with pytest.raises(keys.BadKey):  # bound to its round: another place does not open it
        keys.open_sealed(ORCHESTRATOR.static, msg.sealed, telemetry_context("unit-run", 3, 1, 2, 5))


def test_escrow_seals_the_views_link_keys_to_the_orchestrator() -> None:
    held = session(number=0, view=4)
    msg = held.escrow(SEALING)
    assert (msg.agent, msg.session, msg.view) == (3, 0, 4)
    plain = keys.open_sealed(ORCHESTRATOR.static, msg.sealed, escrow_context("unit-run", 3, 0, 4))
    assert plain == wire.encode_link_keys(held.links.keys)


def test_a_checkpoint_keeps_only_the_rounds_on_its_grid() -> None:
    history = {r: np.full(2, float(r)) for r in range(0, 13)}
    kept = session(number=2, history=history).checkpoint(SEALING, 4)
    assert dataclasses.astuple(kept)[:3] == ("unit-run", 3, 2)
    assert sorted(kept.models) == [0, 4, 8, 12]


@pytest.mark.parametrize(
    ("through", "every", "left"),
    [(7, 4, [4, 7, 8, 9]), (8, 4, [8, 9]), (3, 4, [0, 3, 4, 5, 6, 7, 8, 9]), (7, 0, [7, 8, 9])],
)
def test_recorded_rounds_are_forgotten_but_the_latest_checkpoint_round(
    through: int, every: int, left: list[int]
) -> None:
    """No view starts before a recorded round; a run resumed from disk starts at the latest
    round both the journal and the checkpoint hold, so that one stays."""
    held = session(history={r: np.full(2, float(r)) for r in range(10)})
    held.forget(through, every)
    assert sorted(held.history) == left
    assert all(w[0] == r for r, w in held.history.items())


def test_a_big_models_telemetry_goes_every_round_so_its_history_is_freed() -> None:
    """An agent holds each round's model until the conductor has its report: a model of
    1M parameters (8 MB a round) sends its telemetry every round, not every 10 rounds (80 MB
    held), a 300k one every 3 rounds; small models keep their batch."""
    assert telemetry_rounds(16, 1_000_018) == 1
    assert telemetry_rounds(16, 300_000) == 3
    assert telemetry_rounds(16, 100_000) == TELEMETRY_BATCH
    assert telemetry_rounds(1000, 2) == telemetry_batch(1000)
    core: Any = SimpleNamespace(spec=SimpleNamespace(agents=16, dim=1_000_018))
    held = session()
    held.core = core
    held.reports.append(wire.metrics(3, 1, (0.0, 0.0)))
    assert held.due()


def test_a_large_networks_agents_batch_more_rounds_a_telemetry_message() -> None:
    """Every message costs the orchestrator a signature check and a key agreement: up to
    400 agents a message holds 10 rounds, at 1000 it holds 25 (40 messages a round in all),
    and never more than MAX_TELEMETRY_BATCH."""
    assert [telemetry_batch(n) for n in (2, 30, 400, 401, 1000, 10_000)] == [
        TELEMETRY_BATCH,
        TELEMETRY_BATCH,
        TELEMETRY_BATCH,
        11,
        25,
        MAX_TELEMETRY_BATCH,
    ]
    for agents in (30, 1000):
        core: Any = SimpleNamespace(spec=SimpleNamespace(agents=agents, dim=2))
        held = session()
        held.core = core
        batch = []
        for r in range(1, 31):
            held.reports.append(wire.metrics(3, r, (0.0, 0.0)))
            held.reports.append(Report(3, r, np.zeros(2)))
            if held.due():
                batch.append(r)
                held.reports = []
        assert batch == ([10, 20, 30] if agents == 30 else [25])

"""The conductor's stage transition table (`records.TRANSITIONS`) against what the code
does: the scenarios of the conductor's tests, and two named here, make every move in the
table, and nothing else (`Conductor.to` raises on a move the table lacks, and every stage
change goes through it: `stage` has no setter). The docs draw the same table."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import test_conductor as scenarios
import test_conductor_parts as part_scenarios
from runs import Harness

from privnet.agent import control, wire
from privnet.agent.protocol import Output
from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.conductor import TRANSITIONS, Conductor, Stage

Move = tuple[Stage, Stage]
DOCS = Path(__file__).parent.parent / "docs" / "design" / "control-plane.md"


def aborted_while_closing() -> None:
    """Ctrl-C while the agents answer Close: the run fails, the results stay."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    h.hold = lambda publisher, frame: (
        frame.category == "control"
        and isinstance(wire.decode_signed(frame.payload).msg, control.Left)
    )
    h.start()
    c = h.conductor
    assert c.stage is Stage.CLOSING and not c.collection.farewells
    out = c.abort("Ctrl-C")  # the agents, leaving, need not hear it: only the conductor
    assert out.events[0].kind == "failed" and c.stage is Stage.FAILED and len(c.results) == 1


def aborted_after_done() -> None:
    """The outputs could not be written once every session was done (a full disk): the
    engine aborts instead of `bye`."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    h.start()
    c = h.conductor
    assert c.stage is Stage.CLOSING or c.stage is Stage.DONE
    if c.stage is Stage.CLOSING:
        c.tick(c.liveness.deadline_at())
    assert c.stage is Stage.DONE
    assert c.abort("no space left on device").events[0].kind == "failed"
    assert c.stage is Stage.FAILED and c.abort("again") == Output()


SCENARIOS: dict[str, Callable[[], None]] = {
    "registration deadline": scenarios.test_the_registration_deadline_holds_whatever_junk_arrives,
    "lost while registering": part_scenarios.test_an_agent_lost_during_registration_fails_the_run,
    "keying stalls, then fails": (
        scenarios.test_keying_that_stalls_is_redone_under_a_new_view_then_fails_naming_the_members
    ),
    "a silent member, replayed": scenarios.test_a_silent_agent_is_excluded_by_the_silence_rule,
    "a split network": scenarios.test_a_session_without_view_specs_cannot_change_membership,
    "lost after the last round": (
        scenarios.test_a_member_lost_after_the_last_round_leaves_nothing_to_redo
    ),
    "aborted while running": scenarios.test_abort_stops_every_node_once,
    "closed by bye": scenarios.test_after_bye_everything_is_counted_as_closed,
    "aborted while closing": aborted_while_closing,
    "aborted after done": aborted_after_done,
}


def table() -> set[Move]:
    return {(a, b) for a, nexts in TRANSITIONS.items() for b in nexts}


@pytest.fixture(scope="module")
def made() -> dict[Move, list[str]]:
    """Every move the scenarios made, with the scenarios that made it (the real
    `Conductor.to` runs; this only notes its argument)."""
    moves: dict[Move, list[str]] = {}
    real = Conductor.to
    name = ""

    def noted(self: Conductor, stage: Stage, now: float | None = None) -> None:
        moves.setdefault((self.stage, stage), []).append(name)
        real(self, stage, now)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Conductor, "to", noted)
        for name, scenario in SCENARIOS.items():  # noqa: B007 (read by `noted`)
            scenario()
    return moves


def test_the_scenarios_make_every_move_of_the_table_and_no_other(
    made: dict[Move, list[str]],
) -> None:
    assert set(made) <= table(), set(made) - table()
    assert table() <= set(made), sorted(table() - set(made))
    assert not TRANSITIONS[Stage.FAILED] and not TRANSITIONS[Stage.CLOSED]  # ends


def test_every_named_scenario_makes_a_move(made: dict[Move, list[str]]) -> None:
    """Each scenario is there for its moves (a stale one would hide a lost move)."""
    assert {name for names in made.values() for name in names} == set(SCENARIOS)


def test_a_move_the_table_lacks_is_refused() -> None:
    c, _, _ = scenarios.conductor()
    with pytest.raises(RuntimeError, match="cannot go from registering to running"):
        c.to(Stage.RUNNING)
    assert c.stage is Stage.REGISTERING and not c.moves
    with pytest.raises(AttributeError):
        c.stage = Stage.RUNNING  # type: ignore[misc]


def test_the_docs_draw_the_table() -> None:
    text = DOCS.read_text()
    body = text.split("<!-- stages:begin -->")[1].split("<!-- stages:end -->")[0]
    drawn = {}
    for row in body.strip().splitlines()[2:]:
        stage, nexts = (cell.strip() for cell in row.strip("|").split("|"))
        names = re.sub(r"\([^)]*\)", "", nexts).replace(",", " ").split()
        drawn[Stage(stage)] = frozenset(Stage(n) for n in names)
    assert drawn == dict(TRANSITIONS)

"""The agent's transition table (privnet/agent/phases.py) against the node that obeys it.

Every phase change of `AgentNode` goes through `_move`, which looks the move up in
`TRANSITIONS`; here `_move` is wrapped to record (from, trigger, to) while nodes are driven
through runs of the in-memory harness and genuine, orchestrator-signed control frames are
delivered in exact phases. The moves recorded must be the table: every one the code makes
is in it (else `_move` raises), and every entry is made by some scenario below, so the
table holds no move the code cannot make.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from runs import Harness
from test_node import TARGET, config_for, is_control, is_setup, setup

from privnet.agent import control, keys, node
from privnet.agent.node import AgentNode
from privnet.agent.phases import (
    FINAL,
    INITIAL,
    TRANSITIONS,
    IllegalTransition,
    Phase,
    Trigger,
    allows,
    next_phase,
)
from privnet.agent.protocol import Output, Publish
from privnet.agent.spec import Scheme, Strategy
from privnet.orchestrator.engines.memory import CONDUCTOR

Move = tuple[Phase, Trigger, Phase]
Make = Callable[[Harness], control.Control]
TABLE = {(p, t, to) for p, moves in TRANSITIONS.items() for t, to in moves.items()}


def const(msg: control.Control) -> Make:
    return lambda _: msg


def setup_of(view: int) -> Make:
    """A genuine Setup of a later `view` of session 0 for the target."""
    return lambda h: setup(h, view=view, config=config_for(h, TARGET, view=view))


HOLD1, HOLD2 = const(control.Hold(0, 1)), const(control.Hold(0, 2))
EXCLUDED1, EXCLUDED2, EXCLUDED3 = (const(control.Excluded(TARGET, 0, v)) for v in (1, 2, 3))
ABORT, CLOSE = const(control.Abort("test over")), const(control.Close())


@dataclass(frozen=True)
class Chain:
    """Once the target is in `start` (in a run of the harness), `steps` delivered to it
    one by one, each a control frame signed by the orchestrator and the phase it leads to."""

    start: Phase
    steps: tuple[tuple[Make, Phase], ...]


CHAINS = [
    Chain(Phase.REGISTERING, ((ABORT, Phase.FAILED),)),
    Chain(Phase.REGISTERED, ((CLOSE, Phase.LEAVING), (ABORT, Phase.FAILED))),
    Chain(Phase.REGISTERED, ((ABORT, Phase.FAILED),)),
    Chain(
        Phase.CONFIGURED,
        (
            (HOLD1, Phase.HELD),
            (HOLD2, Phase.HELD),  # held already: the view ends there
            (EXCLUDED3, Phase.EXCLUDED),
            (CLOSE, Phase.LEAVING),
        ),
    ),
    Chain(
        Phase.KEYED,
        (
            (HOLD1, Phase.HELD),
            (setup_of(1), Phase.CONFIGURED),
            (EXCLUDED2, Phase.EXCLUDED),
            (setup_of(3), Phase.CONFIGURED),
            (ABORT, Phase.FAILED),
        ),
    ),
    Chain(Phase.KEYED, ((EXCLUDED1, Phase.EXCLUDED), (ABORT, Phase.FAILED))),
    Chain(Phase.KEYED, ((ABORT, Phase.FAILED),)),
    Chain(Phase.RUNNING, ((HOLD1, Phase.HELD), (ABORT, Phase.FAILED))),
    Chain(Phase.RUNNING, ((EXCLUDED1, Phase.EXCLUDED),)),
    Chain(Phase.RUNNING, ((ABORT, Phase.FAILED),)),
    Chain(
        Phase.FINISHED,
        (
            (HOLD1, Phase.FINISHED),  # a member still, flushing its telemetry
            (EXCLUDED2, Phase.EXCLUDED),
        ),
    ),
    Chain(Phase.FINISHED, ((ABORT, Phase.FAILED),)),
    Chain(Phase.LEFT, ((ABORT, Phase.FAILED),)),
]


def obey(h: Harness, target: AgentNode, msg: control.Control, phase: Phase) -> None:
    """`msg` is obeyed (not rejected: a move that keeps the phase counts too) into `phase`."""
    before = target.rejected.total()
    h.deliver(target, *h.down(msg, TARGET))
    assert target.rejected.total() == before, (msg, target.rejected)
    assert target.phase is phase, (msg, target.phase)


def play_chain(chain: Chain) -> None:
    h = Harness.build()  # local-ghp: a Setup's keys take the neighbours, so CONFIGURED lasts
    target = h.nodes[TARGET]
    if chain.start is Phase.REGISTERED:
        h.hold = lambda _, frame: is_setup(frame)

    def steps() -> None:
        for make, phase in chain.steps:
            obey(h, target, make(h), phase)

    h.when(lambda: target.phase is chain.start, steps)
    h.start()
    if chain.start is Phase.LEFT:
        h.finish()
    assert h.fired == 1, f"the target never was {chain.start}"


def play_two_sessions() -> None:
    """A clean run of two sessions: registration to Bye, and a next session's Setup."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE), (Strategy.ATC, Scheme.LOCAL_GHP)])
    h.play()
    assert all(n.phase is Phase.CLOSED for n in h.nodes)


def play_paced() -> None:
    """The orchestrator's pacing, a window of one round at a time (the conductor grants
    1024): every node runs to Go's `until` and holds; a later Go while held, and another
    while running, take them to the last round; then the finished target is held for a
    later view, left out of the next, configured (and keyed) for the one after, and aborted."""
    h = Harness.build([(Strategy.ATC, Scheme.NONE)])
    h.hold = lambda _, frame: is_control(frame, control.Go, "all")
    h.start()
    assert len(h.held) == 1 and all(n.phase is Phase.KEYED for n in h.nodes)
    h.hold, h.held = None, []
    router, target = h.net.router, h.nodes[TARGET]

    def go(until: int) -> None:
        router.send(CONDUCTOR, control_output(h, control.Go(0, 0, until)))

    go(1)
    router.drain()
    assert all(n.phase is Phase.HELD and n.session and n.session.core.round == 2 for n in h.nodes)
    go(2)
    go(3)  # queued ahead of every round-2 frame: it reaches each node running
    router.drain()
    assert all(n.phase is Phase.FINISHED for n in h.nodes)
    for make, phase in (
        (HOLD1, Phase.FINISHED),
        (EXCLUDED2, Phase.EXCLUDED),
        (setup_of(3), Phase.KEYED),  # no keys to agree under scheme none
        (ABORT, Phase.FAILED),
    ):
        obey(h, target, make(h), phase)


def control_output(h: Harness, msg: control.Control) -> Output:
    """`msg` to every node, as the orchestrator's (a fresh sequence number)."""
    topic, payload = h.down(msg, "all")
    return Output([Publish(topic, payload, "control")])


@pytest.fixture
def moves(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[Move]]:
    """Every (from, trigger, to) any node makes while the test runs."""
    seen: set[Move] = set()
    move = AgentNode._move

    def recording(self: AgentNode, trigger: Trigger) -> None:
        before = self.phase
        move(self, trigger)
        seen.add((before, trigger, self.phase))

    monkeypatch.setattr(AgentNode, "_move", recording)
    yield seen


def test_the_node_makes_every_move_in_the_table_and_no_other(moves: set[Move]) -> None:
    play_two_sessions()
    play_paced()
    for chain in CHAINS:
        play_chain(chain)
    assert moves - TABLE == set()  # (else `_move` would have raised)
    assert TABLE - moves == set(), "entries of TRANSITIONS no scenario here makes"
    assert moves == TABLE


def test_every_phase_change_goes_through_the_table() -> None:
    """`self.phase` is set in `__init__` (to INITIAL) and in `_move`, nowhere else."""
    tree = ast.parse(inspect.getsource(node))
    writers = {
        function.name
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef)
        for target in ast.walk(function)
        if isinstance(target, ast.Attribute)
        and target.attr == "phase"
        and isinstance(target.ctx, ast.Store)
    }
    assert writers == {"__init__", "_move"}


def test_a_move_the_table_lacks_is_a_bug_that_says_where() -> None:
    launch = node.Launch("run", 0, keys.Identity.generate().public, bytes(32))
    agent = AgentNode(launch, keys.Identity.generate())
    with pytest.raises(IllegalTransition, match=r"agent phase registering has no move on BYE"):
        agent._move(Trigger.BYE)
    assert agent.phase is INITIAL
    with pytest.raises(IllegalTransition, match="the table allows: WELCOME -> registered"):
        next_phase(Phase.REGISTERING, Trigger.GO)


def test_the_table_is_a_life_cycle() -> None:
    """Every phase is reached from INITIAL; only the final ones are left by nothing, and any
    other can fail."""
    reached, frontier = {INITIAL}, [INITIAL]
    while frontier:
        for to in TRANSITIONS[frontier.pop()].values():
            if to not in reached:
                reached.add(to)
                frontier.append(to)
    assert reached == set(Phase)
    assert {p for p in Phase if not TRANSITIONS[p]} == set(FINAL)
    assert all(allows(p, Trigger.FAILURE) for p in Phase if p not in FINAL)
    assert {t for moves in TRANSITIONS.values() for t in moves} == set(Trigger)

"""Time-varying topologies (issue 31 item 2): the pure schedule (privnet/agent/schedule.py),
the seats of its masks (privnet/agent/seats.py), and every engine following it: the
memory engine (the agent core) equal to the oracle, the audit clean at every round's hubs,
the accountant charging each round's weights, a membership change dropping a left-out
agent's pairs from every later round.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_audit import config, memory_recording

from privnet.agent import schedule as expand
from privnet.agent.core import AgentCore
from privnet.agent.losses import make_loss
from privnet.agent.messages import Model, Reason, Rejected
from privnet.agent.seats import round_seats, union_seats
from privnet.agent.spec import STEPS, ConfigError, Schedule, Scheme, Strategy
from privnet.orchestrator import audit
from privnet.orchestrator.audit.verdict import AttackPlan
from privnet.orchestrator.conductor import View
from privnet.orchestrator.engines.memory import replay, run_memory
from privnet.orchestrator.engines.oracle import run_oracle
from privnet.orchestrator.experiment import schedules, specs, topology
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.privacy.accountant import account

FAST = settings(max_examples=40, deadline=None)
KINDS = ("one-peer-exponential", "random-matching")


@st.composite
def schedules_drawn(draw: st.DrawFn) -> Schedule:
    """A schedule of any kind on 2..40 agents, a random view of its members included."""
    agents = draw(st.integers(2, 40))
    kind = draw(st.sampled_from((*KINDS, "matrices")))
    rule = draw(st.sampled_from(topology.RULES))
    strategy = draw(st.sampled_from(list(Strategy)))
    members: tuple[int, ...] = ()
    if draw(st.booleans()):
        members = tuple(sorted(draw(st.sets(st.integers(0, agents - 1), min_size=1))))
    if kind == "matrices":
        graphs = [topology.make_graph("erdos-renyi", agents, draw(st.integers(0, 99)))]
        flat = tuple(tuple(topology.combination_matrix(g, rule).ravel()) for g in graphs)
        return Schedule(kind, agents, strategy, rule, members=members, matrices=flat)
    peers = draw(st.integers(1, agents - 1)) if kind == "random-matching" else 0
    seed = draw(st.integers(0, 2**63))
    return Schedule(kind, agents, strategy, rule, peers, seed, members)


@FAST
@given(made=schedules_drawn(), round_=st.integers(1, 10_000))
def test_every_round_is_left_stochastic_with_a_self_weight(made: Schedule, round_: int) -> None:
    """Columns sum to 1, every a_mm > 0, generated graphs are symmetric (metropolis: the
    matrix too), and an agent outside the view's members keeps only itself."""
    a = expand.matrix(made, round_)
    np.testing.assert_allclose(a.sum(axis=0), 1.0, atol=1e-12)
    assert (a >= 0).all() and (np.diag(a) > 0).all()
    if made.kind != "matrices":
        assert ((a > 0) == (a.T > 0)).all()
        if made.rule == "metropolis":
            np.testing.assert_allclose(a, a.T, atol=1e-15)
    for m in set(range(made.agents)) - set(made.members or range(made.agents)):
        assert a[m, m] == 1.0 and a[:, m].sum() == a[m].sum() == 1.0


@FAST
@given(made=schedules_drawn(), first=st.integers(1, 50), length=st.integers(0, 40))
def test_union_covers_every_rounds_pairs_and_plans_agree(
    made: Schedule, first: int, length: int
) -> None:
    """Whoever an agent meets in any round of first..last is in its union plan of that step
    (so its keys were agreed once); a round's plan is its column and row of A_i on the
    strategy's step and the identity elsewhere."""
    last = first + length
    carrier = expand.STRATEGY_STEP[made.strategy]
    for p in range(made.agents):
        union = {plan.step: plan for plan in expand.union_plans(made, first, last, p)}
        for round_ in range(first, last + 1):
            a = expand.matrix(made, round_)
            for plan in expand.plans(made, round_, p):
                assert plan.weights_in.keys() <= union[plan.step].weights_in.keys()
                assert plan.weights_out.keys() <= union[plan.step].weights_out.keys()
                if plan.step == carrier:
                    assert plan.weights_in == {int(m): a[m, p] for m in np.flatnonzero(a[:, p])}
                    assert plan.weights_out == {int(k): a[p, k] for k in np.flatnonzero(a[p])}
                else:
                    assert plan.weights_in == plan.weights_out == {p: 1.0}


@FAST
@given(made=schedules_drawn(), round_=st.integers(1, 500))
def test_rounds_are_deterministic_from_the_public_inputs(made: Schedule, round_: int) -> None:
    """Two expansions of equal schedules (no shared cache) give the same round; a
    random-matching round depends on the seed."""
    again = Schedule(**{f: getattr(made, f) for f in made.__dataclass_fields__})
    expand._graph.cache_clear()
    first = expand.matrix(made, round_)
    expand._graph.cache_clear()
    np.testing.assert_array_equal(first, expand.matrix(again, round_))
    if made.kind == "random-matching" and made.agents >= 8 and not made.members:
        other = Schedule(
            made.kind, made.agents, made.strategy, made.rule, made.peers, made.seed + 1
        )
        draws = [expand.matrix(other, r) for r in range(round_, round_ + 4)]
        assert any(
            not np.array_equal(d, expand.matrix(made, r)) for r, d in enumerate(draws, round_)
        )


@pytest.mark.parametrize("agents", [2, 5, 8, 30, 33])
def test_one_peer_exponential_cycles_through_powers_of_two(agents: int) -> None:
    made = Schedule("one-peer-exponential", agents, Strategy.ATC)
    tau = math.ceil(math.log2(agents))
    assert expand.period(made) == tau
    for round_ in range(1, 2 * tau + 1):
        distance = 2 ** ((round_ - 1) % tau)
        column = expand.graph(made, round_).columns[0]
        assert set(column) == {0, distance % agents, -distance % agents}


@FAST
@given(made=schedules_drawn(), round_=st.integers(1, 300))
def test_each_rounds_masks_pair_only_keyed_partners_and_cancel(made: Schedule, round_: int) -> None:
    """At every hub of the round, every sender's partners are among those keyed once
    (union_seats of the view's rounds), each pair on opposite sides: the masks cancel."""
    graph = expand.graph(made, round_)
    carrier = STEPS.index(expand.STRATEGY_STEP[made.strategy])
    for hub in range(made.agents):
        keyed = union_seats(made, hub, 1, round_ + 3)
        union = expand.union_plans(made, 1, round_ + 3, hub)[carrier].senders(hub)
        assert set(keyed) - {hub} <= set(union)  # seats only for the union's senders
        sides: dict[tuple[int, int], int] = {}
        for m in [*graph.senders(hub), hub]:
            for _, at, partner, side in round_seats(graph, [hub], m):
                assert at == hub and partner in keyed[m].partners
                sides[(m, partner)] = side
        for (m, partner), side in sides.items():
            assert sides[(partner, m)] == -side


def test_schedule_refuses_what_cannot_run() -> None:
    with pytest.raises(ConfigError, match="random-matching:S with 1 <= S < 6"):
        Schedule("random-matching", 6, Strategy.ATC, peers=6)
    with pytest.raises(ConfigError, match="unknown schedule"):
        Schedule("one-peer-ring", 6, Strategy.ATC)
    with pytest.raises(ConfigError, match="random-matching:S"):
        topology.parse_topology("random-matching")
    with pytest.raises(ConfigError, match="time-varying"):
        topology.make_graph("one-peer-exponential", 6)
    with pytest.raises(ConfigError, match="use --rekey once"):
        Instance.build(
            ExperimentConfig(agents=8, topology="random-matching:2", rekey="every-round")
        )
    with pytest.raises(ConfigError, match="never meet"):  # one round: a perfect matching
        Instance.build(ExperimentConfig(agents=8, iters=1, topology="random-matching:1"))


def test_a_matrix_list_is_a_schedule(tmp_path: Path) -> None:
    """`--matrix a,b`: round i uses number (i - 1) mod 2; each needs a_mm > 0."""
    ring = topology.combination_matrix(topology.make_graph("ring", 6), "metropolis")
    line = np.eye(6)
    line[:2, :2] = 0.5
    np.savetxt(tmp_path / "a.txt", ring)
    np.savetxt(tmp_path / "b.txt", line)
    given = f"{tmp_path / 'a.txt'},{tmp_path / 'b.txt'}"
    problem = Instance.build(ExperimentConfig(agents=6, iters=4, matrix=given))
    assert problem.schedule is not None and problem.schedule.kind == "matrices"
    for round_, want in ((1, ring), (2, line), (3, ring)):
        np.testing.assert_array_equal(problem.round_matrix(round_), want)
    bad = line.copy()
    bad[2, 2], bad[3, 2] = 0.0, 1.0
    np.savetxt(tmp_path / "c.txt", bad)
    many = ",".join([str(tmp_path / "a.txt")] * 911)  # 911 x 36 numbers: over 32768
    with pytest.raises(ConfigError, match="every agent's Setup carries them, at most 32768"):
        Instance.build(ExperimentConfig(agents=6, iters=4, matrix=many))
    with pytest.raises(ConfigError, match="round 3's matrix has a_mm = 0 for agents \\[2\\]"):
        Instance.build(ExperimentConfig(agents=6, iters=4, matrix=f"{given},{tmp_path / 'c.txt'}"))


# ---- the engines follow the schedule ------------------------------------------------------


@pytest.mark.parametrize("topology_name", ["one-peer-exponential", "random-matching:2"])
def test_memory_engine_equals_oracle_for_every_scheme(topology_name: str) -> None:
    """The agent cores (every agent expanding the schedule itself) and the oracle's matrix
    recursion, round by round: bit for bit for the masked schemes, to float rounding else."""
    c = ExperimentConfig(
        agents=9, iters=6, seed=3, topology=topology_name, strategies=("atc", "cta"),
        schemes=tuple(Scheme),
    )  # fmt: skip
    problem = Instance.build(c)
    memory: dict[str, np.ndarray] = {}
    oracle: dict[str, np.ndarray] = {}
    run_memory(problem, models=memory)
    run_oracle(problem, models=oracle)
    assert memory.keys() == oracle.keys() and len(memory) == 10
    for key, models in memory.items():
        if Scheme(key.split("/")[1]).masked:
            np.testing.assert_array_equal(models, oracle[key], err_msg=key)
        else:
            np.testing.assert_allclose(models, oracle[key], rtol=1e-12, atol=1e-14, err_msg=key)


def test_a_frame_from_a_peer_outside_the_rounds_graph_is_refused() -> None:
    """A union neighbour that is not in this round's graph: `not-neighbour`, naming the
    round (no per-round control traffic: the receiver expands the round itself)."""
    problem = Instance.build(
        ExperimentConfig(agents=8, iters=4, seed=1, topology="one-peer-exponential")
    )
    (spec, *_) = specs.agent_specs(problem, Strategy.ATC, Scheme.NONE)
    core = AgentCore(spec, make_loss(problem.specs(0)[0]))
    core.start()
    step = expand.STRATEGY_STEP[Strategy.ATC]
    assert spec.schedule is not None
    assert expand.plans(spec.schedule, 1, 0)[2].senders(0) == [1, 7]  # round 1: distance 1
    far = 2  # a neighbour in round 2 (distance 2), not in round 1
    assert far in spec.neighbours
    with pytest.raises(Rejected) as refused:
        core.receive(Model(far, 0, 1, step, np.zeros(spec.dim)))
    assert refused.value.reason is Reason.NOT_NEIGHBOUR and "round 1's graph" in str(refused.value)
    core.receive(Model(1, 0, 1, step, np.zeros(spec.dim)))  # this round's sender: taken
    # A peer of a later round may be rounds ahead (it met others since): held, if that
    # round's graph links it; past the run's end, or not linked then, refused.
    assert 4 in expand.plans(spec.schedule, 3, 0)[2].senders(0)  # round 3: distance 4
    core.receive(Model(4, 0, 3, step, np.zeros(spec.dim)))
    with pytest.raises(Rejected) as refused:
        core.receive(Model(1, 0, 3, step, np.zeros(spec.dim)))
    assert refused.value.reason is Reason.NOT_NEIGHBOUR
    with pytest.raises(Rejected) as refused:
        core.receive(Model(1, 0, 7, step, np.zeros(spec.dim)))  # past 4; distance 1 again
    assert refused.value.reason is Reason.AHEAD


@pytest.mark.parametrize("topology_name", ["one-peer-exponential", "random-matching:2"])
def test_audit_finds_every_rounds_hubs_clean(topology_name: str) -> None:
    c = config(
        agents=9, iters=6, topology=topology_name, schemes=(Scheme.LOCAL_GHP, Scheme.MASKED_GHP)
    )
    recording, telemetry = memory_recording(c)
    result = audit.audit(recording, telemetry, "memory")
    for s in result.report["sessions"]:
        assert s["model_messages"] == s["expected_model_messages"] > 0
        assert s["plaintext_messages"] == s["unmatched"] == s["duplicates"] == 0
        resid = s["max_cancellation_residual"]
        assert resid["max"] == 0 and resid["hub_rounds_checked"] > 0
        assert resid["hub_rounds_missing_messages"] == 0


def test_inspect_attack_follows_the_schedule() -> None:
    """`inspect --attack` on a one-peer run: the open wire breaks local-ghp (its hub sums
    are exact, round by round) and not masked-ghp; sealed, nobody reads a frame."""
    schemes = (Scheme.LOCAL_GHP, Scheme.MASKED_GHP)
    c = config(agents=9, iters=6, topology="one-peer-exponential", schemes=schemes)
    recording, telemetry = memory_recording(c)
    result = audit.audit(recording, telemetry, "memory", attack=AttackPlan(0, None))
    rows = {(r["scheme"], r["adversary"]): r for r in result.report["adversaries"]["rows"]}
    assert rows[("local-ghp", "whole wire")]["broken"]
    assert not rows[("masked-ghp", "whole wire")]["broken"]
    for scheme in ("local-ghp", "masked-ghp"):
        assert rows[(scheme, "whole wire (sealed)")]["frames_read"] == 0


def test_accountant_charges_each_round_against_its_graph() -> None:
    """Under masked-ghp an agent's link costs a_mk of that round's A times L: the link
    to a peer it meets only in some rounds is charged in those rounds only."""
    c = ExperimentConfig(
        agents=8, iters=6, seed=2, topology="one-peer-exponential", schemes=("masked-ghp",)
    )
    problem = Instance.build(c)
    got = account(problem, Strategy.ATC, Scheme.MASKED_GHP, neighbour=0)
    assert got.charges is not None
    frames = got.charges.frames
    for (m, i, _), sent in frames.items():
        a = problem.round_matrix(i)
        assert {k for _, k in sent} == {k for k in np.flatnonzero(a[m]) if k != m}, (m, i)
    assert np.isfinite(got.epsilon[-1]).all() and got.epsilon[-1, 0] > 0


def test_a_left_out_agent_drops_from_every_later_round() -> None:
    """A view without agent 3 from round 4: no later round links it, and the run replays in
    memory under the two views (the members' every round of the schedule on the members)."""
    c = ExperimentConfig(
        agents=8, iters=8, seed=2, topology="random-matching:2", schemes=("local-ghp",),
        strategies=("atc",),
    )  # fmt: skip
    problem = Instance.build(c)
    members = frozenset(range(8)) - {3}
    made = schedules.for_view(problem.schedule, Strategy.ATC, members)  # type: ignore[arg-type]
    for round_ in range(4, 9):
        a = expand.matrix(made, round_)
        assert a[3, 3] == 1.0 and a[3].sum() == 1.0 and a[:, 3].sum() == 1.0
    views = [
        View(0, 0, 1, tuple(range(8)), "start"),
        View(0, 1, 4, tuple(sorted(members)), "agent 3 left", {m: 3 for m in members}),
    ]
    models: dict[str, np.ndarray] = {}
    replay(problem, views, models)
    (run,) = models.values()
    assert run.shape == (8, 8, problem.config.dim)
    inside = sorted(members)
    assert np.isfinite(run[:, inside]).all() and np.isnan(run[3:, 3]).all()  # 3 reports no more

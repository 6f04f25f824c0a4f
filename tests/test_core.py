"""The sans-IO agent core (agent/core.py), driven by the memory router and by hand.

No sockets: cores run through orchestrator.engines.memory.route (wrapped to log the wire) or
through `drive` below, a FIFO router like route that can edit, drop or inject messages.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import networkx as nx
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent import keys, rng
from agent.core import AgentCore, Seat, split_senders
from agent.losses import LeastSquares
from agent.messages import KeyPlan, KeyShare, Message, Model, Rejected, Report
from agent.spec import STEPS, STRATEGY_STEP, ConfigError, Rekey, Scheme, StepPlan, Strategy
from orchestrator.engines.memory import build_cores, route
from orchestrator.experiment import topology
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.problem import Problem

SEED = 7
ROUNDS = 5
REL = 1e-12  # masks must cancel, and local-ghp must equal none, to this relative precision
# A masked message differs from the clear one by Laplace noise of std >= sigma_g = 0.1; the
# chance that a 2-dim draw lands within 1e-6 of zero is ~1e-10, so this is "masked", while
# float drift between two runs (~1e-16) stays far below it.
MASKED = 1e-6
INJECT_ROUND = 3
PROPERTY = settings(max_examples=8, deadline=None)

rules = st.sampled_from(topology.RULES)
strategies = st.sampled_from(list(Strategy))


@st.composite
def graphs(draw: st.DrawFn) -> nx.Graph:
    """Small connected random graphs, drawn by make_graph from a seed."""
    kind = draw(st.sampled_from(["geometric", "erdos-renyi", "ring"]))
    return topology.make_graph(kind, draw(st.integers(3, 9)), draw(st.integers(0, 10_000)))


# Graphs where some hub has a single other neighbour (split_senders' fallback).
PATH = nx.path_graph(5)
STAR = nx.star_graph(5)
PAIR = nx.path_graph(2)


def problem_on(graph: nx.Graph, rule: str = "metropolis", **overrides: Any) -> Problem:
    overrides = {"iters": ROUNDS, "seed": SEED, **overrides}
    config = ExperimentConfig(agents=graph.number_of_nodes(), rule=rule, **overrides)
    a = topology.combination_matrix(graph, rule)
    return Problem(config, graph, a, topology.perron(a))


def geometric(agents: int = 10, rule: str = "metropolis", **overrides: Any) -> Problem:
    return problem_on(topology.make_graph("geometric", agents, SEED), rule, **overrides)


def step_of(strategy: Strategy) -> int:
    return STRATEGY_STEP[strategy]


def weights(problem: Problem, strategy: Strategy) -> np.ndarray:
    """The matrix of the strategy's communicating step: A[m, k] = a_mk."""
    return problem.matrices(strategy)[step_of(strategy)]


def senders(a: np.ndarray, k: int) -> list[int]:
    return [int(m) for m in np.flatnonzero(a[:, k]) if m != k]


def assert_same_trajectory(got: np.ndarray, want: np.ndarray, rel: float = REL) -> None:
    err = np.max(np.abs(got - want))
    assert err <= rel * np.max(np.abs(want)), f"trajectories differ by {err:.3g}"


# ---- recording runs through memory.route --------------------------------------------------


class Tap:
    """A core as memory.route sees it, logging every message the core emits."""

    def __init__(self, core: AgentCore, wire: list[Message]) -> None:
        self.core, self.wire = core, wire

    @property
    def me(self) -> int:
        return self.core.me

    @property
    def done(self) -> bool:
        return self.core.done

    def start(self) -> list[Message]:
        return self._log(self.core.start())

    def receive(self, msg: Message) -> list[Message]:
        return self._log(self.core.receive(msg))

    def _log(self, out: list[Message]) -> list[Message]:
        self.wire.extend(out)
        return out


@dataclass
class Trace:
    """A run's wire, and what each agent kept off it: (agent, round) -> (value, self-term)."""

    cores: list[AgentCore]
    models: np.ndarray  # (rounds, P, M): w after every round, from the Reports
    wire: list[Message]
    kept: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def sent(self) -> dict[tuple[int, int, int], np.ndarray]:
        """(sender, receiver, round) -> vector of every Model on the wire."""
        return {
            (m.sender, m.receiver, m.round): m.vector for m in self.wire if isinstance(m, Model)
        }


def keep_self_terms(core: AgentCore, kept: dict) -> None:
    """Record the value a core privatizes and the self-term it keeps, before it combines."""
    send = core._send

    def recording(plan: StepPlan) -> list[Message]:
        value = core.value.copy()
        out = send(plan)
        kept[(core.me, core.round)] = (value, core._inbox[core.position][core.me].copy())
        return out

    core._send = recording  # type: ignore[method-assign]


def trace(problem: Problem, strategy: Strategy, scheme: Scheme) -> Trace:
    cores = build_cores(problem, strategy, scheme, 0)
    c = problem.config
    result = Trace(cores, np.zeros((c.iters, c.agents, c.dim)), [])
    for core in cores:
        keep_self_terms(core, result.kept)

    def on_report(report: Report) -> None:
        result.models[report.round - 1, report.sender] = report.w

    route([Tap(core, result.wire) for core in cores], on_report)  # type: ignore[misc]
    return result


# ---- a router that can tamper --------------------------------------------------------------

Edit = Callable[[Message], Message | None]
Inject = Callable[[Message, AgentCore], list[Message]]


@dataclass
class Outcome:
    models: np.ndarray
    rejected: list[str]  # reasons of the injected messages, in order


def drive(
    cores: list[AgentCore], *, edit: Edit | None = None, inject: Inject | None = None
) -> Outcome:
    """FIFO delivery like memory.route. `edit` rewrites or drops (None) each message before
    delivery; `inject` returns bad messages to hand the receiver right after a delivery,
    each of which must raise Rejected. Stops when the queue is empty, done or not."""
    spec = cores[0].spec
    outcome = Outcome(np.zeros((spec.rounds, spec.agents, spec.dim)), [])
    queue: deque[Message] = deque()
    for core in cores:
        queue.extend(core.start())
    while queue:
        msg = queue.popleft()
        if edit is not None and (msg := edit(msg)) is None:
            continue
        if isinstance(msg, Report):
            outcome.models[msg.round - 1, msg.sender] = msg.w
            continue
        target = cores[msg.receiver]
        queue.extend(target.receive(msg))
        for bad in inject(msg, target) if inject else []:
            with pytest.raises(Rejected) as info:
                target.receive(bad)
            outcome.rejected.append(info.value.reason)
    return outcome


def once(when: Callable[[Message, AgentCore], bool], make: Inject) -> Inject:
    """An Inject that fires at the first delivery matching `when`."""
    fired = False

    def inject(msg: Message, core: AgentCore) -> list[Message]:
        nonlocal fired
        if fired or not when(msg, core):
            return []
        fired = True
        return make(msg, core)

    return inject


# ---- construction -------------------------------------------------------------------------


def test_core_rejects_inconsistent_construction() -> None:
    problem = geometric(4)
    spec = build_cores(problem, Strategy.ATC, Scheme.NONE, 0)[0].spec
    loss = LeastSquares(np.ones((3, spec.dim + 1)), np.ones(3), 0.0)
    with pytest.raises(ValueError, match="loss has dim"):
        AgentCore(spec, loss)
    lg = dataclasses.replace(spec, scheme=Scheme.LOCAL_GHP)
    with pytest.raises(ValueError, match="local-ghp needs the agent's identity"):
        AgentCore(lg, LeastSquares(np.ones((3, spec.dim)), np.ones(3), 0.0))


def test_scheme_given_as_text_runs_that_scheme() -> None:
    """A spec built with "none" must not fall through to ghp's noisy branch."""
    core = build_cores(geometric(4), Strategy.ATC, Scheme.GHP, 0)[0]
    spec = dataclasses.replace(core.spec, scheme="none", rekey="every-round")  # type: ignore[arg-type]
    assert spec.scheme is Scheme.NONE and spec.rekey is Rekey.EVERY_ROUND
    plain = AgentCore(spec, core.loss)
    out = plain.start()
    assert out and all(np.array_equal(m.vector, plain.value) for m in out)  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"unknown scheme 'lgp'.*local-ghp"):
        dataclasses.replace(core.spec, scheme="lgp")  # type: ignore[arg-type]


# ---- 1. protocol shape ---------------------------------------------------------------------


@pytest.mark.parametrize("scheme", list(Scheme))
@pytest.mark.parametrize("strategy", list(Strategy))
def test_one_model_per_out_neighbour_and_one_report_per_round(
    strategy: Strategy, scheme: Scheme
) -> None:
    problem = geometric(8, iters=3)
    run = trace(problem, strategy, scheme)
    for core in run.cores:
        assert [p.step for p in core.spec.steps if p.communicates] == [step_of(strategy)]
    models = [m for m in run.wire if isinstance(m, Model)]
    assert {m.step for m in models} == {step_of(strategy)}
    per_link = Counter((m.sender, m.receiver, m.round) for m in models)
    a = weights(problem, strategy)
    want = {(m, k, i) for k in range(8) for m in senders(a, k) for i in (1, 2, 3)}
    assert per_link.keys() == want and set(per_link.values()) == {1}
    reports = Counter((r.sender, r.round) for r in run.wire if isinstance(r, Report))
    assert reports == {(p, i): 1 for p in range(8) for i in (1, 2, 3)}
    assert all(core.done and not core.counters.rejected for core in run.cores)


@pytest.mark.parametrize("strategy", list(Strategy))
def test_start_of_local_ghp_hub_announces_one_key_plan_per_in_neighbour(
    strategy: Strategy,
) -> None:
    problem = problem_on(nx.lollipop_graph(4, 3))  # a clique, then a tail ending in a leaf
    a = weights(problem, strategy)
    for core in build_cores(problem, strategy, Scheme.LOCAL_GHP, 0):
        out = core.start()
        assert all(isinstance(m, KeyPlan) for m in out), "no keys or models before the plans"
        assert Counter(m.receiver for m in out) == Counter(senders(a, core.me))
        seats = split_senders(senders(a, core.me), core.me)
        for plan in out:
            assert (plan.sender, plan.step) == (core.me, step_of(strategy))
            assert Seat(plan.side, plan.partners) == seats[plan.receiver]


@pytest.mark.parametrize("scheme", [Scheme.NONE, Scheme.RANDOM, Scheme.GHP])
def test_start_without_keys_sends_round_one(scheme: Scheme) -> None:
    problem = geometric(6)
    a = weights(problem, Strategy.CONSENSUS)
    for core in build_cores(problem, Strategy.CONSENSUS, scheme, 0):
        out = core.start()
        assert all(isinstance(m, Model) and (m.round, m.step) == (1, 0) for m in out)
        assert sorted(m.receiver for m in out) == [
            k for k in range(6) if a[core.me, k] > 0 and k != core.me
        ]
        assert core.waiting_for() == senders(a, core.me)


@settings(max_examples=50, deadline=None)
@given(
    others=st.lists(st.integers(0, 50), min_size=1, max_size=12, unique=True),
    hub=st.integers(51, 60),
)
def test_split_pairs_every_sender_with_the_other_side(others: list[int], hub: int) -> None:
    seats = split_senders(sorted(others), hub)
    if len(others) == 1:
        assert seats == {others[0]: Seat(+1, (hub,)), hub: Seat(-1, (others[0],))}
        return
    assert seats.keys() == set(others)
    for m, seat in seats.items():
        assert seat.partners, f"sender {m} has no partner to hide behind"
        for partner in seat.partners:
            assert seats[partner].side == -seat.side and m in seats[partner].partners


# ---- 2. local-ghp: masks cancel at every hub, no message in the clear -----------------------


@PROPERTY
@given(graph=graphs(), rule=rules, strategy=strategies)
@example(graph=PATH, rule="metropolis", strategy=Strategy.ATC)
@example(graph=STAR, rule="averaging", strategy=Strategy.CTA)
@example(graph=PAIR, rule="metropolis", strategy=Strategy.CONSENSUS)
def test_local_ghp_masks_cancel_at_every_hub(
    graph: nx.Graph, rule: str, strategy: Strategy
) -> None:
    problem = problem_on(graph, rule, iters=3)
    masked = trace(problem, strategy, Scheme.LOCAL_GHP)
    clear = trace(problem, strategy, Scheme.NONE)
    got, want = masked.sent(), clear.sent()
    assert got.keys() == want.keys()
    for link, vector in got.items():
        assert np.linalg.norm(vector - want[link]) > MASKED, f"model {link} crossed in the clear"
    a = weights(problem, strategy)
    for k in range(problem.config.agents):
        others = senders(a, k)
        for i in range(1, problem.config.iters + 1):
            value, own = masked.kept[(k, i)]
            lhs = a[k, k] * own + sum(a[m, k] * got[(m, k, i)] for m in others)
            rhs = a[k, k] * clear.kept[(k, i)][1] + sum(a[m, k] * want[(m, k, i)] for m in others)
            scale = a[k, k] * np.linalg.norm(own) + sum(
                a[m, k] * np.linalg.norm(got[(m, k, i)]) for m in others
            )
            assert np.linalg.norm(lhs - rhs) <= REL * scale, f"hub {k}, round {i}"
            # Only a hub with a single other neighbour masks its own term (it pairs itself).
            if len(others) == 1:
                assert np.linalg.norm(own - value) > MASKED
            else:
                np.testing.assert_array_equal(own, value)
    assert_same_trajectory(masked.models, clear.models)


def _noise_table(core: AgentCore, round_: int) -> np.ndarray:
    """Row `core.me` of round `round_`'s noise table, as documented in core._privatize."""
    spec = core.spec
    plan = next(p for p in spec.steps if p.communicates)
    raw = rng.raw_row(
        spec.noise_key,
        rng.Domain.NOISE,
        plan.step,
        round_,
        spec.agent,
        spec.agents,
        spec.agents * spec.dim,
    )
    return rng.laplace(rng.uniforms(raw), spec.sigma_g).reshape(spec.agents, spec.dim)


# ---- 3. ghp: the noise cancels in the q-weighted network sum ------------------------------


@PROPERTY
@given(graph=graphs(), rule=rules, strategy=strategies)
@example(graph=STAR, rule="averaging", strategy=Strategy.ATC)
def test_ghp_noise_is_graph_homomorphic(graph: nx.Graph, rule: str, strategy: Strategy) -> None:
    """sum_p q_p a_mp (message_mp - x_m) = 0 per sender m, with the self-term it keeps."""
    problem = problem_on(graph, rule, iters=3)
    run = trace(problem, strategy, Scheme.GHP)
    got, a, q, c = run.sent(), weights(problem, strategy), problem.q, problem.config
    for m in range(c.agents):
        receivers = senders(a.T, m)
        for i in range(1, c.iters + 1):
            x, own = run.kept[(m, i)]
            noise = {k: got[(m, k, i)] - x for k in receivers} | {m: own - x}
            residual = sum(q[k] * a[m, k] * g for k, g in noise.items())
            scale = sum(q[k] * a[m, k] * np.linalg.norm(g) for k, g in noise.items())
            assert scale > 0
            assert np.linalg.norm(residual) <= REL * scale, f"sender {m}, round {i}"
            g = _noise_table(run.cores[m], i)[m]  # one draw per sender, the same for all
            for k in receivers:
                np.testing.assert_allclose(got[(m, k, i)], x + g, rtol=0, atol=1e-14)
            np.testing.assert_allclose(own, x - (1 - a[m, m]) / a[m, m] * g, rtol=0, atol=1e-14)


# ---- 4. random: independent noise per receiver, from the public streams --------------------


@pytest.mark.parametrize("strategy", list(Strategy))
def test_random_noise_differs_per_receiver_and_comes_from_rng(strategy: Strategy) -> None:
    problem = geometric(8, iters=3)
    run = trace(problem, strategy, Scheme.RANDOM)
    got, a = run.sent(), weights(problem, strategy)
    for m in range(8):
        receivers = senders(a.T, m)
        for i in (1, 2, 3):
            x, own = run.kept[(m, i)]
            np.testing.assert_array_equal(own, x)  # no noise on the self-term
            table = _noise_table(run.cores[m], i)
            for k in receivers:
                np.testing.assert_allclose(got[(m, k, i)], x + table[k], rtol=0, atol=1e-14)
            for k, j in pairwise(receivers):
                assert np.linalg.norm(got[(m, k, i)] - got[(m, j, i)]) > MASKED


# ---- 5. rejections --------------------------------------------------------------------------


def _stranger(core: AgentCore, step: int) -> int:
    return min(set(range(core.spec.agents)) - set(core.spec.plan(step).weights_in))


def _slot(msg: Model) -> tuple[int, int]:
    return (msg.round, STEPS.index(msg.step))


BAD_MODELS: dict[str, Callable[[Model, AgentCore], Message]] = {
    "wrong-receiver": lambda msg, core: dataclasses.replace(
        msg, receiver=(msg.receiver + 1) % core.spec.agents
    ),
    "not-neighbour": lambda msg, core: dataclasses.replace(msg, sender=_stranger(core, msg.step)),
    "stale": lambda msg, core: dataclasses.replace(msg, round=core.round - 1),
    "duplicate": lambda msg, core: msg,  # a replay of the message just delivered
    "ahead": lambda msg, core: dataclasses.replace(msg, round=core.round + 2),
    "shape": lambda msg, core: dataclasses.replace(msg, vector=np.zeros(core.spec.dim + 1)),
    "non-finite": lambda msg, core: dataclasses.replace(msg, vector=np.full(core.spec.dim, np.nan)),
    "schema": lambda msg, core: Report(sender=msg.sender, round=msg.round, w=msg.vector),
}


def _mid_run(msg: Message, core: AgentCore) -> bool:
    """A Model of INJECT_ROUND whose slot the receiver still holds (so a replay is a
    duplicate), at an agent that has a non-neighbour."""
    return (
        isinstance(msg, Model)
        and msg.round == INJECT_ROUND
        and core.position <= _slot(msg)
        and len(core.spec.plan(msg.step).weights_in) < core.spec.agents
    )


@pytest.mark.parametrize("scheme", [Scheme.RANDOM, Scheme.LOCAL_GHP])
@pytest.mark.parametrize("reason", list(BAD_MODELS))
def test_bad_model_is_rejected_counted_and_harmless(reason: str, scheme: Scheme) -> None:
    problem = geometric()
    clean = drive(build_cores(problem, Strategy.ATC, scheme, 0))
    cores = build_cores(problem, Strategy.ATC, scheme, 0)
    hit: list[int] = []

    def make(msg: Message, core: AgentCore) -> list[Message]:
        hit.append(core.me)
        return [BAD_MODELS[reason](msg, core)]  # type: ignore[arg-type]

    outcome = drive(cores, inject=once(_mid_run, make))
    assert outcome.rejected == [reason]
    assert [c.counters.rejected for c in cores] == [
        {reason: 1} if c.me in hit else {} for c in cores
    ]
    assert all(c.done for c in cores)
    if scheme is Scheme.RANDOM:
        np.testing.assert_array_equal(outcome.models, clean.models)
    else:
        assert_same_trajectory(outcome.models, clean.models)


# ---- 6. key agreement -----------------------------------------------------------------------


def _relayed(msg: Message) -> bool:
    return isinstance(msg, KeyShare) and msg.sender == msg.hub != msg.owner


class KeySwap:
    """Hub `hub` replaces every key it relays with one of its own (a man in the middle)."""

    def __init__(self, cores: list[AgentCore], hub: int, resign: bool) -> None:
        self.cores, self.hub, self.resign = cores, hub, resign
        self.swapped: list[KeyShare] = []

    def __call__(self, msg: Message) -> Message | None:
        if not (_relayed(msg) and msg.sender == self.hub):
            return msg
        assert isinstance(msg, KeyShare)
        evil = keys.Ephemeral.generate()
        signature = msg.signature
        if self.resign:
            hub = self.cores[self.hub]
            assert hub.identity is not None
            signature = keys.sign_share(
                hub.identity,
                hub.spec.session,
                msg.owner,
                msg.hub,
                msg.partner,
                msg.step,
                msg.epoch,
                evil,
            )
        self.swapped.append(msg)
        return dataclasses.replace(msg, public=evil.public, signature=signature)


@pytest.mark.parametrize("resign", [True, False], ids=["re-signed", "owner-signature"])
def test_hub_that_swaps_a_relayed_key_is_caught_by_the_partner(resign: bool) -> None:
    problem = geometric()
    cores = build_cores(problem, Strategy.ATC, Scheme.LOCAL_GHP, 0)
    a = weights(problem, Strategy.ATC)
    hub = next(k for k in range(10) if len(senders(a, k)) >= 2)
    swap = KeySwap(cores, hub, resign)
    with pytest.raises(keys.BadKey) as info:
        drive(cores, edit=swap)
    first = swap.swapped[0]
    who = f"key of agent {first.owner} relayed by hub {hub} for agent {first.partner}"
    assert who in str(info.value) and "signature" in str(info.value)
    assert not cores[first.partner].counters.rejected  # an attack stops the run, not a count


def _partners(core: AgentCore, hub: int, step: int) -> tuple[int, ...]:
    return core._seats[(hub, step)].partners


def _foreign_share(cores: list[AgentCore], msg: KeyShare, core: AgentCore) -> KeyShare:
    """A correctly signed key share from an agent that is not core's partner at msg.hub."""
    x = min(set(range(core.spec.agents)) - {core.me, *_partners(core, msg.hub, msg.step)})
    assert cores[x].identity is not None
    eph = keys.Ephemeral.generate()
    signature = keys.sign_share(
        cores[x].identity, core.spec.session, x, msg.hub, core.me, msg.step, msg.epoch, eph
    )
    return dataclasses.replace(msg, owner=x, public=eph.public, signature=signature)


BAD_SHARES: dict[str, Callable[[list[AgentCore], KeyShare, AgentCore], Message]] = {
    "not-neighbour": _foreign_share,
    "spoofed": lambda cores, msg, core: dataclasses.replace(msg, sender=msg.owner),
    "duplicate": lambda cores, msg, core: msg,
    "wrong-receiver": lambda cores, msg, core: dataclasses.replace(msg, receiver=msg.owner),
    "stale": lambda cores, msg, core: dataclasses.replace(msg, epoch=core.round - 1),
    "ahead": lambda cores, msg, core: dataclasses.replace(msg, epoch=core.round + 2),
}


@pytest.mark.parametrize("reason", list(BAD_SHARES))
def test_bad_key_share_at_the_partner_is_rejected_and_harmless(reason: str) -> None:
    """Every-round re-keying, so epochs move and a stale epoch exists mid-run."""
    problem = geometric(rekey=Rekey.EVERY_ROUND)
    clean = drive(build_cores(problem, Strategy.CTA, Scheme.NONE, 0))
    cores = build_cores(problem, Strategy.CTA, Scheme.LOCAL_GHP, 0)

    def when(msg: Message, core: AgentCore) -> bool:
        # ... and the partner has not finished that round, so a replay is a duplicate
        return _relayed(msg) and msg.epoch == INJECT_ROUND >= core.round  # type: ignore[union-attr]

    def make(msg: Message, core: AgentCore) -> list[Message]:
        return [BAD_SHARES[reason](cores, msg, core)]  # type: ignore[arg-type]

    outcome = drive(cores, inject=once(when, make))
    assert outcome.rejected == [reason]
    assert sum(sum(c.counters.rejected.values()) for c in cores) == 1
    assert all(c.done for c in cores)
    assert_same_trajectory(outcome.models, clean.models)


def test_hub_refuses_to_relay_for_agents_it_did_not_pair() -> None:
    problem = geometric()
    cores = build_cores(problem, Strategy.ATC, Scheme.LOCAL_GHP, 0)
    clean = drive(build_cores(problem, Strategy.ATC, Scheme.NONE, 0))

    def when(msg: Message, core: AgentCore) -> bool:
        return isinstance(msg, KeyShare) and msg.receiver == msg.hub != msg.owner

    def make(msg: Message, hub: AgentCore) -> list[Message]:
        share: KeyShare = msg  # type: ignore[assignment]
        owner = cores[share.owner]
        paired = _partners(owner, hub.me, share.step)
        unpaired = min(set(range(10)) - {share.owner, hub.me, *paired})
        assert owner.identity is not None
        eph = keys.Ephemeral.generate()
        signature = keys.sign_share(
            owner.identity,
            owner.spec.session,
            owner.me,
            hub.me,
            unpaired,
            share.step,
            share.epoch,
            eph,
        )
        return [
            dataclasses.replace(share, partner=unpaired, public=eph.public, signature=signature)
        ]

    outcome = drive(cores, inject=once(when, make))
    assert outcome.rejected == ["not-neighbour"]
    assert_same_trajectory(outcome.models, clean.models)


def _distinct_partners(problem: Problem, strategy: Strategy, p: int) -> set[int]:
    """Everyone p shares a mask with: its partners at every hub it sends to, itself included."""
    a = weights(problem, strategy)
    found: set[int] = set()
    for k in [k for k in range(problem.config.agents) if a[p, k] > 0]:
        seat = split_senders(senders(a, k), k).get(p)
        found |= set(seat.partners) if seat else set()
    return found


def _relays(problem: Problem, strategy: Strategy, k: int) -> int:
    """Shares hub k forwards per epoch: two per pair (none when it pairs with its neighbour)."""
    seats = split_senders(senders(weights(problem, strategy), k), k)
    return sum(len(s.partners) for m, s in seats.items() if m != k and k not in s.partners)


@pytest.mark.parametrize(
    "graph",
    [PATH, STAR, topology.make_graph("geometric", 9, SEED)],
    ids=["path", "star", "geometric"],
)
@pytest.mark.parametrize("rekey", list(Rekey))
def test_rekey_counts_agreements_and_keeps_the_trajectory(graph: nx.Graph, rekey: Rekey) -> None:
    problem = problem_on(graph, rekey=rekey)
    clean = drive(build_cores(problem, Strategy.ATC, Scheme.NONE, 0))
    cores = build_cores(problem, Strategy.ATC, Scheme.LOCAL_GHP, 0)
    outcome = drive(cores)
    epochs = ROUNDS if rekey is Rekey.EVERY_ROUND else 1
    for core in cores:
        assert core.counters.agreements == epochs * len(
            _distinct_partners(problem, Strategy.ATC, core.me)
        )
        assert core.counters.relayed == epochs * _relays(problem, Strategy.ATC, core.me)
    assert_same_trajectory(outcome.models, clean.models)


# ---- 7. waiting_for --------------------------------------------------------------------------


def test_waiting_for_names_the_silent_neighbour() -> None:
    problem = geometric()
    cores = build_cores(problem, Strategy.ATC, Scheme.NONE, 0)
    a = weights(problem, Strategy.ATC)
    silent = 0

    def edit(msg: Message) -> Message | None:
        return None if isinstance(msg, Model) and msg.sender == silent and msg.round >= 2 else msg

    drive(cores, edit=edit)
    listeners = [k for k in range(10) if k != silent and a[silent, k] > 0]
    assert listeners
    for k in listeners:
        assert not cores[k].done and cores[k].position == (2, STEPS.index(2))
        assert cores[k].waiting_for() == [silent]


def test_waiting_for_names_the_partner_whose_key_never_came() -> None:
    problem = geometric()
    cores = build_cores(problem, Strategy.ATC, Scheme.LOCAL_GHP, 0)
    silent = 0

    def edit(msg: Message) -> Message | None:
        return None if isinstance(msg, KeyShare) and msg.owner == silent else msg

    drive(cores, edit=edit)
    partners = {p for p in range(10) if silent in _distinct_partners(problem, Strategy.ATC, p)}
    assert partners
    for p in partners:
        assert cores[p].round == 1 and silent in cores[p].waiting_for()

"""The sans-IO agent core (privnet/agent/core.py): whole sessions and single cores.

Whole sessions run on the memory engine (conductor and agent nodes on its one Router, the
frames the MQTT shells would publish), with observed cores; attacks tamper with, drop or
inject frames in flight there, and the receiving node must count each bad delivery. Tests
of one core's logic hand it messages directly.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import pairwise
from typing import Any

import networkx as nx
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from probes import inject, uncounted
from router import Routed

from privnet.agent import keys, rng, topics, wire
from privnet.agent.core import AgentCore, Seat, split_senders
from privnet.agent.losses import LeastSquares, Local, make_loss
from privnet.agent.messages import KeyPlan, KeyShare, Message, Model, Rejected, Report
from privnet.agent.node import AgentNode
from privnet.agent.protocol import Publish
from privnet.agent.spec import STEPS, STRATEGY_STEP, ConfigError, Rekey, Scheme, StepPlan, Strategy
from privnet.agent.wire import Peer
from privnet.orchestrator.experiment import topology
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance
from privnet.orchestrator.experiment.specs import agent_specs, session_plans

SEED = 7
ROUNDS = 5
REL = 1e-12  # float agreement, relative
# Masked schemes round each weighted term of a combination to the noise grid (rng.on_lattice,
# 2^-24 at sigma_g = 0.1): local-ghp follows none's trajectory (masked-ghp ghp's) that
# closely, a few grid steps a round, and far below the noise scale b = 0.07.
LATTICE = 1e-5
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


def problem_on(graph: nx.Graph, rule: str = "metropolis", **overrides: Any) -> Instance:
    overrides = {"iters": ROUNDS, "seed": SEED, **overrides}
    config = ExperimentConfig(agents=graph.number_of_nodes(), rule=rule, **overrides)
    a = topology.combination_matrix(graph, rule)
    return dataclasses.replace(Instance.build(config), graph=graph, A=a, q=topology.perron(a))


def geometric(agents: int = 10, rule: str = "metropolis", **overrides: Any) -> Instance:
    return problem_on(topology.make_graph("geometric", agents, SEED), rule, **overrides)


def step_of(strategy: Strategy) -> int:
    return STRATEGY_STEP[strategy]


def weights(problem: Instance, strategy: Strategy) -> np.ndarray:
    """The matrix of the strategy's communicating step: A[m, k] = a_mk."""
    return problem.matrices(strategy)[step_of(strategy)]


def senders(a: np.ndarray, k: int) -> list[int]:
    return [int(m) for m in np.flatnonzero(a[:, k]) if m != k]


def assert_same_trajectory(got: np.ndarray, want: np.ndarray, rel: float = LATTICE) -> None:
    err = np.max(np.abs(got - want))
    assert err <= rel * np.max(np.abs(want)), f"trajectories differ by {err:.3g}"


# ---- whole sessions on the memory engine ----------------------------------------------------


@dataclass
class Notes:
    """What the observed cores of one session noted."""

    # (agent, round) -> (the value it privatized, the self-term it kept)
    kept: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    # (agent, round) -> the scheme's release to each target before any mask
    released: dict[tuple[int, int], dict[int, np.ndarray]] = field(default_factory=dict)
    refused: list[Exception] = field(default_factory=list)  # raised by receive, in order
    agreed: dict[int, int] = field(default_factory=dict)  # agent -> DH agreements at its start


class Observed(AgentCore):
    """An AgentCore that notes what it privatizes, the self-term it keeps, what it refuses."""

    def __init__(self, *args: Any, notes: Notes) -> None:
        super().__init__(*args)
        self.notes = notes

    def _send(self, plan: StepPlan) -> list[Message]:
        value = self.value.copy()
        out = super()._send(plan)
        self.notes.kept[(self.me, self.round)] = (value, self._inbox[self.position][self.me])
        return out

    def start(self, until: int | None = None) -> list[Message]:
        self.notes.agreed[self.me] = self.counters.agreements
        return super().start(until)

    def _release(self, plan: StepPlan) -> dict[int, np.ndarray]:
        released = super()._release(plan)
        self.notes.released[(self.me, self.round)] = released
        return released

    def receive(self, msg: Message) -> list[Message]:
        try:
            return super().receive(msg)
        except (Rejected, keys.BadKey) as exc:
            self.notes.refused.append(exc)
            raise


class Session:
    """One session on the memory engine: the conductor and a node per agent on the tests' Router,
    with observed cores; `wire` is every peer message the agents published, as delivered
    and read by an eavesdropper (edited in flight, if it was; "injected" frames left out).

    On the visible wire (`--seal-links off`): these tests read, edit and forge the frames
    of the round protocol in flight, which sealing hides from anyone but a link's two ends
    (tests/test_links.py covers the seal itself)."""

    def __init__(self, problem: Instance, strategy: Strategy, scheme: Scheme) -> None:
        self.dim = problem.config.dim
        self.notes = Notes()
        self.wire: list[Peer] = []
        self.models = np.zeros(0)
        plans = session_plans(problem, [(strategy, scheme, 0)])
        self.network = Routed.build(
            plans, core=partial(Observed, notes=self.notes), tap=self._tap, seal_links=False
        )
        self.router = self.network.router

    def _tap(self, publisher: str, frame: Publish) -> None:
        msg = self.peer(frame)
        if msg is not None:
            self.wire.append(msg)

    def peer(self, frame: Publish) -> Peer | None:
        """The peer message an agent published in `frame` (None for anything else)."""
        if frame.category == "injected" or topics.parse_peer_topic(frame.topic) is None:
            return None
        return wire.peek_peer(frame.payload, self.dim)

    @property
    def nodes(self) -> list[AgentNode]:
        return self.network.nodes

    def core(self, p: int) -> AgentCore:
        session = self.nodes[p].session
        assert session is not None
        return session.core

    @property
    def cores(self) -> list[AgentCore]:
        return [self.core(p) for p in range(len(self.nodes))]

    def play(self) -> np.ndarray:
        """The session to its end: the true models (rounds, P, M) from the sealed telemetry."""
        (result,) = self.network.play()
        self.models = result.models
        return self.models

    def stall(self) -> None:
        """Deliver all there is, for a session that cannot finish."""
        self.network.start()
        self.router.drain()

    def rejected(self) -> list[dict[str, int]]:
        """Per node, the deliveries it refused, by reason; every delivery is counted."""
        parties = [*self.nodes, self.network.conductor]
        assert [uncounted(p.deliveries) for p in parties] == [0] * len(parties)
        return [dict(node.deliveries.rejected) for node in self.nodes]

    def frame(self, receiver: int, msg: Message) -> bytes:
        """`msg` as its sender frames it for `receiver`: MACed with their link key (a Report,
        which no agent sends to a peer, as the plain frame telemetry seals)."""
        if isinstance(msg, Report):
            return wire.encode_report(msg)
        session = self.nodes[receiver].session
        assert session is not None
        if msg.sender not in session.links.keys:  # a non-neighbour: the receiver derived no
            return wire.encode_peer(msg, bytes(32))  # link key with it, so no MAC can pass
        return wire.encode_peer(msg, session.links.keys[msg.sender])

    def drop(self, lost: Callable[[Peer], bool]) -> None:
        """Lose every peer frame whose message is `lost` in flight."""

        def edit(publisher: str, frame: Publish) -> Publish | None:
            msg = self.peer(frame)
            return None if msg is not None and lost(msg) else frame

        self.router.edit = edit

    def inject_once(
        self, when: Callable[[Peer, AgentCore], bool], make: Callable[[Peer, AgentCore], Message]
    ) -> list[int]:
        """At the first peer frame in flight that `when` matches (given its receiver's core),
        deliver what `make` builds in its place, as its sender would frame it; the genuine
        frame comes after all queued so far. Returns the receiver hit, once it is."""
        hit: list[int] = []

        def edit(publisher: str, frame: Publish) -> Publish:
            msg = self.peer(frame)
            if hit or msg is None or not when(msg, core := self.core(msg.receiver)):
                return frame
            hit.append(msg.receiver)
            inject(self.router, frame.topic, frame.payload, publisher)
            bad = make(msg, core)
            topic = topics.peer_topic(self.nodes[msg.receiver].run, msg.receiver, bad.sender)
            return Publish(topic, self.frame(msg.receiver, bad), "injected")

        self.router.edit = edit
        return hit

    def sent(self) -> dict[tuple[int, int, int], np.ndarray]:
        """(sender, receiver, round) -> vector of every Model on the wire."""
        return {
            (m.sender, m.receiver, m.round): m.vector for m in self.wire if isinstance(m, Model)
        }


def played(problem: Instance, strategy: Strategy, scheme: Scheme) -> Session:
    session = Session(problem, strategy, scheme)
    session.play()
    return session


# ---- single cores ---------------------------------------------------------------------------


def cores(problem: Instance, strategy: Strategy, scheme: Scheme) -> list[AgentCore]:
    """One core per agent with fresh identities, for tests of one core at a time."""
    specs = agent_specs(problem, strategy, scheme)
    identities = [keys.Identity.generate() for _ in specs]
    directory = {p: identity.public for p, identity in enumerate(identities)}
    data = problem.specs(0)
    return [AgentCore(s, make_loss(data[s.agent]), identities[s.agent], directory) for s in specs]


# ---- construction -------------------------------------------------------------------------


def test_core_rejects_inconsistent_construction() -> None:
    problem = geometric(4)
    spec = cores(problem, Strategy.ATC, Scheme.NONE)[0].spec

    def loss(dim: int) -> Local:
        return Local(LeastSquares(0.0).risk(np.ones((3, dim)), np.ones(3), 0), dim, 3)

    with pytest.raises(ValueError, match="loss has dim"):
        AgentCore(spec, loss(spec.dim + 1))
    lg = dataclasses.replace(spec, scheme=Scheme.LOCAL_GHP)
    with pytest.raises(ValueError, match="local-ghp needs the agent's identity"):
        AgentCore(lg, loss(spec.dim))


def test_scheme_given_as_text_runs_that_scheme() -> None:
    """A spec built with "none" must not fall through to ghp's noisy branch."""
    core = cores(geometric(4), Strategy.ATC, Scheme.GHP)[0]
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
    run = played(problem, strategy, scheme)
    for core in run.cores:
        assert [p.step for p in core.spec.steps if p.communicates] == [step_of(strategy)]
    models = [m for m in run.wire if isinstance(m, Model)]
    assert {m.step for m in models} == {step_of(strategy)}
    per_link = Counter((m.sender, m.receiver, m.round) for m in models)
    a = weights(problem, strategy)
    want = {(m, k, i) for k in range(8) for m in senders(a, k) for i in (1, 2, 3)}
    assert per_link.keys() == want and set(per_link.values()) == {1}
    # Every agent reported every round, once: the conductor refuses a second report.
    assert run.models.shape == (3, 8, problem.config.dim) and not np.isnan(run.models).any()
    assert run.rejected() == [{}] * 8 and not run.network.conductor.deliveries.rejected
    assert all(core.done for core in run.cores)


@pytest.mark.parametrize("strategy", list(Strategy))
def test_start_of_local_ghp_hub_announces_one_key_plan_per_in_neighbour(
    strategy: Strategy,
) -> None:
    problem = problem_on(nx.lollipop_graph(4, 3))  # a clique, then a tail ending in a leaf
    a = weights(problem, strategy)
    for core in cores(problem, strategy, Scheme.LOCAL_GHP):
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
    for core in cores(problem, Strategy.CONSENSUS, scheme):
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


# ---- 2. masked schemes: masks cancel at every hub, no message in the clear ------------------


UNMASKED = {Scheme.LOCAL_GHP: Scheme.NONE, Scheme.MASKED_GHP: Scheme.GHP}


@PROPERTY
@given(graph=graphs(), rule=rules, strategy=strategies, scheme=st.sampled_from(list(UNMASKED)))
@example(graph=PATH, rule="metropolis", strategy=Strategy.ATC, scheme=Scheme.LOCAL_GHP)
@example(graph=STAR, rule="averaging", strategy=Strategy.CTA, scheme=Scheme.MASKED_GHP)
@example(graph=PAIR, rule="metropolis", strategy=Strategy.CONSENSUS, scheme=Scheme.LOCAL_GHP)
def test_masks_cancel_exactly_at_every_hub(
    graph: nx.Graph, rule: str, strategy: Strategy, scheme: Scheme
) -> None:
    """Every frame masked; each hub's combination, its terms on the lattice, is exactly the
    one of the unmasked releases; the trajectory is the unmasked scheme's up to the grid."""
    problem = problem_on(graph, rule, iters=3)
    masked = played(problem, strategy, scheme)
    got, sigma_g = masked.sent(), problem.config.sigma_g
    a = weights(problem, strategy)
    for (m, k, i), vector in got.items():
        release = masked.notes.released[(m, i)][k]
        assert np.linalg.norm(vector - release) > MASKED, f"model {(m, k, i)} crossed unmasked"
    for k in range(problem.config.agents):
        others = senders(a, k)
        for i in range(1, problem.config.iters + 1):
            own = masked.notes.kept[(k, i)][1]
            released = {m: masked.notes.released[(m, i)][k] for m in [k, *others]}
            sent = {m: got[(m, k, i)] for m in others} | {k: own}
            combined = sum(rng.on_lattice(sent[m], a[m, k], rng.grid(sigma_g)) for m in sent)
            exact = sum(rng.on_lattice(released[m], a[m, k], rng.grid(sigma_g)) for m in released)
            np.testing.assert_array_equal(combined, exact, err_msg=f"hub {k}, round {i}")
            # Only a hub with a single other neighbour masks its own term (it pairs itself).
            if len(others) == 1:
                assert np.linalg.norm(own - released[k]) > MASKED
            else:
                np.testing.assert_array_equal(
                    own, rng.masked_release(released[k], 0.0, a[k, k], rng.grid(sigma_g))
                )
    unmasked = played(problem, strategy, UNMASKED[scheme]).models
    assert_same_trajectory(masked.models, unmasked)


def test_masked_releases_are_one_function_of_a_lattice_point() -> None:
    """Each frame is (n grid) / a_mk for an integer n: its low-order bits carry nothing of x."""
    problem = geometric(8, iters=3)
    step = rng.grid(problem.config.sigma_g)
    a = weights(problem, Strategy.ATC)
    for scheme in UNMASKED:
        for (m, k, _), vector in played(problem, Strategy.ATC, scheme).sent().items():
            n = np.rint(a[m, k] * vector / step)
            np.testing.assert_array_equal(vector, n * step / a[m, k])
            assert np.all(np.abs(n) < 2**51)


def _noise_table(core: AgentCore, round_: int) -> np.ndarray:
    """Round `round_`'s row of the core's own noise stream, as documented in core._privatize."""
    spec = core.spec
    plan = next(p for p in spec.steps if p.communicates)
    raw = rng.raw_row(spec.noise_key, rng.Domain.NOISE, plan.step, round_, spec.agents * spec.dim)
    return rng.laplace(rng.uniforms(raw), spec.sigma_g).reshape(spec.agents, spec.dim)


# ---- 3. ghp, masked-ghp: the noise cancels in the q-weighted network sum -------------------


@PROPERTY
@given(
    graph=graphs(),
    rule=rules,
    strategy=strategies,
    scheme=st.sampled_from([Scheme.GHP, Scheme.MASKED_GHP]),
)
@example(graph=STAR, rule="averaging", strategy=Strategy.ATC, scheme=Scheme.GHP)
def test_ghp_noise_is_graph_homomorphic(
    graph: nx.Graph, rule: str, strategy: Strategy, scheme: Scheme
) -> None:
    """sum_p q_p a_mp (release_mp - x_m) = 0 per sender m, with the self-term it keeps
    (masked-ghp: its release before the masks, which ghp puts on the wire as it is)."""
    problem = problem_on(graph, rule, iters=3)
    run = played(problem, strategy, scheme)
    got, a, q, c = run.sent(), weights(problem, strategy), problem.q, problem.config
    for m in range(c.agents):
        receivers = senders(a.T, m)
        for i in range(1, c.iters + 1):
            value, _ = run.notes.kept[(m, i)]
            released = run.notes.released[(m, i)]
            if scheme is Scheme.GHP:
                assert all(np.array_equal(got[(m, k, i)], released[k]) for k in receivers)
            x = rng.snap(value, c.sigma_g)  # released on the noise grid
            np.testing.assert_allclose(x, value, rtol=0, atol=rng.grid(c.sigma_g))
            noise = {k: released[k] - x for k in [*receivers, m]}
            residual = sum(q[k] * a[m, k] * g for k, g in noise.items())
            scale = sum(q[k] * a[m, k] * np.linalg.norm(g) for k, g in noise.items())
            assert scale > 0
            assert np.linalg.norm(residual) <= REL * scale, f"sender {m}, round {i}"
            g = _noise_table(run.cores[m], i)[m]  # one draw per sender, the same for all
            for k in receivers:
                np.testing.assert_allclose(released[k], x + g, rtol=0, atol=1e-14)
            own = released[m]
            np.testing.assert_allclose(own, x - (1 - a[m, m]) / a[m, m] * g, rtol=0, atol=1e-14)


# ---- 4. random: independent noise per receiver, from the public streams --------------------


@pytest.mark.parametrize("strategy", list(Strategy))
def test_random_noise_differs_per_receiver_and_comes_from_rng(strategy: Strategy) -> None:
    problem = geometric(8, iters=3)
    run = played(problem, strategy, Scheme.RANDOM)
    got, a = run.sent(), weights(problem, strategy)
    for m in range(8):
        receivers = senders(a.T, m)
        for i in (1, 2, 3):
            value, own = run.notes.kept[(m, i)]
            x = rng.snap(value, problem.config.sigma_g)  # released on the noise grid
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


def _replay(msg: Model, core: AgentCore) -> Model:
    """A replay of a model that core holds for msg's slot, from another sender."""
    held = core._inbox[_slot(msg)]
    sender = min(set(held) - {core.me, msg.sender})
    return dataclasses.replace(msg, sender=sender, vector=held[sender])


# Each made in place of a genuine model that its receiver accepts, so at round msg.round - 1
# or msg.round, and holding another sender's model for that slot.
BAD_MODELS: dict[str, Callable[[Model, AgentCore], Message]] = {
    "wrong-receiver": lambda msg, core: dataclasses.replace(
        msg, receiver=(msg.receiver + 1) % core.spec.agents
    ),
    "not-neighbour": lambda msg, core: dataclasses.replace(msg, sender=_stranger(core, msg.step)),
    "stale": lambda msg, core: dataclasses.replace(msg, round=msg.round - 2),
    "duplicate": _replay,
    "ahead": lambda msg, core: dataclasses.replace(msg, round=msg.round + 2),
    "shape": lambda msg, core: dataclasses.replace(msg, vector=np.zeros(core.spec.dim + 1)),
    "non-finite": lambda msg, core: dataclasses.replace(msg, vector=np.full(core.spec.dim, np.nan)),
    "schema": lambda msg, core: Report(sender=msg.sender, round=msg.round, w=msg.vector),
}


@pytest.mark.parametrize("reason", list(BAD_MODELS))
def test_core_itself_rejects_a_bad_model(reason: str) -> None:
    """The core's own checks, behind the wire's (which catch shape, non-finite, schema and
    wrong-receiver first): a neighbour's model for round 1, then a bad one made from the
    model another neighbour is about to send."""
    problem = geometric()
    step = step_of(Strategy.ATC)
    core = next(
        c
        for c in cores(problem, Strategy.ATC, Scheme.NONE)
        if 2 <= len(c.spec.plan(step).senders(c.me)) < c.spec.agents - 1
    )
    core.start()
    first, second = core.spec.plan(step).senders(core.me)[:2]
    assert core.receive(Model(first, core.me, 1, step, np.ones(core.spec.dim))) == []
    upcoming = Model(second, core.me, 1, step, np.ones(core.spec.dim))
    with pytest.raises(Rejected) as info:
        core.receive(BAD_MODELS[reason](upcoming, core))
    assert info.value.reason == reason


def _mid_run(msg: Peer, core: AgentCore) -> bool:
    """A Model of INJECT_ROUND, at an agent that has a non-neighbour and holds another
    sender's model for that slot (to replay)."""
    return (
        isinstance(msg, Model)
        and msg.round == INJECT_ROUND
        and len(core.spec.plan(msg.step).weights_in) < core.spec.agents
        and bool(set(core._inbox.get(_slot(msg), {})) - {core.me})
    )


@pytest.mark.parametrize("scheme", [Scheme.RANDOM, Scheme.LOCAL_GHP])
@pytest.mark.parametrize("reason", list(BAD_MODELS))
def test_bad_model_is_rejected_counted_and_harmless(reason: str, scheme: Scheme) -> None:
    problem = geometric()
    clean = played(problem, Strategy.ATC, scheme).models
    run = Session(problem, Strategy.ATC, scheme)
    hit = run.inject_once(_mid_run, BAD_MODELS[reason])  # type: ignore[arg-type]
    models = run.play()
    assert len(hit) == 1
    # A node holds link keys with its neighbours only: a stranger's frame stops at the wire.
    seen = "unknown-sender" if reason == "not-neighbour" else reason
    assert run.rejected() == [{seen: 1} if p in hit else {} for p in range(10)]
    assert all(c.done for c in run.cores)
    np.testing.assert_array_equal(models, clean)  # masks cancel exactly: nothing changed


# ---- 6. key agreement -----------------------------------------------------------------------


def _relayed(msg: Peer) -> bool:
    return isinstance(msg, KeyShare) and msg.sender == msg.hub != msg.owner


class KeySwap:
    """Hub `hub` forges every key it relays (a man in the middle): its own ephemeral key,
    re-signed by itself or under the owner's signature; the genuine share follows it."""

    def __init__(self, run: Session, hub: int, resign: bool) -> None:
        self.run, self.hub, self.resign = run, hub, resign
        self.swapped: list[KeyShare] = []

    def __call__(self, publisher: str, frame: Publish) -> Publish:
        msg = self.run.peer(frame)
        if not (isinstance(msg, KeyShare) and _relayed(msg) and msg.sender == self.hub):
            return frame
        evil = keys.Ephemeral.generate()
        signature = msg.signature
        if self.resign:
            signature = keys.sign_share(
                self.run.nodes[self.hub].identity,
                self.run.core(self.hub).spec.session,
                msg.owner,
                msg.hub,
                msg.partner,
                msg.step,
                msg.epoch,
                evil,
            )
        self.swapped.append(msg)
        inject(self.run.router, frame.topic, frame.payload)
        forged = dataclasses.replace(msg, public=evil.public, signature=signature)
        return dataclasses.replace(frame, payload=self.run.frame(msg.partner, forged))


@pytest.mark.parametrize("resign", [True, False], ids=["re-signed", "owner-signature"])
def test_hub_that_swaps_a_relayed_key_is_caught_counted_and_harmless(resign: bool) -> None:
    """The partner refuses the forged key ("bad-key") without storing it, so the genuine
    share, which comes after it, still completes the pair and the run goes on."""
    problem = geometric()
    clean = played(problem, Strategy.ATC, Scheme.LOCAL_GHP).models
    a = weights(problem, Strategy.ATC)
    hub = next(k for k in range(10) if len(senders(a, k)) >= 2)
    run = Session(problem, Strategy.ATC, Scheme.LOCAL_GHP)
    swap = KeySwap(run, hub, resign)
    run.router.edit = swap
    models = run.play()
    assert swap.swapped
    forged = Counter(msg.partner for msg in swap.swapped)
    assert run.rejected() == [{"bad-key": forged[p]} if p in forged else {} for p in range(10)]
    assert len(run.notes.refused) == len(swap.swapped)
    for msg, refusal in zip(swap.swapped, run.notes.refused, strict=True):
        who = f"key of agent {msg.owner} relayed by hub {hub} for agent {msg.partner}"
        assert isinstance(refusal, keys.BadKey)
        assert who in str(refusal) and "signature" in str(refusal)
    np.testing.assert_array_equal(models, clean)  # masks cancel exactly


def _partners(core: AgentCore, hub: int, step: int) -> tuple[int, ...]:
    return core._seats[(hub, step)].partners


def _foreign_share(run: Session, msg: KeyShare, core: AgentCore) -> KeyShare:
    """A correctly signed key share from an agent that is not core's partner at msg.hub."""
    x = min(set(range(core.spec.agents)) - {core.me, *_partners(core, msg.hub, msg.step)})
    eph = keys.Ephemeral.generate()
    signature = keys.sign_share(
        run.nodes[x].identity, core.spec.session, x, msg.hub, core.me, msg.step, msg.epoch, eph
    )
    return dataclasses.replace(msg, owner=x, public=eph.public, signature=signature)


def _held_share(run: Session, core: AgentCore) -> KeyShare | None:
    """The last key share delivered to core whose key it holds (to replay), if any."""
    held = [
        m
        for m in run.wire
        if isinstance(m, KeyShare)
        and m.receiver == m.partner == core.me
        and (m.epoch, m.hub, m.step, m.owner) in core._partner_keys
    ]
    return held[-1] if held else None


# Each made in place of a genuine relayed share, as BAD_MODELS are.
BAD_SHARES: dict[str, Callable[[Session, KeyShare, AgentCore], Message | None]] = {
    "not-neighbour": _foreign_share,
    "spoofed": lambda run, msg, core: dataclasses.replace(msg, sender=msg.owner),
    "duplicate": lambda run, msg, core: _held_share(run, core),
    "wrong-receiver": lambda run, msg, core: dataclasses.replace(msg, receiver=msg.owner),
    "stale": lambda run, msg, core: dataclasses.replace(msg, epoch=msg.epoch - 2),
    "ahead": lambda run, msg, core: dataclasses.replace(msg, epoch=msg.epoch + 2),
}


@pytest.mark.parametrize("reason", list(BAD_SHARES))
def test_bad_key_share_at_the_partner_is_rejected_and_harmless(reason: str) -> None:
    """Every-round re-keying, so epochs move and a stale epoch exists mid-run."""
    problem = geometric(rekey=Rekey.EVERY_ROUND)
    clean = played(problem, Strategy.CTA, Scheme.LOCAL_GHP).models
    run = Session(problem, Strategy.CTA, Scheme.LOCAL_GHP)

    def when(msg: Peer, core: AgentCore) -> bool:
        # ... at a partner still in that epoch, that holds a key share to replay
        return (
            _relayed(msg)
            and msg.epoch == INJECT_ROUND >= core.round  # type: ignore[union-attr]
            and _held_share(run, core) is not None
        )

    hit = run.inject_once(when, partial(BAD_SHARES[reason], run))  # type: ignore[arg-type]
    models = run.play()
    rejected = run.rejected()
    if reason == "spoofed" and rejected[hit[0]] == {"unknown-sender": 1}:
        # the owner is two hops away: the partner holds no link key with it, so its frame
        # stops at the wire before the core could call it spoofed
        rejected[hit[0]] = {reason: 1}
    assert rejected == [{reason: 1} if p in hit else {} for p in range(10)]
    assert len(hit) == 1 and all(c.done for c in run.cores)
    np.testing.assert_array_equal(models, clean)  # masks cancel exactly


def test_hub_refuses_to_relay_for_agents_it_did_not_pair() -> None:
    problem = geometric()
    clean = played(problem, Strategy.ATC, Scheme.LOCAL_GHP).models
    run = Session(problem, Strategy.ATC, Scheme.LOCAL_GHP)

    def when(msg: Peer, core: AgentCore) -> bool:
        return isinstance(msg, KeyShare) and msg.receiver == msg.hub != msg.owner

    def make(msg: Peer, hub: AgentCore) -> Message:
        share: KeyShare = msg  # type: ignore[assignment]
        paired = _partners(run.core(share.owner), hub.me, share.step)
        unpaired = min(set(range(10)) - {share.owner, hub.me, *paired})
        eph = keys.Ephemeral.generate()
        signature = keys.sign_share(
            run.nodes[share.owner].identity,
            hub.spec.session,
            share.owner,
            hub.me,
            unpaired,
            share.step,
            share.epoch,
            eph,
        )
        return dataclasses.replace(share, partner=unpaired, public=eph.public, signature=signature)

    hit = run.inject_once(when, make)
    models = run.play()
    assert run.rejected() == [{"not-neighbour": 1} if p in hit else {} for p in range(10)]
    np.testing.assert_array_equal(models, clean)  # masks cancel exactly


def _distinct_partners(problem: Instance, strategy: Strategy, p: int) -> set[int]:
    """Everyone p shares a mask with: its partners at every hub it sends to, itself included."""
    a = weights(problem, strategy)
    found: set[int] = set()
    for k in [k for k in range(problem.config.agents) if a[p, k] > 0]:
        seat = split_senders(senders(a, k), k).get(p)
        found |= set(seat.partners) if seat else set()
    return found


def _relays(problem: Instance, strategy: Strategy, k: int) -> int:
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
    clean = played(problem, Strategy.ATC, Scheme.NONE).models
    run = played(problem, Strategy.ATC, Scheme.LOCAL_GHP)
    epochs = ROUNDS if rekey is Rekey.EVERY_ROUND else 1
    for core in run.cores:
        assert core.counters.agreements == epochs * len(
            _distinct_partners(problem, Strategy.ATC, core.me)
        )
        assert core.counters.relayed == epochs * _relays(problem, Strategy.ATC, core.me)
    assert_same_trajectory(run.models, clean)


@pytest.mark.parametrize("scheme", [s for s in Scheme if s.masked])
def test_masked_schemes_agree_on_every_pair_key_while_keying_not_in_round_one(
    scheme: Scheme,
) -> None:
    """Go waits for every agent's Ready, so the Diffie-Hellman agreements and the pairs'
    streams are made before it: round 1 then costs what later rounds cost (a thousand-agent
    network has about 140 pairs an agent, several rounds' time in round 1 before)."""
    problem = geometric()
    run = played(problem, Strategy.ATC, scheme)
    want = {p: len(_distinct_partners(problem, Strategy.ATC, p)) for p in range(10)}
    assert run.notes.agreed == want and sum(want.values()) > 0
    assert all(core.counters.agreements == want[core.me] for core in run.cores)  # no more


# ---- 7. waiting_for --------------------------------------------------------------------------


def test_waiting_for_names_the_silent_neighbour() -> None:
    problem = geometric()
    run = Session(problem, Strategy.ATC, Scheme.NONE)
    a = weights(problem, Strategy.ATC)
    silent = 0
    run.drop(lambda msg: isinstance(msg, Model) and msg.sender == silent and msg.round >= 2)
    run.stall()
    listeners = [k for k in range(10) if k != silent and a[silent, k] > 0]
    assert listeners
    for k in listeners:
        core = run.core(k)
        assert not core.done and core.position == (2, STEPS.index(2))
        assert core.waiting_for() == [silent]


def test_waiting_for_names_the_partner_whose_key_never_came() -> None:
    problem = geometric()
    run = Session(problem, Strategy.ATC, Scheme.LOCAL_GHP)
    silent = 0
    run.drop(lambda msg: isinstance(msg, KeyShare) and msg.owner == silent)
    run.stall()
    partners = {p for p in range(10) if silent in _distinct_partners(problem, Strategy.ATC, p)}
    assert partners
    for p in partners:
        core = run.core(p)
        assert core.round == 1 and silent in core.waiting_for()

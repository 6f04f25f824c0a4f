"""From the global picture (matrices, config) to what each agent is told."""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable, Iterable

import networkx as nx
import numpy as np

from privnet.agent import schedule as expand
from privnet.agent import wire
from privnet.agent.spec import STEPS, AgentSpec, ConfigError, Scheme, StepPlan, Strategy
from privnet.orchestrator.conductor import SessionPlan
from privnet.orchestrator.experiment import schedules, seeds, topology
from privnet.orchestrator.experiment.config import ExperimentConfig
from privnet.orchestrator.experiment.instance import Instance


def step_plans(A_j: np.ndarray, step: int, agent: int) -> StepPlan:
    """Column `agent` of A_j is what it receives; row `agent` is who listens to it."""
    weights_in = {int(m): float(A_j[m, agent]) for m in np.flatnonzero(A_j[:, agent])}
    weights_out = {int(k): float(A_j[agent, k]) for k in np.flatnonzero(A_j[agent, :])}
    return StepPlan(step=step, weights_in=weights_in, weights_out=weights_out)


def agent_specs(
    problem: Instance,
    strategy: Strategy,
    scheme: Scheme,
    *,
    repeat: int = 0,
    session: bytes | None = None,
    members: frozenset[int] | None = None,
) -> list[AgentSpec]:
    """One AgentSpec per agent; every agent of a run shares the session id, and each has
    its own noise key (seeds.Purpose.NOISE of the run's seed, this repeat, its id).

    With `members`, the weights are those of the view: `view_matrix` on its graph."""
    c = problem.config
    plans = _plans(problem, strategy, members)
    session = session if session is not None else secrets.token_bytes(16)
    made = (
        None
        if problem.schedule is None
        else schedules.for_view(problem.schedule, strategy, members)
    )
    noise_keys = seeds.keys(c.seed, seeds.Purpose.NOISE, repeat, c.agents)
    w0 = problem.w0
    attackers = {p: str(attack) for p, attack in c.attackers().items()}
    defense = "" if c.defense.strip() in ("", "none") else c.defense.strip()
    # () is the problem's own initial model, which each agent computes (zeros, or the
    # plug-in's `initial`): in fewer bytes, and for a model over what a Setup carries
    start = tuple(w0.tolist()) if w0.any() and len(w0) <= wire.SETUP_FLOATS else ()
    return [
        AgentSpec(
            agent=p,
            agents=c.agents,
            dim=c.dim,
            steps=plans(p),
            scheme=scheme,
            sigma_g=c.sigma_g,
            mu=c.mu,
            rounds=c.iters,
            noise_key=noise_keys[p],
            session=session,
            rekey=c.rekey,
            w0=start,
            schedule=None if problem.schedule is None else made,
            attack=attackers.get(p, ""),
            defense=defense,
            wire=problem.wire,
            local_steps=c.local_steps,
        )
        for p in range(c.agents)
    ]


def _plans(
    problem: Instance, strategy: Strategy, members: frozenset[int] | None
) -> Callable[[int], tuple[StepPlan, StepPlan, StepPlan]]:
    """Agent p's step plans: of the view's A, or under a schedule the union of the run's
    rounds (each round's own plans the agent expands itself)."""
    if problem.schedule is not None:
        if members is not None:
            view_graph(problem, members)  # refuses a split network
        made = schedules.for_view(problem.schedule, strategy, members)
        return lambda p: expand.union_plans(made, 1, problem.config.iters, p)
    a = problem.A if members is None else view_matrix(problem, members)
    by_step = dict(enumerate(topology.strategy_matrices(strategy, a)))
    return lambda p: tuple(step_plans(by_step[j], j, p) for j in STEPS)  # type: ignore[return-value]


def view_graph(problem: Instance, members: frozenset[int]) -> nx.Graph:
    """The members' graph (a schedule's: the union of its rounds on them); ConfigError
    when it is not connected: no view runs on a split network."""
    inside = sorted(members)
    if len(inside) < 2:
        raise ConfigError(f"{len(inside)} agent(s) left: a network needs two: stopping")
    if problem.schedule is None:
        sub = problem.graph.subgraph(inside)
    else:
        made = schedules.for_view(problem.schedule, Strategy.ATC, members)
        sub = schedules.union_graph(made, 1, problem.config.iters).subgraph(inside)
    if not nx.is_connected(sub):
        parts = sorted((sorted(part) for part in nx.connected_components(sub)), key=len)
        raise ConfigError(
            f"the {len(inside)} agents left form {len(parts)} disconnected groups "
            f"{[part[:10] for part in parts[:4]]}; privnet does not run a split network "
            "(each part would learn alone, off the configured problem): stopping"
        )
    return sub


def view_matrix(problem: Instance, members: frozenset[int]) -> np.ndarray:
    """A on the graph the members span, by the configured rule: metropolis or averaging
    recomputed on the members' subgraph; a user-given matrix restricted to the members and
    renormalized per column (each keeps its weights' proportions, and they sum to 1 again).
    Agents out of the view keep only themselves (a_mm = 1), which no member reads.
    ConfigError when the members' graph is not connected: no view runs on a split network.
    """
    c = problem.config
    agents = c.agents
    inside = sorted(members)
    sub = view_graph(problem, members)
    if c.matrix:
        a = problem.A * np.isin(np.arange(agents), inside)[:, None]
        a[:, inside] /= a[:, inside].sum(axis=0, keepdims=True)
    else:
        graph: nx.Graph = nx.Graph()
        graph.add_nodes_from(range(agents))
        graph.add_edges_from(sub.edges)
        a = topology.combination_matrix(graph, c.rule)
    outside = [m for m in range(agents) if m not in members]
    a[:, outside] = 0.0
    a[outside, outside] = 1.0
    return a


def session_list(config: ExperimentConfig) -> list[tuple[Strategy, Scheme, int]]:
    """Sessions in the order every engine plays them: strategy, then scheme, then repeat."""
    return [
        (strategy, scheme, repeat)
        for strategy in config.strategies
        for scheme in config.schemes
        for repeat in range(config.repeats)
    ]


def session_plans(
    problem: Instance, sessions: Iterable[tuple[Strategy, Scheme, int]]
) -> list[SessionPlan]:
    """What the conductor plays, in order: one plan per strategy x scheme x repeat."""
    plans = []
    for strategy, scheme, repeat in sessions:
        session = secrets.token_bytes(16)
        view_specs = functools.partial(
            _view_specs, problem, strategy, scheme, repeat=repeat, session=session
        )
        plans.append(
            SessionPlan(
                strategy,
                scheme,
                repeat,
                agent_specs(problem, strategy, scheme, repeat=repeat, session=session),
                problem.specs(repeat),
                view_specs,
                problem.float32,
            )
        )
    return plans


def _view_specs(
    problem: Instance,
    strategy: Strategy,
    scheme: Scheme,
    members: frozenset[int],
    *,
    repeat: int,
    session: bytes,
) -> list[AgentSpec]:
    return agent_specs(problem, strategy, scheme, repeat=repeat, session=session, members=members)

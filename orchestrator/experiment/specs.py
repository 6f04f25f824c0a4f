"""From the global picture (matrices, config) to what each agent is told."""

from __future__ import annotations

import secrets
from collections.abc import Iterable

import numpy as np

from agent import rng
from agent.spec import STEPS, AgentSpec, Scheme, StepPlan, Strategy
from orchestrator.conductor import SessionPlan
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.problem import Problem


def step_plans(A_j: np.ndarray, step: int, agent: int) -> StepPlan:
    """Column `agent` of A_j is what it receives; row `agent` is who listens to it."""
    weights_in = {int(m): float(A_j[m, agent]) for m in np.flatnonzero(A_j[:, agent])}
    weights_out = {int(k): float(A_j[agent, k]) for k in np.flatnonzero(A_j[agent, :])}
    return StepPlan(step=step, weights_in=weights_in, weights_out=weights_out)


def agent_specs(
    problem: Problem,
    strategy: Strategy,
    scheme: Scheme,
    *,
    repeat: int = 0,
    session: bytes | None = None,
) -> list[AgentSpec]:
    """One AgentSpec per agent; every agent of a run shares the session id and noise key."""
    c = problem.config
    A0, A1, A2 = problem.matrices(strategy)
    by_step = {0: A0, 1: A1, 2: A2}
    session = session if session is not None else secrets.token_bytes(16)
    key = rng.run_key(c.seed, repeat)
    return [
        AgentSpec(
            agent=p,
            agents=c.agents,
            dim=c.dim,
            steps=tuple(step_plans(by_step[j], j, p) for j in STEPS),  # type: ignore[arg-type]
            scheme=scheme,
            sigma_g=c.sigma_g,
            mu=c.mu,
            rounds=c.iters,
            noise_key=key,
            session=session,
            rekey=c.rekey,
        )
        for p in range(c.agents)
    ]


def session_list(config: ExperimentConfig) -> list[tuple[Strategy, Scheme, int]]:
    """Sessions in the order every engine plays them: strategy, then scheme, then repeat."""
    return [
        (strategy, scheme, repeat)
        for strategy in config.strategies
        for scheme in config.schemes
        for repeat in range(config.repeats)
    ]


def session_plans(
    problem: Problem, sessions: Iterable[tuple[Strategy, Scheme, int]]
) -> list[SessionPlan]:
    """What the conductor plays, in order: one plan per strategy x scheme x repeat."""
    return [
        SessionPlan(
            f"{strategy}/{scheme}/{repeat}",
            agent_specs(problem, strategy, scheme, repeat=repeat),
            problem.spec(repeat),
        )
        for strategy, scheme, repeat in sessions
    ]

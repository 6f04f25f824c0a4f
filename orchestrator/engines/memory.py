"""The `memory` engine: the real agent cores in one process, messages routed in memory.

Same cores, same messages as the networked run, minus the broker; fast enough for tests
and for checking the `net` engine and the oracle against each other.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from agent import keys
from agent.core import AgentCore
from agent.losses import LeastSquares
from agent.messages import Message, Report
from agent.spec import Scheme, Strategy
from orchestrator.experiment.problem import Problem, msd
from orchestrator.experiment.specs import agent_specs
from orchestrator.report import Curve


def build_cores(
    problem: Problem,
    strategy: Strategy,
    scheme: Scheme,
    repeat: int,
    core: type[AgentCore] = AgentCore,
) -> list[AgentCore]:
    """One core per agent with fresh identities, as the networked agents would have."""
    specs = agent_specs(problem, strategy, scheme, repeat=repeat)
    problem_spec = problem.spec(repeat)
    identities = [keys.Identity.generate() for _ in specs]
    directory = {p: ident.public for p, ident in enumerate(identities)}
    return [
        core(
            spec,
            LeastSquares.from_spec(problem_spec, spec.agent, spec.agents),
            identities[spec.agent],
            directory,
        )
        for spec in specs
    ]


def route(cores: list[AgentCore], on_report: Callable[[Report], None]) -> None:
    """Deliver every message until all cores are done (FIFO, deterministic)."""
    queue: deque[Message] = deque()
    for core in cores:
        queue.extend(core.start())
    while queue:
        msg = queue.popleft()
        if isinstance(msg, Report):
            on_report(msg)
            continue
        queue.extend(cores[msg.receiver].receive(msg))
    stuck = [c.me for c in cores if not c.done]
    if stuck:
        raise RuntimeError(f"agents {stuck} stopped before the last round (protocol deadlock)")


def run_once(problem: Problem, strategy: Strategy, scheme: Scheme, repeat: int) -> np.ndarray:
    """The models of every agent after every round, shape (iters, P, M)."""
    c = problem.config
    models = np.zeros((c.iters, c.agents, c.dim))
    cores = build_cores(problem, strategy, scheme, repeat)

    def on_report(report: Report) -> None:
        models[report.round - 1, report.sender] = report.w

    route(cores, on_report)
    return models


def run_memory(
    problem: Problem,
    strategies=None,
    schemes=None,
    progress: Callable[[int], None] | None = None,
) -> list[Curve]:
    """Every strategy x scheme x repeat through the real cores; one Curve per pair."""
    c = problem.config
    curves = []
    for strategy in strategies or c.strategies:
        for scheme in schemes or c.schemes:
            cent = np.zeros((c.repeats, c.iters))
            avg = np.zeros((c.repeats, c.iters))
            start = time.perf_counter()
            for r in range(c.repeats):
                models = run_once(problem, strategy, scheme, r)
                for i in range(c.iters):
                    cent[r, i], avg[r, i] = msd(models[i], problem.w_opt[r], problem.q)
                if progress:
                    progress(1)
            wall = time.perf_counter() - start
            curves.append(Curve(str(strategy), str(scheme), cent, avg, c.iters * c.repeats / wall))
    return curves

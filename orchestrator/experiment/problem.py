"""The fixed parts of an experiment every engine shares: graph, matrices, data, w^o."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import TypeVar, cast

import networkx as nx
import numpy as np

from agent import datasets
from agent.losses import ClassificationSpec, ProblemSpec, RegressionSpec
from agent.spec import ConfigError, Scheme, Strategy
from orchestrator.experiment import topology
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.data import draw_problem, global_minimizer, local_moments


@dataclass(frozen=True)
class Problem:
    config: ExperimentConfig
    graph: nx.Graph
    A: np.ndarray  # left-stochastic: A[m, p] = a_mp, the weight p gives to m
    q: np.ndarray  # Perron vector, A q = q
    neighbour: int | None = None  # whose data is replaced (D'), for the accountant

    @classmethod
    def build(cls, config: ExperimentConfig) -> Problem:
        if config.problem == "classification":
            if config.dataset not in datasets.DATASETS:
                raise ConfigError(
                    f"unknown dataset {config.dataset!r}; shipped: {', '.join(datasets.DATASETS)}"
                )
            config = replace(config, dim=datasets.load(config.dataset).dim)
        if config.matrix:
            A = topology.load_matrix(config.matrix)
            graph = topology.graph_of(A)
        else:
            graph = topology.make_graph(
                config.topology, config.agents, config.seed, radius=config.radius, path=config.edges
            )
            A = topology.combination_matrix(graph, config.rule)
        ghp = next((s for s in map(Scheme, config.schemes) if s.homomorphic), Scheme.NONE)
        topology.validate(A, graph, scheme=ghp)
        return cls(config, graph, A, topology.perron(A))

    def matrices(self, strategy: Strategy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(A0, A1, A2) of the paper's general form for this strategy."""
        return topology.strategy_matrices(strategy, self.A)

    @property
    def classifies(self) -> bool:
        return self.config.problem == "classification"

    def twin(self, agent: int) -> Problem:
        """The same experiment on the neighbouring dataset D': `agent`'s data replaced."""
        if not 0 <= agent < self.config.agents:
            raise ConfigError(
                f"neighbour agent {agent} is not in [0, {self.config.agents}); "
                "pass --neighbour-agent with an agent id of this network"
            )
        return replace(self, neighbour=agent)

    def specs(self, repeat: int) -> tuple[ProblemSpec, ...]:
        """Every agent's problem spec, by agent id: what its Setup carries (its own keys)."""
        c = self.config
        if self.classifies:
            from orchestrator.experiment import classification  # scipy: only to classify

            return classification.draw_problem(c, repeat, self.neighbour)
        return draw_problem(
            c.seed,
            c.agents,
            repeat=repeat,
            dim=c.dim,
            samples=c.samples,
            rho=c.rho,
            batch=c.batch,
            twin=self.neighbour,
        )

    def regression_specs(self, repeat: int) -> tuple[RegressionSpec, ...]:
        return _narrow(self.specs(repeat), RegressionSpec)

    def classification_specs(self, repeat: int) -> tuple[ClassificationSpec, ...]:
        return _narrow(self.specs(repeat), ClassificationSpec)

    @cached_property
    def w_opt(self) -> np.ndarray:
        """w^o per repeat, shape (repeats, M)."""
        repeats = range(self.config.repeats)
        if self.classifies:
            from orchestrator.experiment import classification

            solved = [
                classification.global_minimizer(self.classification_specs(r)) for r in repeats
            ]
        else:
            solved = [global_minimizer(self.regression_specs(r)) for r in repeats]
        return np.stack(solved)

    def test_errors(self, models: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Testing error of the centroid and average individual testing error, per round,
        of models (T, P, M); None for regression, which has no test set."""
        if not self.classifies:
            return None
        from orchestrator.experiment import classification

        return classification.test_errors(models, self.q, datasets.load(self.config.dataset))

    def moments(self, repeat: int) -> tuple[np.ndarray, np.ndarray]:
        return local_moments(self.regression_specs(repeat))


S = TypeVar("S", RegressionSpec, ClassificationSpec)


def _narrow(specs: tuple[ProblemSpec, ...], kind: type[S]) -> tuple[S, ...]:
    """`specs` as the kind of problem a step is written for, or a clear error."""
    if not all(isinstance(spec, kind) for spec in specs):
        raise ConfigError(
            f"this step works on a {kind.__name__}, the experiment is a {type(specs[0]).__name__}"
        )
    return cast(tuple[S, ...], specs)


def msd(w: np.ndarray, w_opt: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    """(centroid MSD, average individual MSD) of models w (P, M) against w^o.

    Agents without a model for the round (NaN rows: out of the membership view) are left
    out, and the centroid's weights q renormalized over those present."""
    present = ~np.isnan(w[:, 0])
    if not present.all():
        w, q = w[present], q[present] / q[present].sum()
    centroid = q @ w
    return float(np.sum((centroid - w_opt) ** 2)), float(np.mean(np.sum((w - w_opt) ** 2, axis=1)))

"""The fixed parts of an experiment every engine shares: graph, matrices, data, w^o."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import networkx as nx
import numpy as np

from agent.losses import RegressionSpec
from agent.spec import Scheme, Strategy
from orchestrator.experiment import topology
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.data import draw_problem, global_minimizer, local_moments


@dataclass(frozen=True)
class Problem:
    config: ExperimentConfig
    graph: nx.Graph
    A: np.ndarray  # left-stochastic: A[m, p] = a_mp, the weight p gives to m
    q: np.ndarray  # Perron vector, A q = q

    @classmethod
    def build(cls, config: ExperimentConfig) -> Problem:
        if config.matrix:
            A = topology.load_matrix(config.matrix)
            graph = topology.graph_of(A)
        else:
            graph = topology.make_graph(
                config.topology, config.agents, config.seed, radius=config.radius, path=config.edges
            )
            A = topology.combination_matrix(graph, config.rule)
        ghp = Scheme.GHP in config.schemes
        topology.validate(A, graph, scheme="ghp" if ghp else "none")
        return cls(config, graph, A, topology.perron(A))

    def matrices(self, strategy: Strategy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(A0, A1, A2) of the paper's general form for this strategy."""
        return topology.strategy_matrices(strategy, self.A)

    def spec(self, repeat: int) -> RegressionSpec:
        c = self.config
        return draw_problem(
            c.seed, c.agents, repeat=repeat, dim=c.dim, samples=c.samples, rho=c.rho, batch=c.batch
        )

    @cached_property
    def w_opt(self) -> np.ndarray:
        """w^o per repeat, shape (repeats, M)."""
        return np.stack(
            [global_minimizer(self.spec(r), self.config.agents) for r in range(self.config.repeats)]
        )

    def moments(self, repeat: int) -> tuple[np.ndarray, np.ndarray]:
        return local_moments(self.spec(repeat), self.config.agents)


def msd(w: np.ndarray, w_opt: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    """(centroid MSD, average individual MSD) of models w (P, M) against w^o."""
    centroid = q @ w
    return float(np.sum((centroid - w_opt) ** 2)), float(np.mean(np.sum((w - w_opt) ** 2, axis=1)))

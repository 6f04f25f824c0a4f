"""The fixed parts of an experiment every engine shares: graph, matrices, data, w^o.

`Instance` is one experiment's instance: its graph and combination matrices, and its
`plugin`, the learning problem (privnet.agent.problems) every agent solves on its share of the data.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, replace
from functools import cached_property

import networkx as nx
import numpy as np

from privnet.agent import problems, wire
from privnet.agent import schedule as expand
from privnet.agent.problems import LINEAR, Params, Share
from privnet.agent.spec import ConfigError, Rekey, Schedule, Scheme, Strategy, WireDtype
from privnet.orchestrator.experiment import data, schedules, topology
from privnet.orchestrator.experiment.config import ExperimentConfig

SCORED_MODELS = 64  # models scored at once: bounds the (models, test rows) output


@dataclass(frozen=True)
class Instance:
    config: ExperimentConfig
    graph: nx.Graph
    A: np.ndarray  # left-stochastic: A[m, p] = a_mp, the weight p gives to m
    q: np.ndarray  # Perron vector, A q = q
    plugin: problems.Problem  # what every agent minimizes, built from `params`
    params: Params  # the plug-in's public parameters, as each agent's Setup carries them
    features: int  # of the data's rows (a dataset's bias column included)
    classes: int  # of the dataset's labels (0: regression targets)
    neighbour: int | None = None  # whose data is replaced (D'), for the accountant
    # A time-varying topology (strategy ATC, every agent in): then `graph` is the union of
    # the run's rounds and A their mean (for q); each round's own A is `round_matrix`.
    schedule: Schedule | None = None

    @classmethod
    def build(cls, config: ExperimentConfig) -> Instance:
        plugin_class = problems.problem_class(config.problem)
        params = problems.params(_with_rho(plugin_class, config))
        plugin = problems.make(config.problem, params)
        dataset = config.dataset or getattr(plugin, "data", None)
        if dataset is None:
            raise ConfigError(
                f"problem {config.problem!r} has no data of its own: name a dataset "
                "(digits, adult, ...) or linear"
            )
        config = replace(config, dataset=dataset)
        features, classes = (config.dim, 0) if dataset == LINEAR else _shape(dataset)
        config = replace(config, dim=plugin.dim(features, classes))
        config = replace(config, wire_dtype=config.wire_dtype or _default_wire(config, plugin))
        check_wire(config)
        _check_frame(config)
        schemes = [Scheme(s) for s in config.schemes]
        ghp = next((s for s in schemes if s.homomorphic), schemes[0])
        made = schedules.template(config)
        if made is not None:
            graph = schedules.check(made, config.iters, ghp, Rekey(config.rekey))
            A = schedules.mean_matrix(made, 1, config.iters)
            q = topology.perron(A)
            return cls(config, graph, A, q, plugin, params, features, classes, schedule=made)
        if config.matrix:
            A = topology.load_matrix(config.matrix)
            graph = topology.graph_of(A)
        else:
            graph = topology.make_graph(
                config.topology, config.agents, config.seed, radius=config.radius, path=config.edges
            )
            A = topology.combination_matrix(graph, config.rule)
        topology.validate(A, graph, scheme=ghp)
        return cls(config, graph, A, topology.perron(A), plugin, params, features, classes)

    @property
    def float32(self) -> bool:
        """Whether the problem's model is float32 (a torch problem's default): its true
        models in telemetry Parts travel as float32 (wire.telemetry_dtype)."""
        return bool(np.dtype(getattr(self.plugin, "dtype", np.float64)) == np.float32)

    @property
    def wire(self) -> WireDtype:
        """How this problem's releases travel (resolved when built: never None then)."""
        return self.config.wire_dtype or WireDtype.F8

    def matrices(self, strategy: Strategy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(A0, A1, A2) of the paper's general form for this strategy."""
        return topology.strategy_matrices(strategy, self.A)

    def round_matrix(self, round_: int, members: frozenset[int] | None = None) -> np.ndarray:
        """Round `round_`'s A: the schedule's (on the view's members), or the static one."""
        if self.schedule is None:
            return self.A
        return expand.matrix(schedules.for_view(self.schedule, Strategy.ATC, members), round_)

    def round_matrices(self, strategy: Strategy, round_: int) -> tuple[np.ndarray, ...]:
        """(A0, A1, A2) of round `round_` (every round's under a static topology)."""
        if self.schedule is None:
            return self.matrices(strategy)
        return topology.strategy_matrices(strategy, self.round_matrix(round_))

    def twin(self, agent: int) -> Instance:
        """The same experiment on the neighbouring dataset D': `agent`'s data replaced."""
        if not 0 <= agent < self.config.agents:
            raise ConfigError(
                f"neighbour agent {agent} is not in [0, {self.config.agents}); "
                "pass --neighbour-agent with an agent id of this network"
            )
        return replace(self, neighbour=agent)

    def specs(self, repeat: int) -> tuple[Share, ...]:
        """Every agent's Share, by agent id: what its Setup carries (its own keys)."""
        return data.draw_shares(self.config, self.params, self.features, repeat, self.neighbour)

    def parts(self, repeat: int) -> data.Parts:
        """Every agent's samples (x, y) in `repeat`, as each agent draws them."""
        return data.parts(self.specs(repeat))

    def risks(self, repeat: int) -> list[problems.Risk]:
        """Every agent's local risk in `repeat`."""
        return [self.plugin.risk(x, y, self.classes) for x, y in self.parts(repeat)]

    @property
    def w0(self) -> np.ndarray:
        """The model every agent starts from: the plug-in's `initial`, else zeros."""
        initial = getattr(self.plugin, "initial", None)
        if initial is None:
            return np.zeros(self.config.dim)
        return np.asarray(initial(self.features, self.classes), dtype=np.float64)

    @cached_property
    def w_opt(self) -> np.ndarray:
        """w^o per repeat, shape (repeats, M); NaN where the problem has no reference (then
        MSD is NaN too, and the problem's test metric tells how learning went)."""
        c = self.config
        solved = [
            data.reference(self.plugin, self.risks(r), self.parts(r), c.dim)
            for r in range(c.repeats)
        ]
        return np.stack([np.full(c.dim, np.nan) if w is None else w for w in solved])

    @property
    def metric(self) -> str | None:
        """The name of the plug-in's test metric, if it has one and the data a test split."""
        if self.config.dataset == LINEAR or not callable(getattr(self.plugin, "score", None)):
            return None
        return str(getattr(self.plugin, "metric", "score"))

    @property
    def metric_series(self) -> tuple[str, ...]:
        """The per-round columns of the test metric: of the centroid, of the average
        individual (test_error_centroid, test_error_avg for logistic regression)."""
        return () if self.metric is None else (f"{self.metric}_centroid", f"{self.metric}_avg")

    @property
    def classifies(self) -> bool:
        """Whether learning is measured by a test metric (classification) rather than MSD."""
        return self.metric is not None

    def scores(self, models: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The test metric of the centroid and the average individual one, per round, of
        models (T, P, M); agents without a model (NaN rows) left out, q renormalized over
        the others; NaN for a round without any (between the models of --models-every).
        None without a metric."""
        if self.metric is None or self.config.dataset is None:
            return None
        from privnet.agent import datasets

        test = datasets.load(self.config.dataset)
        score = self.plugin.score  # type: ignore[attr-defined]
        centroid_out = np.full(models.shape[0], np.nan)
        average_out = np.full(models.shape[0], np.nan)
        held = np.flatnonzero((~np.isnan(models[..., 0])).any(axis=1))
        if not held.size:
            return centroid_out, average_out
        models = models[held]  # only the rounds with models: a copy of those alone
        present = ~np.isnan(models[..., 0])  # (T', P)
        weights = np.where(present, self.q, 0.0)
        centroid = np.einsum(
            "tp,tpm->tm", weights / weights.sum(1, keepdims=True), np.nan_to_num(models)
        )
        flat = np.concatenate([centroid, models.reshape(-1, models.shape[-1])])
        values = np.full(len(flat), np.nan)
        rows = np.flatnonzero(~np.isnan(flat[:, 0]))
        for start in range(0, len(rows), SCORED_MODELS):
            chunk = rows[start : start + SCORED_MODELS]
            values[chunk] = score(flat[chunk], test.x_test, test.y_test, self.classes)
        individual = values[len(centroid) :].reshape(present.shape)
        centroid_out[held] = values[: len(centroid)]
        average_out[held] = np.nanmean(individual, axis=1)
        return centroid_out, average_out

    @property
    def agent_series(self) -> tuple[str, str]:
        """The columns of the agents' own metrics (`privnet.agent.losses.Local.metrics`),
        every round, averaged over the agents that reported: the loss on their minibatches,
        and their test metric on their held-out rows, or (regression) their risk on all
        their samples."""
        return ("loss_agents", f"{self.metric}_agents" if self.metric else "risk_agents")

    def agent_metrics(self, metrics: np.ndarray) -> dict[str, np.ndarray]:
        """The agents' metrics (T, P, 2) as those columns, (T,) each: NaN where none."""
        out = {}
        for n, name in enumerate(self.agent_series):
            values = metrics[..., n]
            seen = (~np.isnan(values)).sum(axis=1)
            total = np.nansum(values, axis=1)
            out[name] = np.where(seen > 0, total / np.maximum(seen, 1), np.nan)
        return out


def msd(w: np.ndarray, w_opt: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    """(centroid MSD, average individual MSD) of models w (P, M) against w^o.

    Agents without a model for the round (NaN rows: out of the membership view) are left
    out, and the centroid's weights q renormalized over those present."""
    present = ~np.isnan(w[:, 0])
    if not present.any():  # a round whose models no agent sent (--models-every)
        return math.nan, math.nan
    if not present.all():
        w, q = w[present], q[present] / q[present].sum()
    centroid = q @ w
    return float(np.sum((centroid - w_opt) ** 2)), float(np.mean(_square_gaps(w, w_opt)))


def _square_gaps(w: np.ndarray, w_opt: np.ndarray) -> np.ndarray:
    """`np.sum((w - w_opt) ** 2, axis=1)`, the same sums, one row at a time in one buffer:
    at 16 x 1M parameters the whole-array form makes two 128 MB temporaries a model round.
    Rows not contiguous take the whole-array form (numpy sums them in another order)."""
    if not w.flags.c_contiguous or w.dtype != np.float64:
        return np.sum((w - w_opt) ** 2, axis=1)
    gap, out = np.empty(w.shape[1]), np.empty(len(w))
    for p, row in enumerate(w):
        np.subtract(row, w_opt, out=gap)
        np.multiply(gap, gap, out=gap)
        out[p] = np.sum(gap)
    return out


def _shape(dataset: str) -> tuple[int, int]:
    from privnet.agent import datasets

    full = datasets.load(dataset)
    return full.dim, full.classes


def _with_rho(plugin_class: type, config: ExperimentConfig) -> dict[str, object]:
    """The plug-in's parameters: the experiment's `params`, and its `rho` when the plug-in's
    constructor takes one and `params` does not set it."""
    params = dict(config.params)
    if "rho" not in params and "rho" in inspect.signature(plugin_class).parameters:
        params["rho"] = config.rho
    return params


def wire_of(plugin: problems.Problem) -> WireDtype:
    """The wire form a problem's models take by default: u4 (4 bytes a parameter) for a
    float32 model (mlp, cnn: privnet.agent.torchnet), f8 otherwise (least-squares, logistic)."""
    dtype = np.dtype(getattr(plugin, "dtype", np.float64))
    return WireDtype.U4 if dtype == np.float32 else WireDtype.F8


def _check_frame(config: ExperimentConfig) -> None:
    """A model crosses the peer plane in one frame, or in chunks (privnet.agent.wire.chunks):
    refuse one over the most chunks a model may take, naming the limit."""
    code = (config.wire_dtype or WireDtype.F8).code
    most = wire.max_chunked_dim(code)
    if config.dim > most:
        width = 8 if code == wire.DTYPE else 4
        raise ConfigError(
            f"problem {config.problem!r} has {config.dim:,} parameters: a model crosses the wire "
            f"in at most {wire.MAX_CHUNKS:,} chunks of {wire.CHUNK_BYTES:,} bytes "
            f"(privnet.agent.wire.chunks.MAX_CHUNKS), which hold {most:,} "
            f"{'float64' if width == 8 else 'u4'} parameters ({width * config.dim:,} bytes "
            "needed, and as many held per "
            "in-link by every receiver); use a smaller model"
        )


def _default_wire(config: ExperimentConfig, plugin: problems.Problem) -> WireDtype:
    """The problem's wire (wire_of), or f8 where u4 is not built yet (_u4_refusal): a float32
    model on a time-varying topology or with attackers runs, at 8 bytes a parameter."""
    dtype = wire_of(plugin)
    return WireDtype.F8 if _u4_refusal(replace(config, wire_dtype=dtype)) else dtype


def _u4_refusal(config: ExperimentConfig) -> str | None:
    """Why the u4 wire cannot carry this run (None: it can). It is built for a static graph
    and honest agents so far: a schedule's round-by-round masks and an attacker's view of
    its inbox are float64's."""
    if config.wire_dtype is not WireDtype.U4:
        return None
    if schedules.template(config) is not None:
        return (
            f"topology {config.topology!r} with wire_dtype u4: a time-varying topology runs "
            "on the f8 wire for now; use --wire-dtype f8 or a static topology"
        )
    if config.byzantine.strip():
        return (
            "byzantine agents with wire_dtype u4: attacks run on the f8 wire for now; "
            "use --wire-dtype f8"
        )
    return None


def check_wire(config: ExperimentConfig) -> None:
    """Refuse an explicit u4 wire where it is not built (_u4_refusal): checked when an
    Experiment names the wire, and when the problem resolves it."""
    refusal = _u4_refusal(config)
    if refusal:
        raise ConfigError(refusal)

"""The two problems of the paper, and the one place a Share becomes an agent's loss.

`LeastSquares` (section V-A) and `Logistic` (section V-B) are plug-ins like any other
(privnet.agent.problems); their risks take leading axes, so the oracle evaluates every agent and
repeat in one call of the very code each agent runs. `make_loss` turns the Share in an
agent's Setup into what its core asks each round: the gradient of its risk on that
round's minibatch (drawn from its own key, the same in every engine).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from privnet.agent import attacks, problems
from privnet.agent.spec import ConfigError

NEWTON_TOL = 1e-12
SCORE_ROWS = 256  # test rows an agent scores its model on, every round (fewer at big models)
SCORE_BUDGET = 1 << 26  # rows x parameters a round's score may cost: 64 rows at a 1M model
SCORE_FLOOR = 32  # the fewest rows a big model is scored on


def score_rows(dim: int) -> int:
    """Held-out rows a model of `dim` parameters is scored on each round: SCORE_ROWS, or at
    big models as many as SCORE_BUDGET allows (at least SCORE_FLOOR), so the per-round score
    (a forward pass) stays a small part of a round; at 1.69M parameters 256 rows had cost
    more than the round's gradient. The centroid's test metric, every K rounds, is exact."""
    return max(SCORE_FLOOR, min(SCORE_ROWS, SCORE_BUDGET // max(dim, 1)))


class Loss(Protocol):
    """What an agent's core asks of its loss (privnet.agent.core)."""

    dim: int

    def grad(self, w: np.ndarray, round_: int, local: int = 0) -> np.ndarray:
        """Gradient estimate at w in round `round_`, local step `local` (minibatches are
        drawn per round and local step)."""
        ...


def _t(a: np.ndarray) -> np.ndarray:
    return a.swapaxes(-1, -2)


def _rows(x: np.ndarray, y: np.ndarray, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The minibatch `rows` (..., B) of samples x (..., N, F), y (..., N); all of them for None."""
    if rows is None:
        return x, y
    return np.take_along_axis(x, rows[..., None], axis=-2), np.take_along_axis(y, rows, axis=-1)


def _check_rho(rho: float) -> float:
    if not (rho >= 0 and np.isfinite(rho)):
        raise ConfigError(f"rho must be a finite number >= 0, got {rho}")
    return float(rho)


class LeastSquares:
    """J_p(w) = 1/N sum_n (y_n - x_n^T w)^2 + rho ||w||^2 (the paper's section V-A)."""

    stacks = True
    data = problems.LINEAR

    def __init__(self, rho: float = 0.01) -> None:
        self.rho = _check_rho(rho)

    def dim(self, features: int, classes: int) -> int:
        return features

    def risk(self, x: np.ndarray, y: np.ndarray, classes: int) -> _Squares:
        return _Squares(x, y, self.rho)

    def optimum(self, parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """w^o = (mean_p R_p + rho I)^-1 mean_p r_p, R_p = x^T x / N, r_p = x^T y / N."""
        r_hat = np.mean([x.T @ x / len(y) for x, y in parts], axis=0)
        r_xy = np.mean([x.T @ y / len(y) for x, y in parts], axis=0)
        return np.linalg.solve(r_hat + self.rho * np.eye(len(r_hat)), r_xy)


class _Squares:
    """Full batch: precomputed moments, so a gradient is one small matmul per model."""

    def __init__(self, x: np.ndarray, y: np.ndarray, rho: float) -> None:
        n = x.shape[-2]
        self.x, self.y, self.rho = x, y.astype(np.float64), rho
        eye = np.eye(x.shape[-1])
        self.hessian = 2.0 * (_t(x) @ x / n + rho * eye)  # (..., M, M), symmetric
        self.r = 2.0 * (_t(x) @ self.y[..., None] / n).swapaxes(-1, -2)  # (..., 1, M)

    def gradient(self, w: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        if rows is None:
            g: np.ndarray = w @ self.hessian - self.r
            return g
        x, y = _rows(self.x, self.y, rows)
        residual = x @ _t(w) - y[..., None]  # (..., B, K)
        return _t(2.0 * (_t(x) @ residual / x.shape[-2] + self.rho * _t(w)))

    def value(self, w: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        x, y = _rows(self.x, self.y, rows)
        residual = x @ _t(w) - y[..., None]
        # np.mean's and np.sum's own sums, bit for bit, without their Python wrappers: an
        # agent asks this of its model every round (its telemetry's metrics)
        mean = np.add.reduce(residual**2, axis=-2) / residual.shape[-2]
        v: np.ndarray = mean + self.rho * np.add.reduce(w**2, axis=-1)
        return v


class Logistic:
    """J_p(w) = 1/N sum_n ln(1 + exp(-t_n x_n^T w)) + rho ||w||^2, t_n = +1 for class 1 and
    -1 for class 0 (the paper's section V-B); scored by its testing error."""

    stacks = True
    data = "adult"
    metric = "test_error"

    def __init__(self, rho: float = 0.001) -> None:
        self.rho = _check_rho(rho)

    def dim(self, features: int, classes: int) -> int:
        if classes != 2:
            raise ConfigError(
                f"logistic regression takes two classes, the dataset has {classes}; "
                "pick a binary dataset (adult, breast-cancer) or a problem such as mlp"
            )
        return features

    def risk(self, x: np.ndarray, y: np.ndarray, classes: int) -> _Logits:
        return _Logits(x, 2.0 * y - 1.0, self.rho)

    def optimum(self, parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """argmin 1/P sum_p J_p by Newton's method (every row weighed 1 / (P N_p))."""
        x = np.vstack([x for x, _ in parts])
        t = np.concatenate([2.0 * y - 1.0 for _, y in parts])
        weight = np.concatenate([np.full(len(y), 1.0 / (len(parts) * len(y))) for _, y in parts])
        w = np.zeros(x.shape[1])
        eye = np.eye(x.shape[1])
        for _ in range(50):
            s = _sigmoid(-t * (x @ w))
            grad = -(x.T @ (weight * t * s)) + 2 * self.rho * w
            hess = (x.T * (weight * s * (1 - s))) @ x + 2 * self.rho * eye
            step = np.linalg.solve(hess, grad)
            w -= step
            if np.linalg.norm(step) < NEWTON_TOL:
                break
        return w

    def score(self, w: np.ndarray, x: np.ndarray, y: np.ndarray, classes: int) -> np.ndarray:
        """Fraction of rows misclassified by sign(x^T w), for each model of w (K, M)."""
        wrong: np.ndarray = np.mean(np.sign(x @ w.T) != (2.0 * y - 1.0)[:, None], axis=0)
        return wrong


class _Logits:
    def __init__(self, x: np.ndarray, t: np.ndarray, rho: float) -> None:
        self.x, self.t, self.rho = x, t, rho

    def gradient(self, w: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        x, t = _rows(self.x, self.t, rows)
        # d/dw ln(1 + e^{-t x^T w}) = -t x sigmoid(-t x^T w)
        coeff = -t[..., None] * _sigmoid(-t[..., None] * (x @ _t(w))) / x.shape[-2]  # (..., N, K)
        return _t(_t(x) @ coeff) + 2.0 * self.rho * w

    def value(self, w: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        x, t = _rows(self.x, self.t, rows)
        margins = t[..., None] * (x @ _t(w))
        v: np.ndarray = np.mean(np.logaddexp(0.0, -margins), axis=-2)
        v += self.rho * np.sum(w**2, axis=-1)
        return v


def _sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-z), written overflow-free."""
    e = np.exp(-np.abs(z))
    s: np.ndarray = np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return s


class Local:
    """One agent's loss as its core asks for it: a risk on `samples` samples, on each
    round's minibatch of `batch` of them drawn from `batch_key` (None: all of them)."""

    def __init__(
        self,
        risk: problems.Risk,
        dim: int,
        samples: int,
        batch: int | None = None,
        batch_key: tuple[int, int] = (0, 0),
        initial: Callable[[], np.ndarray] | None = None,
        score: Callable[[np.ndarray], float] | None = None,
    ) -> None:
        self.risk, self.dim, self.samples = risk, dim, samples
        self.batch, self.batch_key = batch, batch_key
        self._initial = initial
        self._score = score

    def start(self) -> np.ndarray:
        """The problem's own initial model (its plug-in's `initial`, else zeros): what an
        agent starts from when its Setup names none (a model too big to carry there)."""
        if self._initial is None:
            return np.zeros(self.dim)
        w = np.asarray(self._initial(), dtype=np.float64)
        if w.shape != (self.dim,):
            raise ConfigError(f"the problem's initial model has shape {w.shape}, not ({self.dim},)")
        return w

    def grad(self, w: np.ndarray, round_: int, local: int = 0) -> np.ndarray:
        rows = problems.minibatch(self.batch, self.batch_key, self.samples, round_, local)
        g: np.ndarray = self.risk.gradient(w[None], rows)[0]
        return g

    def metrics(self, w: np.ndarray, round_: int) -> tuple[float, float]:
        """What the agent says of its model w after round `round_`, every round (the
        orchestrator sees the model itself only every K): J_p on that round's minibatch,
        and its score: the problem's test metric on the dataset's test rows where it has
        one, else J_p on all its samples (the regression problem's own term). NaN where the
        risk has no `value`."""
        value = getattr(self.risk, "value", None)
        if value is None:
            return math.nan, math.nan if self._score is None else self._score(w)
        rows = problems.minibatch(self.batch, self.batch_key, self.samples, round_)
        loss = float(value(w[None], rows)[0])
        if self._score is not None:
            return loss, self._score(w)
        return loss, loss if rows is None else float(value(w[None], None)[0])


def make_loss(share: problems.Share, flip_labels: bool = False) -> Local:
    """The local risk an agent's Share describes (the one factory every engine uses):
    its problem, built from the Share's parameters, on the samples the Share draws
    (`flip_labels`: a Byzantine agent's label flipping, privnet.agent.attacks)."""
    problem = problems.make(share.problem, share.params)
    features, classes = problems.shape(share.data)
    dim = problem.dim(features, classes)
    if dim != share.dim:
        raise ConfigError(
            f"problem {share.problem!r} has {dim} parameters on this agent's data, its Setup "
            f"says {share.dim}: the orchestrator and the agent run different code"
        )
    x, y = problems.samples(share.data, share.data_key)
    if flip_labels:
        y = attacks.flip_labels(y, classes)
    initial = getattr(problem, "initial", None)
    start = None if initial is None else functools.partial(initial, features, classes)
    risk = problem.risk(x, y, classes)
    score = _scorer(problem, share.data, classes, share.data_key, score_rows(dim))
    return Local(risk, dim, len(y), share.batch, share.batch_key, start, score)


def _scorer(
    problem: problems.Problem,
    data: problems.Linear | problems.Rows,
    classes: int,
    key: tuple[int, int],
    wanted: int,
) -> Callable[[np.ndarray], float] | None:
    """The problem's test metric of one model on the agent's held-out rows: `wanted`
    (score_rows) of the dataset's test split drawn from its data key (every round, so a
    few), or None: no metric, or generated data."""
    score = getattr(problem, "score", None)
    if not callable(score) or isinstance(data, problems.Linear):
        return None
    from privnet.agent import datasets

    test = datasets.load(data.dataset)
    count = len(test.y_test)
    rows = np.random.default_rng(list(key)).choice(count, min(wanted, count), replace=False)
    x, y = test.x_test[np.sort(rows)], test.y_test[np.sort(rows)]
    return lambda w: float(score(w[None], x, y, classes)[0])

"""A run's curves as data: the curves every engine produces, what they say in steady
state, and the order and style every table and figure shows them in. Engines, the
accountant and the report all read these; none of them draws here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privnet.agent.spec import ConfigError, Scheme
from privnet.orchestrator.conductor.collection import blank_models

METRICS_HEADER = ("strategy", "scheme", "repeat", "iter", "msd_centroid", "msd_avg")
DIVERGED_GROWTH = 10.0  # a tail of MSD this many times the window before it: diverging
DPI = 120  # every figure's

# The paper's Fig. 3: columns consensus, ATC, CTA; blue / yellow / red curves, plus local-ghp
# and masked-ghp.
STRATEGY_ORDER = ("consensus", "atc", "cta")
STRATEGY_TITLE = {"consensus": "Consensus", "atc": "ATC", "cta": "CTA"}


def scheme_order() -> tuple[str, ...]:
    """Every registered scheme in registration order: the paper's three, then local-ghp and
    masked-ghp, then any registered since (privnet.agent.schemes.registry)."""
    return tuple(str(s) for s in Scheme)


def scheme_style(name: str) -> dict[str, Any]:
    """The line style of a scheme's curves (its part's `style`); a name not registered (a
    result read back) gets its name as its label."""
    try:
        style = Scheme(name).part.style
    except ConfigError:
        style = {}
    return {"label": name, **style}


@dataclass
class Curve:
    """One strategy x scheme over repeats: linear MSD per repeat and iteration."""

    strategy: str
    scheme: str
    msd_centroid: np.ndarray  # (repeats, iters), ||w_c,i - w^o||^2 with w_c = sum_p q_p w_p
    msd_avg: np.ndarray  # (repeats, iters), mean_p ||w_p,i - w^o||^2
    rounds_per_s: float
    extra: dict[str, Any] = field(default_factory=dict)  # merged into the result record
    # More per-round columns of metrics.csv, each (repeats, iters): testing errors, the
    # accountant's Delta and epsilon.
    series: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.msd_centroid = np.asarray(self.msd_centroid, dtype=np.float64)
        self.msd_avg = np.asarray(self.msd_avg, dtype=np.float64)
        for name in ("msd_centroid", "msd_avg"):
            arr = getattr(self, name)
            if arr.ndim != 2 or 0 in arr.shape:
                raise ValueError(
                    f"{self.strategy}/{self.scheme}: {name} has shape {arr.shape}; "
                    "it must be a non-empty (repeats, iters) array"
                )
        for name, arr in [("msd_avg", self.msd_avg), *self.series.items()]:
            if np.shape(arr) != self.msd_centroid.shape:
                raise ValueError(
                    f"{self.strategy}/{self.scheme}: msd_centroid {self.msd_centroid.shape} and "
                    f"{name} {np.shape(arr)} must have the same (repeats, iters) shape"
                )

    @property
    def key(self) -> tuple[str, str]:
        return (self.strategy, self.scheme)


ROUNDS_SUFFIX = "#rounds"  # models.npz: the rounds a sparse session's models are of


def model_rounds(models: np.ndarray) -> np.ndarray:
    """Indices of the rounds of models (T, P, M) some agent sent its model for."""
    return np.flatnonzero((~np.isnan(models[..., 0])).any(axis=1))


def expand_models(held: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """models.npz's arrays by session, each (T, P, M): a session saved sparse (models
    every K rounds: its model rounds and `ROUNDS_SUFFIX`) made whole, NaN between."""
    out = {}
    for name, models in held.items():
        if name.endswith(ROUNDS_SUFFIX):
            continue
        rounds = held.get(name + ROUNDS_SUFFIX)
        if rounds is not None:
            whole = blank_models(int(rounds.max(initial=0)), *models.shape[1:])
            whole[rounds - 1] = models
            models = whole
        out[name] = models
    return out


def steady_state_db(msd: np.ndarray, tail: float = 0.2) -> float:
    """10 log10 of the mean linear MSD over the last `tail` of iterations and all repeats.

    `msd` is (repeats, iters), or one curve (iters,). Averaging before the log (not
    averaging dB values) is what the paper's curves show.
    """
    arr = np.asarray(msd, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[np.newaxis, :]
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise ValueError(f"msd has shape {arr.shape}; pass a non-empty (repeats, iters) array")
    if not 0 < tail <= 1:
        raise ValueError(f"tail = {tail} must be a fraction in (0, 1]")
    count = max(1, round(tail * arr.shape[1]))
    mean = float(arr[:, -count:].mean())
    if mean < 0:
        raise ValueError(f"mean MSD {mean} is negative; MSD values are squared norms")
    return -math.inf if mean == 0 else 10.0 * math.log10(mean)


def diverged(curve: Curve, tail: float = 0.2) -> bool:
    """Whether the recursion ran away (a step size mu too large): MSD overflowed, or its
    last `tail` of rounds is above its first round and DIVERGED_GROWTH times the window
    before: a stable run's noise floor is flat, an unstable one grows geometrically.
    Rounds nobody reported (NaN: a lost agent, a resumed run) are left out, not counted."""
    for msd in (curve.msd_centroid, curve.msd_avg):
        if np.isinf(msd).any():
            return True
        reported = msd[:, ~np.isnan(msd).any(axis=0)].mean(axis=0)
        count = max(1, round(tail * len(reported)))
        if len(reported) < 2 * count:
            continue
        last, before = reported[-count:].mean(), reported[-2 * count : -count].mean()
        if last > DIVERGED_GROWTH * before and last > reported[0]:
            return True
    return False


def steady_state(values: np.ndarray, tail: float = 0.2) -> float:
    """Mean over the last `tail` of iterations and all repeats of a (repeats, iters) series."""
    count = max(1, round(tail * values.shape[1]))
    return float(np.asarray(values)[:, -count:].mean())

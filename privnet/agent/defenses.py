"""How an honest hub combines when some neighbours may lie (issue 34), as pure functions.

A defense works only on what the hub sees. Under `none`, `random` and `ghp` it sees each
neighbour's message, so it can judge each one:

- `clip` (ClippedGossip, self-centered clipping; He, Karimireddy, Jaggi 2022): the hub
  moves towards each neighbour by at most tau, x + sum_m a_mp clip(y_m - x, tau). With
  `tau` given it is fixed; else it is the distance of the (b+1)-th farthest neighbour,
  so the b farthest are pulled in to it (b defaults to 4: with b = 2 one of three runs
  with 3 sign flippers among 30 on V-A left the honest agents 4.1 dB worse than without
  attackers; with 4 every run stays within 1.9 dB, for a no-attacker MSD 2.0 dB above
  no defense's, against 0.5 dB with b = 2: docs/tasks/byzantine.md).
- `trim` (coordinate-wise trimmed mean): per coordinate, the b largest and b smallest of
  the neighbours' values are replaced by the hub's own, then the usual weighted sum. With
  at most b liars among the neighbours, every coordinate lands within the range of the
  honest values and the hub's own (b is capped at (n - 1) // 2 for n neighbours).

Under `local-ghp` and `masked-ghp` a hub sees masked messages, noise until they are
summed: judging one is judging noise. What it can bound is its own step:

- `clip-step`: x + clip(sum - x, tau). It guarantees that one combine moves the hub's model
  by at most tau whatever its neighbours send, so f liars move it by at most tau a round
  (not f tau, and not the unbounded step of `none`); it does not find the liars, nor stop
  a bias smaller than tau. With `tau` given it is fixed; else tau is the median of the
  hub's last `window` steps (after clipping, so a liar cannot inflate it faster than
  the honest steps let it), and the first `window` steps are taken as they come.
  It works under every scheme. (Robust aggregation of masked sums in the literature,
  e.g. norm-bounded contributions proven in zero knowledge, RoFL, EIFFeL, needs proofs
  privnet's wire does not carry.)

Written as `NAME[:KEY=VALUE,...]`, e.g. `clip`, `clip:tau=0.5`, `trim:b=1`, `clip-step`.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from privnet.agent.attacks import parse_params
from privnet.agent.spec import ConfigError, Scheme


class Kind(StrEnum):
    NONE = "none"
    CLIP = "clip"
    TRIM = "trim"
    CLIP_STEP = "clip-step"

    @property
    def sees_messages(self) -> bool:
        """Judges each neighbour's message (so it cannot run where they are masked)."""
        return self in (Kind.CLIP, Kind.TRIM)


DEFAULTS: dict[Kind, dict[str, float]] = {
    Kind.NONE: {},
    Kind.CLIP: {"tau": 0.0, "b": 4},  # tau 0: adaptive, from b
    Kind.TRIM: {"b": 1},
    Kind.CLIP_STEP: {"tau": 0.0, "window": 10},  # tau 0: adaptive, the median of a window
}


def weighted_sum(weights: Mapping[int, float], vectors: Mapping[int, np.ndarray]) -> np.ndarray:
    """No defense: sum_m a_m v_m in the weights' order, as `sum` would add them (without its int 0
    start, so the result is always an array); `weights` is never empty (p is in N_p)."""
    (first, a), *rest = weights.items()
    total = a * vectors[first]
    for m, b in rest:
        total = total + b * vectors[m]
    return total


def clip(v: np.ndarray, tau: float) -> np.ndarray:
    """v scaled down to norm tau when longer."""
    norm = float(np.linalg.norm(v))
    return v if norm <= tau else v * (tau / norm)


@dataclass(frozen=True)
class Hood:
    """A hub's neighbours at one step, as the per-message defenses use them: built once per
    weights (a combine runs every round with the same ones), not at every combine.

    A combine is then a handful of array operations: inside a run each costs several times
    what it costs in a loop of its own (the rest of the round evicts numpy's code and data
    from the caches), so the defenses stack the hub's own term and its model with the
    neighbours' messages and finish with one weighted sum (a matrix product)."""

    weights: Mapping[int, float]  # held, so that `is` tells the same weights apart
    others: tuple[int, ...]
    a: list[float]  # the others' weights, in that order
    own: float  # the hub's own weight
    pull: float  # the others' total weight
    b: int
    k: int  # clip: the rank (ascending) of the distance that is the adaptive radius
    cut: int  # trim: the values cut at each end, per coordinate (b, at most (n - 1) // 2)
    trim_weights: np.ndarray  # trim: the hub's own weight, then the others'

    @classmethod
    def of(cls, weights: Mapping[int, float], me: int, b: int) -> Hood:
        others = tuple(m for m in weights if m != me)
        n = len(others)
        a = [weights[m] for m in others]
        k = n - 1 - min(b, n - 1) if n else 0
        cut = min(b, (n - 1) // 2) if n else 0
        own = weights[me]
        return cls(weights, others, a, own, math.fsum(a), b, k, cut, np.array([own, *a]))


def _hood(weights: Mapping[int, float], me: int, b: int, hood: Hood | None) -> Hood:
    if hood is None:
        return Hood.of(weights, me, b)
    if hood.b != b or hood.weights is not weights:
        raise ValueError("a Hood is built for one hub's weights and b: build it with Hood.of")
    return hood


@functools.cache
def _ones(dim: int) -> np.ndarray:
    return np.ones(dim)


@functools.cache
def _columns(dim: int) -> np.ndarray:
    return np.arange(dim)


def clipped_gossip(
    weights: Mapping[int, float],
    inbox: Mapping[int, np.ndarray],
    center: np.ndarray,
    me: int,
    tau: float,
    b: int,
    hood: Hood | None = None,
) -> np.ndarray:
    """sum_m a_mp z_m with z_m = center + clip(y_m - center, tau) for every neighbour and
    the hub's own term as it is (under ghp it carries the self-term noise that cancels):
    a_pp y_p + (sum_m a_mp) center + sum_m a_mp min(1, tau / |y_m - center|) (y_m - center),
    the last two as one product. Six array operations whatever the degree (the per-
    neighbour scalars in Python): it runs at every combine of every hub."""
    h = _hood(weights, me, b, hood)
    if not h.others:
        return np.asarray(h.own * inbox[me])
    if center.shape == (2,):
        return _clipped_pair(h, inbox, center, me, tau)
    return _clipped_arrays(h, inbox, center, me, tau)


def _clipped_arrays(
    h: Hood, inbox: Mapping[int, np.ndarray], center: np.ndarray, me: int, tau: float
) -> np.ndarray:
    """clipped_gossip in numpy, for a hub with neighbours, whatever the coordinates."""
    rows = np.array([inbox[me], center, *[inbox[m] for m in h.others]])
    diffs = rows[2:]  # a view: (n, dim)
    diffs -= center
    squares = ((diffs * diffs) @ _ones(rows.shape[1])).tolist()  # |y_m - x|^2
    # tau fixed, or the (b+1)-th farthest neighbour's distance (the nearest's with fewer)
    tau2 = tau * tau if tau > 0 else sorted(squares)[h.k]
    pulls = [a if s <= tau2 else a * math.sqrt(tau2 / s) for a, s in zip(h.a, squares, strict=True)]
    return np.asarray(np.array([h.own, h.pull, *pulls]) @ rows)


def _clipped_pair(
    h: Hood, inbox: Mapping[int, np.ndarray], center: np.ndarray, me: int, tau: float
) -> np.ndarray:
    """clipped_gossip on models of 2 coordinates (the paper's V-A problem) in Python floats:
    there numpy's per-call cost is most of a combine. The distances are the same bytes (a
    sum of two squares does not depend on its order); the weighted sum adds in the rows'
    order, where numpy's product may group them otherwise (a last-bit difference)."""
    x0, x1 = center.tolist()
    d0s: list[float] = []
    d1s: list[float] = []
    squares: list[float] = []
    for m in h.others:
        y0, y1 = inbox[m].tolist()
        d0, d1 = y0 - x0, y1 - x1
        d0s.append(d0)
        d1s.append(d1)
        squares.append(d0 * d0 + d1 * d1)
    tau2 = tau * tau if tau > 0 else sorted(squares)[h.k]
    y0, y1 = inbox[me].tolist()
    t0, t1 = h.own * y0 + h.pull * x0, h.own * y1 + h.pull * x1
    for a, s, d0, d1 in zip(h.a, squares, d0s, d1s, strict=True):
        pull = a if s <= tau2 else a * math.sqrt(tau2 / s)
        t0 += pull * d0
        t1 += pull * d1
    return np.array((t0, t1))


# trim with b = 1 finds each coordinate's two cut rows in Python lists up to this many
# coordinates: at 2 (the paper's V-A models) 5.9 us a combine in a loop of its own against
# 6.2 us with numpy's argmin and argmax (inside a 30-agent run 15-22 us against 17-21 us,
# within the runs' noise; no defense 10-13 us); from about 4 coordinates numpy's few calls
# are cheaper than a Python loop over them.
LISTED = 2


def _cut_listed(rows: np.ndarray, center: np.ndarray) -> bool:
    """trim with b = 1 on `rows` (the hub's own term, then the neighbours') in place: per
    coordinate the first lowest and the last highest neighbour's value replaced by center's,
    the rows numpy's argmin and reversed argmax pick. False (rows unchanged) when a coordinate
    holds a NaN (Python's min and max do not rank it as argmin does: numpy's path decides)."""
    columns = rows[1:].T.tolist()
    if any(s != s for s in map(sum, columns)):  # NaN (or inf - inf): numpy's path
        return False
    last = rows.shape[0] - 1
    for j, column in enumerate(columns):
        rows[1 + column.index(min(column)), j] = center[j]
        column.reverse()
        rows[last - column.index(max(column)), j] = center[j]
    return True


def trimmed(
    weights: Mapping[int, float],
    inbox: Mapping[int, np.ndarray],
    center: np.ndarray,
    me: int,
    b: int,
    hood: Hood | None = None,
) -> np.ndarray:
    """sum_m a_mp z_m, z_m = y_m with, per coordinate, the b largest and b smallest of the
    neighbours' values replaced by the hub's own (center); its own term as it is."""
    h = _hood(weights, me, b, hood)
    rows = np.array([inbox[me], *[inbox[m] for m in h.others]])  # the hub's own term first
    if h.cut == 1 and rows.shape[1] <= LISTED and _cut_listed(rows, center):
        return np.asarray(h.trim_weights @ rows)
    if h.cut:
        _cut_arrays(rows, center, h.cut)
    return np.asarray(h.trim_weights @ rows)


def _cut_arrays(rows: np.ndarray, center: np.ndarray, cut: int) -> None:
    """trim on `rows` (the hub's own term, then the neighbours') in place, in a few numpy
    calls whatever the coordinates: per coordinate the `cut` lowest and highest neighbours'
    values replaced by center's."""
    stacked = rows[1:]  # a view: (n, dim)
    n, columns = stacked.shape[0], _columns(rows.shape[1])
    if cut == 1:  # per coordinate the first lowest and the last highest (two rows even
        # when all n are equal): two passes, no sort
        low, high = stacked.argmin(axis=0), n - 1 - stacked[::-1].argmax(axis=0)
        stacked[low, columns] = center
        stacked[high, columns] = center
    else:  # the rows of the cut ranks, per coordinate (the method skips numpy's wrapper)
        ranks = stacked.argpartition((cut - 1, n - cut), axis=0)
        stacked[ranks[:cut], columns] = center
        stacked[ranks[n - cut :], columns] = center


@dataclass
class StepClipper:
    """`clip-step` at one combine step of one hub: it keeps its last steps' norms."""

    tau: float
    window: int
    norms: deque[float] = field(default_factory=deque)

    def __call__(self, total: np.ndarray, center: np.ndarray) -> np.ndarray:
        step = total - center
        tau = self.tau
        if tau <= 0:  # adaptive: the median of the window, once it is full
            tau = statistics.median(self.norms) if len(self.norms) >= self.window else math.inf
        norm = math.sqrt(float(step @ step))
        self.norms.append(min(norm, tau))  # the step taken
        if len(self.norms) > self.window:
            self.norms.popleft()
        if norm <= tau:
            return total
        return np.asarray(center + step * (tau / norm))


@dataclass(frozen=True)
class Defense:
    kind: Kind = Kind.NONE
    params: dict[str, float] = field(default_factory=dict)

    def __getitem__(self, name: str) -> float:
        return self.params.get(name, DEFAULTS[self.kind][name])

    def __str__(self) -> str:
        given = ",".join(f"{k}={v:g}" for k, v in sorted(self.params.items()))
        return f"{self.kind}:{given}" if given else str(self.kind)


def parse(text: str, scheme: Scheme | None = None) -> Defense:
    """`NAME[:KEY=VALUE,...]` -> Defense (empty: none); with `scheme`, a ConfigError when
    the defense cannot work under it."""
    name, _, rest = (text.strip() or "none").partition(":")
    try:
        kind = Kind(name.strip())
    except ValueError:
        valid = ", ".join(k.value for k in Kind)
        raise ConfigError(f"defense {text!r}: choose one of {valid}") from None
    params = parse_params(rest, DEFAULTS[kind], f"defense {kind}")
    for key, low in (("b", 0), ("window", 1)):
        if key in params and (params[key] < low or params[key] % 1):
            raise ConfigError(
                f"defense {kind}: {key} must be a whole number >= {low}, got {params[key]:g}"
            )
    if params.get("tau", 0.0) < 0:
        raise ConfigError(f"defense {kind}: tau must be > 0 (or left out: adaptive)")
    defense = Defense(kind, params)
    if scheme is not None:
        check(defense, scheme)
    return defense


def check(defense: Defense, scheme: Scheme) -> None:
    """ConfigError when `defense` needs to see messages `scheme` masks."""
    if defense.kind.sees_messages and Scheme(scheme).masked:
        raise ConfigError(
            f"defense {defense.kind} judges each neighbour's message, and under {scheme} a hub "
            "sees only masked messages whose masks cancel in the sum: use clip-step there "
            "(it bounds the hub's own step), or run the scheme without a defense"
        )


@dataclass
class Combiner:
    """One hub's defense over a run: the per-message combine, or the step bound (per step)."""

    defense: Defense
    me: int
    clippers: dict[int, StepClipper] = field(default_factory=dict)
    hoods: dict[int, Hood] = field(default_factory=dict)  # step -> its neighbours, cached
    sees_messages: bool = field(init=False)

    def __post_init__(self) -> None:
        d = self.defense
        self.sees_messages = d.kind.sees_messages
        self._tau = d["tau"] if d.kind in (Kind.CLIP, Kind.CLIP_STEP) else 0.0
        self._b = int(d["b"]) if d.kind in (Kind.CLIP, Kind.TRIM) else 0
        self._clips = d.kind is Kind.CLIP

    def combine(
        self,
        weights: Mapping[int, float],
        inbox: Mapping[int, np.ndarray],
        center: np.ndarray,
        step: int = 0,
    ) -> np.ndarray:
        """The per-message defenses' combine (clip, trim) at `step` (its neighbours cached
        while its weights stay the same object: a schedule's new weights are a new one)."""
        hood = self.hoods.get(step)
        if hood is None or hood.weights is not weights:
            hood = self.hoods[step] = Hood.of(weights, self.me, self._b)
        if self._clips:
            return clipped_gossip(weights, inbox, center, self.me, self._tau, self._b, hood)
        return trimmed(weights, inbox, center, self.me, self._b, hood)

    def bound(self, total: np.ndarray, center: np.ndarray, step: int) -> np.ndarray:
        """clip-step's bound on the combine's result; any other defense leaves it."""
        if self.defense.kind is not Kind.CLIP_STEP:
            return total
        clipper = self.clippers.get(step)
        if clipper is None:
            d = self.defense
            clipper = self.clippers[step] = StepClipper(d["tau"], int(d["window"]))
        return clipper(total, center)

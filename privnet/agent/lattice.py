"""The compact wire form (`--wire-dtype u4`): a release as its integer on the noise lattice,
mod 2^32, 4 bytes a parameter.

A release x goes on the wire as k = rint(x / step) reduced mod 2^32 (`words`), step the
noise grid of issue 18 (`rng.grid(sigma_g)`), or `NOISELESS_GRID` where a run adds no
noise. Every scheme's wire value is then a lattice point by construction, so the float
leak stays closed. A masked scheme's term is rint(a v / step) plus its pair masks, words
drawn uniformly mod 2^32 (keys.WordBank); the hub adds the words mod 2^32, where the masks
cancel exactly at any width, and reads the sum back as a signed integer (`total`).

The range. 32 bits hold integers in [-2^31, 2^31); a sum mod 2^32 outside that wraps,
and a hub cannot see that it did (a uniform mask hides every term). So the sender refuses:
no release is put on the wire with |k| > LIMIT steps (`OutOfRange`, counted as
`wire-range`; the agent stops with the reason). A hub's in-weights sum to 1
(spec._check_plan), so honest terms sum within LIMIT + 1 < 2^31: no wrap. A hub also
refuses a total beyond that (some wraps of a sender that did not check land there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from privnet.agent import rng
from privnet.agent.messages import Reason, Rejected
from privnet.agent.spec import WireDtype

NOISELESS_GRID = 2.0**-24  # u4 without noise: float32's spacing at 1, a range of +-128
LIMIT = 2**31 - 2**16  # |k| a release may have on the wire; sums stay below 2^31
_SLACK = 2**8  # rounding and the in-weights' tolerance: an honest hub total is within this
BLOCK = 1 << 16  # entries a masked release is worked out in at a time (512 kB of float64)


class OutOfRange(Rejected):
    """A release (or a hub's total) outside the u4 wire's range: refused, never wrapped."""

    def __init__(self, detail: str) -> None:
        super().__init__(Reason.WIRE_RANGE, detail)


def grid(sigma_g: float, wire: WireDtype) -> float:
    """The lattice a release sits on: the noise grid (0, none, for f8 without noise)."""
    step = rng.grid(sigma_g)
    return step if step or wire is WireDtype.F8 else NOISELESS_GRID


def _refuse(k: np.ndarray, bound: float, step: float, where: str, offset: int = 0) -> None:
    """OutOfRange at k's first entry beyond +-bound (`offset`: k's first entry's index)."""
    if k.size and k.min() >= -bound and k.max() <= bound:  # the usual case: no temporaries
        return  # (NaN fails both comparisons: it is found below)
    over = np.flatnonzero(~((k >= -bound) & (k <= bound)))  # NaN is over too
    if over.size:
        i = int(over[0])
        raise OutOfRange(
            f"{where}: entry {offset + i} is {float(k.flat[i]) * step:.6g} ({float(k.flat[i]):.4g} "
            f"lattice steps of {step:.3g}), where the u4 wire holds +-{bound * step:.6g} "
            f"({over.size} of {k.size} entries over): run with --wire-dtype f8, or keep the model "
            "smaller (e.g. a smaller mu)"
        )


def words(v: np.ndarray, step: float, where: str) -> np.ndarray:
    """v's lattice integers as the u4 wire carries them: uint32, two's complement (through
    int32, which holds every |k| <= LIMIT exactly)."""
    k = np.rint(v / step)
    _refuse(k, LIMIT, step, where)
    return k.astype(np.int32).view(np.uint32)


def values(w: np.ndarray, step: float) -> np.ndarray:
    """The floats a vector of words stands for: step * (w read as signed int32)."""
    return w.view(np.int32) * step


def sent(
    released: Mapping[int, np.ndarray], me: int, step: float, where: str
) -> dict[int, np.ndarray]:
    """An unmasked scheme's releases as words for every target but `me` (the self-term
    does not travel: it stays floats)."""
    made: dict[int, np.ndarray] = {}  # by the release's id: a shared one becomes words once
    out = {}
    for k, v in released.items():
        if k != me and id(v) not in made:
            made[id(v)] = words(v, step, f"{where} to {k}")
        out[k] = v if k == me else made[id(v)]
    return out


def floats(inbox: Mapping[int, np.ndarray], step: float) -> dict[int, np.ndarray]:
    """What an unmasked scheme combines: words received back as floats, floats as they are."""
    return {m: values(v, step) if v.dtype == np.uint32 else v for m, v in inbox.items()}


def masked_words(
    v: np.ndarray,
    masks: np.ndarray,
    a: np.ndarray,
    step: float,
    where: str,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """rint(a v / step) + masks mod 2^32 per target (rows of `masks`, weights `a` as a
    column; `v` one vector for every row, or a row each): the masked schemes' u4 release,
    refused beyond a * LIMIT per term. Into `out` (may be `masks` itself), else a new array.

    Row by row and block by block through two small reused buffers: at a million
    parameters and seven targets, the whole-array form held about 100 MB of float64 and
    int64 temporaries at once."""
    out = np.empty_like(masks) if out is None else out
    if masks.size <= BLOCK:  # a small model: one pass over every row, temporaries small too
        k = np.rint(a * v / step)
        if not (np.abs(k) <= a * LIMIT).all():  # NaN too: the row by row path says where
            return _masked_rows(v, masks, a, step, where, out)
        np.add(masks, k.astype(np.int64), out=out, casting="unsafe")  # mod 2^32
        return out
    return _masked_rows(v, masks, a, step, where, out)


def _masked_rows(
    v: np.ndarray, masks: np.ndarray, a: np.ndarray, step: float, where: str, out: np.ndarray
) -> np.ndarray:
    """`masked_words` row by row and block by block, through two small reused buffers. The
    range is checked once on v where that suffices (`_inside`), else on every row's k."""
    dim = masks.shape[1]
    scaled = np.empty(min(dim, BLOCK), dtype=np.float64)
    k = np.empty(len(scaled), dtype=np.int32)  # |k| <= LIMIT < 2^31: int32 holds it exactly
    words = k.view(np.uint32)  # its two's complement: added to the masks mod 2^32 as is
    shared = v.ndim == 1 and _inside(v, a, step)
    for i in range(len(masks)):
        row = v if v.ndim == 1 else v[i]
        bound, name = float(a[i, 0]) * LIMIT, f"{where}, row {i}" if i else where
        checked = shared if v.ndim == 1 else _inside(row, a[i : i + 1], step)
        for at in range(0, dim, BLOCK):
            end = min(at + BLOCK, dim)
            x, n = scaled[: end - at], k[: end - at]
            np.multiply(a[i], row[at:end], out=x)
            np.divide(x, step, out=x)
            if checked:  # integers already: the cast is exact
                np.rint(x, out=n, casting="unsafe")
            else:
                np.rint(x, out=x)
                _refuse(x, bound, step, name, at)
                np.copyto(n, x, casting="unsafe")
            np.add(masks[i, at:end], words[: end - at], out=out[i, at:end])  # mod 2^32
    return out


def _inside(v: np.ndarray, a: np.ndarray, step: float) -> bool:
    """Whether every |rint(a_i v / step)| <= a_i LIMIT for sure, from v's extremes alone
    (two passes over v, not two a row and block): |a v / step| <= a max|v| / step, and
    rint adds at most 1/2; a margin of one step and 1e-9 covers the float rounding. False
    (NaN too) sends the rows to the exact check, which names the entry."""
    if not v.size:
        return True
    if not float(a.min()) > 0:  # no weight: nothing to bound it by
        return False
    top = max(-float(v.min()), float(v.max())) / step  # NaN: both comparisons below fail
    return bool(top * (1 + 1e-9) + 1.0 / float(a.min()) + 1.0 <= LIMIT)


def total(terms: Sequence[np.ndarray] | np.ndarray, step: float, where: str) -> np.ndarray:
    """A hub's combination: its terms' words (rows) added mod 2^32, where the masks cancel,
    read as signed and as floats; refused beyond what honest terms can sum to. The terms
    are added one by one into one vector (no stacked copy of them all)."""
    summed = np.array(terms[0], dtype=np.uint32)
    for term in terms[1:]:
        np.add(summed, term, out=summed)
    signed = summed.view(np.int32)
    _refuse(signed, LIMIT + _SLACK, step, where)
    combined: np.ndarray = signed * step
    return combined


def wrapped(x: np.ndarray, step: float) -> np.ndarray:
    """A sum of lattice floats as a hub of the u4 wire reads it: its integers mod 2^32,
    signed (the auditor's check of what the hub's `total` saw, from the words as floats)."""
    k = np.rint(np.asarray(x) / step).astype(np.int64).astype(np.uint32).view(np.int32)
    out: np.ndarray = k * step
    return out


def received(vector: np.ndarray, wire: WireDtype, where: str) -> np.ndarray:
    """A model vector as the core keeps it: f8, float64; u4, uint32 words, or Rejected
    (shape) for anything else."""
    if wire is WireDtype.F8:
        return np.asarray(vector, dtype=np.float64)
    if not (isinstance(vector, np.ndarray) and vector.dtype == np.uint32):
        kind = getattr(vector, "dtype", type(vector).__name__)
        raise Rejected(Reason.SHAPE, f"{where}: a u4 run's models are uint32 words, got {kind}")
    return vector

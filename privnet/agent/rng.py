"""Counter-based random streams, so every engine draws the same numbers in any order.

A stream is Philox4x64 keyed by one agent's own key for one purpose (its noise, its
minibatches), which the orchestrator derives one way from the run's master seed
(privnet/orchestrator/experiment/seeds.py), so no agent can compute another's stream. The counter
says what is drawn (domain, step) and where: the row of round i, `width` entries. An agent
jumps straight to its round; the oracle draws whole blocks of rounds at once. Secrets of
the protocol never come from here (see keys.py).
"""

from __future__ import annotations

import math
from enum import IntEnum

import numpy as np

UNIFORM_BITS = 52  # k + 1/2 is exact in a double only for k < 2^52
_STEP = 2.0**-UNIFORM_BITS


class Domain(IntEnum):
    """What a stream is for; part of the Philox counter, so domains never overlap."""

    NOISE = 1  # `random` (off-diagonal) and `ghp` (diagonal) perturbations
    BATCH = 2  # minibatch sample indices
    ATTACK = 3  # a Byzantine agent's own draws (privnet.agent.attacks)


def _padded(width: int) -> int:
    return 4 * math.ceil(width / 4)


def _counter(position: int, domain: Domain, step: int) -> np.ndarray:
    # Philox emits 4 words per counter value, so rows start on multiples of 4.
    return np.array([position // 4, 0, int(domain), step], dtype=np.uint64)


def raw_row(key: tuple[int, int], domain: Domain, step: int, round_: int, width: int) -> np.ndarray:
    """The `width` raw words of round `round_`'s row of the stream `key`."""
    bitgen = np.random.Philox(
        key=np.array(key, dtype=np.uint64), counter=_counter(round_ * _padded(width), domain, step)
    )
    return bitgen.random_raw(width)


class Rows:
    """One key's rows read forward a block of rounds at a time (the oracle's chunks): the
    words raw_row gives round by round, from one generator while the blocks follow each
    other (the oracle draws every agent's stream, so a generator per block would cost)."""

    def __init__(self, key: tuple[int, int], domain: Domain, step: int, width: int) -> None:
        self._key, self._domain, self._step = np.array(key, dtype=np.uint64), domain, step
        self._width, self._padded = width, _padded(width)
        self._bitgen: np.random.Philox | None = None
        self._next = -1  # the round the generator stands at

    def block(self, first_round: int, rounds: int) -> np.ndarray:
        """Rows of rounds first_round .. first_round+rounds-1, shape (rounds, width)."""
        if self._bitgen is None or first_round != self._next:
            counter = _counter(first_round * self._padded, self._domain, self._step)
            self._bitgen = np.random.Philox(key=self._key, counter=counter)
        self._next = first_round + rounds
        raw = self._bitgen.random_raw(rounds * self._padded)
        return raw.reshape(rounds, self._padded)[:, : self._width]


def generator(key: tuple[int, int]) -> np.random.Generator:
    """A sequential generator on `key` from counter 0, for draws made once (data)."""
    return np.random.Generator(np.random.Philox(key=np.array(key, dtype=np.uint64)))


def uniforms(raw: np.ndarray) -> np.ndarray:
    """Map 64-bit words to doubles strictly inside (0, 1): midpoints (k + 1/2) 2^-52 of the
    top 52 bits. (With 53 bits, k + 1/2 rounds to 2^53 for the top k: u = 1, infinite noise.)"""
    return ((raw >> np.uint64(64 - UNIFORM_BITS)).astype(np.float64) + 0.5) * _STEP


GRID_BITS = 20  # the noise grid is the power of two 2^-20 below the Laplace scale


def float_laplace(u: np.ndarray, sigma_g: float) -> np.ndarray:
    """Inverse-CDF Laplace with per-coordinate variance sigma_g^2, i.e. scale sigma_g/sqrt(2).

    Its doubles leak: x + this is often a double that x' + this can never be (Mironov
    2012; privnet/orchestrator/privacy/sampler.py measures it). Release `laplace` instead.
    """
    b = sigma_g / math.sqrt(2.0)
    c = u - 0.5
    return -b * np.sign(c) * np.log1p(-2.0 * np.abs(c))


def grid(sigma_g: float) -> float:
    """Spacing of the noise grid: 2^(floor(log2 b) - GRID_BITS); 0 without noise."""
    b = sigma_g / math.sqrt(2.0)
    return 0.0 if b == 0 else 2.0 ** (math.floor(math.log2(b)) - GRID_BITS)


def snap(x: np.ndarray, sigma_g: float) -> np.ndarray:
    """x rounded to the noise grid: what a private scheme adds its noise to (exact: the
    grid is a power of two), so a release carries no low-order bits of x."""
    return on_lattice(x, 1.0, grid(sigma_g))


def on_lattice(v: np.ndarray, a: np.ndarray | float, step: float) -> np.ndarray:
    """a * v rounded to the noise grid `step` (grid(sigma_g)): the point n * step of the
    integer lattice that a masked scheme releases (n exact for |n| < 2^51, i.e. |a v| < 2^30
    Laplace scales; without noise, step 0, a v itself).

    A hub applies the same function to what it receives: on_lattice(masked_release(v, M,
    a, step), a, step) is exactly on_lattice(v, a, step) + M, so pair masks M on the grid
    cancel exactly, in integers, and every term of a masked combination is a v rounded to
    the grid."""
    return a * v if step == 0 else step * np.rint(a * v / step)


def masked_release(
    v: np.ndarray, masks: np.ndarray | float, a: np.ndarray | float, step: float
) -> np.ndarray:
    """What a masked scheme sends to a hub that weighs it by the public a: the lattice point
    on_lattice(v, a, step) + masks (masks on the grid) divided by a. The release is one
    float function of that integer point and the public a, so its low-order bits carry
    nothing of v (Mironov's float attack finds no impossible release; privacy/sampler.py).
    """
    return (on_lattice(v, a, step) + masks) / a


def laplace(u: np.ndarray, sigma_g: float) -> np.ndarray:
    """Laplace noise on the grid (a discretized Laplace, as OpenDP releases it).

    snap(x) + laplace(u) is a grid point, and every grid point within ~21 scales of x is
    reachable from any x, so the float leak of `float_laplace` is gone; beyond that the
    52-bit uniforms thin out (probability e^-21 ~ 8e-10, a delta). The rounding adds
    variance grid^2 / 12 <= 2^-40 b^2: nothing measurable.
    """
    step = grid(sigma_g)
    noise = float_laplace(u, sigma_g)
    return noise if step == 0 else step * np.rint(noise / step)


def indices(raw: np.ndarray, n: int) -> np.ndarray:
    """Uniform sample indices in [0, n) (Lemire's multiply-shift on the top 32 bits)."""
    top = (raw >> np.uint64(32)).astype(np.uint64)
    return ((top * np.uint64(n)) >> np.uint64(32)).astype(np.int64)

"""Does the Laplace sampler leak through its floating-point outputs? (Mironov, CCS 2012)

With the plain inverse CDF (privnet.agent.rng.float_laplace) a release y = x + noise is a sparse,
uneven subset of the doubles, so a y that x = 0 can never produce proves x != 0: an infinite
privacy loss. `impossible_fraction` measures how often that happens, exactly (a release is
monotone in the sampler's input, so a binary search over its 2^52 values decides). privnet's
own releases are checked too: random and ghp send snap(x) + laplace(u), both on a
power-of-two grid; the masked schemes one float function of a lattice point
(privnet.agent.rng.masked_release), here with a weight of 1/3, no power of two.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from privnet.agent import rng

K_BITS = rng.UNIFORM_BITS
Release = Callable[[float, np.ndarray, float], np.ndarray]  # (x, k, sigma_g) -> y


def _uniforms(k: np.ndarray) -> np.ndarray:
    return rng.uniforms(k.astype(np.uint64) << np.uint64(64 - K_BITS))


def float_release(x: float, k: np.ndarray, sigma_g: float) -> np.ndarray:
    """x + inverse-CDF Laplace: the textbook sampler, which leaks."""
    return x + rng.float_laplace(_uniforms(k), sigma_g)


def grid_release(x: float, k: np.ndarray, sigma_g: float) -> np.ndarray:
    """What random and ghp put on the wire: snap(x) + Laplace on the grid."""
    return rng.snap(np.asarray(x, dtype=np.float64), sigma_g) + rng.laplace(_uniforms(k), sigma_g)


A_PK = 1 / 3  # a public weight a_pk that is no power of two


def lattice_release(x: float, k: np.ndarray, sigma_g: float) -> np.ndarray:
    """What local-ghp puts on a link to a hub that weighs it by a_pk: one pair's mask (the
    one drawn from k) on the lattice of a_pk x, divided by a_pk."""
    mask = rng.laplace(_uniforms(k), sigma_g)
    return rng.masked_release(np.asarray(x, dtype=np.float64), mask, A_PK, rng.grid(sigma_g))


def masked_ghp_release(x: float, k: np.ndarray, sigma_g: float) -> np.ndarray:
    """masked-ghp: the lattice release of its ghp release snap(x) + g, for one ghp draw g
    (the test holds for each draw: the image under x = 0 is taken with the same g)."""
    g = rng.laplace(np.array(0.3), sigma_g)
    return lattice_release(float(rng.snap(np.asarray(x), sigma_g) + g), k, sigma_g)


def float_mask_release(x: float, k: np.ndarray, sigma_g: float) -> np.ndarray:
    """x + mask / a_pk: how local-ghp released before its masks went on the lattice."""
    return x + rng.laplace(_uniforms(k), sigma_g) / A_PK


RELEASES: dict[str, Release] = {
    "float inverse CDF": float_release,
    "grid (random, ghp)": grid_release,
    "float masks / a_pk = 1/3": float_mask_release,
    "lattice, a_pk = 1/3 (local-ghp)": lattice_release,
    "lattice, a_pk = 1/3 (masked-ghp)": masked_ghp_release,
}
LEAKY = ("float inverse CDF", "float masks / a_pk = 1/3")  # what privnet does not send


def in_image(y: np.ndarray, release: Release, sigma_g: float) -> np.ndarray:
    """Whether each y is exactly release(0, k) for some input k of rng.uniforms."""
    lo = np.zeros(y.shape, dtype=np.uint64)
    hi = np.full(y.shape, (1 << K_BITS) - 1, dtype=np.uint64)
    while np.any(lo < hi):  # smallest k with release(0, k) >= y (non-decreasing in k)
        mid = lo + (hi - lo) // np.uint64(2)
        below = release(0.0, mid, sigma_g) < y
        lo = np.where(below, mid + np.uint64(1), lo)
        hi = np.where(below, hi, mid)
    return release(0.0, lo, sigma_g) == y


def impossible_fraction(
    release: Release, sigma_g: float, shift: float, draws: int, seed: int = 0
) -> float:
    """Fraction of releases for x = shift that x = 0 could not have produced."""
    gen = np.random.Generator(np.random.Philox(seed))
    k = gen.integers(0, 1 << K_BITS, draws, dtype=np.uint64)
    return float(np.mean(~in_image(release(shift, k, sigma_g), release, sigma_g)))


def first_hole(sigma_g: float) -> float:
    """|noise| / b beyond which the grid sampler skips grid points: there the spacing of
    its outputs, 2 b e^(|z|/b) 2^-52, exceeds the grid. A release whose x moved by
    Delta reaches past it with probability e^-(hole - Delta/b) / 2: the delta of the
    (eps, delta) guarantee (3.7e-8 for Delta = 5 b at the default grid)."""
    b = sigma_g / math.sqrt(2.0)
    return math.log(rng.grid(sigma_g) * 2.0**K_BITS / (2 * b))


SHIFTS = (0.01, 1.0, 5.0)  # x - x' in Laplace scales b


def sampler_report(sigma_g: float, draws: int = 20_000) -> dict[str, Any]:
    """The leak of each sampler at this noise level, for shifts of 0.01, 1 and 5 scales."""
    b = sigma_g / math.sqrt(2.0)
    return {
        "first_hole_scales": first_hole(sigma_g),
        "releases": [
            {
                "sampler": name,
                "sigma_g": sigma_g,
                "shift_scales": shift,
                "draws": draws,
                "impossible_fraction": impossible_fraction(release, sigma_g, shift * b, draws),
            }
            for name, release in RELEASES.items()
            for shift in SHIFTS
        ],
    }

"""Mironov's floating-point attack on the Laplace samplers
(privnet/orchestrator/privacy/sampler.py).

The textbook inverse CDF leaks: most releases for x != 0 are doubles that x = 0 cannot
produce, and so do masks divided by a public weight a_pk = 1/3. What privnet releases has
no such doubles: snap(x) + Laplace on the grid (random, ghp), and one function of a lattice
point for the masked schemes, whatever a_pk.
"""

from __future__ import annotations

import numpy as np
import pytest

from privnet.agent import rng
from privnet.orchestrator.privacy.sampler import (
    LEAKY,
    RELEASES,
    SHIFTS,
    first_hole,
    float_release,
    grid_release,
    impossible_fraction,
    in_image,
)

DRAWS = 4000


def test_membership_is_exact() -> None:
    k = np.array([0, 1, 12345, 2**51, 2**52 - 1], dtype=np.uint64)
    y = float_release(0.0, k, 0.1)
    assert np.all(in_image(y, float_release, 0.1))
    assert not np.any(in_image(np.nextafter(y[1:4], np.inf), float_release, 0.1))


@pytest.mark.parametrize("sigma_g", [0.1, 0.894])
@pytest.mark.parametrize("shift", SHIFTS)
@pytest.mark.parametrize("sampler", list(RELEASES))
def test_float_samplers_leak_and_every_scheme_s_release_does_not(
    sigma_g: float, shift: float, sampler: str
) -> None:
    """Shifts in Laplace scales b; beyond ~21 scales the grid thins out (first_hole)."""
    x = shift * sigma_g / np.sqrt(2)
    leaked = impossible_fraction(RELEASES[sampler], sigma_g, x, DRAWS)
    if sampler in LEAKY:
        assert leaked > 0.5
    else:
        assert leaked == 0.0


def test_the_grid_thins_out_only_far_in_the_tail() -> None:
    assert 19 < first_hole(0.1) < 23
    far = (first_hole(0.1) + 3) * 0.1 / np.sqrt(2)  # most releases land past the hole
    assert impossible_fraction(grid_release, 0.1, far, DRAWS) > 0.1


def test_uniforms_stay_strictly_inside_zero_one() -> None:
    """The extreme words: with 53-bit midpoints the top one rounded to u = 1 (noise = inf)."""
    u = rng.uniforms(np.array([0, 2**64 - 1], dtype=np.uint64))
    assert u[0] > 0 and u[1] < 1
    assert np.all(np.isfinite(rng.laplace(u, 1.0)))


def test_grid_noise_keeps_the_laplace_law() -> None:
    raw = np.random.Generator(np.random.Philox(3)).integers(0, 2**64, 50_000, dtype=np.uint64)
    u = rng.uniforms(raw)
    exact, grid = rng.float_laplace(u, 0.5), rng.laplace(u, 0.5)
    assert np.max(np.abs(grid - exact)) <= rng.grid(0.5) / 2
    assert np.all(np.mod(grid, rng.grid(0.5)) == 0)
    assert rng.grid(0.5) == 2.0 ** (np.floor(np.log2(0.5 / np.sqrt(2))) - rng.GRID_BITS)

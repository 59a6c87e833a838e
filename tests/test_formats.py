"""Format rounding against independent references (pure-Python arithmetic, torch's own float8)."""

import math
import random

import numpy as np
import pytest
import torch

from vcbench.kernels.spec.formats import (
    E2M1,
    E2M1_GRID,
    E4M3,
    INT8,
    round_e2m1,
    round_e4m3,
    round_fp22,
    round_int8,
    to_storage,
)


def e4m3_reference(x: float) -> float:
    """Nearest E4M3 (fn) value by enumerating the grid: ties to the even mantissa."""
    grid = []
    for e in range(16):
        for m in range(8):
            if e == 15 and m == 7:
                continue  # NaN in the fn variant
            grid.append((m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    mag = min(abs(x), 448.0)
    best = min(grid, key=lambda g: (abs(g - mag), _odd_mantissa(g)))
    return math.copysign(best, x)


def _odd_mantissa(g: float) -> int:
    if g == 0:
        return 0
    if g < 2.0**-6:
        return int(round(g / 2.0**-9)) & 1
    e = math.floor(math.log2(g))
    return int(round((g / 2.0**e - 1) * 8)) & 1


def test_e4m3_matches_enumerated_grid():
    rng = random.Random(0)
    xs = [rng.uniform(-500, 500) for _ in range(300)]
    xs += [rng.uniform(-0.02, 0.02) for _ in range(200)]  # subnormals
    xs += [2.0**-9 * 0.5, 2.0**-9 * 1.5, 1.0625, 1.1875, 2.0**-6 * 1.0625]  # exact ties
    got = round_e4m3(torch.tensor(xs, dtype=torch.float64)).tolist()
    assert got == [e4m3_reference(x) for x in xs]


def _e4m3_grid() -> np.ndarray:
    """The 127 non-negative finite E4M3 (fn) values, from the bit layout (8 e + m)."""
    return np.array([(m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
                     for e in range(16) for m in range(8) if not (e == 15 and m == 7)])


def test_e4m3_saturates_and_matches_the_enumerated_grid_on_many_values():
    x = torch.tensor([1000.0, -1000.0, 448.0, 464.0, 0.0, -0.0])
    assert round_e4m3(x).tolist() == [448.0, -448.0, 448.0, 448.0, 0.0, 0.0]
    # Nearest grid value by brute force over all 127 (FP64 distances); a tie goes to the even
    # code, i.e. the even index into the grid, which is ordered by code.
    y = torch.randn(20000, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 50
    grid = _e4m3_grid()
    mag = np.minimum(np.abs(y.numpy()), 448.0)
    dist = np.abs(mag[:, None] - grid[None, :])
    best = dist.min(1, keepdims=True)
    candidates = np.where(dist == best, np.arange(grid.size) % 2, 2)  # even index first
    want = np.copysign(grid[candidates.argmin(1)], y.numpy())
    assert np.array_equal(round_e4m3(y).numpy(), want)


def test_int8_rounds_half_to_even_and_clips():
    x = torch.tensor([2.5, -2.5, 3.5, 0.5, -0.5, 126.6, 200.0, -200.0])
    assert round_int8(x).tolist() == [2.0, -2.0, 4.0, 0.0, -0.0, 127.0, 127.0, -127.0]


def e2m1_reference(x: float) -> float:
    mag = min(abs(x), 6.0)
    # Nearest grid value; on a tie the even index (0, 2, 4, 6) wins.
    best = min(range(8), key=lambda i: (abs(E2M1_GRID[i] - mag), i % 2))
    return math.copysign(E2M1_GRID[best], x)


def test_e2m1_nearest_with_ties_to_even():
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    rng = random.Random(1)
    xs = ties + [-t for t in ties] + [rng.uniform(-8, 8) for _ in range(500)] + list(E2M1_GRID)
    got = round_e2m1(torch.tensor(xs)).tolist()
    assert got == [e2m1_reference(x) for x in xs]
    assert round_e2m1(torch.tensor([0.75, 1.75, 3.5, 0.25, 2.5, 5.0])).tolist() == [1.0, 2.0, 4.0, 0.0, 2.0, 4.0]


def test_fp22_keeps_13_mantissa_bits():
    x = torch.randn(1000) * 1e3
    y = round_fp22(x)
    assert torch.all((y.view(torch.int32) & 0x3FF) == 0)
    assert torch.all((x - y).abs() <= x.abs() * 2.0**-13)
    assert torch.all(y.abs() <= x.abs())  # truncation toward zero


@pytest.mark.parametrize("fmt", [INT8, E4M3, E2M1])
def test_storage_round_trip(fmt):
    values = fmt.round(torch.randn(512) * fmt.max / 2)
    stored = to_storage(values, fmt)
    if fmt is E2M1:
        grid = torch.tensor(E2M1_GRID)
        back = grid[(stored & 7).long()] * torch.where((stored >> 3) == 1, -1.0, 1.0)
    else:
        back = stored.float()
    assert torch.equal(back, values)

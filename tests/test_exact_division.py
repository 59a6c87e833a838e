"""The NVFP4 attention kernel's divisions without a divide: its sequences, in exact arithmetic,
give what a correctly rounded FP32 division gives (numpy's float32 division is IEEE), so P's
codes stay the emulation's. Checked on every E4M3 microscale, on row scales down to FP32's
subnormals, and on dividends at E2M1's rounding boundaries and in the subnormal range."""

from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("triton", reason="the kernel module needs Triton")
from vcbench.kernels.backends.triton import nvfp4_attention as k  # noqa: E402

f32 = np.float32
RNG = np.random.default_rng(20261202)


def rn32(value: Fraction) -> np.float32:
    """The FP32 nearest to an exact value, ties to even."""
    c = f32(float(value))
    best = None
    for x in (np.nextafter(c, f32(-np.inf)), c, np.nextafter(c, f32(np.inf))):
        d = abs(Fraction(float(x)) - value)
        if best is None or d < best[0] or (d == best[0] and int(x.view(np.uint32)) % 2 == 0):
            best = (d, x)
    return best[1]


def F(x) -> Fraction:
    return Fraction(float(x))


def div_by(x, d_up, recip) -> np.float32:
    """_div_rn_by: x_up = x * 2^64, q = x_up * recip, r = fma(-q, d_up, x_up), fma(r, recip, q),
    each step rounded once to FP32 (the GPU's mul.rn and fma.rn)."""
    x_up = rn32(F(x) * 2**64)
    assert F(x_up) == F(x) * 2**64  # the scaling is exact
    q = rn32(F(x_up) * F(recip))
    r = rn32(F(x_up) - F(q) * F(d_up))
    return rn32(F(q) + F(r) * F(recip))


def recip_e4m3_up(x_up: np.float32) -> np.float32:
    """_recip_e4m3_up on the host: the table entry for the mantissa times 2^-exponent."""
    bits = int(x_up.view(np.uint32))
    pow2 = np.array([(254 - ((bits >> 23) & 0xFF)) << 23], dtype=np.uint32).view(np.float32)[0]
    return f32(k._R[(bits >> 20) & 7] * pow2)


def e4m3_positive():
    values = {(1 + m / 8) * 2.0 ** (e - 7) for e in range(1, 16) for m in range(8)}
    values |= {m / 8 * 2.0**-6 for m in range(1, 8)}  # subnormals
    return [f32(v) for v in sorted(values) if v <= 448]


def around(t: np.float32, ulps: int = 2):
    out = [t]
    for direction in (np.inf, -np.inf):
        v = t
        for _ in range(ulps):
            v = np.nextafter(v, f32(direction))
            out.append(v)
    return out


def test_reciprocal_table_is_round_to_nearest():
    for m, r in enumerate(k._R):
        assert f32(r) == rn32(1 / (1 + Fraction(m, 8)))
    for d in e4m3_positive():
        d_up = f32(d * f32(2.0**64))
        assert recip_e4m3_up(d_up) == f32(1) / d_up


def test_division_by_a_microscale_is_correctly_rounded():
    for d in e4m3_positive()[::3] + [f32(448), f32(2.0**-9)]:
        d_up = f32(d * f32(2.0**64))
        recip = recip_e4m3_up(d_up)
        xs = list(f32(RNG.uniform(0, 2688, 12)))
        for kk in (1, 3, 5, 7, 10, 14, 20, 25):  # E2M1 boundaries (x 2: half-integers)
            xs += around(f32(kk / 4 * float(d)))
        xs += [f32(2.0**e) for e in (-149, -140, -130, -126, -100)]  # x subnormal or tiny
        for x in xs:
            assert div_by(x, d_up, recip) == f32(x) / d, (x, d)


def test_division_by_a_row_scale_is_correctly_rounded():
    for _ in range(150):
        s1 = f32(2.0 ** RNG.uniform(-148, -11.4))  # rowmax / 2688, down to subnormal
        d_up = f32(s1 * f32(2.0**64))
        recip = f32(1) / d_up  # div_rn(1, s1_up), once per row
        xs = list(f32(RNG.uniform(0, 1, 6) * float(s1) * 2688))
        # p <= rowmax = 2688 s1: the small ones down to subnormal
        xs += [f32(2.0 ** RNG.uniform(-149, np.log2(float(s1) * 2688))) for _ in range(4)]
        for x in xs:
            assert div_by(x, d_up, recip) == f32(x) / s1, (x, s1)


def test_the_row_scale_itself():
    d_up, recip = f32(k.P_ROW_DIVISOR_UP.value), f32(k.P_ROW_RECIP_UP.value)
    assert F(d_up) == Fraction(448 * 6 * 2**64) and recip == f32(1) / d_up
    rowmax = list(f32(RNG.uniform(0, 1, 200))) + [f32(1), f32(2.0**-149), f32(2.0**-127)]
    for x in rowmax:
        assert div_by(x, d_up, recip) == f32(x) / f32(448 * 6), x

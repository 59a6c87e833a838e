"""The NVFP4 kernels' divisions and E2M1 rounding without a divide or a conversion: their
sequences, in exact arithmetic, give the codes a correctly rounded FP32 division and the
emulation's piecewise rounding give (numpy's float32 division is IEEE), so the codes stay the
emulation's. Checked on every E4M3 microscale, on row and outer scales down to FP32's
subnormals, and on dividends at E2M1's rounding boundaries and in the subnormal range."""

from fractions import Fraction

import numpy as np
import pytest
import torch

pytest.importorskip("triton", reason="the kernel modules need Triton")
from vcbench.kernels.backends.triton import nvfp4  # noqa: E402
from vcbench.kernels.backends.triton import nvfp4_attention as k  # noqa: E402
from vcbench.kernels.spec.formats import round_e2m1  # noqa: E402

f32 = np.float32
RNG = np.random.default_rng(20261202)
E2M1_BOUNDARIES = [Fraction(b, 4) for b in (1, 3, 5, 7, 10, 14, 20)]


def rn32(value: Fraction) -> np.float32:
    """The FP32 nearest to an exact value, ties to even (subnormals included)."""
    c = f32(float(value))
    best = None
    for x in (np.nextafter(c, f32(-np.inf)), c, np.nextafter(c, f32(np.inf))):
        d = abs(Fraction(float(x)) - value)
        if best is None or d < best[0] or (d == best[0] and int(x.view(np.uint32)) % 2 == 0):
            best = (d, x)
    return best[1]


def F(x) -> Fraction:
    return Fraction(float(x))


def bits_to_f32(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


def markstein(x, d, recip) -> np.float32:
    """div_rn_markstein: q = x * recip, r = fma(-q, d, x), fma(r, recip, q), each step rounded
    once to FP32 (the GPU's mul.rn and fma.rn)."""
    q = rn32(F(x) * F(recip))
    r = rn32(F(x) - F(q) * F(d))
    return rn32(F(q) + F(r) * F(recip))


def div_by(x, d_up, recip) -> np.float32:
    """_div_rn_by: Markstein's correction on x_up = x * 2^64 (an exact scaling)."""
    x_up = rn32(F(x) * 2**64)
    assert F(x_up) == F(x) * 2**64
    return markstein(x_up, d_up, recip)


def recip_e4m3(x: np.float32) -> np.float32:
    """nvfp4.recip_e4m3 on the host: the table entry for the mantissa times 2^-exponent."""
    bits = int(x.view(np.uint32))
    pow2 = bits_to_f32((254 - ((bits >> 23) & 0xFF)) << 23)
    return f32(nvfp4._R[(bits >> 20) & 7] * pow2)


def e2m1_code(y: np.float32) -> float:
    """The emulation's rounding (formats.round_e2m1) of one value."""
    return float(round_e2m1(torch.tensor([float(y)], dtype=torch.float32))[0])


def e2m1_magic(y: np.float32) -> float:
    """nvfp4.round_e2m1_nonneg on the host, step by step in FP32."""
    mag = min(y, f32(6))
    e = max(int(mag.view(np.uint32)) >> 23, 127)
    magic = bits_to_f32(((e + 22) << 23) + 0x400000)
    return float(rn32(F(rn32(F(mag) + F(magic))) - F(magic)))


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


def boundary_dividends(d):
    """x at and beside every E2M1 rounding boundary times d, a few random, and tiny ones."""
    xs = list(f32(RNG.uniform(0, 6.5 * float(d), 12)))
    for b in E2M1_BOUNDARIES:
        xs += around(rn32(b * F(d)))
    xs += [f32(2.0**e) for e in (-149, -140, -130, -126, -100, -30, -13, -12, -11)]
    return xs


def test_reciprocal_table_is_round_to_nearest():
    for m, r in enumerate(nvfp4._R):
        assert f32(r) == rn32(1 / (1 + Fraction(m, 8)))
    for d in e4m3_positive():
        assert recip_e4m3(d) == f32(1) / d
        d_up = f32(d * f32(2.0**64))
        assert recip_e4m3(d_up) == f32(1) / d_up


def test_magic_e2m1_rounding_is_the_emulations():
    """Every FP32 in [0, 8) near a boundary or a code, and a random spread, down to 0."""
    ys = [f32(0), f32(2.0**-149), f32(2.0**-126), f32(7.9)]
    for t in [F(c) / 2 for c in range(13)] + E2M1_BOUNDARIES:
        ys += around(rn32(t), ulps=3)
    ys += list(f32(RNG.uniform(0, 7, 4000)))
    ys += list(f32(2.0 ** RNG.uniform(-149, 3, 1000)))
    for y in ys:
        assert e2m1_magic(y) == e2m1_code(y), y


def test_division_by_a_microscale_gives_the_correct_code():
    """Unscaled, as the kernels divide by a microscale: where the quotient is not correctly
    rounded (x tiny, an intermediate subnormal) the code is still the correct quotient's."""
    for d in e4m3_positive() + [f32(448), f32(2.0**-9)]:
        recip = recip_e4m3(d)
        for x in boundary_dividends(d):
            got, want = markstein(x, d, recip), f32(x) / d
            assert e2m1_code(got) == e2m1_code(want), (x, d)
            if x >= 2.0**-11:  # where a code can be nonzero, the quotient itself
                assert got == want, (x, d)


def test_division_under_an_outer_scale_gives_the_correct_code():
    """attnqat-tf: full = microscale * outer, any FP32 down to subnormal; x and full scaled by
    2^(127 - e), e = max(full's exponent field, 1), one division per group."""
    outers = [f32(2.0 ** RNG.uniform(-150, 120)) for _ in range(16)] + [f32(2.0**-149)]
    for outer in outers:
        for scale in e4m3_positive()[::12] + [f32(448)]:
            full = f32(scale * outer)
            if full == 0:
                continue
            e = max((int(full.view(np.uint32)) >> 23) & 0xFF, 1)
            pow2 = bits_to_f32((254 - e) << 23)
            d = rn32(F(full) * F(pow2))
            assert F(d) == F(full) * F(pow2)  # exact
            recip = f32(1) / d
            for x in boundary_dividends(full)[:-9]:
                xs = rn32(F(x) * F(pow2))
                got, want = markstein(xs, d, recip), f32(x) / full
                assert e2m1_code(got) == e2m1_code(want), (x, full)


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

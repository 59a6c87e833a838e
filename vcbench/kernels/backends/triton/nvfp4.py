"""Fused preprocessing of the NVFP4 methods: E2M1 codes and E4M3 microscales, bit for bit.

What `vcbench.kernels.reference.engine.prepare` computes for a plan whose Q, K, V are NVFP4 (E2M1
under one E4M3 scale per 16 elements along the contraction axis, optionally under one FP32
scale per (batch, head)), written in the layout `nvfp4_attention.py` reads:

    Q, K values  fp16 (B*H, N_pad, D): each E2M1 code times its E4M3 microscale (at most 6
                 significant bits in [2^-10, 2688]: exact in FP16), padding rows zero
    Q, K scales  fp16 (B*H, N_pad, D / 16), the E4M3 microscale's value (E4M3 is a subset
                 of FP16, subnormals included, so the value is exact)
    V values     fp16 (B*H, N_pad, D), as Q and K; V scales fp16 (B*H, N_pad / 16, D): along
                 the tokens, the contraction axis of P V
    V means      fp16 (B*H, N_pad / block_n, D): V-Smooth's stored block means (unscaled)
    Q means      fp32 (B*H, N_pad / block_m, D): Q smoothing's block means, for the bias
    outer scales fp32 (B*H,): the two-level scale of an operand that has one

With `key_order="sm90"` the K and V values (not their scales) come with the rows of each
128-key tile in the order of the compiled NVFP4 kernel (`sm90_row`), so that its TMA copies
them as they lie; every other field is as above.

The codes themselves are the values over their microscales, exactly (`Nvfp4Operands.codes`).
Dequantized here, once a call, rather than in the attention kernel: there every K and V tile
would be dequantized again by each of the N / block_m programs that read it, and the codes'
loads could not stream into shared memory as FP16 tiles do.

One pass over each input, in the emulation's order: Q (gather-free: the scale fold, Q
smoothing's block means of the unrotated rows by a first read of the tile, rotated once, the
QK Hadamard, the means' subtraction, codes), K (its token mean by one more read, then gather,
rotation, subtraction of the rotated mean, codes, and for Q smoothing the gathered 16-bit
rows the bias reads), V (gather, V-Smooth's block means, codes). The rotation is the 8-bit
quantizers' butterfly (`quantize.hadamard_rows`), the same IEEE operations in the same order
as `rotation.rotate`. An outer scale reads its operand once more first (its amax; for a
rotated operand, of the rotation, by the quantizer's own code writing one amax a program).
Programs step through 32 rows at a time (a tile's mean, where one is needed, by a first loop
over the steps), which keeps the butterfly in registers and many loads in flight. Roundings
are done in integer and float arithmetic with explicit ties-to-even (the magic-number add),
never by a conversion, so the codes do not depend on how a compiler lowers a cast; the
division by the scale is the correctly rounded quotient (Markstein's correction, below); block
means are summed in FP64, as the emulation sums them. Both kernels are compiled with
`enable_fp_fusion=False`: the scale fold q * c followed by Q smoothing's subtraction would
otherwise become one FMA, rounded once where the emulation rounds twice.

Non-finite input, as the emulation's: a group holding a NaN or an infinity has a NaN
microscale, NaN values and zero codes (`quantize.abs_max`), and a (batch, head) with a NaN
scale anywhere has NaN V values and V scales (`granularity.nonfinite_poison`; the quantizers
flag their NaN microscales as they write them), so its output is NaN and every other (batch,
head)'s is unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from vcbench.kernels.backends.triton.quantize import (
    _rope,
    abs_max,
    hadamard_norm,
    hadamard_rows,
    program_heads_first,
    rope_args,
    token_mean_gpu,
)

MAGIC_ROUND = tl.constexpr(12582912.0)  # 1.5 * 2^23: (y + M) - M is y rounded half to even, |y| < 2^22
MAGIC_MANTISSA = tl.constexpr(0x400000)  # the mantissa bits of 1.5 * 2^k
E4M3_BIAS_SHIFT = tl.constexpr(3)  # E4M3 has 3 mantissa bits: its quantum is 2^(exponent - 3)
E4M3_MIN_EXP = tl.constexpr(121)  # FP32 biased exponent of 2^-6, E4M3's smallest normal binade
# RN(1 / (1 + m/8)) in FP32 for an E4M3 value's three mantissa bits m (the reciprocal of a
# microscale is one of these times a power of two)
_R = [float(np.float32(1) / np.float32(1 + m / 8)) for m in range(8)]
R1, R2, R3, R4, R5, R6, R7 = (tl.constexpr(r) for r in _R[1:])
# Triton's interpreter computes tl.fma as a product, rounded, then a sum: Markstein's correction
# needs the fused one, so there the divisions are numpy's, the IEEE quotient the sequence gives
# on a GPU (tests/test_exact_division.py holds the sequence to exact arithmetic).
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def rne(y):
    """y rounded to the nearest integer, ties to even (|y| < 2^22), as a float."""
    return (y + MAGIC_ROUND) - MAGIC_ROUND


@triton.jit
def round_e4m3_nonneg(x):
    """`formats.round_e4m3` for x >= 0: clamp to 448, then round to E4M3's grid, nearest even.
    The grid step in the binade of x is 2^(e - 3) (e its exponent, at least -6: below 2^-6 the
    subnormal step 2^-9 holds), so x times the power of two 2^(3 - e) is rounded to an integer
    and scaled back, both exactly."""
    x = tl.minimum(x, 448.0, propagate_nan=tl.PropagateNan.ALL)  # a NaN amax stays NaN
    e = tl.maximum((x.to(tl.int32, bitcast=True) >> 23) & 0xFF, E4M3_MIN_EXP)
    quantum = ((e - E4M3_BIAS_SHIFT) << 23).to(tl.float32, bitcast=True)
    inverse = ((254 - e + E4M3_BIAS_SHIFT) << 23).to(tl.float32, bitcast=True)
    return rne(x * inverse) * quantum


@triton.jit
def round_e2m1_nonneg(y):
    """`formats.round_e2m1` of y >= 0: min(y, 6) rounded to the multiple of its quantum (0.5
    below 2, 1 on [2, 4), 2 from 4), ties to even, by one magic-number add whose exponent is
    read off y's (1.5 * 2^23 * quantum). The even multiple is E2M1's even code at every tie
    (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), and y in [1.75,
    2) or [3.5, 4) rounds up to the next binade's first code, as the piecewise form's does."""
    mag = tl.minimum(y, 6.0)
    e = tl.maximum(mag.to(tl.int32, bitcast=True) >> 23, 127)  # FP32 exponent field, >= 2^0
    magic = (((e + 22) << 23) + MAGIC_MANTISSA).to(tl.float32, bitcast=True)
    return (mag + magic) - magic


@triton.jit
def round_e2m1(y):
    """`formats.round_e2m1`: the magnitude's code with y's sign."""
    v = round_e2m1_nonneg(tl.abs(y))
    return tl.where(y < 0, -v, v)


@triton.jit
def microscale(amax):
    """The E4M3 microscale of a group whose (outer-divided) absolute max is amax:
    `formats.scale_for` (a multiply by the FP32 reciprocal of 6), rounded to E4M3."""
    return round_e4m3_nonneg(amax * (1.0 / 6.0))


@triton.jit
def recip_e4m3(x):
    """div_rn(1, x) for x > 0 an E4M3 value (at most 4 significant bits: its FP32 mantissa is
    in the top three bits), or one scaled by a power of two that keeps 1 / x normal: the
    table's entry for the mantissa times 2^-exponent, exact, with no division. The entry by a
    select on each mantissa bit in turn (7 selects, no compares)."""
    bits = x.to(tl.int32, bitcast=True)
    m0 = (bits & 0x100000) != 0
    m1 = (bits & 0x200000) != 0
    t = tl.where((bits & 0x400000) != 0,
                 tl.where(m1, tl.where(m0, R7, R6), tl.where(m0, R5, R4)),
                 tl.where(m1, tl.where(m0, R3, R2), tl.where(m0, R1, 1.0)))
    pow2 = ((254 - ((bits >> 23) & 0xFF)) << 23).to(tl.float32, bitcast=True)
    return t * pow2


@triton.jit
def div_rn_markstein(x, d, recip):
    """x / d rounded to nearest (div_rn's result), given recip = div_rn(1, d): q = x * recip
    is within an ulp of the quotient, r = x - q d is exact by FMA, and q + r * recip rounded
    once is the correctly rounded quotient when no intermediate is subnormal (Markstein's
    correction; tests/test_exact_division.py checks it against exact arithmetic). A division
    per element would be a subroutine call per element."""
    if INTERPRETED:  # d = 0 only where the caller multiplies the quotient by 0; a NaN d
        d = tl.zeros_like(x) + d  # (a non-finite group's) gives NaN, as the sequence does
        return tl.math.div_rn(x, tl.where(d == 0, 1.0, d))
    q = x * recip
    r = tl.fma(-q, d, x)
    return tl.fma(r, recip, q)


@triton.jit
def normalizer(d):
    """2^(127 - e), e = max(d's FP32 exponent field, 1): d times it lies in [1, 2) (in [2^-23,
    1) from FP32's subnormals), and a quotient keeps its value when both operands take it."""
    e = tl.maximum((d.to(tl.int32, bitcast=True) >> 23) & 0xFF, 1)
    return ((254 - e) << 23).to(tl.float32, bitcast=True)


@triton.jit
def nvfp4_values(x, amax, Outer, bh, OUTER: tl.constexpr):
    """(microscale, values) of x under groups whose absolute max is amax, the scale's axis
    broadcast by the caller: values = E2M1(x / full) * microscale, full the microscale (times
    the outer scale with OUTER: attnqat-tf's two levels, the outer applied by the attention
    kernel). A zero scale gives zero codes.
    Each quotient is correctly rounded wherever it can change a code or a microscale
    (tests/test_exact_division.py):
      - x / microscale (an E4M3 value in [2^-9, 448]): the reciprocal from the table, x
        unscaled. A nonzero code needs |x| >= 2^-11, and then no intermediate is subnormal;
      - with an outer scale (any FP32): amax / outer and x / full on operands scaled by
        `normalizer` of the divisor, the reciprocals by one division per (batch, head) and
        one per group; a nonzero microscale or code needs a dividend >= 2^-31 after the
        scaling (the same argument), and an underflowed dividend has a quotient below both."""
    if OUTER:
        outer = tl.load(Outer + bh)
        s_o = normalizer(outer)
        d_o = outer * s_o
        scale = microscale(div_rn_markstein(amax * s_o, d_o, tl.math.div_rn(1.0, d_o)))
        full = scale * outer
        # 0 for a zero scale, whose quotient (and code) must be 0
        s_f = tl.where(full > 0, normalizer(full), 0.0)
        d = tl.where(full > 0, full * s_f, 1.0)
        y = div_rn_markstein(x * s_f, d, tl.math.div_rn(tl.zeros_like(d) + 1.0, d))
    else:
        scale = microscale(amax)
        # d = 1 for a zero scale: every |x| there is below 6 * 2^-10, its quotient's code 0
        d = tl.where(scale > 0, scale, 1.0)
        y = div_rn_markstein(x, d, recip_e4m3(d))
    return scale, round_e2m1(y) * scale


@triton.jit
def _flag_nan(Bad, bh, scale):
    """Bad[bh] |= 1 where a microscale of this step is NaN (a group with a non-finite value;
    a microscale is never infinite: it saturates at 448): what `granularity.nonfinite_poison`
    reads off the scales, without a pass over them. The atomic is masked off, so no memory
    is touched, in every program of finite input."""
    tl.atomic_or(Bad + bh, 1, mask=tl.sum((scale != scale).to(tl.int32)) > 0, sem="relaxed")


# The compiled NVFP4 kernel's order of a 128-key tile's rows (sm90/csrc/nvfp4_softmax.cuh,
# key_of): key b + 2c + 16q + 64u (b < 2, c < 8, q < 4, u < 2) at row b + 2q + 8c + 64u. Its QK
# accumulator gives a thread (quad lane q) the columns 8c' + 2q + b of its rows, so with its K
# rows so ordered a thread holds keys 16q..16q+15 and 64+16q..64+16q+15, two whole microscale
# groups of P: their amax and microscale without a shuffle. V's rows take the same order, the
# k index of the PV product.
SM90_TILE = tl.constexpr(128)


@triton.jit
def sm90_row(r):
    """The row at which the compiled kernel's layout stores padded key row r (any int tensor)."""
    k = r % SM90_TILE
    return r - k + (k & 65) + ((k >> 4) & 3) * 2 + ((k >> 1) & 7) * 8


def sm90_rows(n_pad: int, device=None) -> torch.Tensor:
    """`sm90_row` of keys 0 .. n_pad - 1 (n_pad a multiple of SM90_TILE), int64: the stored row
    of each key, so x_stored[..., sm90_rows(n), :] is x in key order."""
    r = torch.arange(n_pad, device=device)
    k = r % SM90_TILE.value
    return r - k + (k & 65) + ((k >> 4) & 3) * 2 + ((k >> 1) & 7) * 8


@triton.jit
def _qk_chunk(X, Perm, Mean, Gathered, rows, bh, n, stride_b, stride_h, stride_n, H, multiplier,
              norm, CHUNK: tl.constexpr, D: tl.constexpr, HAS_PERM: tl.constexpr,
              HAS_MEAN: tl.constexpr, MULTIPLY: tl.constexpr, GATHER_OUT: tl.constexpr,
              HADAMARD: tl.constexpr, LOG2_D: tl.constexpr, Cos, Sin, ROPE: tl.constexpr):
    """Tokens `rows` (CHUNK of them) of Q or K as FP32 (CHUNK, D / 16, 16), in the emulation's
    order: gather by the permutation, RoPE on the source token (`quantize._rope`, spec.rope's
    FP32 ops rounded to the input's dtype, when ROPE names it), the gathered input rows
    written out with GATHER_OUT (rotated by RoPE: what the score term reads), scale fold, QK
    Hadamard (`quantize.hadamard_rows`, the butterfly of `rotation.rotate`, on (CHUNK, D)
    rows), token-mean subtraction (K smoothing; with HADAMARD, Mean is the rotated mean:
    appendix B's order). Padding rows are zero (the emulation pads after rotating)."""
    b = bh // H
    h = bh % H
    groups = tl.arange(0, D // 16)
    cols = groups[:, None] * 16 + tl.arange(0, 16)[None, :]  # (D / 16, 16)
    valid = rows < n
    src = rows.to(tl.int64)
    if HAS_PERM:
        src = tl.load(Perm + bh * n + rows, mask=valid, other=0).to(tl.int64)
    r64 = rows.to(tl.int64)
    base = X + b * stride_b + h * stride_h
    if HADAMARD or ROPE != 0:  # whole rows: the butterfly and RoPE's pairs work on (CHUNK, D)
        flat = tl.arange(0, D)
        x_in = tl.load(base + src[:, None] * stride_n + flat[None, :], mask=valid[:, None],
                       other=0.0)
        x = x_in.to(tl.float32)
        if ROPE != 0:
            x = _rope(x, src, valid, Cos, Sin, CHUNK, D, ROPE)  # exact in x_in's dtype
        if GATHER_OUT:
            tl.store(Gathered + bh * n * D + r64[:, None] * D + flat[None, :],
                     x.to(x_in.dtype), mask=valid[:, None])
        if MULTIPLY:
            x = x * multiplier
        if HADAMARD:
            x = hadamard_rows(x, norm, CHUNK, D, LOG2_D)
        x = tl.reshape(x, (CHUNK, D // 16, 16))
    else:
        x_in = tl.load(base + src[:, None, None] * stride_n + cols[None],
                       mask=valid[:, None, None], other=0.0)
        if GATHER_OUT:
            tl.store(Gathered + bh * n * D + r64[:, None, None] * D + cols[None], x_in,
                     mask=valid[:, None, None])
        x = x_in.to(tl.float32)
        if MULTIPLY:
            x = x * multiplier
    if HAS_MEAN:
        x = tl.where(valid[:, None, None], x - tl.load(Mean + bh * D + cols)[None], 0.0)
    return x


@triton.jit
def _quantize_qk(X, Perm, Mean, Outer, Values, Scales, QMean, Gathered, BlockAmax, Bad, n, n_pad,
                 stride_b, stride_h, stride_n, H, multiplier, norm, ROWS: tl.constexpr,
                 CHUNK: tl.constexpr, D: tl.constexpr, HAS_PERM: tl.constexpr,
                 HAS_MEAN: tl.constexpr, MULTIPLY: tl.constexpr, SMOOTH: tl.constexpr,
                 OUTER: tl.constexpr, GATHER_OUT: tl.constexpr, HADAMARD: tl.constexpr,
                 LOG2_D: tl.constexpr, AMAX_ONLY: tl.constexpr, Cos, Sin, ROPE: tl.constexpr,
                 SM90_ORDER: tl.constexpr):
    """Q or K, ROWS tokens of one (batch, head), CHUNK at a time (`_qk_chunk`); with SMOOTH
    (Q smoothing, ROWS the query tile) the block's mean first, by a pass over its chunks
    summing in FP64 (the second reads them again, from L2: a (ROWS, D) FP32 tile held whole
    would take 128 registers a thread as FP64), written out and subtracted; microscales along
    D; values. With AMAX_ONLY the program writes nothing but max |x| of its rows (NaN for a
    non-finite one) to BlockAmax: the first pass of a rotated operand's outer scale, which
    needs the amax of the rotated tensor before any element is quantized. A program that
    leaves a NaN microscale sets its (batch, head)'s flag in Bad (`_flag_nan`). With SM90_ORDER
    (K for the compiled kernel) the values' rows go where `sm90_row` puts them."""
    block, bh = program_heads_first(n_pad // ROWS)
    groups = tl.arange(0, D // 16)
    cols = groups[:, None] * 16 + tl.arange(0, 16)[None, :]  # (D / 16, 16)
    if SMOOTH:  # the block's mean from the unrotated rows, then rotated once (the emulation's)
        sums = tl.zeros((D // 16, 16), tl.float64)
        for c in range(ROWS // CHUNK):
            rows = block * ROWS + c * CHUNK + tl.arange(0, CHUNK)
            x = _qk_chunk(X, Perm, Mean, Gathered, rows, bh, n, stride_b, stride_h, stride_n,
                          H, multiplier, norm, CHUNK, D, HAS_PERM, HAS_MEAN, MULTIPLY, False,
                          False, LOG2_D, Cos, Sin, ROPE)
            sums += tl.sum(x.to(tl.float64), 0)
        count = tl.minimum(n - block * ROWS, ROWS).to(tl.float64)
        mean = (sums / count).to(tl.float32)
        if HADAMARD:
            mean = tl.reshape(hadamard_rows(tl.reshape(mean, (1, D)), norm, 1, D, LOG2_D),
                              (D // 16, 16))
        if not AMAX_ONLY:
            tl.store(QMean + (bh * (n_pad // ROWS) + block) * D + cols, mean)
    block_amax = tl.zeros((), tl.float32)
    for c in range(ROWS // CHUNK):
        rows = block * ROWS + c * CHUNK + tl.arange(0, CHUNK)
        x = _qk_chunk(X, Perm, Mean, Gathered, rows, bh, n, stride_b, stride_h, stride_n, H,
                      multiplier, norm, CHUNK, D, HAS_PERM, HAS_MEAN, MULTIPLY,
                      GATHER_OUT and not AMAX_ONLY, HADAMARD, LOG2_D, Cos, Sin, ROPE)
        if SMOOTH:
            x = tl.where((rows < n)[:, None, None], x - mean[None], 0.0)
        amax = abs_max(x, 2)
        if AMAX_ONLY:
            block_amax = tl.maximum(block_amax, abs_max(abs_max(amax, 1), 0),
                                    propagate_nan=tl.PropagateNan.ALL)
        else:
            scale, values = nvfp4_values(x, amax[:, :, None], Outer, bh, OUTER)
            r64 = rows.to(tl.int64)
            at = sm90_row(r64) if SM90_ORDER else r64
            tl.store(Values + bh * n_pad * D + at[:, None, None] * D + cols[None],
                     values.to(tl.float16))
            tl.store(Scales + bh * n_pad * (D // 16) + r64[:, None] * (D // 16) + groups[None, :],
                     tl.reshape(scale, (CHUNK, D // 16)).to(tl.float16))
            _flag_nan(Bad, bh, scale)
    if AMAX_ONLY:
        tl.store(BlockAmax + bh * (n_pad // ROWS) + block, block_amax)


@triton.jit
def _v_chunk(X, Perm, tile_row, bh, n, stride_b, stride_h, stride_n, H, CHUNK: tl.constexpr,
             D: tl.constexpr, HAS_PERM: tl.constexpr):
    """Tokens tile_row .. + CHUNK of V as FP32 (16, CHUNK / 16, D), token tile_row + 16 g + i
    at [i, g], gathered by the permutation; padding rows zero. Returns (x, rows)."""
    b = bh // H
    h = bh % H
    rows = tile_row + tl.arange(0, CHUNK // 16)[None, :] * 16 + tl.arange(0, 16)[:, None]
    valid = rows < n
    src = rows.to(tl.int64)
    if HAS_PERM:
        src = tl.load(Perm + bh * n + rows, mask=valid, other=0).to(tl.int64)
    cols = tl.arange(0, D)
    x = tl.load(X + b * stride_b + h * stride_h + src[:, :, None] * stride_n + cols[None, None, :],
                mask=valid[:, :, None], other=0.0).to(tl.float32)
    return x, rows


@triton.jit
def _quantize_v(X, Perm, Outer, Values, Scales, StoredMeans, Bad, n, n_pad, stride_b,
                stride_h, stride_n, H, ROWS: tl.constexpr, CHUNK: tl.constexpr, D: tl.constexpr,
                HAS_PERM: tl.constexpr, DEMEAN: tl.constexpr, OUTER: tl.constexpr,
                SM90_ORDER: tl.constexpr):
    """V, ROWS tokens of one (batch, head), CHUNK at a time (`_v_chunk`): with DEMEAN (ROWS the
    KV tile) V-Smooth's block mean first, by a pass over the chunks summing in FP64 (exact for
    16-bit inputs, so in any order), stored FP16, the residual taken against the stored value
    as the second pass reads the chunks again (from L2); microscales along the tokens; values.
    Loaded as (16, CHUNK / 16, D): the compiler lays a thread's registers along the first
    axis, so each group's tokens sit in one thread (or two warps) and its microscale is
    computed once per column held, not once per element as a (CHUNK / 16, 16, D) tile would
    have it. The values go to Values (N_pad, D), their rows where `sm90_row` puts them with
    SM90_ORDER. NaN microscales flagged in Bad, as the Q/K quantizer's."""
    tile = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, D)
    if DEMEAN:
        sums = tl.zeros((D,), tl.float64)
        for c in range(ROWS // CHUNK):
            x, rows = _v_chunk(X, Perm, tile * ROWS + c * CHUNK, bh, n, stride_b, stride_h,
                               stride_n, H, CHUNK, D, HAS_PERM)
            sums += tl.sum(tl.sum(x.to(tl.float64), 0), 0)
        count = tl.minimum(n - tile * ROWS, ROWS).to(tl.float64)
        mean = (sums / count).to(tl.float32)
        stored = tl.clamp(mean, -65504.0, 65504.0, propagate_nan=tl.PropagateNan.ALL)
        stored = stored.to(tl.float16)
        tl.store(StoredMeans + (bh * (n_pad // ROWS) + tile) * D + cols, stored)
    for c in range(ROWS // CHUNK):
        x, rows = _v_chunk(X, Perm, tile * ROWS + c * CHUNK, bh, n, stride_b, stride_h,
                           stride_n, H, CHUNK, D, HAS_PERM)
        if DEMEAN:
            x = tl.where((rows < n)[:, :, None], x - stored.to(tl.float32)[None, None, :], 0.0)
        scale, values = nvfp4_values(x, abs_max(x, 0)[None, :, :], Outer, bh, OUTER)
        r64 = rows.to(tl.int64)
        at = sm90_row(r64) if SM90_ORDER else r64
        tl.store(Values + bh * n_pad * D + at[:, :, None] * D + cols[None, None, :],
                 values.to(tl.float16))
        scale_rows = ((tile * ROWS + c * CHUNK) // 16 + tl.arange(0, CHUNK // 16)).to(tl.int64)
        tl.store(Scales + bh * (n_pad // 16) * D + scale_rows[:, None] * D + cols[None, :],
                 tl.reshape(scale, (CHUNK // 16, D)).to(tl.float16))
        _flag_nan(Bad, bh, scale)


@triton.jit
def _fill_nan(X, Poison, per_head, BLOCK: tl.constexpr):
    """NaN over all per_head elements of each (batch, head) whose `nonfinite_poison` is NaN,
    one program a (batch, head). A finite head's program reads its flag and ends, so a call
    without non-finite input writes nothing; the rare poisoned head is written by one
    program."""
    bh = tl.program_id(0).to(tl.int64)
    poison = tl.load(Poison + bh)
    if poison != poison:
        nan = tl.full((BLOCK,), float("nan"), X.dtype.element_ty)
        for start in range(0, per_head, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(X + bh * per_head + offs, nan, mask=offs < per_head)


@triton.jit
def _tf32_halves(x):
    """x = big + small exactly, big x rounded to TF32 (10 mantissa bits, to nearest, ties away
    from zero: cvt.rna's rounding); small's own low 13 bits the tensor core then ignores."""
    big = ((x.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return big, x - big


@triton.jit
def score_program(key_chunks, m_tiles, q_blocks, BM: tl.constexpr):
    """A score-term program's (key chunk, (batch, head), its BM query blocks, which of them
    are real), keys fastest: a head's query-block means stay in L2."""
    pid = tl.program_id(0).to(tl.int64)
    blocks = (pid // key_chunks % m_tiles) * BM + tl.arange(0, BM)
    return pid % key_chunks, pid // key_chunks // m_tiles, blocks, blocks < q_blocks


@triton.jit
def bias_vectors(BiasQ, bh, q_blocks, blocks, in_m, D: tl.constexpr):
    """The vectors bias_q of query blocks `blocks` of one (batch, head), (len(blocks), D) FP32;
    zero for the blocks past the head's (not in_m)."""
    cols = tl.arange(0, D)
    return tl.load(BiasQ + (bh * q_blocks + blocks)[:, None] * D + cols[None, :],
                   mask=in_m[:, None], other=0.0)


@triton.jit
def key_rows(KIn, bh, n, keys, D: tl.constexpr):
    """Rows `keys` of one (batch, head)'s K_in (contiguous HND), in its dtype; keys past n
    zero."""
    cols = tl.arange(0, D)
    return tl.load(KIn + (bh * n + keys)[:, None] * D + cols[None, :], mask=(keys < n)[:, None],
                   other=0.0)


@triton.jit
def centered_keys(KIn, k_mean, bh, n, keys, D: tl.constexpr):
    """Rows `keys` of one (batch, head)'s K_in minus K's token mean, in FP32 (the emulation's
    subtraction), (len(keys), D); keys past n zero."""
    k = key_rows(KIn, bh, n, keys, D)
    return tl.where((keys < n)[:, None], k.to(tl.float32) - k_mean[None, :], 0.0)


@triton.jit
def store_term(Out, term, bh, q_blocks, blocks, in_m, keys, n, nk_pad):
    """A (blocks, keys) tile of the score term into Out (B*H, q_blocks, nk_pad): -inf for the
    padded keys (n .. nk_pad - 1), which masks them in the kernel that reads it; nothing for
    blocks past the head's or keys past nk_pad."""
    term = tl.where((keys < n)[None, :], term, float("-inf"))
    tl.store(Out + (bh * q_blocks + blocks)[:, None] * nk_pad + keys[None, :], term,
             mask=in_m[:, None] & (keys < nk_pad)[None, :])


@triton.jit
def _score_term(BiasQ, KIn, KMean, Out, n, nk_pad, q_blocks, key_chunks, m_tiles,
                D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, TILES: tl.constexpr):
    """Q smoothing's score term for BM query blocks and TILES x BN keys of one (batch, head):
    bias_q . (K_in - mean_K), FP32 out, -inf for the padded keys. The centering is the FP32
    subtraction the emulation does; the product is three TF32 tensor-core products (small.big
    + big.small + big.big of each FP32 operand split in two: ~2^-21 of each term, FP32's own
    accumulation error being larger), where a plain FP32 product would run on the CUDA cores.
    The query-block means are loaded and split once a program and the key tiles streamed past
    them (Triton's tf32x3 dot splits both operands again at every tile: 9.1 against 8.8 ms at
    the Wan2.2 shape on the H200, the same tiles)."""
    chunk, bh, blocks, in_m = score_program(key_chunks, m_tiles, q_blocks, BM)
    means = bias_vectors(BiasQ, bh, q_blocks, blocks, in_m, D)
    m_big, m_small = _tf32_halves(means)
    k_mean = tl.load(KMean + bh * D + tl.arange(0, D))
    for t in range(TILES):
        keys = (chunk * TILES + t) * BN + tl.arange(0, BN)
        k_big, k_small = _tf32_halves(tl.trans(centered_keys(KIn, k_mean, bh, n, keys, D)))
        term = tl.dot(m_small, k_big, input_precision="tf32")
        term = tl.dot(m_big, k_small, term, input_precision="tf32")
        term = tl.dot(m_big, k_big, term, input_precision="tf32")
        store_term(Out, term, bh, q_blocks, blocks, in_m, keys, n, nk_pad)


@triton.jit
def _score_term_16bit(BiasQ, KIn, KMean, Out, n, nk_pad, q_blocks, key_chunks, m_tiles,
                      D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, TILES: tl.constexpr):
    """`_score_term` for 16-bit K_in, uncentered: bias_q . K_in - bias_q . mean_K. K_in is
    exact in TF32 (BF16's and FP16's significands fit its 11 bits), so two TF32 products of
    it (by bias_q's TF32 head and tail: ~2^-22 of each term) replace the centered form's three,
    with no centering or split of K; they accumulate onto -(bias_q . mean_K), an FP32 dot per
    query block. Its rounding is the uncentered sum's: a few FP32 ulps of |bias_q| . |K_in|,
    not of |bias_q| . |K_in - mean_K|."""
    chunk, bh, blocks, in_m = score_program(key_chunks, m_tiles, q_blocks, BM)
    means = bias_vectors(BiasQ, bh, q_blocks, blocks, in_m, D)
    m_big, m_small = _tf32_halves(means)
    k_mean = tl.load(KMean + bh * D + tl.arange(0, D))
    shift = -tl.sum(means * k_mean[None, :], 1)
    for t in range(TILES):
        keys = (chunk * TILES + t) * BN + tl.arange(0, BN)
        kt = tl.trans(key_rows(KIn, bh, n, keys, D).to(tl.float32))
        term = tl.broadcast_to(shift[:, None], (BM, BN))
        term = tl.dot(m_small, kt, term, input_precision="tf32")
        term = tl.dot(m_big, kt, term, input_precision="tf32")
        store_term(Out, term, bh, q_blocks, blocks, in_m, keys, n, nk_pad)


# --- the host side ------------------------------------------------------------------------

OUTER_DIVISOR = 448.0 * 6.0  # E4M3 max x E2M1 max: what a two-level scale divides the amax by
# 128 x 128 elements a program: 64 a thread (as FP64 for the block means, 128 registers)
NUM_WARPS = 8
# The Q/K quantizer's step: 32 rows (32 x 128 elements, 32 a thread on 4 warps), small enough
# for the butterfly's temporaries to stay in registers and for many programs to keep loads in
# flight; Q smoothing's programs loop over the query tile in these steps.
QK_CHUNK = 32
QK_WARPS = 4
V_CHUNK = 32  # V's step likewise (two microscale groups of 16 tokens)
V_WARPS = 4


@dataclass
class Nvfp4Operands:
    """What `nvfp4_attention.launch` reads (layouts in the module docstring): q, k, v are the
    dequantized FP16 values, the scales are there for `codes` and the tests."""

    q: torch.Tensor
    q_scale: torch.Tensor
    k: torch.Tensor
    k_scale: torch.Tensor
    v: torch.Tensor
    v_scale: torch.Tensor
    n: int
    block_m: int
    block_n: int
    q_outer: torch.Tensor | None = None
    k_outer: torch.Tensor | None = None
    v_outer: torch.Tensor | None = None
    v_mean: torch.Tensor | None = None
    # Q smoothing: the block means (as the emulation's q_mean), the vector each query block
    # dots with the smoothed keys (the means, or their Hadamard rotation: (q H) . k = q . (k H)
    # for the symmetric H), and what the bias reads of K: the 16-bit input (contiguous HND,
    # after RoPE where the call fused it), gathered through the permutation, minus its token
    # mean.
    q_mean: torch.Tensor | None = None
    bias_q: torch.Tensor | None = None
    k_mean: torch.Tensor | None = None
    k_input: torch.Tensor | None = None
    permutation: torch.Tensor | None = None
    # "natural", or "sm90": k and v with each key tile's rows in `sm90_row`'s order
    key_order: str = "natural"

    def in_key_order(self, name: str) -> torch.Tensor:
        """The values of "q", "k" or "v", (B*H, N_pad, D), rows in key order whichever
        `key_order` they were written in."""
        x = getattr(self, name)
        if self.key_order == "natural" or name == "q":
            return x
        return x[:, sm90_rows(x.shape[1], x.device)]

    def codes(self, name: str, heads: slice = slice(None)) -> torch.Tensor:
        """The E2M1 codes (values, as the emulation's `Quantized.codes`) of operand "q", "k" or
        "v", (B*H, N_pad, D) FP32, or of the (batch, head)s `heads`: values over their
        microscales, exact (a code times an E4M3 value is exact in FP16, so dividing it back
        is too); zero where the scale is zero or NaN. A non-finite group's codes are zero in
        the emulation too; a poisoned (batch, head)'s V codes are not recoverable from its NaN
        values (the emulation keeps them, under its NaN scales)."""
        values = self.in_key_order(name)[heads].float()
        scale = getattr(self, f"{name}_scale")[heads].float()
        full = scale.repeat_interleave(16, dim=-2 if name == "v" else -1)
        return torch.where(full > 0, values / torch.where(full > 0, full, 1.0), 0.0)


# The score term's tile, the fastest of those timed at the Wan2.2 shape (docs/perf/log.md):
# 128 query blocks x 64 keys a dot on 8 warps, 16 key tiles a program (8.5 ms on the H100,
# 8 tiles 9.0), one stage (the loads of the next tile are in flight beside the products
# anyway: two stages were slower). The keys on the product's M side, the means as its
# shared-memory B operand, spilled less and ran 24-30% slower.
SCORE_BLOCK_M, SCORE_BLOCK_N, SCORE_WARPS, SCORE_TILES, SCORE_STAGES = 128, 64, 8, 16, 1


def score_term(ops: Nvfp4Operands, nk_pad: int) -> torch.Tensor:
    """Q smoothing's score term for a kernel that reads it precomputed, one FP32 per (query
    block, key): bias_q . (K_in - mean_K), (B*H, N_q_pad / block_m, nk_pad), the per-tile sum
    the Triton attention kernel takes in its loop; -inf past the last key, which masks the
    padded keys of the kernel's last tile (their scores start from it) without a masked
    softmax of its own. 4 bytes per (query block, key): 7.2 GB at the Wan2.2 shape."""
    bh, q_blocks, d = ops.bias_q.shape
    n = ops.n
    out = torch.empty(bh, q_blocks, nk_pad, device=ops.bias_q.device, dtype=torch.float32)
    key_chunks = triton.cdiv(nk_pad, SCORE_BLOCK_N * SCORE_TILES)
    m_tiles = triton.cdiv(q_blocks, SCORE_BLOCK_M)
    k_input = ops.k_input.reshape(bh, n, d)  # contiguous HND, in the permuted order
    kernel = _score_term if k_input.dtype == torch.float32 else _score_term_16bit
    kernel[(bh * m_tiles * key_chunks,)](
        ops.bias_q, k_input, ops.k_mean, out, n, nk_pad, q_blocks, key_chunks, m_tiles, D=d,
        BM=SCORE_BLOCK_M, BN=SCORE_BLOCK_N, TILES=SCORE_TILES, num_warps=SCORE_WARPS,
        num_stages=SCORE_STAGES)
    return out


def _outer(amax: torch.Tensor) -> torch.Tensor:
    """The two-level NVFP4 scale of `granularity.Quantizer`: amax / (448 * 6) (a true division,
    as the emulation's), 1 where the operand is all zero. (B, H) -> (B*H,) FP32."""
    outer = amax.float() / torch.tensor(OUTER_DIVISOR, dtype=torch.float32, device=amax.device)
    outer = torch.where(outer == 0, torch.ones_like(outer), outer)  # a NaN amax stays NaN
    return outer.reshape(-1).contiguous()


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def prepare(q, k, v, plan, *, permutation=None, grid=None, centroids=None, sm_scale=None,
            key_order="natural", rope=None) -> Nvfp4Operands:
    """HND 16-bit (or FP32) inputs -> the NVFP4 operands of `plan`, bit-equal to
    `reference.engine.prepare` on the same tensors. The plan is one
    `operands.nvfp4_unsupported_reason` accepts. `key_order`: "natural", what the Triton
    attention kernel reads, or "sm90", K's and V's values with each 128-key tile's rows in the
    compiled NVFP4 kernel's order (`sm90_row`; the plan's block_n must be 128). With
    `rope` (spec.rope.Rope, FP32 tables), q and k come before RoPE, and the Q and K quantizers,
    K's token mean and the score term's K rows take them rotated on load, bit-equal to
    rotating first (16-bit inputs: RoPE rounds to the input's dtype)."""
    from vcbench.kernels.backends.triton.kmeans import grouping
    from vcbench.kernels.reference.engine import softmax_scale_log2
    from vcbench.kernels.spec.rotation import rotate

    b, h, n, d = q.shape
    bm, bn = plan.block_m, plan.block_n
    if key_order not in ("natural", "sm90"):
        raise ValueError(f"key_order is 'natural' or 'sm90', got {key_order!r}")
    sm90_order = key_order == "sm90"
    if sm90_order and bn % SM90_TILE.value:
        raise ValueError(f"key_order='sm90' orders tiles of {SM90_TILE.value} keys: block_n {bn}")
    nq_pad, nk_pad = triton.cdiv(n, bm) * bm, triton.cdiv(n, bn) * bn
    dev = q.device
    scale_log2 = torch.tensor(softmax_scale_log2(d, sm_scale), dtype=torch.float32).item()
    rotated = plan.hadamard_qk
    norm = hadamard_norm(d) if rotated else 1.0

    if plan.vsmooth is not None and permutation is None:
        permutation = grouping(v, plan.vsmooth, grid=grid, init=centroids).permutation
    perm = None if permutation is None else permutation.to(dev, torch.int32).contiguous()
    q, k, v = (_last_dim_contiguous(x) for x in (q, k, v))
    cos, sin, rope_switch = rope_args(rope, q)

    def launch_qk(x, n_pad, *, multiplier=None, mean=None, gather=None, smooth=False,
                  outer=None, gathered=None, block_amax=None, sm90=False):
        values = scales = q_mean = None
        if block_amax is None:
            values = torch.empty(b * h, n_pad, d, device=dev, dtype=torch.float16)
            scales = torch.empty(b * h, n_pad, d // 16, device=dev, dtype=torch.float16)
            if smooth:
                q_mean = torch.empty(b * h, n_pad // bm, d, device=dev, dtype=torch.float32)
        # a program quantizes QK_CHUNK rows a step: bm rows (its mean's block) with smoothing
        rows = bm if smooth else QK_CHUNK
        spare = x  # any pointer, for the arguments a switch leaves unread

        def ptr(t):
            return spare if t is None else t
        _quantize_qk[(n_pad // rows * b * h,)](
            x, ptr(gather), ptr(mean), ptr(outer), ptr(values), ptr(scales), ptr(q_mean),
            ptr(gathered), ptr(block_amax), bad, n, n_pad, x.stride(0), x.stride(1), x.stride(2), h,
            float(multiplier) if multiplier is not None else 1.0, norm, ROWS=rows,
            CHUNK=QK_CHUNK, D=d,
            HAS_PERM=gather is not None, HAS_MEAN=mean is not None,
            MULTIPLY=multiplier is not None, SMOOTH=smooth, OUTER=outer is not None,
            GATHER_OUT=gathered is not None, HADAMARD=rotated, LOG2_D=d.bit_length() - 1,
            AMAX_ONLY=block_amax is not None, Cos=cos, Sin=sin, ROPE=rope_switch,
            SM90_ORDER=sm90, num_warps=QK_WARPS, enable_fp_fusion=False)
        return values, scales, q_mean

    def outer_of(x, quantizer, n_pad=None, multiplier=None, **qk):
        """The outer scale of `quantizer` on x (times `multiplier`, rotated, by the Hadamard or
        RoPE, when Q and K are: `n_pad` is then the quantizer's padded length), or None."""
        if not quantizer.granularity.global_scale:
            return None
        if (rotated or rope is not None) and n_pad is not None:
            # the amax of the rotated tensor, before any element is quantized: a first pass
            # that writes one amax per program (exact: a max does not round)
            rows = bm if qk.get("smooth") else QK_CHUNK
            block_amax = torch.empty(b * h, n_pad // rows, device=dev, dtype=torch.float32)
            launch_qk(x, n_pad, multiplier=multiplier, block_amax=block_amax, **qk)
            return _outer(block_amax.amax(1))
        # max |x| in one read (x.abs() would write a copy first); exact in any dtype, NaN
        # propagated; an infinity made NaN, as `granularity.abs_max` does
        amax = torch.linalg.vector_norm(x, float("inf"), dim=(-2, -1)).float()
        amax = torch.where(torch.isfinite(amax), amax, torch.full_like(amax, float("nan")))
        if multiplier is not None:  # rounded multiplication is monotone: max |x c| = max |x| c
            amax = amax * torch.tensor(multiplier, dtype=torch.float32, device=dev)
        return _outer(amax.reshape(b, h))

    # 1 for a (batch, head) left with a NaN microscale, set by the quantizers (`_flag_nan`)
    bad = torch.zeros(b * h, device=dev, dtype=torch.int32)

    # Q: the scale fold, the rotation, Q smoothing, codes: one read (two with an outer scale)
    q_out = outer_of(q, plan.q, nq_pad, multiplier=scale_log2)
    qv, qs, q_mean = launch_qk(q, nq_pad, multiplier=scale_log2, smooth=plan.smooth_q,
                               outer=q_out)

    # K: its token mean (unrotated, from the input: the FP64 sum does not depend on the
    # order, so not on the permutation: `token_mean_gpu`), then the gather, the rotation, the
    # subtraction of the rotated mean, codes, and the gathered 16-bit rows for the bias
    k_mean = k_input = mean_in = None
    if plan.smooth_k:  # after RoPE, as the emulation takes it
        k_mean = token_mean_gpu(k, (cos, sin, rope_switch))
        mean_in = rotate(k_mean) if rotated else k_mean
    if plan.smooth_q:  # the bias reads K's rows contiguous, in the permuted order, after RoPE
        k_input = k if perm is None and k.is_contiguous() and rope is None else torch.empty(
            b, h, n, d, device=dev, dtype=k.dtype)
    k_out = outer_of(k, plan.k, nk_pad, mean=mean_in)
    kv, ks, _ = launch_qk(k, nk_pad, mean=mean_in, gather=perm, outer=k_out,
                          gathered=k_input if k_input is not None and k_input is not k else None,
                          sm90=sm90_order)
    if plan.smooth_q and k_mean is None:
        k_mean = torch.zeros(b * h, d, device=dev)

    v_out = outer_of(v, plan.v)
    vv = torch.empty(b * h, nk_pad, d, device=dev, dtype=torch.float16)
    vs = torch.empty(b * h, nk_pad // 16, d, device=dev, dtype=torch.float16)
    demean = plan.vsmooth is not None
    v_mean = torch.empty(b * h, nk_pad // bn, d, device=dev, dtype=torch.float16) if demean else None
    v_rows = bn if demean else V_CHUNK  # a program's tokens: the KV tile for its block mean
    _quantize_v[(nk_pad // v_rows, b * h)](
        v, perm if perm is not None else vs, v_out if v_out is not None else vs, vv, vs,
        v_mean if v_mean is not None else vs, bad, n, nk_pad,
        v.stride(0), v.stride(1), v.stride(2), h, ROWS=v_rows, CHUNK=V_CHUNK, D=d,
        HAS_PERM=perm is not None, DEMEAN=demean, OUTER=v_out is not None,
        SM90_ORDER=sm90_order, num_warps=V_WARPS, enable_fp_fusion=False)

    # as engine.prepare: a (batch, head) with a NaN scale has NaN V scales (the microscales
    # of the PV product's operand, and the epilogue's outer scale where there is one), and so
    # NaN V values, the microscales being in them: the emulation's codes times NaN
    # NaN microscales flagged by the quantizers; an outer scale is NaN only where all of its
    # microscales are, but it is checked as the emulation checks it (one number a head)
    bad = bad != 0
    for outer in (q_out, k_out, v_out):
        if outer is not None:
            bad |= ~torch.isfinite(outer)
    poison = torch.where(bad, float("nan"), torch.zeros(b * h, device=dev))
    for x in (vv, vs):
        _fill_nan[(b * h,)](x, poison, x[0].numel(), BLOCK=1024)
    if v_out is not None:
        v_out = v_out + poison

    bias_q = None
    if q_mean is not None:
        bias_q = rotate(q_mean) if rotated else q_mean
    return Nvfp4Operands(
        q=qv, q_scale=qs, k=kv, k_scale=ks, v=vv, v_scale=vs, n=n, block_m=bm, block_n=bn,
        q_outer=q_out, k_outer=k_out, v_outer=v_out, v_mean=v_mean, q_mean=q_mean,
        bias_q=None if bias_q is None else bias_q.contiguous(), k_mean=k_mean,
        k_input=k_input, permutation=permutation, key_order=key_order)

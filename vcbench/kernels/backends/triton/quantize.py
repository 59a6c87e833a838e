"""Fused preprocessing kernels: the quantized operands of the 8-bit methods.

Each kernel reads the BF16/FP16 input once per pass and writes only codes, scales and block
means: no high-precision intermediate goes back to HBM. They reproduce the emulation
(`vcbench.kernels.reference.engine.prepare`) bit for bit: means are summed in FP64 (exact for 16-bit
inputs, so the order of the sum does not matter), divisions are `div_rn`, roundings are
nearest-even, conversions saturate; a group holding a non-finite value has a NaN scale and
zero codes (`abs_max`), as the emulation's.

    token_sums      K's channel sums over tokens in FP64 (per chunk; torch adds the chunks),
                    the statistic of K smoothing, without an FP32/FP64 copy of K (of K
                    after RoPE, when the call fuses it).
    quantize_rows   Q or K: optional gather by pi, optional RoPE on load (spec.rope's FP32
                    ops, rounded to the input dtype), optional QK Hadamard (the butterfly of
                    spec.rotation in registers), optional mean subtraction, a scale per
                    ROWS tokens (16 = per warp, 128 = per block), INT8 or E4M3 codes.
    v_block_stats   V pass 1: gather by pi, FP64 block means, per-block residual amax.
    quantize_v      V pass 2: codes written transposed (D, N) for the FP8 PV product,
                    with the block means stored FP16 and pre-divided by the channel scale.

Every offset that can pass 2^31 elements is 64-bit: the (batch, head) base and the token row
times its stride (a Wan2.2 1080p operand holds 3.5e9 elements, and an NHD view's token stride
is H*D). Grids are 1-D (program = bh * blocks + block), so neither the head count nor the
sequence length meets CUDA's 65535 limit on a grid's second axis.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

FMT_INT8 = 0
FMT_E4M3 = 1
# A kernel's ROPE switch: no RoPE, or RoPE on load with its FP32 result rounded to the
# input's dtype (spec.rope stores it there); the kernels test the numbers
ROUND_NONE = 0
ROUND_BF16 = 1
ROUND_FP16 = 2


if os.environ.get("TRITON_INTERPRET") == "1":  # numpy never contracts a product into an FMA
    @triton.jit
    def _mul_rn(a, b):
        return a * b
else:
    @triton.jit
    def _mul_rn(a, b):
        """a * b rounded on its own: `mul.rn` is never contracted into an FMA with a later
        add, so `x - _mul_rn(m, s)` rounds twice, exactly as the emulation's separate ops do."""
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b],
                                         dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def abs_max(x, axis: tl.constexpr):
    """`granularity.abs_max`: max |x| along `axis`, NaN where a NaN or an infinity is among
    them. The GPU's max drops NaN (its comparisons are false), a sum does not: x * 0 is 0 for
    finite x and NaN otherwise, and adding the sum of zeros leaves the max as it is."""
    return tl.max(tl.abs(x), axis) + tl.sum(x * 0.0, axis)


@triton.jit
def program(blocks):
    """(block, bh) of this program in a 1-D grid of bh * blocks + block, both 64-bit: the grid
    of the vcbench Triton kernels that read no RoPE tables, blocks fastest (a head's programs
    run side by side); the RoPE-carrying ones take `program_heads_first`."""
    pid = tl.program_id(0).to(tl.int64)
    return pid % blocks, pid // blocks


@triton.jit
def program_heads_first(blocks):
    """(block, bh) of this program in a 1-D grid of block * (B*H) + bh, both 64-bit: the grid of
    a kernel that may rotate by RoPE on load. The (batch, head)s of one token block run side by
    side, so each row of RoPE's FP32 tables (`rope_args`' (N, D / 2) halves), the same for
    every head, is read by all of them while it is in L2 (a head at a time, `program`, goes
    through both tables, twice the bytes of a 16-bit operand, once a head). Measured at the
    Wan2.2 shape, with the (N, D) tables then read: 0.1-0.5 ms a call faster, bit for bit the
    same."""
    pid = tl.program_id(0).to(tl.int64)
    bh_count = tl.num_programs(0) // blocks
    return pid // bh_count, pid % bh_count


@triton.jit
def _load_rows(X, Perm, group, bh, n, stride_b, stride_h, stride_n, H, ROWS: tl.constexpr,
               D: tl.constexpr, HAS_PERM: tl.constexpr, Cos=None, Sin=None,
               ROPE: tl.constexpr = 0):
    """Tokens group*ROWS .. +ROWS of one (batch, head) as FP32, gathered through the
    permutation when there is one, rotated by RoPE when ROPE names the input's dtype (`_rope`,
    each row by its source token's angles: RoPE comes before the gather); rows past n
    (padding) read as zero. bh is 64-bit, and so is every row offset (row * stride_n passes
    2^31 in long NHD views)."""
    b = bh // H
    h = bh % H
    rows = group * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, D)
    valid = rows < n
    src = rows
    if HAS_PERM:
        src = tl.load(Perm + bh * n + rows, mask=valid, other=0)
    base = X + b * stride_b + h * stride_h
    x = tl.load(base + src.to(tl.int64)[:, None] * stride_n + cols[None, :],
                mask=valid[:, None], other=0.0).to(tl.float32)
    if ROPE != 0:  # ROUND_NONE
        x = _rope(x, src, valid, Cos, Sin, ROWS, D, ROPE)
    return x, rows, cols, valid


@triton.jit
def _rope(x, src, valid, Cos, Sin, ROWS: tl.constexpr, D: tl.constexpr, ROUND: tl.constexpr):
    """spec.rope.apply_rope of rows x (ROWS, D), FP32, of tokens `src`: per channel pair,
    x1*cos - x2*sin and x1*sin + x2*cos, each product rounded on its own (`_mul_rn`: no FMA),
    then the sum, then the rounding to the input's dtype, as torch's separate ops store it.
    Returned as FP32 (exact). Cos and Sin are the (N, D / 2) tables of the entries RoPE reads
    (`rope_args`): whole rows, loaded in the layout of x's channel pairs. Read from the (N, D)
    tables at a stride of two, the loads were narrow and the products took layout conversions
    through shared memory: twice the quantizer's instructions, ~30 more barriers a step."""
    at = src.to(tl.int64)[:, None] * (D // 2) + tl.arange(0, D // 2)[None, :]
    c = tl.load(Cos + at, mask=valid[:, None], other=0.0)
    s = tl.load(Sin + at, mask=valid[:, None], other=0.0)
    x1, x2 = tl.split(tl.reshape(x, [ROWS, D // 2, 2]))
    even = _mul_rn(x1, c) - _mul_rn(x2, s)
    odd = _mul_rn(x1, s) + _mul_rn(x2, c)
    y = tl.reshape(tl.join(even, odd), [ROWS, D])
    if ROUND == 1:  # ROUND_BF16
        y = _round_bf16(y)
    else:
        y = y.to(tl.float16).to(tl.float32)
    return y


@triton.jit
def _round_bf16(y):
    """FP32 -> BF16 -> FP32, round to nearest even, on the bits: what `cvt.rn.bf16.f32` (and
    torch's cast) gives, written out so Triton's CPU interpreter, whose BF16 cast rounds ties
    away and truncates elsewhere, computes it too. A NaN stays NaN (its payload could carry
    into the exponent)."""
    bits = y.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(y != y, y, bits.to(tl.float32, bitcast=True))


@triton.jit
def _token_sums(X, Sums, n, chunks, stride_b, stride_h, stride_n, H, Cos, Sin,
                ROWS: tl.constexpr, D: tl.constexpr, TILES: tl.constexpr,
                ROPE: tl.constexpr = 0):
    chunk, bh = program_heads_first(chunks)
    acc = tl.zeros([D], tl.float64)
    for t in range(TILES):
        x, rows, cols, valid = _load_rows(X, X, chunk * TILES + t, bh, n, stride_b, stride_h,
                                          stride_n, H, ROWS, D, False, Cos, Sin, ROPE)
        acc += tl.sum(x.to(tl.float64), 0)
    tl.store(Sums + (bh * chunks + chunk) * D + tl.arange(0, D), acc)


def rope_args(rope, x):
    """(Cos, Sin, ROPE) of a kernel that rotates x's rows by `rope` (spec.rope.Rope) on load:
    the (N, D / 2) FP32 tables of the entries a channel pair reads (cos at the even channels,
    sin at the odd ones) on x's device, contiguous, and the switch naming the dtype spec.rope
    stores the rotated rows in; without `rope`, x as the pointers the switch leaves unread and
    ROUND_NONE. A UserError where the fusion would not be bit-exact: tables other than FP32,
    or x other than 16-bit."""
    import torch

    if rope is None:
        return x, x, ROUND_NONE
    switch = {torch.bfloat16: ROUND_BF16, torch.float16: ROUND_FP16}.get(x.dtype)
    if not rope.fusable() or switch is None:
        from vcbench.errors import UserError

        raise UserError("the fused RoPE takes FP32 tables and 16-bit q and k")
    cos, sin = rope.cos[:, 0::2], rope.sin[:, 1::2]  # the entries a channel pair reads
    return cos.to(x.device).contiguous(), sin.to(x.device).contiguous(), switch


def token_mean_gpu(x, tables=None):
    """`vsmooth.token_mean` of a 16-bit or FP32 (B, H, N, D) CUDA tensor, bit for bit: the
    FP64 sum of 16-bit values is exact, so chunking it cannot change it, and so is that of
    FP32 values while a channel's magnitudes span fewer than 29 - log2(N) binades (53 bits
    against 24); past that, the chunks still add in one fixed order, so a call repeats its
    bits. With `tables` (what `rope_args` returned for the call's RoPE and x's dtype, so
    the caller's quantizers and this share one copy of the tables), the mean of x after RoPE,
    rotated on load. Returns FP32 (B*H, D)."""
    import torch

    b, h, n, d = x.shape
    rows, tiles = 64, 16
    chunks = triton.cdiv(n, rows * tiles)
    sums = torch.empty(b * h, chunks, d, device=x.device, dtype=torch.float64)
    cos, sin, switch = tables if tables is not None else rope_args(None, x)
    _token_sums[(chunks * b * h,)](x, sums, n, chunks, x.stride(0), x.stride(1), x.stride(2),
                                   h, cos, sin, ROWS=rows, D=d, TILES=tiles, ROPE=switch)
    return (sums.sum(1) / n).float()


@triton.jit
def hadamard_rows(x, norm, ROWS: tl.constexpr, D: tl.constexpr, LOG2_D: tl.constexpr):
    """spec.rotation.rotate of each row of x (ROWS, D) in registers: the same butterfly
    stages (x_j + x_(j+h), x_j - x_(j+h) for h = 1, 2, ..., D/2) in the same order, then the
    multiply by `norm`, the FP32 1/sqrt(D) (`hadamard_norm`), each rounded on its own, so the
    codes match the emulation's bit for bit.

    The stages h = 1, 2 pair columns a thread holds (its four adjacent ones) and are split and
    joined in place; from h = 4 the partner lives in another lane, and a gather of column j ^ h
    (warp shuffles) takes its value: the lower column of a pair gets a + b, the upper a - b, the
    same IEEE operations. Expressed as split and join, those stages were layout conversions
    through shared memory with a barrier each, and the 8-bit K quantizer's 128-row tile
    spilled (tests/test_nvfp4_compile.py holds the quantizers to no spills)."""
    col = tl.zeros([ROWS, D], tl.int32) + tl.arange(0, D)[None, :]
    for s in tl.static_range(LOG2_D):
        if s < 2:
            pairs = tl.permute(tl.reshape(x, [ROWS, D >> (s + 1), 2, 1 << s]), [0, 1, 3, 2])
            a, b = tl.split(pairs)
            x = tl.reshape(tl.permute(tl.join(a + b, a - b), [0, 1, 3, 2]), [ROWS, D])
        else:
            partner = tl.gather(x, col ^ (1 << s), 1)
            x = tl.where((col & (1 << s)) == 0, x + partner, partner - x)
    return _mul_rn(x, tl.zeros_like(x) + norm)


def hadamard_norm(d: int) -> float:
    """The FP32 1/sqrt(d) that spec.rotation.rotate multiplies by, as a Python float."""
    import torch

    return torch.tensor(1.0 / d**0.5, dtype=torch.float32).item()


@triton.jit
def _quantize_rows(X, Perm, Mean, Out, Scale, n, n_pad, stride_b, stride_h, stride_n, H,
                   multiplier, norm, ROWS: tl.constexpr, D: tl.constexpr, FMT: tl.constexpr,
                   HAS_PERM: tl.constexpr, HAS_MEAN: tl.constexpr, MULTIPLY: tl.constexpr,
                   HADAMARD: tl.constexpr = False, LOG2_D: tl.constexpr = 0, Cos=None, Sin=None,
                   ROPE: tl.constexpr = 0):
    group, bh = program_heads_first(n_pad // ROWS)
    # RoPE (on the source token), then the scale fold, the Hadamard, the mean: the
    # emulation's order, each step rounded where it rounds
    x, rows, cols, valid = _load_rows(X, Perm, group, bh, n, stride_b, stride_h, stride_n, H,
                                      ROWS, D, HAS_PERM, Cos, Sin, ROPE)
    if MULTIPLY:
        x = _mul_rn(x, tl.zeros_like(x) + multiplier)
    if HADAMARD:  # then Mean is the rotated mean: rotate, subtract (appendix B's order)
        x = hadamard_rows(x, norm, ROWS, D, LOG2_D)
    if HAS_MEAN:
        mean = tl.load(Mean + bh * D + cols)
        x = tl.where(valid[:, None], x - mean[None, :], 0.0)
    amax = abs_max(abs_max(x, 1), 0)  # NaN for a non-finite group: NaN scale, zero codes
    if FMT == 0:  # formats.scale_for: a multiply by the FP32 reciprocal
        scale = amax * (1.0 / 127.0)
    else:
        scale = amax * (1.0 / 448.0)
    safe = tl.where(scale > 0, scale, 1.0)
    y = tl.math.div_rn(x, tl.zeros_like(x) + safe)
    y = tl.where(scale > 0, y, 0.0)
    out_ptrs = Out + bh * n_pad * D + rows.to(tl.int64)[:, None] * D + cols[None, :]
    if FMT == 0:
        # Clamp, then round half to even by the magic-number add (exact for |y| < 2^22).
        y = tl.minimum(tl.maximum(y, -127.0), 127.0)
        tl.store(out_ptrs, ((y + 12582912.0) - 12582912.0).to(tl.int8))
    else:
        tl.store(out_ptrs, tl.clamp(y, -448.0, 448.0).to(tl.float8e4nv))
    tl.store(Scale + bh * (n_pad // ROWS) + group, scale)


@triton.jit
def _v_block_stats(X, Perm, Means, BlockAmax, n, n_blocks, stride_b, stride_h, stride_n, H,
                   ROWS: tl.constexpr, D: tl.constexpr, HAS_PERM: tl.constexpr,
                   DEMEAN: tl.constexpr):
    block, bh = program(n_blocks)
    x, rows, cols, valid = _load_rows(X, Perm, block, bh, n, stride_b, stride_h, stride_n, H,
                                      ROWS, D, HAS_PERM)
    if DEMEAN:
        count = tl.minimum(n - block * ROWS, ROWS).to(tl.float64)
        mean = (tl.sum(x.to(tl.float64), 0) / count).to(tl.float32)
        tl.store(Means + (bh * n_blocks + block) * D + cols, mean)
        x = tl.where(valid[:, None], x - mean[None, :], 0.0)
    tl.store(BlockAmax + (bh * n_blocks + block) * D + cols, abs_max(x, 0))


@triton.jit
def _quantize_v(X, Perm, Means, Scale, OutT, StoredMeans, n, n_pad, stride_b, stride_h, stride_n,
                H, ROWS: tl.constexpr, D: tl.constexpr, HAS_PERM: tl.constexpr,
                DEMEAN: tl.constexpr, PER_BLOCK: tl.constexpr):
    n_blocks = n_pad // ROWS
    block, bh = program(n_blocks)
    x, rows, cols, valid = _load_rows(X, Perm, block, bh, n, stride_b, stride_h, stride_n, H,
                                      ROWS, D, HAS_PERM)
    if PER_BLOCK:  # fp8-fa4: one scale per block of tokens, all channels
        amax = abs_max(abs_max(x, 1), 0)
        scale_b = amax * (1.0 / 448.0)
        tl.store(Scale + bh * n_blocks + block, scale_b)
        scale = tl.zeros([D], tl.float32) + scale_b
    else:
        scale = tl.load(Scale + bh * D + cols)
    if DEMEAN:
        mean = tl.load(Means + (bh * n_blocks + block) * D + cols)
        stored = tl.clamp(tl.math.div_rn(mean, scale), -65504.0, 65504.0,
                          propagate_nan=tl.PropagateNan.ALL).to(tl.float16)
        tl.store(StoredMeans + (bh * n_blocks + block) * D + cols, stored)
        restored = _mul_rn(stored.to(tl.float32), scale)
        x = tl.where(valid[:, None], x - restored[None, :], 0.0)
    safe = tl.where(scale > 0, scale, 1.0)
    y = tl.math.div_rn(x, tl.zeros_like(x) + safe[None, :])
    y = tl.where(scale[None, :] > 0, y, 0.0)
    codes = tl.clamp(y, -448.0, 448.0).to(tl.float8e4nv)
    tl.store(OutT + bh * D * n_pad + cols.to(tl.int64)[None, :] * n_pad + rows[:, None], codes)

"""vcbench.attention: the method contract, padding, layouts, errors, and the fidelity order."""

import math

import pytest
import torch
from conftest import reference_attention, rel_l2

import vcbench
from vcbench.analysis.synthetic import synthetic_qkv
from vcbench.errors import UserError
from vcbench.kernels import METHODS, get_method
from vcbench.kernels.reference.engine import prepare
from vcbench.kernels.reference.vsmooth import group
from vcbench.kernels.spec.vsmooth import VSmoothConfig

EIGHT = ["bf16", "fp8-fa4", "sage2-8bit", "sage3-4bit", "attnqat-tf", "vc-8bit",
         "vc-8bit-vsmooth", "vc-4bit", "vc-8bit-fp8qk"]
# Relative L2 each method must stay within on the padding inputs, per kind of input. The
# methods fall into tiers; each tolerance sits above its own tier's largest error measured on
# those inputs (n = 130 and 257) and below the smallest measured for the next-worse tier.
# Plain Gaussian Q/K/V, where an unmasked pad takes a large share of every row's mass:
#   bf16                                  0.0033-0.0034  -> 0.01  (8-bit tier from 0.036)
#   sage2-8bit, vc-8bit, vc-8bit-vsmooth  0.0362-0.0409  -> 0.045 (fp8-fa4 from 0.052)
#   fp8-fa4, vc-8bit-fp8qk                0.0523-0.0572  -> 0.07  (4-bit tier from 0.189)
#   sage3-4bit, vc-4bit, attnqat-tf       0.1891-0.2018  -> 0.21  (no worse method; unmasked
#                                         pads give 0.23-2.6, Q-smoothing's score term
#                                         dropped 0.220-0.234)
PLAIN_TOLERANCE = {"bf16": 0.01, "fp8-fa4": 0.07, "sage2-8bit": 0.045, "sage3-4bit": 0.21,
                   "attnqat-tf": 0.21, "vc-8bit": 0.045, "vc-8bit-vsmooth": 0.045, "vc-4bit": 0.21,
                   "vc-8bit-fp8qk": 0.07}
# Gaussian with a per-channel bias on Q and on K (the channel outliers of video DiTs), which
# smoothing removes and the unsmoothed methods must carry:
#   bf16                                  0.0098-0.0153  -> 0.025 (8-bit smoothed from 0.034)
#   sage2-8bit, vc-8bit, vc-8bit-vsmooth  0.0340-0.0378  -> 0.05  (vc-8bit-fp8qk from 0.094)
#   vc-8bit-fp8qk                         0.0945-0.0997  -> 0.11  (4-bit smoothed from 0.125)
#   sage3-4bit, vc-4bit                   0.1247-0.1529  -> 0.156 (fp8-fa4 from 0.158)
#   fp8-fa4                               0.158-0.187    -> 0.3   (attnqat-tf from 0.559)
#   attnqat-tf                            0.559-0.567    -> 0.62  (no worse method; Q-smoothing's
#                                         score term dropped gives 0.87 and more)
TOLERANCE = {"bf16": 0.025, "fp8-fa4": 0.3, "sage2-8bit": 0.05, "sage3-4bit": 0.156,
             "attnqat-tf": 0.62, "vc-8bit": 0.05, "vc-8bit-vsmooth": 0.05, "vc-4bit": 0.156,
             "vc-8bit-fp8qk": 0.11}


def _padding_inputs(n, dtype=torch.float32, biased=True):
    g = torch.Generator().manual_seed(1234)
    q, k, v = (torch.randn(1, 2, n, 64, generator=g) for _ in range(3))
    if biased:
        q = q + 3 * torch.randn(1, 2, 1, 64, generator=g)
        k = k + 3 * torch.randn(1, 2, 1, 64, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def test_eight_methods_registered():
    assert METHODS.builtin_names() == EIGHT


@pytest.mark.parametrize("method", EIGHT)
@pytest.mark.parametrize("n", [130, 257])
@pytest.mark.parametrize("biased", [False, True], ids=["gaussian", "channel-biased"])
def test_padding_never_changes_the_result(method, n, biased):
    # 130 tokens leave 126 padded keys in the last tile: were they not masked they would
    # take a large share of every row's probability mass.
    q, k, v = _padding_inputs(n, biased=biased)
    out = vcbench.attention(q, k, v, method)
    assert out.shape == q.shape and out.dtype == q.dtype
    tolerance = (TOLERANCE if biased else PLAIN_TOLERANCE)[method]
    assert rel_l2(out, reference_attention(q, k, v)) < tolerance


def test_bf16_padded_and_unpadded_tiles_are_bit_identical_in_float64():
    """Where the plan has no scale that a tile could change (bf16: unscaled BF16 operands) and
    the arithmetic is exact, padding must change no bit. Small integer Q, K, V (exact in BF16)
    and sm_scale = ln 2 give integer log2 scores, so every probability 2^(s - m), every
    running-max rescale and every sum is exact in FP64: 192 tokens as three 64-key tiles (no
    padding) and as two 128-key tiles (64 padded keys) must give the same bits, and those of
    the exact softmax written out here, sum_j 2^(s_j - m) v_j / sum_j 2^(s_j - m)."""
    g = torch.Generator().manual_seed(7)
    q, k = (torch.randint(-1, 2, (1, 2, 192, 64), generator=g).double()
            * (torch.rand(1, 2, 192, 64, generator=g) < 0.1) for _ in range(2))
    v = torch.randint(-8, 9, (1, 2, 192, 64), generator=g).double()
    ln2 = math.log(2.0)
    unpadded = vcbench.attention(q, k, v, "bf16", sm_scale=ln2, block_m=64, block_n=64)
    padded = vcbench.attention(q, k, v, "bf16", sm_scale=ln2, block_m=128, block_n=128)
    s = q @ k.transpose(-1, -2)
    assert torch.equal(s, s.round()) and (s - s.amax(-1, keepdim=True)).min() > -40
    p = torch.exp2(s - s.amax(-1, keepdim=True))
    exact = (p @ v) / p.sum(-1, keepdim=True)
    assert torch.equal(unpadded, exact)
    assert torch.equal(padded, exact)


def test_padded_and_unpadded_tiles_agree_in_float64_with_exact_formats():
    """With every format exact, FP64 inputs and all of smoothing on (K mean, Q tile means with
    their score term, V-Smooth block means), 192 tokens run as three 64-row tiles (no padding)
    and as two 128-row tiles (64 padded rows) must agree to FP64 rounding, and both equal
    softmax(Q K^T / sqrt(d)) V."""
    from vcbench.kernels.reference.engine import emulate
    from vcbench.kernels.spec.formats import EXACT
    from vcbench.kernels.spec.granularity import Quantizer, Unscaled
    from vcbench.kernels.spec.method import Plan
    from vcbench.kernels.spec.probability import ExpThenCast

    exact = Quantizer(EXACT, Unscaled())
    q, k, v = _padding_inputs(192, torch.float64)
    v = v + 4 * torch.randn(1, 2, 1, 64, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    outs = {}
    for block in (64, 128):
        plan = Plan(q=exact, k=exact, v=exact, p=ExpThenCast(EXACT), smooth_k=True, smooth_q=True,
                    vsmooth=VSmoothConfig(order="sequence", block_rows=block), block_m=block,
                    block_n=block)
        outs[block] = emulate(q, k, v, plan)
    assert torch.allclose(outs[64], outs[128], rtol=0, atol=1e-12)
    assert torch.allclose(outs[128], reference_attention(q, k, v), rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", EIGHT)
def test_layouts_agree_and_dtype_is_kept(method, gen):
    q, k, v = (torch.randn(1, 2, 200, 128, generator=gen).bfloat16() for _ in range(3))
    hnd = vcbench.attention(q, k, v, method)
    nhd = vcbench.attention(*(x.transpose(1, 2) for x in (q, k, v)), method, tensor_layout="NHD")
    assert hnd.dtype == torch.bfloat16
    assert torch.equal(hnd, nhd.transpose(1, 2))
    assert torch.equal(hnd, vcbench.attention(q, k, v, method))  # deterministic


def test_clear_errors(gen):
    q = torch.randn(1, 1, 64, 96, generator=gen)
    with pytest.raises(UserError, match="head dim 96"):
        vcbench.attention(q, q, q, "bf16")
    q = torch.randn(1, 1, 64, 64, generator=gen)
    with pytest.raises(UserError, match="unknown method 'nope'"):
        vcbench.attention(q, q, q, "nope")
    with pytest.raises(UserError, match="has no option 'expcast_beta'"):
        vcbench.attention(q, q, q, "sage2-8bit", expcast_beta=0.1)
    with pytest.raises(UserError, match=r"has no option 'hadamrd_qk' \(did you mean 'hadamard_qk'\?"):
        vcbench.attention(q, q, q, "vc-8bit", hadamrd_qk=False)
    with pytest.raises(UserError, match="accum"):
        vcbench.attention(q, q, q, "sage2-8bit", accum="fp16")
    with pytest.raises(UserError, match="one shape"):
        vcbench.attention(q, q[:, :, :10], q, "bf16")
    with pytest.raises(UserError, match="tensor_layout"):
        vcbench.attention(q, q, q, "bf16", tensor_layout="BHND")
    with pytest.raises(UserError, match="cube"):
        vcbench.attention(q, q, q, "vc-8bit", vsmooth_order="cube")


def test_quantized_operands_have_declared_formats(gen):
    q, k, v = (torch.randn(1, 2, 256, 128, generator=gen) for _ in range(3))
    ops = prepare(q, k, v, get_method("sage2-8bit").plan())
    assert ops.q.scale.shape == (1, 2, 256 // 16)  # per warp
    assert ops.k.scale.shape == (1, 2, 2)  # per 128-token block
    assert ops.v.scale.shape == (1, 2, 128)  # per channel
    for codes in (ops.q.codes, ops.k.codes):
        assert torch.equal(codes, codes.round()) and codes.abs().max() <= 127
    assert torch.equal(ops.v.codes, ops.v.codes.to(torch.float8_e4m3fn).float())
    # K was smoothed: its token mean is gone before quantization.
    assert ops.k.dequantize().mean(-2).abs().max() < 0.05


def test_given_permutation_reproduces_internal_grouping(gen):
    t = synthetic_qkv(3, heads=2, grid=(2, 16, 16))
    config = get_method("vc-8bit").plan().vsmooth
    perm = group(t.v.float(), config).permutation
    a = vcbench.attention(t.q, t.k, t.v, "vc-8bit")
    b = vcbench.attention(t.q, t.k, t.v, "vc-8bit", permutation=perm)
    assert torch.equal(a, b)
    # A different order changes the quantized residual, so the output too.
    c = vcbench.attention(t.q, t.k, t.v, "vc-8bit", vsmooth_order="sequence")
    assert not torch.equal(a, c)
    assert isinstance(config, VSmoothConfig)


def _errors(q, k, v, methods, **kw):
    ref = reference_attention(q, k, v)
    return {m: rel_l2(vcbench.attention(q, k, v, m, **kw.get(m, {})), ref) for m in methods}


@pytest.mark.parametrize("seed", [0, 1])
def test_fidelity_order_on_video_like_tensors(seed):
    t = synthetic_qkv(seed, heads=2, grid=(4, 16, 32))
    # V-Smooth against its host at one QK path, with the QK Hadamard off and on (the VC
    # default): on these tensors the rotation does not always help the INT8 scores (seed 0:
    # it raises both methods' error), so the order is only a claim at matched QK paths.
    for rotated in (False, True):
        opts = {"hadamard_qk": rotated}
        e = _errors(t.q, t.k, t.v, ["fp8-fa4", "sage2-8bit", "vc-8bit-vsmooth"],
                    **{"sage2-8bit": opts, "vc-8bit-vsmooth": opts})
        assert e["vc-8bit-vsmooth"] < e["sage2-8bit"] < e["fp8-fa4"]
    e4 = _errors(t.q, t.k, t.v, ["attnqat-tf", "sage3-4bit", "vc-4bit"])
    assert e4["vc-4bit"] < e4["sage3-4bit"] < e4["attnqat-tf"]


def test_fidelity_order_with_plain_token_outliers(gen):
    # Gaussian Q/K/V, a channel bias on K, and a few value tokens carrying a large outlier.
    q = torch.randn(1, 2, 2048, 128, generator=gen)
    k = torch.randn(1, 2, 2048, 128, generator=gen) + 3 * torch.randn(1, 2, 1, 128, generator=gen)
    v = torch.randn(1, 2, 2048, 128, generator=gen)
    rows = torch.randperm(2048, generator=gen)[:40]
    v[:, :, rows] += 20 * torch.randn(1, 2, 1, 128, generator=gen)
    q, k, v = (x.bfloat16() for x in (q, k, v))
    e = _errors(q, k, v, ["fp8-fa4", "sage2-8bit", "vc-8bit-vsmooth"])
    assert e["vc-8bit-vsmooth"] < e["sage2-8bit"] < e["fp8-fa4"]


def test_hadamard_qk_and_vsmooth_off_are_real_options(gen):
    q, k, v = (torch.randn(1, 1, 256, 64, generator=gen) for _ in range(3))
    base = vcbench.attention(q, k, v, "fp8-fa4")
    rotated = vcbench.attention(q, k, v, "fp8-fa4", hadamard_qk=True)
    assert not torch.equal(base, rotated)
    ref = reference_attention(q, k, v)
    assert rel_l2(rotated, ref) < PLAIN_TOLERANCE["fp8-fa4"]
    off = vcbench.attention(q, k, v, "vc-8bit", vsmooth=False)
    with pytest.raises(UserError, match="without V-Smooth"):
        vcbench.attention(q, k, v, "vc-8bit", vsmooth=False, permutation=torch.zeros(1, 1, 256).long())
    assert rel_l2(off, ref) < PLAIN_TOLERANCE["vc-8bit"]


@pytest.mark.parametrize("method", ["vc-8bit", "vc-4bit"])
def test_a_given_permutation_is_the_token_order_used(method, gen):
    """A permutation handed to a V-Smooth method is the order it demeans in: the output equals
    that of the same method in `sequence` order (the identity) on K and V gathered by the
    permutation beforehand. A random permutation, far from any k-means order."""
    q, k, v = (torch.randn(1, 2, 256, 64, generator=gen).bfloat16() for _ in range(3))
    v = v + (4 * torch.randn(1, 2, 1, 64, generator=gen)).bfloat16()
    perm = torch.stack([torch.randperm(256, generator=gen) for _ in range(2)])[None]
    given = vcbench.attention(q, k, v, method, permutation=perm)
    gathered = [torch.gather(x, -2, perm[..., None].expand_as(x)) for x in (k, v)]
    assert torch.equal(given, vcbench.attention(q, *gathered, method, vsmooth_order="sequence"))
    assert not torch.equal(given, vcbench.attention(q, k, v, method))  # k-means' own order

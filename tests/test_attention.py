"""vcbench.attention: the method contract, padding, layouts, errors, and the fidelity order."""

import pytest
import torch
from conftest import reference_attention, rel_l2

import vcbench
from vcbench.analysis.synthetic import synthetic_qkv
from vcbench.errors import UserError
from vcbench.kernels import get_method
from vcbench.kernels.online import prepare
from vcbench.kernels.vsmooth import VSmoothConfig, group

EIGHT = ["bf16", "fp8-fa4", "sage2-8bit", "sage3-4bit", "attnqat-tf", "vc-8bit",
         "vc-8bit-vsmooth", "vc-4bit", "vc-8bit-fp8qk"]
# Relative L2 a method must stay within on random inputs (far above what each reaches,
# far below what an unmasked pad or a misplaced scale produces).
TOLERANCE = {"bf16": 0.01, "fp8-fa4": 0.08, "sage2-8bit": 0.06, "sage3-4bit": 0.25,
             "attnqat-tf": 0.25, "vc-8bit": 0.06, "vc-8bit-vsmooth": 0.06, "vc-4bit": 0.25,
             "vc-8bit-fp8qk": 0.08}


def test_eight_methods_registered():
    assert vcbench.list_methods() == EIGHT


@pytest.mark.parametrize("method", EIGHT)
@pytest.mark.parametrize("n", [130, 257])
def test_padding_never_changes_the_result(method, n, gen):
    # 130 tokens leave 126 padded keys in the last tile: were they not masked they would
    # take about half of every row's probability mass.
    q, k, v = (torch.randn(1, 2, n, 64, generator=gen) for _ in range(3))
    out = vcbench.attention(q, k, v, method)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert rel_l2(out, reference_attention(q, k, v)) < TOLERANCE[method]


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
    e = _errors(t.q, t.k, t.v, ["fp8-fa4", "sage2-8bit", "vc-8bit-vsmooth"])
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
    assert rel_l2(rotated, ref) < TOLERANCE["fp8-fa4"]
    off = vcbench.attention(q, k, v, "vc-8bit", vsmooth=False)
    with pytest.raises(UserError, match="without V-Smooth"):
        vcbench.attention(q, k, v, "vc-8bit", vsmooth=False, permutation=torch.zeros(1, 1, 256).long())
    assert rel_l2(off, ref) < TOLERANCE["vc-8bit"]

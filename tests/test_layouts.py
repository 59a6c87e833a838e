"""Every layout a video DiT hands the kernels gives the output of a contiguous copy, bit for bit
(a non-finite value in one (batch, head) stays there: test_nonfinite.py).

The layouts are the ones diffusers' attention processors and the model families produce:
HND and NHD tensors, (B, N, H, D) memory seen through a transpose, and slices of a fused QKV
projection (non-unit strides in every dim but the last), in bf16 and fp16, with batch > 1 of
different content. The emulation is what CI runs; the Triton kernels are held to the same
properties under Triton's interpreter in test_triton_interpreted.py, and on the GPU by
benchmarks/checks/reliability.py.
"""

import pytest
import torch

import vcbench
from vcbench.kernels.reference.vsmooth import group
from vcbench.kernels.spec.vsmooth import VSmoothConfig

METHODS = vcbench.kernels.METHODS.builtin_names()
B, H, N, D = 2, 2, 160, 64  # 160 tokens: a full KV tile and a padded one


def _qkv(gen, dtype):
    return [torch.randn(B, H, N, D, generator=gen).to(dtype) for _ in range(3)]


def _options(method, q, k, v):
    """V-Smooth's k-means reads V: a permutation computed once keeps every layout's call on
    the same token order, so the comparison is of the attention alone (the k-means' own
    layout independence is checked below)."""
    if not method.startswith("vc-"):
        return {}
    return {"permutation": group(v, VSmoothConfig(block_rows=128)).permutation}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method", METHODS)
def test_every_layout_equals_the_contiguous_hnd_call(method, dtype, gen):
    q, k, v = _qkv(gen, dtype)
    opts = _options(method, q, k, v)
    ref = vcbench.attention(q, k, v, method, **opts)
    assert ref.dtype == dtype and ref.shape == q.shape

    bnhd = [x.transpose(1, 2).contiguous() for x in (q, k, v)]  # (B, N, H, D) memory
    # NHD tensors, as diffusers' processors hand them to F.scaled_dot_product_attention's users
    out = vcbench.attention(*bnhd, method, tensor_layout="NHD", **opts)
    assert torch.equal(out.transpose(1, 2), ref)
    # the same memory seen as HND through a transpose (strides B: NHD, H: D, N: HD)
    out = vcbench.attention(*(x.transpose(1, 2) for x in bnhd), method, **opts)
    assert torch.equal(out, ref)

    # slices of one fused QKV projection: (B, N, 3, H, D), each operand strided in B, N and H
    fused = torch.stack(bnhd, dim=2)
    qs, ks, vs = fused.unbind(2)
    assert not qs.is_contiguous() and qs.stride(-1) == 1
    out = vcbench.attention(qs, ks, vs, method, tensor_layout="NHD", **opts)
    assert torch.equal(out.transpose(1, 2), ref)
    out = vcbench.attention(qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2), method,
                            **opts)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("method", METHODS)
def test_each_batch_entry_is_its_own_call(method, gen):
    # Classifier-free guidance batches the conditional and unconditional passes: different
    # content per batch entry, and nothing may leak between them.
    q, k, v = _qkv(gen, torch.bfloat16)
    opts = _options(method, q, k, v)
    out = vcbench.attention(q, k, v, method, **opts)
    for b in range(B):
        one = {key: val[b : b + 1] for key, val in opts.items()}
        alone = vcbench.attention(q[b : b + 1], k[b : b + 1], v[b : b + 1], method, **one)
        assert torch.equal(out[b : b + 1], alone)
    assert not torch.equal(out[0], out[1])


def test_vsmooth_grouping_reads_any_layout(gen):
    v = torch.randn(B, H, N, D, generator=gen).bfloat16()
    ref = group(v, VSmoothConfig()).permutation
    strided = torch.stack([v.transpose(1, 2).contiguous()] * 3, dim=2).unbind(2)[1].transpose(1, 2)
    assert not strided.is_contiguous()
    assert torch.equal(group(strided, VSmoothConfig()).permutation, ref)

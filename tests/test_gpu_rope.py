"""RoPE fused into the Triton quantizers, on a GPU (skipped elsewhere): the 8-bit operands are
bit-equal to the emulation's (which rotates first, as diffusers does) on the same CUDA
tensors, the NVFP4 ones to the same preprocessing of eagerly rotated q and k (whose equality
with the emulation tests/test_nvfp4_prepare.py holds), and `attention(..., rope=...)` on every GPU backend gives the bits of rotating first
and calling it (a backend without the fusion is given q, k rotated: the same call)."""

import zlib

import pytest
import torch
from conftest import rope_with_junk
from test_gpu_kernels import assert_bit_equal, inputs

import vcbench
from vcbench.kernels import backends, get_method
from vcbench.kernels.backends.triton.operands import prepare_gpu
from vcbench.kernels.reference.engine import prepare
from vcbench.kernels.spec.rope import apply_rope

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not backends.triton_ready(),
                                                  reason="needs a CUDA GPU (sm_90+) and Triton")]
CASES = [("vc-8bit", {}), ("vc-8bit", {"hadamard_qk": False}), ("vc-8bit-vsmooth", {}),
         ("vc-8bit-vsmooth", {"hadamard_qk": False}), ("vc-8bit-fp8qk", {}),
         ("sage2-8bit", {}), ("fp8-fa4", {})]


def outlier_inputs(n, d, seed, dtype=torch.bfloat16):
    q, k, v = (x.clone().to(dtype) for x in inputs("outliers", n, d, seed))
    q[..., 7] *= 16
    k[..., 3] += 12
    return q, k, v, rope_with_junk(n, d, "cuda")


@pytest.mark.parametrize("method, options", CASES)
@pytest.mark.parametrize("n, d", [(4133, 128), (2048, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_rope_operands_equal_the_emulations(method, options, n, d, dtype):
    q, k, v, rope = outlier_inputs(n, d, zlib.crc32(f"rope{method}{options}{n}{d}".encode()), dtype)
    plan = get_method(method).plan(options)
    emu = prepare(q, k, v, plan, rope=rope)
    ops = prepare_gpu(q, k, v, plan, permutation=emu.permutation, rope=rope)
    assert_bit_equal(ops.q_scale, emu.q.scale, "Q scales")
    assert_bit_equal(ops.q, emu.q.codes, "Q codes")
    assert_bit_equal(ops.k_scale, emu.k.scale, "K scales")
    assert_bit_equal(ops.k, emu.k.codes, "K codes")
    assert_bit_equal(ops.v_scale, emu.v.scale, "V scales")
    assert_bit_equal(ops.v_t.transpose(-1, -2), emu.v.codes, "V codes")


NVFP4_FIELDS = ("q", "q_scale", "k", "k_scale", "v", "v_scale", "q_outer", "k_outer", "q_mean",
                "bias_q", "k_mean", "k_input")


@pytest.mark.parametrize("method, options", [("sage3-4bit", {}), ("vc-4bit", {}),
                                             ("vc-4bit", {"hadamard_qk": False}),
                                             ("attnqat-tf", {})])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_rope_nvfp4_operands_equal_rotating_first(method, options, dtype):
    from vcbench.kernels.backends.triton import nvfp4

    n, d = 4133, 128
    q, k, v, rope = outlier_inputs(n, d, zlib.crc32(f"nvfp4{method}{options}".encode()), dtype)
    plan = get_method(method).plan(options)
    perm = None if plan.vsmooth is None else vcbench.kernels.group(v, plan.vsmooth).permutation
    fused = nvfp4.prepare(q, k, v, plan, permutation=perm, rope=rope)
    eager = nvfp4.prepare(apply_rope(q, rope), apply_rope(k, rope), v, plan, permutation=perm)
    for name in NVFP4_FIELDS:
        a, b = getattr(fused, name), getattr(eager, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert_bit_equal(a, b, name)


@pytest.mark.parametrize("method", ["vc-8bit", "vc-8bit-vsmooth", "vc-8bit-fp8qk", "sage2-8bit",
                                    "fp8-fa4", "bf16", "vc-4bit", "sage3-4bit", "attnqat-tf"])
def test_every_gpu_backend_with_rope_is_rotate_then_run(method):
    q, k, v, rope = outlier_inputs(1000, 128, zlib.crc32(method.encode()))
    perm = {}
    if get_method(method).plan().vsmooth is not None:
        perm = {"permutation": vcbench.kernels.group(v, get_method(method).plan().vsmooth).permutation}
    want = vcbench.attention(apply_rope(q, rope), apply_rope(k, rope), v, method, backend="auto",
                             **perm)
    got = vcbench.attention(q, k, v, method, backend="auto", rope=(rope.cos, rope.sin), **perm)
    assert torch.equal(got, want)

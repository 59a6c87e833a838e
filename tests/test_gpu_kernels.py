"""GPU kernels against their emulation (runs on a CUDA machine; skipped elsewhere).

Tolerance rule, the same for every 8-bit kernel:
  - quantized operands (codes, scales, block means) are bit-equal to the emulation's, run on
    the same CUDA tensors;
  - the output is finite everywhere (it is poisoned with NaN first), within
    max(4e-3, 0.5 * e) relative L2 of the emulation's output, where e is the emulation's own
    error against FP64 (the kernel's exp2 is MUFU's approximation, so P codes may differ by
    one at rounding boundaries, and its FP8 MMA accumulates in the tensor core's own order
    and precision; measured up to 3.0e-3 on the outlier inputs);
  - and its own error against FP64 is within 1.25 e + 1e-3.
"""

import zlib

import pytest
import torch
from conftest import reference_attention, rel_l2

import vcbench
from vcbench.kernels import get_method, gpu
from vcbench.kernels.online import finish, prepare, run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu.triton_ready(),
                                                  reason="needs a CUDA GPU (sm_90+) and Triton")]
TRITON_METHODS = ["fp8-fa4", "sage2-8bit", "vc-8bit-vsmooth", "vc-8bit"]


def inputs(kind, n, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(1, 4, n, d, device="cuda", generator=g) for _ in range(3))
    if kind == "outliers":
        k = k + 3 * torch.randn(1, 4, 1, d, device="cuda", generator=g)
        rows = torch.randperm(n, device="cuda", generator=g)[: n // 50]
        v[:, :, rows] += 20 * torch.randn(1, 4, 1, d, device="cuda", generator=g)
    return tuple(x.bfloat16() for x in (q, k, v))


def assert_bit_equal(got, want, what):
    got = got.float()
    diff = (got != want).nonzero()
    assert diff.numel() == 0, (f"{what}: {len(diff)} of {want.numel()} differ, first at "
                               f"{diff[0].tolist()}: {got[tuple(diff[0])].item()} vs "
                               f"{want[tuple(diff[0])].item()}")


@pytest.mark.parametrize("method", TRITON_METHODS)
@pytest.mark.parametrize("n, d", [(1000, 128), (4133, 128), (2048, 64)])
@pytest.mark.parametrize("kind", ["normal", "outliers"])
def test_kernel_matches_emulation(method, n, d, kind):
    seed = zlib.crc32(f"{method}{n}{d}{kind}".encode())
    q, k, v = inputs(kind, n, d, seed)
    plan = get_method(method).plan()
    emu = prepare(q, k, v, plan)
    ops = gpu.prepare_gpu(q, k, v, plan, permutation=emu.permutation)
    assert_bit_equal(ops.q_scale, emu.q.scale, "Q scales")
    assert_bit_equal(ops.q, emu.q.codes, "Q codes")
    assert_bit_equal(ops.k_scale, emu.k.scale, "K scales")
    assert_bit_equal(ops.k, emu.k.codes, "K codes")
    assert_bit_equal(ops.v_scale, emu.v.scale, "V scales")
    if plan.vsmooth is not None:
        assert_bit_equal(ops.v_mean, emu.v_mean, "V block means")
    assert_bit_equal(ops.v_t.transpose(-1, -2), emu.v.codes, "V codes")

    out = torch.full_like(q, float("nan"))
    gpu.run_prepared(ops, plan, out)
    assert torch.isfinite(out).all()
    emu_out = finish(run(emu, plan)[0], n, plan)
    ref = reference_attention(q, k, v)
    e = rel_l2(emu_out, ref)
    assert rel_l2(out, emu_out) <= max(4e-3, 0.5 * e)
    assert rel_l2(out, ref) <= 1.25 * e + 1e-3


@pytest.mark.parametrize("method", ["bf16", *TRITON_METHODS])
def test_backend_gpu_through_the_public_api(method):
    q, k, v = inputs("normal", 3000, 128, 7)
    out = vcbench.attention(q, k, v, method, backend="gpu")
    nhd = vcbench.attention(*(x.transpose(1, 2) for x in (q, k, v)), method, backend="gpu",
                            tensor_layout="NHD")
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert rel_l2(out, nhd.transpose(1, 2)) < 1e-6 or method == "bf16"
    assert rel_l2(out, reference_attention(q, k, v)) < (0.01 if method == "bf16" else 0.08)
    auto = vcbench.attention(q, k, v, method, backend="auto")
    assert torch.equal(auto, out) or method == "bf16"


def test_auto_falls_back_to_emulation_for_options_without_a_kernel():
    q, k, v = inputs("normal", 512, 128, 11)
    auto = vcbench.attention(q, k, v, "sage2-8bit", backend="auto", accum="fp22")
    emulated = vcbench.attention(q, k, v, "sage2-8bit", backend="emulate", accum="fp22")
    assert torch.equal(auto, emulated)

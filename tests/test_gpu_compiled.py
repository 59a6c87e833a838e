"""The compiled sm_90a kernel against its emulation (a Hopper GPU and nvcc; skipped elsewhere).

Same tolerance rule as the Triton kernel (test_gpu_kernels.py): the output poisoned with NaN
first, then finite everywhere, within max(4e-3, 0.5 e) relative L2 of the emulation on the
same CUDA tensors and within 1.25 e + 1e-3 of FP64, e being the emulation's own error. The
operands are prepare_gpu's, already held bit-equal to the emulation's by test_gpu_kernels.py.
Fresh random and outlier-carrying inputs, N = 1000 and 4133 (a masked last KV tile; 8 and 33
tiles: V-Smooth's mean batches of 16 end part-way) and 8192.
"""

import os
import shutil
import zlib

import pytest
import torch
from conftest import reference_attention, rel_l2
from test_gpu_kernels import inputs

import vcbench
from vcbench.kernels import get_method, implementation
from vcbench.kernels.backends.sm90 import compiled
from vcbench.kernels.backends.triton.operands import prepare_gpu
from vcbench.kernels.reference.engine import finish, prepare, run


def _hopper_with_nvcc() -> bool:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        return False
    return shutil.which("nvcc") is not None or bool(os.environ.get("CUDA_HOME"))


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _hopper_with_nvcc(),
                                                  reason="needs an sm_90 GPU and nvcc")]


@pytest.fixture(scope="module")
def built():
    if compiled.load() is None:
        compiled.build()
    module = compiled.load()
    assert module is not None, compiled.status()
    return module


def check_against_emulation(q, k, v, method, options=None, out=None):
    m = get_method(method)
    plan = m.build(m.resolve(options or {}))
    n = q.shape[2]
    emu = prepare(q, k, v, plan)
    ops = prepare_gpu(q, k, v, plan, permutation=emu.permutation)
    out = torch.full_like(q, float("nan")) if out is None else out.fill_(float("nan"))
    compiled.run(ops, plan, out)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), f"{int((~torch.isfinite(out)).sum())} outputs not finite"
    emu_out = finish(run(emu, plan)[0], n, plan)
    ref = reference_attention(q, k, v)
    e = rel_l2(emu_out, ref)
    vs_emu, vs_ref = rel_l2(out, emu_out), rel_l2(out, ref)
    assert vs_emu <= max(4e-3, 0.5 * e), f"vs emulation {vs_emu:.3e} (e = {e:.3e})"
    assert vs_ref <= 1.25 * e + 1e-3, f"vs FP64 {vs_ref:.3e} (e = {e:.3e})"
    return ops, plan, out


@pytest.mark.parametrize("method", ["vc-8bit", "vc-8bit-vsmooth", "vc-8bit-fp8qk", "fp8-fa4"])
@pytest.mark.parametrize("n", [1000, 4133, 8192])
@pytest.mark.parametrize("kind", ["normal", "outliers"])
def test_compiled_matches_emulation(built, method, n, kind):
    q, k, v = inputs(kind, n, 128, zlib.crc32(f"sm90{method}{n}{kind}".encode()))
    check_against_emulation(q, k, v, method)


@pytest.mark.parametrize("method, options", [("sage2-8bit", {}),
                                             ("sage2-8bit", {"q_granularity": "block"}),
                                             ("vc-8bit", {"vsmooth": False}),
                                             ("vc-8bit-fp8qk", {"vsmooth": False}),
                                             ("vc-8bit", {"q_granularity": "block"}),
                                             ("fp8-fa4", {"hadamard_qk": True}),
                                             ("sage2-8bit", {"hadamard_qk": True}),
                                             ("vc-8bit", {"hadamard_qk": False}),
                                             ("vc-8bit-fp8qk", {"hadamard_qk": False})])
def test_other_plans_it_covers(built, method, options):
    q, k, v = inputs("outliers", 3001, 128, zlib.crc32(f"{method}{options}".encode()))
    check_against_emulation(q, k, v, method, options)


def test_batches_strided_fp16_output_and_repeatability(built):
    """B = 2, H = 3 (the (batch, head) index), an fp16 output written through a (B, N, H, D)
    buffer's strided view, and a second run bit-equal to the first (a race would move it)."""
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(2, 3, 777, 128, device="cuda", generator=g).half() for _ in range(3))
    buf = torch.empty(2, 777, 3, 128, device="cuda", dtype=torch.float16)
    ops, plan, out = check_against_emulation(q, k, v, "vc-8bit", out=buf.transpose(1, 2))
    first = out.clone()
    compiled.run(ops, plan, out)
    assert torch.equal(out, first)


def test_fp8_score_instances_take_e4m3_codes_and_a_zero_v_tile(built):
    """The FP8-score instances read the prepared E4M3 Q and K codes; a zero V
    tile (scale 0, fp8-fa4's per-tile V) leaves the output finite and that tile's keys count
    in the softmax's sum as in the emulation."""
    q, k, v = inputs("normal", 1500, 128, 11)
    v[:, :, 256:384] = 0  # one whole KV tile of zeros
    for method in ("fp8-fa4", "vc-8bit-fp8qk"):
        ops, plan, out = check_against_emulation(q, k, v, method)
        assert ops.q.dtype == ops.k.dtype == torch.float8_e4m3fn


def test_public_api_with_vcbench_kernel_sm90(built, monkeypatch):
    monkeypatch.setenv("VCBENCH_KERNEL", "sm90")
    assert implementation("vc-8bit") == compiled.IMPLEMENTATION
    assert implementation("fp8-fa4") == compiled.IMPLEMENTATION
    q, k, v = inputs("normal", 3000, 128, 7)
    out = vcbench.attention(q, k, v, "vc-8bit", backend="gpu")
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert rel_l2(out, reference_attention(q, k, v)) < 0.08


def test_describe_reports_no_local_memory(built):
    """Every compiled instance, the 8-bit and the NVFP4 ones, is free of local memory."""
    text = built.describe()
    lines = text.splitlines()
    assert len(lines) == len(compiled.INSTANCES) + len(compiled.NVFP4_INSTANCES), text
    assert sum(line.startswith("nvfp4 ") for line in lines) == len(compiled.NVFP4_INSTANCES), text
    assert all(" 0 B local" in line for line in lines), text


@pytest.mark.parametrize("method", ["vc-8bit", "vc-8bit-fp8qk"])
def test_timeit_times_a_v_smooth_methods_plain_steps_on_the_same_kernel(built, method, monkeypatch):
    """timeit's plain_ms is the kernel of the schedule's plain steps, on the compiled kernel as
    the grouping steps are (vc-8bit-fp8qk's ran on the Triton kernel before it had one)."""
    from vcbench.timing.timeit import Inputs, time_method

    monkeypatch.setenv("VCBENCH_KERNEL", "sm90")
    q, k, v = inputs("normal", 2048, 128, 17)
    row = time_method(method, Inputs(q, k, v, None, "test"), 0.2, 0.2)
    assert row["implementation"] == row["plain_implementation"] == compiled.IMPLEMENTATION
    assert row["plain_ms"] > 0 and row["attention_ms"] > 0 and row["plain_preprocess_ms"] > 0
    # the two kernels alternated in one window: distinct instances, a ratio of two medians
    assert 0.5 < row["plain_over_method"] < 2.0 and "plain_sm_mhz" in row


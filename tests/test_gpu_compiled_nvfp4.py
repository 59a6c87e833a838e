"""The compiled NVFP4 instances (sm90/csrc/nvfp4_*) against the emulation, on a Hopper GPU
with nvcc (skipped elsewhere).

The rule is the NVFP4 Triton kernel's (tests/test_gpu_nvfp4.py derives it): the output, into an
FP32 buffer filled with NaN first, finite everywhere, within nvfp4_kernel_tolerance(e) of the
emulation's output and within 1.05 e + 1e-4 of FP64, e being the emulation's own error. The
operands are nvfp4.prepare's, which test_gpu_nvfp4.py holds bit-equal to the emulation's; what
differs here is P's arithmetic, within the same mechanism the rule bounds (nvfp4_softmax.cuh
says how): p / s1 as one exp2 and x / microscale as a product by the reciprocal.
"""

import zlib

import pytest
import torch
from conftest import nvfp4_kernel_tolerance, reference_attention, rel_l2
from test_gpu_compiled import _hopper_with_nvcc
from test_gpu_nvfp4 import SAMPLE_ROWS, inputs

import vcbench
from vcbench.kernels import backends, get_method, implementation
from vcbench.kernels.backends.sm90 import SM90_NVFP4, compiled
from vcbench.kernels.reference.engine import finish, prepare, run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _hopper_with_nvcc(),
                                                  reason="needs an sm_90 GPU and nvcc")]
VARIANTS = [("sage3-4bit", {}), ("sage3-4bit", {"hadamard_qk": True}), ("vc-4bit", {}),
            ("vc-4bit", {"hadamard_qk": False}), ("vc-4bit", {"vsmooth": False}),
            ("attnqat-tf", {})]


@pytest.fixture(scope="module", autouse=True)
def built():
    if compiled.load() is None:
        compiled.build()
    assert compiled.load() is not None, compiled.status()


def variant_id(v):
    return v[0] + "".join(f"+{k}={val}" for k, val in v[1].items())


def check_against_emulation(q, k, v, plan, out_dtype=torch.float32):
    n = q.shape[-2]
    assert SM90_NVFP4.supports(plan, tuple(q.shape)) is None
    emu = prepare(q, k, v, plan)
    ops = SM90_NVFP4.prepare(q, k, v, plan, permutation=emu.permutation)
    out = torch.full(q.shape, float("nan"), dtype=out_dtype, device="cuda")
    SM90_NVFP4.run_prepared(ops, plan, out)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), f"{int((~torch.isfinite(out)).sum())} outputs not finite"
    emu_out = finish(run(emu, plan)[0], n, plan)
    rows = torch.arange(n, device="cuda")
    if n > SAMPLE_ROWS:
        rows = torch.linspace(0, n - 1, SAMPLE_ROWS, device="cuda").long()
    ref = reference_attention(q[:, :, rows], k, v)
    e = rel_l2(emu_out[:, :, rows], ref)
    dist = rel_l2(out.float(), emu_out)
    rounding = 0.0 if out_dtype == torch.float32 else 4e-3  # a 16-bit output's own rounding
    assert dist <= nvfp4_kernel_tolerance(e) + rounding, f"vs emulation {dist:.3e}, e = {e:.3e}"
    assert rel_l2(out[:, :, rows].float(), ref) <= 1.05 * e + 1e-4 + rounding
    return dist, e


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
@pytest.mark.parametrize("n", [100, 1000, 4133, 16384])
@pytest.mark.parametrize("kind", ["normal", "outliers", "synthetic"])
def test_compiled_nvfp4_matches_emulation(variant, n, kind):
    if kind == "synthetic" and n != 4133:
        pytest.skip("synthetic inputs at one length (their grid is built on the CPU)")
    method, opts = variant
    seed = zlib.crc32(f"sm90-{variant_id(variant)}{n}{kind}".encode())
    check_against_emulation(*inputs(kind, n, 128, seed), get_method(method).plan(opts))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_outputs_through_strides(dtype):
    """out written through its strides: NHD memory seen as HND."""
    q, k, v = inputs("outliers", 2500, 128, 3, heads=3)
    plan = get_method("vc-4bit").plan()
    emu = prepare(q, k, v, plan)
    ops = SM90_NVFP4.prepare(q, k, v, plan, permutation=emu.permutation)
    out = torch.full((1, 2500, 3, 128), float("nan"), dtype=dtype, device="cuda").transpose(1, 2)
    SM90_NVFP4.run_prepared(ops, plan, out)
    assert torch.isfinite(out).all()
    emu_out = finish(run(emu, plan)[0], 2500, plan)
    assert rel_l2(out.float(), emu_out) < 5e-3


def test_offsets_past_two_to_the_31_elements():
    """B*H*N*D = 17000 * 1024 * 128 > 2^31 elements: the last heads against their emulation."""
    heads, n, d = 17000, 1024, 128
    g = torch.Generator(device="cuda").manual_seed(31)
    q, k, v = (torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    plan = get_method("sage3-4bit").plan()
    ops = SM90_NVFP4.prepare(q, k, v, plan)
    out = torch.full_like(q, float("nan"))
    SM90_NVFP4.run_prepared(ops, plan, out)
    assert torch.isfinite(out).all()
    last = slice(heads - 2, heads)
    emu = prepare(q[:, last], k[:, last], v[:, last], plan)
    emu_out = finish(run(emu, plan)[0], n, plan)
    e = rel_l2(emu_out, reference_attention(q[:, last], k[:, last], v[:, last]))
    assert rel_l2(out[:, last].float(), emu_out) <= nvfp4_kernel_tolerance(e) + 4e-3


def test_nan_stays_in_its_batch_and_head():
    q, k, v = inputs("normal", 1000, 128, 17, heads=3)
    k = k.clone()
    k[0, 1, 500, 7] = float("nan")
    for method in ("vc-4bit", "attnqat-tf"):
        out = vcbench.attention(q, k, v, method, backend="gpu")
        assert torch.isnan(out[0, 1]).all()
        clean = vcbench.attention(q[:, [0, 2]], k[:, [0, 2]], v[:, [0, 2]], method, backend="gpu")
        if method != "vc-4bit":  # vc-4bit regroups per call: k-means ties may fall differently
            assert torch.equal(out[:, [0, 2]], clean)
        assert torch.isfinite(out[:, [0, 2]]).all()


@pytest.mark.parametrize("method", ["sage3-4bit", "vc-4bit", "attnqat-tf"])
def test_selected_on_hopper(method):
    assert implementation(method) == compiled.NVFP4_IMPLEMENTATION
    q, k, v = inputs("normal", 3000, 128, 7)
    out = vcbench.attention(q, k, v, method, backend="gpu")
    assert out.dtype == torch.bfloat16
    assert rel_l2(out, reference_attention(q, k, v)) < 0.25
    assert backends.select(get_method(method).plan(), (1, 2, 3000, 64)) is backends.NVFP4

"""The NVFP4 kernels (triton/nvfp4*.py) against their emulation, on a CUDA sm_90+ machine.

Tolerance rule, derived (not fitted; nothing here has been measured on a GPU yet):
  - every quantized operand (E2M1 codes, E4M3 microscales, FP32 outer scales, V-Smooth's FP16
    means, Q smoothing's block means) is bit-equal to the emulation's on the same CUDA tensors;
  - the output, written into an FP32 buffer filled with NaN first, is finite everywhere and
    within nvfp4_kernel_tolerance(e) = max(2e-4, 0.2 e) relative L2 of the emulation's output,
    e being the emulation's own error against FP64; and its own error against FP64 is within
    1.05 e + 1e-4.
Why 0.2 e. With bit-equal operands, every dequantized value is exact in FP16 and every product
exact in FP32, so the kernel and the emulation differ only in (a) the order and the tensor
core's internal rounding of the FP32 sums (QK over D, the bias over D, PV and the row sums
over a tile) and (b) exp2 (MUFU's ex2.approx, relative error ~2^-22, against torch's). Their
direct effect on O is ~1e-6 relative. The indirect one: a perturbation of relative size delta
of a P~ entry moves it across an E2M1 rounding boundary (or its group's amax across an E4M3
one) with probability at most ~10 delta (the boundaries sit at >= 1/4 of a value apart in
relative terms, 16 groups' worth for a microscale), and a crossing changes that entry's
P_q by one grid step where its quantization error was close to half a step. The mean squared
quantization error is step^2 / 12, so ||dP_q|| / ||P~ - P_q|| <= sqrt(12 * 10 delta), and the
output moves by that fraction of the emulation's probability error term, at most e. The scores
are sums of D <= 128 exact products in FP32; with a truncating tensor-core accumulator their
error is below D * 2^-23 of sum |q_i k_i|, i.e. delta <= 3e-4 on these inputs: sqrt(0.036) =
0.19. Under the interpreter (numpy sums, numpy exp2) the same mechanism gives <= 6e-5.
"""

import math
import zlib

import pytest
import torch
from conftest import nvfp4_kernel_tolerance, reference_attention, rel_l2

import vcbench
from vcbench.errors import UserError
from vcbench.kernels import backends, get_method, implementation, implementation_label
from vcbench.kernels.reference.engine import finish, prepare, run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not backends.triton_ready(),
                                                  reason="needs a CUDA GPU (sm_90+) and Triton")]
VARIANTS = [("sage3-4bit", {}), ("sage3-4bit", {"hadamard_qk": True}), ("vc-4bit", {}),
            ("vc-4bit", {"hadamard_qk": False}), ("attnqat-tf", {})]
SAMPLE_ROWS = 512  # FP64 reference rows at long N (an N x N FP64 matrix per head otherwise)


def variant_id(v):
    return v[0] + "".join(f"+{k}" for k in v[1])


def inputs(kind, n, d, seed, heads=2):
    """`normal`: random; `outliers`: what SageAttention's smoothing and V-Smooth are for, shared
    Q and K channel offsets and a few large V tokens; `synthetic`: the video-like tensors of
    analysis/synthetic.py (objects, a smooth field, V token spikes, Q/K channel biases)."""
    if kind == "synthetic":
        from vcbench.analysis.synthetic import synthetic_qkv

        t = synthetic_qkv(seed % 1000, heads=heads, grid=(-(-n // 1024), 32, 32), head_dim=d)
        return tuple(x[:, :, :n].cuda().contiguous() for x in (t.q, t.k, t.v))
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(1, heads, n, d, device="cuda", generator=g) for _ in range(3))
    if kind == "outliers":
        q = q + 2 * torch.randn(1, heads, 1, d, device="cuda", generator=g)
        k = k + 3 * torch.randn(1, heads, 1, d, device="cuda", generator=g)
        rows = torch.randperm(n, device="cuda", generator=g)[: n // 50]
        v[:, :, rows] += 20 * torch.randn(1, heads, 1, d, device="cuda", generator=g)
    return tuple(x.bfloat16() for x in (q, k, v))


def assert_bit_equal(got, want, what):
    if want is None:
        assert got is None, f"{what}: the kernel has one, the emulation none"
        return
    assert got is not None, f"{what}: missing"
    got = got.float().reshape(want.shape)
    diff = (got != want.float()).nonzero()
    assert diff.numel() == 0, (f"{what}: {len(diff)} of {want.numel()} differ, first at "
                               f"{diff[0].tolist()}: {got[tuple(diff[0])].item()} vs "
                               f"{want[tuple(diff[0])].item()}")


def assert_operands_equal(ops, emu):
    assert_bit_equal(ops.codes("q"), emu.q.codes, "Q codes")
    assert_bit_equal(ops.q_scale, emu.q.scale, "Q microscales")
    assert_bit_equal(ops.codes("k"), emu.k.codes, "K codes")
    assert_bit_equal(ops.k_scale, emu.k.scale, "K microscales")
    assert_bit_equal(ops.codes("v"), emu.v.codes, "V codes")
    assert_bit_equal(ops.v_scale, emu.v.scale, "V microscales")
    assert_bit_equal(ops.q_outer, emu.q.outer, "Q outer scale")
    assert_bit_equal(ops.k_outer, emu.k.outer, "K outer scale")
    assert_bit_equal(ops.v_outer, emu.v.outer, "V outer scale")
    assert_bit_equal(ops.v_mean, emu.v_mean, "V block means")
    assert_bit_equal(ops.q_mean, emu.q_mean, "Q block means")


def check_against_emulation(q, k, v, plan):
    """Operands bit-equal; the poisoned FP32 output within the rule. Returns the distances."""
    n = q.shape[-2]
    emu = prepare(q, k, v, plan)
    ops = backends.NVFP4.prepare(q, k, v, plan, permutation=emu.permutation)
    assert_operands_equal(ops, emu)
    out = torch.full(q.shape, float("nan"), dtype=torch.float32, device="cuda")
    backends.NVFP4.run_prepared(ops, plan, out)
    assert torch.isfinite(out).all(), "rows left unwritten (NaN) or non-finite"
    emu_out = finish(run(emu, plan)[0], n, plan)
    rows = torch.arange(n, device="cuda")
    if n > SAMPLE_ROWS:
        rows = torch.linspace(0, n - 1, SAMPLE_ROWS, device="cuda").long()
    ref = reference_attention(q[:, :, rows], k, v)
    e = rel_l2(emu_out[:, :, rows], ref)
    dist = rel_l2(out, emu_out)
    assert dist <= nvfp4_kernel_tolerance(e), f"kernel vs emulation {dist:.3e}, e = {e:.3e}"
    assert rel_l2(out[:, :, rows], ref) <= 1.05 * e + 1e-4
    return dist, e


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
@pytest.mark.parametrize("n", [1000, 4133, 16384])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("kind", ["normal", "outliers", "synthetic"])
def test_kernel_matches_emulation(variant, n, d, kind):
    if kind == "synthetic" and n != 4133:
        pytest.skip("synthetic inputs at one length (their grid is built on the CPU)")
    method, opts = variant
    seed = zlib.crc32(f"{variant_id(variant)}{n}{d}{kind}".encode())
    check_against_emulation(*inputs(kind, n, d, seed), get_method(method).plan(opts))


@pytest.mark.parametrize("opts", [{"block_m": 64, "block_n": 64}, {"block_m": 64},
                                  {"vsmooth": False}])
def test_other_tile_sizes_and_the_plain_host_kernel(opts):
    q, k, v = inputs("outliers", 3001, 128, 5)
    check_against_emulation(q, k, v, get_method("vc-4bit").plan(opts))


def test_strided_inputs_are_read_through_their_strides():
    """NHD memory seen as HND (what `tensor_layout="NHD"` hands the kernels)."""
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2)
               for x in inputs("outliers", 2500, 64, 9, heads=3))
    check_against_emulation(q, k, v, get_method("vc-4bit").plan())


def test_offsets_past_two_to_the_31_elements():
    """B*H*N*D = 17000 * 1024 * 128 > 2^31: the last heads' codes and outputs start past
    element 2^31 of every operand. Held to the emulation of those heads alone (heads are
    independent)."""
    heads, n, d = 17000, 1024, 128
    assert heads * n * d > 2**31
    g = torch.Generator(device="cuda").manual_seed(31)
    q, k, v = (torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    plan = get_method("sage3-4bit").plan()
    ops = backends.NVFP4.prepare(q, k, v, plan)
    out = torch.full_like(q, float("nan"))
    backends.NVFP4.run_prepared(ops, plan, out)
    assert torch.isfinite(out).all()
    last = slice(heads - 2, heads)
    emu = prepare(q[:, last], k[:, last], v[:, last], plan)
    codes = ops.codes("q", heads=last)  # (batch, head) rows of the operands: B = 1
    assert_bit_equal(codes, emu.q.codes, "Q codes of the last heads")
    assert_bit_equal(ops.codes("v", heads=last), emu.v.codes,
                     "V codes of the last heads")
    emu_out = finish(run(emu, plan)[0], n, plan)
    e = rel_l2(emu_out, reference_attention(q[:, last], k[:, last], v[:, last]))
    # bf16 output: its rounding (2^-9 relative, ~3e-3 in L2) comes on top of the rule
    assert rel_l2(out[:, last], emu_out) <= nvfp4_kernel_tolerance(e) + 4e-3


@pytest.mark.parametrize("method", ["sage3-4bit", "vc-4bit", "attnqat-tf"])
def test_backend_gpu_through_the_public_api(method, monkeypatch):
    monkeypatch.setenv("VCBENCH_KERNEL", "nvfp4")  # ahead of the compiled kernel, if built
    q, k, v = inputs("normal", 3000, 128, 7)
    assert implementation(method) == backends.NVFP4_IMPLEMENTATION
    out = vcbench.attention(q, k, v, method, backend="gpu")
    nhd = vcbench.attention(*(x.transpose(1, 2) for x in (q, k, v)), method, backend="gpu",
                            tensor_layout="NHD")
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    if method != "vc-4bit":  # vc-4bit regroups per call: k-means ties may fall differently
        assert rel_l2(out, nhd.transpose(1, 2)) < 1e-6
    assert rel_l2(out, reference_attention(q, k, v)) < 0.25
    auto = vcbench.attention(q, k, v, method, backend="auto")
    if method != "vc-4bit":
        assert torch.equal(auto, out)


def test_options_the_kernel_does_not_take_fall_back_with_the_reason():
    q, k, v = inputs("normal", 512, 64, 11)
    with pytest.warns(UserWarning, match="hadamard_v"):
        auto = vcbench.attention(q, k, v, "vc-4bit", backend="auto", hadamard_v=True,
                                 vsmooth_order="sequence")
    emulated = vcbench.attention(q, k, v, "vc-4bit", backend="emulate", hadamard_v=True,
                                 vsmooth_order="sequence")
    assert torch.equal(auto, emulated)
    with pytest.raises(UserError, match="hadamard_v"):
        vcbench.attention(q, k, v, "vc-4bit", backend="gpu", hadamard_v=True)


def test_methods_table_shows_the_kernel(monkeypatch):
    from vcbench.kernels import method_table

    monkeypatch.setenv("VCBENCH_KERNEL", "nvfp4")

    rows = {r["method"]: r for r in method_table()}
    for method in ("sage3-4bit", "vc-4bit", "attnqat-tf"):
        assert rows[method]["runs here"] == backends.NVFP4.aliases[0]


def test_run_records_name_the_fidelity_kernel(monkeypatch):
    monkeypatch.setenv("VCBENCH_KERNEL", "nvfp4")  # ahead of the compiled kernel, if built
    label = implementation_label
    assert label(get_method("sage3-4bit"), {}, "gpu", True) == backends.NVFP4_IMPLEMENTATION
    assert label(get_method("vc-4bit"), {"hadamard_qk": False}, "auto", True) == backends.NVFP4_IMPLEMENTATION
    assert label(get_method("vc-4bit"), {"hadamard_v": True}, "auto", True) == "emulate"
    assert label(get_method("attnqat-tf"), {}, "emulate", True) == "emulate"


def test_timeit_rows_carry_the_fidelity_label(monkeypatch):
    from vcbench.timing.timeit import Inputs, time_method

    monkeypatch.setenv("VCBENCH_KERNEL", "nvfp4")

    q, k, v = inputs("normal", 2048, 128, 13)
    row = time_method("sage3-4bit", Inputs(q, k, v, None, "test"), 0.2, 0.2)
    assert row["implementation"] == backends.NVFP4_IMPLEMENTATION
    assert row["attention_ms"] > 0 and math.isfinite(row["preprocess_ms"])

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
from vcbench.kernels import backends, get_method
from vcbench.kernels.backends.triton.operands import prepare_gpu
from vcbench.kernels.reference.engine import finish, prepare, run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not backends.triton_ready(),
                                                  reason="needs a CUDA GPU (sm_90+) and Triton")]
TRITON_METHODS = ["fp8-fa4", "sage2-8bit", "vc-8bit-vsmooth", "vc-8bit", "vc-8bit-fp8qk"]


@pytest.fixture(autouse=True)
def triton_kernel(monkeypatch):
    """These tests are the Triton kernel's, also where a compiled build exists (its own tests
    are tests/test_gpu_compiled.py)."""
    monkeypatch.setenv("VCBENCH_KERNEL", "triton")


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
    check_against_emulation(method, {}, *inputs(kind, n, d, seed))


# The QK Hadamard on and off against each method's default, on inputs whose Q and K carry the
# channel outliers a rotation spreads (the VC methods' default rotates; the baselines' is off).
HADAMARD_CASES = [("sage2-8bit", {"hadamard_qk": True}), ("fp8-fa4", {"hadamard_qk": True}),
                  ("sage2-8bit", {"hadamard_qk": True, "q_granularity": "block"}),
                  ("vc-8bit", {"hadamard_qk": False}), ("vc-8bit-fp8qk", {"hadamard_qk": False}),
                  ("vc-8bit", {}), ("vc-8bit-vsmooth", {}), ("vc-8bit-fp8qk", {})]


@pytest.mark.parametrize("method, options", HADAMARD_CASES)
@pytest.mark.parametrize("n, d", [(4133, 128), (2048, 64)])
def test_qk_hadamard_matches_emulation_on_channel_outliers(method, options, n, d):
    q, k, v = inputs("outliers", n, d, zlib.crc32(f"had{method}{options}{n}{d}".encode()))
    q, k = q.clone(), k.clone()
    q[..., 7] *= 16
    k[..., 3] += 12
    check_against_emulation(method, options, q, k, v)


def check_against_emulation(method, options, q, k, v):
    n = q.shape[-2]
    plan = get_method(method).plan(options)
    emu = prepare(q, k, v, plan)
    ops = prepare_gpu(q, k, v, plan, permutation=emu.permutation)
    assert_bit_equal(ops.q_scale, emu.q.scale, "Q scales")
    assert_bit_equal(ops.q, emu.q.codes, "Q codes")
    assert_bit_equal(ops.k_scale, emu.k.scale, "K scales")
    assert_bit_equal(ops.k, emu.k.codes, "K codes")
    assert_bit_equal(ops.v_scale, emu.v.scale, "V scales")
    if plan.vsmooth is not None:
        assert_bit_equal(ops.v_mean, emu.v_mean, "V block means")
    assert_bit_equal(ops.v_t.transpose(-1, -2), emu.v.codes, "V codes")

    out = torch.full_like(q, float("nan"))
    backends.TRITON.run_prepared(ops, plan, out)
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


def clustered_values(n, seed, clusters=12):
    """Value-like tokens: a few directions with different magnitudes, plus noise."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    centers = torch.randn(1, 4, clusters, 128, device="cuda", generator=g)
    centers *= torch.rand(1, 4, clusters, 1, device="cuda", generator=g) * 6
    pick = torch.randint(0, clusters, (n,), device="cuda", generator=g)
    return (centers[:, :, pick] + torch.randn(1, 4, n, 128, device="cuda", generator=g)).bfloat16()


def test_token_mean_gpu_is_bit_equal_to_the_emulation():
    from vcbench.kernels.backends.triton.quantize import token_mean_gpu
    from vcbench.kernels.reference.vsmooth import token_mean

    _, k, _ = inputs("outliers", 5021, 128, 3)
    want = token_mean(k.float()).reshape(4, 128)
    assert torch.equal(token_mean_gpu(k), want)


@pytest.mark.parametrize("n", [3000, 20011])
def test_kmeans_gpu_matches_the_torch_iterations(n):
    """Same seeding and Lloyd iterations; the 16-bit MMAs may only break near-ties apart (with
    32 centroids on 12 true clusters there are many). A flip moves its clusters' centroids, so
    they are not compared with torch's; instead each is held to what it must be whatever the
    ties: the mean of its members under the kernel's own labels one iteration earlier."""
    from vcbench.kernels.backends.triton.kmeans import kmeans_gpu
    from vcbench.kernels.reference.vsmooth import kmeans

    v = clustered_values(n, n)
    g = torch.Generator(device="cuda").manual_seed(n + 1)
    init = torch.randn(1, 4, 32, 128, device="cuda", generator=g) * 3
    want_labels, want_c = kmeans(v, 32, 6, init=init)
    labels, c = kmeans_gpu(v, 32, 6, init=init)
    assert labels.shape == want_labels.shape and labels.dtype == torch.long
    assert (labels == want_labels).float().mean() >= 0.995
    earlier, _ = kmeans_gpu(v, 32, 5, init=init)  # the labels c was computed from
    one_hot = torch.nn.functional.one_hot(earlier, 32).double()
    counts = one_hot.sum(-2)
    means = (one_hot.transpose(-1, -2) @ v.double()) / counts.clamp(min=1)[..., None]
    members = counts > 0  # an empty cluster keeps its previous centroid
    assert members.sum() >= 32  # (62 and 77 of the 128 at these seeds: the init is wide)
    assert (c.double() - means).abs().amax(-1)[members].max() <= 1e-3 * means.abs().max()

    def inertia(lab, cen):
        return ((v.float() - torch.gather(cen, 2, lab[..., None].expand(-1, -1, -1, 128))) ** 2).sum()

    assert inertia(labels, c) <= 1.001 * inertia(want_labels, want_c)


def test_group_takes_the_gpu_kmeans_for_16_bit_cuda_values():
    from vcbench.kernels import group
    from vcbench.kernels.reference.vsmooth import kmeans
    from vcbench.kernels.spec.vsmooth import VSmoothConfig

    v = clustered_values(4133, 5)
    g = group(v, VSmoothConfig())
    labels, _ = kmeans(v, 32, 10)
    # A permutation that sorts the GPU labels, and labels close to the torch run's.
    assert torch.equal(g.permutation.sort(-1).values, torch.arange(4133, device="cuda").expand(1, 4, -1))
    gpu_labels = torch.gather(labels, -1, g.permutation)
    assert g.centroids.shape == (1, 4, 32, 128)
    assert (gpu_labels.diff(dim=-1) >= 0).float().mean() >= 0.99


@pytest.mark.parametrize("method", ["sage2-8bit", "vc-8bit"])
def test_accumulation_holds_at_the_wan_sequence_length(method):
    """591 KV tiles (N = 75600, one head): the FP8 MMA's truncated accumulator drifts if tiles
    chain into one accumulator (measured 2.2e-2 from a two-level kernel at this N); the kernel's
    default two-level accumulation stays at the short-N distance from the emulation."""
    g = torch.Generator(device="cuda").manual_seed(75600)
    q, k, v = (torch.randn(1, 1, 75600, 128, device="cuda", generator=g).bfloat16() for _ in range(3))
    plan = get_method(method).plan()
    emu = prepare(q, k, v, plan)
    ops = prepare_gpu(q, k, v, plan, permutation=emu.permutation)
    out = torch.full_like(q, float("nan"))
    backends.TRITON.run_prepared(ops, plan, out)
    emu_out = finish(run(emu, plan)[0], 75600, plan)
    rows = torch.arange(0, 75600, 97, device="cuda")  # a sample of rows for the FP64 reference
    ref = reference_attention(q[:, :, rows], k, v)
    e = rel_l2(emu_out[:, :, rows], ref)
    assert torch.isfinite(out).all()
    assert rel_l2(out, emu_out) <= max(4e-3, 0.25 * e)

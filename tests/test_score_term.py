"""Q smoothing's score term for the compiled NVFP4 kernel (triton/nvfp4.py `score_term`):
bias_q . (K_in - mean_K) per (query block, key), one FP32 each, zero past the last key.

Against the emulation's own term (`engine.prepare`'s q_mean @ k_smooth^T, the product its
`score_bias_tile` takes a KV tile at a time) for sage3-4bit and vc-4bit, the QK Hadamard on
and off, through a permutation; and on direct inputs wide enough for several program tiles in
both directions (ragged query blocks, keys past n and past a tile), every (batch, head) with
its own K mean, against FP64 within the bound below. A NaN in one (batch, head)'s K stays
there. Under Triton's CPU interpreter (indexing, masks, padding); on a GPU the same checks run
on tensor cores, where the product is three TF32 products of the operands' split halves.

The bound: each term of the sum is the product of two FP32 numbers split into TF32 halves
(the lo.lo product dropped, the halves rounded: within 2^-20 of the term), summed in FP32
(within D 2^-24 of the sum of magnitudes, the worst case of any summation order): so within
(2^-20 + D 2^-24) sum_d |bias_q_d| |K_d - mean_d| of the FP64 product of the same FP32
centered keys. A wrong index or mask is off by the size of a term, not by that.
"""

import pytest

pytest.importorskip("triton", reason="needs Triton (its interpreter runs the kernels on CPU)")

from interpreted import INTERPRETED, rerun_interpreted  # noqa: E402


def within_bound(term, bias_q, centered):
    """term (BH, M, >= N) against the FP64 product of bias_q (BH, M, D) and centered (BH, N, D)
    (FP32): the largest excess over the bound (<= 0 passes)."""
    d = bias_q.shape[-1]
    exact = bias_q.double() @ centered.double().transpose(1, 2)
    magnitude = bias_q.double().abs() @ centered.double().abs().transpose(1, 2)
    err = (term[..., :centered.shape[1]].double() - exact).abs()
    return (err - (2.0**-20 + d * 2.0**-24) * magnitude).max().item()


def direct_inputs(bh, q_blocks, n, d, device, seed=0, dtype=None):
    """bias_q with a large shared offset and K (BF16 unless `dtype`) with a large shared mean
    (what centering is for), as the fields `score_term` reads."""
    import types

    import torch

    g = torch.Generator().manual_seed(seed)
    bias_q = (torch.randn(bh, q_blocks, d, generator=g) + 4 * torch.randn(bh, 1, d, generator=g))
    k = (torch.randn(bh, n, d, generator=g) + 8 * torch.randn(bh, 1, d, generator=g))
    k = k.to(dtype or torch.bfloat16)
    k_mean = k.double().mean(1).float()
    ops = types.SimpleNamespace(bias_q=bias_q.to(device), k_input=k.to(device),
                                k_mean=k_mean.to(device), n=n)
    return ops, (k.float() - k_mean[:, None]).to(device)


def check_direct(device):
    import torch

    # BF16 and FP16 K (exact in TF32: the uncentered form), FP32 K (the centered one)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        check_direct_one(device, dtype)


def check_direct_one(device, dtype):
    import math

    import torch

    from vcbench.kernels.backends.triton import nvfp4

    bm, keys = nvfp4.SCORE_BLOCK_M, nvfp4.SCORE_BLOCK_N * nvfp4.SCORE_TILES
    # query blocks past one program's and ragged; keys past one program's, the last program's
    # ending inside the padding (keys n .. nk_pad - 1) and past nk_pad
    bh, q_blocks, n, d = 3, bm + 6, keys + 22, 128
    nk_pad = math.ceil(n / 128) * 128
    ops, centered = direct_inputs(bh, q_blocks, n, d, device, dtype=dtype)
    term = nvfp4.score_term(ops, nk_pad)
    assert term.shape == (bh, q_blocks, nk_pad) and term.dtype == torch.float32
    assert within_bound(term, ops.bias_q, centered) <= 0
    assert (term[..., n:] == float("-inf")).all()  # the padded keys, masked
    # a NaN in one (batch, head)'s K: its keys' column is NaN there and nowhere else
    poisoned = ops.k_input.clone()
    poisoned[1, 7, 3] = float("nan")
    ops.k_input = poisoned
    bad = nvfp4.score_term(ops, nk_pad)
    assert torch.isnan(bad[1, :, 7]).all()
    assert not torch.isnan(bad[1, :, :7]).any() and not torch.isnan(bad[1, :, 8:]).any()
    assert torch.equal(bad[[0, 2]], term[[0, 2]])


CASES = [("sage3-4bit", {}, False), ("sage3-4bit", {"hadamard_qk": True}, False),
         ("vc-4bit", {}, True), ("vc-4bit", {"hadamard_qk": False}, True)]


def check_against_the_emulation(method, opts, permuted, device):
    import torch

    from vcbench.kernels import get_method
    from vcbench.kernels.backends.triton import nvfp4
    from vcbench.kernels.reference.engine import prepare

    b, h, n, d = 1, 2, 300, 128
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    q = (q + 2 * torch.randn(b, h, 1, d, generator=g)).bfloat16()
    k = (k + 3 * torch.randn(b, h, 1, d, generator=g)).bfloat16()
    v = v.bfloat16()
    perm = torch.stack([torch.randperm(n, generator=g) for _ in range(b * h)]).view(b, h, n)
    plan = get_method(method).plan(opts)
    call = {"permutation": perm} if permuted else {}
    mine = nvfp4.prepare(*(x.to(device) for x in (q, k, v)), plan,
                         **{key: t.to(device) for key, t in call.items()})
    nk_pad = mine.k.shape[1]
    term = nvfp4.score_term(mine, nk_pad).cpu()
    ref = prepare(q, k, v, plan, **call)
    emulated = (ref.q_mean @ ref.k_smooth.transpose(-1, -2)).reshape(b * h, -1, ref.k_smooth.shape[-2])
    n_emulated = min(emulated.shape[-1], n)
    centered = (mine.k_input.reshape(b * h, n, d).float() - mine.k_mean[:, None]).cpu()
    assert term.shape[:2] == emulated.shape[:2]
    assert within_bound(term, mine.bias_q.cpu(), centered) <= 0
    # the emulation's term is the same sum in another order and space (rotated means against
    # rotated keys): within twice the bound of each
    scale = (mine.bias_q.cpu().double().abs() @ centered.double().abs().transpose(1, 2))
    diff = (term[..., :n_emulated].double() - emulated[..., :n_emulated].double()).abs()
    assert (diff <= 2 * (2.0**-20 + 2 * d * 2.0**-24) * scale[..., :n_emulated] + 1e-6).all()
    assert (term[..., n:] == float("-inf")).all()  # the padded keys, masked


if not INTERPRETED:  # the driver: the checks below run in an interpreted subprocess
    from vcbench.kernels import backends

    def test_score_term_under_the_interpreter():
        rerun_interpreted(__file__, timeout=900)

    @pytest.mark.gpu
    @pytest.mark.skipif(not backends.triton_ready(), reason="needs a CUDA GPU (sm_90+) and Triton")
    def test_score_term_on_the_gpu_within_the_tf32x3_bound():
        check_direct("cuda")

    @pytest.mark.gpu
    @pytest.mark.skipif(not backends.triton_ready(), reason="needs a CUDA GPU (sm_90+) and Triton")
    @pytest.mark.parametrize("method, opts, permuted", CASES)
    def test_score_term_on_the_gpu_is_the_emulations(method, opts, permuted):
        check_against_the_emulation(method, opts, permuted, "cuda")

else:
    def test_score_term_tiles_masks_and_nan():
        check_direct("cpu")

    @pytest.mark.parametrize("method, opts, permuted", CASES)
    def test_score_term_is_the_emulations(method, opts, permuted):
        check_against_the_emulation(method, opts, permuted, "cpu")

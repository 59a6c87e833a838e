"""ExpCast-FP8: the byte map, the paper's worked example, and Proposition 3.1's bound."""

import math

import numpy as np
import pytest
import torch

from vcbench.analysis.expcast import analyze_expcast
from vcbench.kernels.spec.expcast import (
    exp_then_cast_value,
    expcast_code,
    expcast_code_from_scores,
    expcast_value,
)


def test_paper_worked_example():
    # u = -1.60: 8u + 119.65 = 106.85 -> byte 107 = 8*13 + 3 -> 2^6 * 1.375 = 88;
    # 2^(u+8) = 84.4 also rounds to 88 in the binade [64, 128).
    code = expcast_code(torch.tensor([-1.60]))
    assert code.item() == 107
    assert expcast_value(torch.tensor([-1.60])).item() == 88.0
    assert exp_then_cast_value(torch.tensor([-1.60])).item() == 88.0


def test_row_max_is_code_120_and_underflow_is_zero():
    assert expcast_code(torch.tensor([0.0])).item() == 120
    assert expcast_value(torch.tensor([0.0])).item() == 256.0
    assert expcast_code(torch.tensor([-16.0, -100.0, -math.inf])).tolist() == [0, 0, 0]


def test_dense_sampling_agrees_with_exact_analysis():
    # Independent of the exact breakpoint computation: sample many doublings densely.
    u = torch.linspace(-8, 0, 2_000_001, dtype=torch.float64)[:-1].float()
    a = expcast_code(u)
    c = exp_then_cast_value(u).to(torch.float8_e4m3fn).view(torch.uint8)
    agree = (a == c).double().mean().item()
    assert abs(agree - analyze_expcast()["byte_agreement"]) < 2e-3
    assert (a.int() - c.int()).abs().max().item() == 1


def test_paper_constants():
    r = analyze_expcast(-0.35)
    assert r["byte_agreement"] == pytest.approx(0.796, abs=5e-4)
    assert r["beta_minimax"] == pytest.approx(-0.3443, abs=5e-5)
    assert r["ratio_min"] == pytest.approx(0.9290, abs=5e-5)
    assert r["ratio_max"] == pytest.approx(1.0745, abs=1e-4)
    assert 0.0363 < r["tv_bound"] < 0.0364
    assert r["max_code_diff"] == 1
    assert r["max_rel_error"] == pytest.approx(0.0745, abs=1e-4)


def test_analysis_moves_with_beta():
    a, b = analyze_expcast(-0.35), analyze_expcast(-0.2)
    assert a["byte_agreement"] != b["byte_agreement"]
    assert a["ratio_max"] < b["ratio_max"]
    assert a["beta_minimax"] == b["beta_minimax"]  # a property of the format, not of beta


def test_ratio_range_holds_on_samples():
    r = analyze_expcast()
    u = torch.linspace(-14, 0, 100_001)[:-1]
    ratio = expcast_value(u).double() / torch.exp2(u.double() + 8)
    assert ratio.min() >= r["ratio_min"] - 1e-9 and ratio.max() <= r["ratio_max"] + 1e-9


def test_row_total_variation_below_bound(gen):
    # Proposition 3.1: rows in the normal range (u >= -14) stay within the TV bound.
    bound = analyze_expcast()["tv_bound"]
    u = -14 * torch.rand(2000, 256, generator=gen)
    u[:, 0] = 0
    p = torch.exp2(u.double())
    p_hat = expcast_value(u).double()
    p, p_hat = p / p.sum(1, keepdim=True), p_hat / p_hat.sum(1, keepdim=True)
    tv = 0.5 * (p - p_hat).abs().sum(1)
    assert tv.max().item() < bound
    # ...and the bound is not vacuous: endpoint reweighting gets close to it.
    assert np.isclose(bound, 0.0364, atol=1e-4)


# ---- ExpCast inside the engine ----------------------------------------------------------


def _engine_p_bytes(method, q, k, **options):
    """The E4M3 bytes of P the engine feeds the PV product on a single 128-key tile, read back
    through the engine's second accumulator (P_q times the exact V): with V the identity,
    that accumulator is P_q itself, row-normalised. The row maximum decodes to 2^8 under both
    encoders, so P_q / max(P_q) * 256 are the decoded bytes exactly (E4M3's spacing is far
    above the FP64 rounding of that division). Returns (bytes in the engine's key order, the operands)."""
    from vcbench.kernels import get_method
    from vcbench.kernels.reference.engine import prepare, run

    plan = get_method(method).plan(options)
    v = torch.eye(128, dtype=torch.float64).expand(q.shape[0], q.shape[1], 128, 128)
    ops = prepare(q, k, v, plan, keep_exact_v=True)
    _, mixed = run(ops, plan)
    # The engine permutes K and V together; exact V row j is the one-hot of token perm[j],
    # so column perm[j] of P_q V holds P_q's entry for the engine's key j.
    if ops.permutation is not None:
        mixed = torch.gather(mixed, -1, ops.permutation[..., None, :].expand_as(mixed))
    decoded = mixed / mixed.amax(-1, keepdim=True) * 256.0
    codes = decoded.to(torch.float8_e4m3fn)
    assert torch.allclose(codes.double(), decoded, rtol=1e-12, atol=0)  # each is an E4M3 value
    return codes.view(torch.uint8), ops


def _scores(ops):
    """The log2-domain score tile from the quantized operands, as one FP64 product."""
    return ops.q.dequantize() @ ops.k.dequantize().transpose(-1, -2) * ops.sm_scale_log2


def _qk(seed):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, 2, 128, 128, generator=g, dtype=torch.float64) * 1.5 for _ in range(2))
    return q, k


@pytest.mark.parametrize("beta", [-0.35, -0.1])
def test_vc_8bit_p_bytes_are_expcast_of_the_scores(beta):
    q, k = _qk(0)
    got, ops = _engine_p_bytes("vc-8bit", q, k, expcast_beta=beta)
    s = _scores(ops)
    # The kernel's form, t = S * 8 + (120 + beta - 8 m), on the independently computed scores
    want = expcast_code_from_scores(s, s.amax(-1, keepdim=True), beta)
    assert torch.equal(got, want)
    # The u form, t = 8 (S - m) + 120 + beta, is the same map but rounds in a different place:
    # the two can differ only where t lies within FP32 rounding of a half-integer.
    t = 8 * (s - s.amax(-1, keepdim=True)) + 120 + beta
    differ = got != expcast_code(s - s.amax(-1, keepdim=True), beta)
    assert ((t[differ] - t[differ].floor() - 0.5).abs() < 1e-4).all()
    # the tile spans the normal range and the underflow tail, so the bytes are not trivial
    assert (want == 120).any() and (want == 0).any() and ((want > 0) & (want < 120)).float().mean() > 0.5


def test_expcast_normalises_by_the_sum_of_its_decoded_bytes():
    """ExpCast has no FP32 probability: the row sum l is the sum of the decoded bytes, so the
    code error cancels in P_q / l and each output row of V = I sums to 1 (V = I is exact in
    per-channel E4M3). Exp-then-cast sums the FP32 exponentials before rounding: its rows
    miss 1 by the rounding error of P."""
    import vcbench

    q, k = _qk(2)
    v = torch.eye(128, dtype=torch.float64).expand(1, 2, 128, 128)
    sums = {m: vcbench.attention(q, k, v, m, vsmooth=False).sum(-1)
            for m in ("vc-8bit", "vc-8bit-vsmooth")}
    assert torch.allclose(sums["vc-8bit"], torch.ones_like(sums["vc-8bit"]), rtol=0, atol=1e-12)
    assert (sums["vc-8bit-vsmooth"] - 1).abs().max() > 1e-3


def test_vc_8bit_and_vc_8bit_vsmooth_differ_exactly_where_the_encodings_do():
    """The two methods share the QK path and V-Smooth; only P's encoding differs. Their P bytes
    must be ExpCast's and exp-then-cast's (E4M3 of 2^(u+8), by torch's own float8 cast), and
    differ exactly where those two do (about a fifth of the entries, Figure 5)."""
    q, k = _qk(1)
    a, ops_a = _engine_p_bytes("vc-8bit", q, k)
    b, ops_b = _engine_p_bytes("vc-8bit-vsmooth", q, k)
    assert torch.equal(ops_a.permutation, ops_b.permutation)
    s = _scores(ops_a)
    assert torch.equal(s, _scores(ops_b))
    u = s - s.amax(-1, keepdim=True)
    expcast = expcast_code(u)
    cast = torch.exp2(u + 8.0).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(a, expcast) and torch.equal(b, cast)
    differ = a != b
    assert torch.equal(differ, expcast != cast)
    assert 0.05 < differ.double().mean().item() < 0.5

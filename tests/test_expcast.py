"""ExpCast-FP8: the byte map, the paper's worked example, and Proposition 3.1's bound."""

import math

import numpy as np
import pytest
import torch

from vcbench.analysis.expcast import analyze_expcast
from vcbench.kernels.expcast import exp_then_cast_value, expcast_code, expcast_value


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

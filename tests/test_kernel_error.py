"""`analyze kernel-error`: Equation 2's split of a method's output error,

    O - O_q = (P - P_q) V + P_q (V - V_q),

held against what each term must be: the value term vanishes when V is exact in the method's
format, the two terms bound the total (triangle inequality), and the probability term is the
distance of an independently computed P_q V from the exact output.
"""

import math

import pytest
import torch
from conftest import reference_attention

from vcbench.analysis.kernel_error import method_error
from vcbench.analysis.synthetic import synthetic_qkv
from vcbench.kernels import METHODS, get_method
from vcbench.kernels.reference.engine import prepare


def _qkv(n=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, 64, generator=g, dtype=torch.float64) for _ in range(3))
    return q, k + 2 * torch.randn(1, 2, 1, 64, generator=g, dtype=torch.float64), v


def _e4m3_values(shape, g):
    """Random values on the E4M3 grid with 448 (the format's largest) in every 128-row block:
    fp8-fa4's per-block V scale is then 1 and V is exact in its format."""
    codes = torch.randint(0, 126, shape, generator=g, dtype=torch.uint8)  # finite, <= 448
    v = codes.view(torch.float8_e4m3fn).double() * torch.where(
        torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).double()
    v[..., ::128, 0] = 448.0
    return v


def test_value_term_vanishes_when_v_is_exact():
    g = torch.Generator().manual_seed(1)
    q, k, _ = _qkv(256)
    v = _e4m3_values((1, 2, 256, 64), g)
    row = method_error(q, k, v, "fp8-fa4")
    assert row["value_term"] < 1e-12
    assert row["prob_term"] > 1e-3  # P is still E4M3: the whole error is the probability term
    assert row["prob_term"] == pytest.approx(row["rel_l2"], rel=1e-9)


@pytest.mark.parametrize("method", ["fp8-fa4", "sage2-8bit"])
def test_the_terms_are_an_independent_p_q_v_against_the_exact_output(method):
    """One 128-key tile in FP64: from the method's quantized Q and K, P_q = E4M3(2^(u + log2
    448)) by torch's float8 cast, l the sum of the unrounded exponentials (exp-then-cast keeps
    its FP32 probabilities for the row sum); P_q V / l is the mixed output, P_q V_q / l the
    method's. The probability term is ||P_q V / l - O||, the value term ||P_q (V_q - V) / l||,
    both over ||O||."""
    q, k, v = _qkv(128, seed=2)
    ops = prepare(q, k, v, get_method(method).plan())
    s = ops.q.dequantize() @ ops.k.dequantize().transpose(-1, -2)
    p = torch.exp2(s - s.amax(-1, keepdim=True) + math.log2(448.0))
    p_q = p.to(torch.float8_e4m3fn).double()
    row_sum = p.sum(-1, keepdim=True)
    mixed = p_q @ v / row_sum
    out = p_q @ ops.v.dequantize() / row_sum
    ref = reference_attention(q, k, v)
    row = method_error(q, k, v, method)
    assert row["prob_term"] == pytest.approx(((mixed - ref).norm() / ref.norm()).item(), rel=1e-9)
    assert row["value_term"] == pytest.approx(((out - mixed).norm() / ref.norm()).item(), rel=1e-9)
    assert row["rel_l2"] == pytest.approx(((out - ref).norm() / ref.norm()).item(), rel=1e-9)
    assert row["value_term"] > 1e-3 and row["prob_term"] > 1e-3


def test_the_two_terms_bound_the_total_for_every_method():
    t = synthetic_qkv(0, heads=1, grid=(2, 8, 16), head_dim=64)
    q, k, v = (x.double() for x in (t.q, t.k, t.v))
    for method in METHODS.builtin_names():
        row = method_error(q, k, v, method, grid=t.grid)
        assert row["rel_l2"] <= row["prob_term"] + row["value_term"] + 1e-12, method
        assert row["value_share"] == pytest.approx(
            row["value_term"] / (row["prob_term"] + row["value_term"]), rel=1e-12)
        if method != "bf16":
            assert row["prob_term"] > 0 and row["value_term"] > 0, method

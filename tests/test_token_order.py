"""`analyze token-order` (Table 1, Figure 4): the value error, block-energy share and
reconstruction of each token order, against the procedure written out here in FP64 from the
paper's description (Equations 4 and 5, per-channel E4M3 V at 8 bits, 128-row blocks)."""

import math

import pytest
import torch

from vcbench.analysis.synthetic import synthetic_qkv
from vcbench.analysis.token_order import order_row, token_order_table
from vcbench.kernels.reference.vsmooth import group
from vcbench.kernels.spec.vsmooth import VSmoothConfig

ROWS = 128


def _e4m3(x):
    return x.clamp(-448, 448).to(torch.float8_e4m3fn).double()


def _sylvester(d):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def reconstruct(v, demean):
    """V (B, H, N, D) -> what the 8-bit value operand reconstructs, in FP64.

    Without demeaning: per-channel E4M3 with scale amax / 448. With it: each block of 128
    consecutive tokens (the last one partial) loses its mean; the channel scale is fixed from
    that residual; the mean is stored as FP16 in units of the scale; the residual is taken
    against the mean as restored and cast to E4M3; the restored mean is added back.
    """
    v = v.double()
    n = v.shape[-2]
    blocks = [slice(s, min(s + ROWS, n)) for s in range(0, n, ROWS)]
    if not demean:
        scale = v.abs().amax(-2, keepdim=True) / 448
        return _e4m3(v / scale) * scale
    mean = torch.zeros_like(v)
    for b in blocks:
        mean[..., b, :] = v[..., b, :].mean(-2, keepdim=True)
    scale = (v - mean).abs().amax(-2, keepdim=True) / 448
    scale = torch.where(scale > 0, scale, 1.0)
    restored = (mean / scale).half().double() * scale
    return _e4m3((v - restored) / scale) * scale + restored


def energy_share(v):
    """Mean over (batch, head, block) of rows * ||mu_j||^2 / ||V_j||_F^2 (Equation 5)."""
    v = v.double()
    shares = []
    for bh in v.reshape(-1, *v.shape[-2:]):
        for s in range(0, bh.shape[0], ROWS):
            block = bh[s:s + ROWS]
            shares.append(block.shape[0] * block.mean(0).pow(2).sum() / block.pow(2).sum())
    return torch.stack(shares).mean().item()


def _value_error(v, demean):
    return ((reconstruct(v, demean) - v.double()).norm() / v.double().norm()).item()


@pytest.fixture(scope="module")
def video_v():
    t = synthetic_qkv(0, heads=2, grid=(3, 8, 16), head_dim=64)  # 384 tokens
    # 300 tokens: the last block is partial; the first 256 are frames 0-1 of the grid, the rest
    # a tail that the cube order keeps at the end
    return t.v[..., :300, :].float(), (2, 8, 16)


@pytest.mark.parametrize("hadamard_v", [False, True])
def test_sequence_and_none_rows_against_the_written_out_procedure(video_v, hadamard_v):
    v, _ = video_v
    ref_v = v.double() @ _sylvester(v.shape[-1]) if hadamard_v else v.double()
    seq = order_row(v, "sequence", hadamard_v)
    none = order_row(v, "none", hadamard_v)
    assert seq["value_error"] == pytest.approx(_value_error(ref_v, True), rel=1e-4)
    assert none["value_error"] == pytest.approx(_value_error(ref_v, False), rel=1e-4)
    assert seq["energy_share"] == pytest.approx(energy_share(ref_v), rel=1e-5)
    assert none["energy_share"] == 0.0
    # demeaning is what lowers the error on these tensors (they carry per-object value means)
    assert seq["value_error"] < none["value_error"]


def test_kmeans_row_is_the_procedure_on_its_permuted_v(video_v):
    v, grid = video_v
    perm = group(v, VSmoothConfig(order="kmeans", clusters=8, iters=4)).permutation
    permuted = torch.gather(v.double(), -2, perm[..., None].expand(v.shape))
    row = order_row(v, "kmeans", False, grid, clusters=8, iters=4)
    assert row["value_error"] == pytest.approx(_value_error(permuted, True), rel=1e-4)
    assert row["energy_share"] == pytest.approx(energy_share(permuted), rel=1e-5)
    # grouping tokens of one object into a block is what raises the share its mean removes
    assert row["energy_share"] > order_row(v, "sequence", False)["energy_share"]


def test_table_lists_every_order_with_and_without_rotation(video_v):
    v, grid = video_v
    table = token_order_table(v, grid=grid, clusters=8, iters=2)
    assert list(zip(table.order, table.hadamard_v, strict=True)) == [
        (o, h) for o in ("none", "kmeans", "sequence", "cube", "balanced") for h in (False, True)]
    base = table[(table.order == "sequence") & ~table.hadamard_v].value_error.iloc[0]
    assert table.error_vs_sequence.tolist() == pytest.approx((table.value_error / base - 1).tolist())
    cube = table[(table.order == "cube") & ~table.hadamard_v].iloc[0]
    from vcbench.kernels.reference.vsmooth import cube_keys

    perm = torch.argsort(cube_keys(grid, (2, 8, 8), 300), stable=True)
    assert cube.value_error == pytest.approx(_value_error(v.double()[..., perm, :], True), rel=1e-4)

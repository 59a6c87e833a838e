"""`vcbench analyze token-order`: paper Table 1 and Figure 4.

For each token order V-Smooth can use (and with or without a Hadamard rotation of V), the
value operand is permuted, cut into the kernel's 128-row blocks, demeaned and quantized with
the 8-bit V quantizer (per-channel E4M3). Reported per order:

    value_error   ||V_q - V'||_F / ||V'||_F of the reconstructed value operand
    energy_share  mean over blocks of rows * ||mu_j||^2 / ||V'_j||^2 (Equation 5)
    group_s       wall time of computing the order (CPU or GPU as the tensors lie)

`none` is the baseline without demeaning (sequence order, plain per-channel E4M3).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pandas as pd
import torch

from vcbench.kernels.reference.engine import pad_tokens
from vcbench.kernels.reference.vsmooth import (
    block_energy_share,
    demean_and_quantize,
    group,
    permute_tokens,
)
from vcbench.kernels.spec.formats import E4M3
from vcbench.kernels.spec.granularity import PerChannel, Quantizer
from vcbench.kernels.spec.rotation import rotate
from vcbench.kernels.spec.vsmooth import ORDERS, VSmoothConfig

BLOCK_ROWS = 128
V_QUANTIZER = Quantizer(E4M3, PerChannel())


def order_row(v: torch.Tensor, order: str, hadamard_v: bool, grid=None, clusters: int = 32,
              iters: int = 10) -> dict:
    v = v.float()
    n = v.shape[-2]
    if hadamard_v:
        v = rotate(v)
    start = time.perf_counter()
    if order == "none":
        permuted = v
    else:
        config = VSmoothConfig(order=order, clusters=clusters, iters=iters, block_rows=BLOCK_ROWS)
        permuted = permute_tokens(v, group(v, config, grid=grid).permutation)
    if v.is_cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    padded = pad_tokens(permuted, BLOCK_ROWS)
    if order == "none":
        q = V_QUANTIZER(padded)
        recon = q.dequantize()
        share = torch.zeros(1)
    else:
        q, mean = demean_and_quantize(padded, V_QUANTIZER, BLOCK_ROWS, n)
        epi = q.epilogue_scale()
        recon = q.dequantize() + (mean * epi).repeat_interleave(BLOCK_ROWS, dim=-2)
        share = block_energy_share(padded, BLOCK_ROWS, n)
    err = (recon[..., :n, :] - permuted).norm() / permuted.norm()
    return {"order": order, "hadamard_v": hadamard_v, "value_error": err.item(),
            "energy_share": share.float().mean().item(), "group_s": elapsed}


def token_order_table(v: torch.Tensor, grid=None, orders: Sequence[str] | None = None,
                      clusters: int = 32, iters: int = 10, progress=None) -> pd.DataFrame:
    if orders is None:
        orders = ["none"] + [o for o in ORDERS if o != "cube" or grid is not None]
    rows = []
    for order in orders:
        for hadamard_v in (False, True):
            rows.append(order_row(v, order, hadamard_v, grid, clusters, iters))
            if progress is not None:
                progress()
    table = pd.DataFrame(rows)
    base = table[(table.order == "sequence") & (~table.hadamard_v)]
    if len(base):
        table["error_vs_sequence"] = table.value_error / base.value_error.iloc[0] - 1.0
    return table

"""Device check: Q smoothing's score term (`triton.nvfp4.score_term`) at the Wan2.2 shape
(40 heads x 591 query blocks x 75600 keys, D 128), over its tile choices and two forms:

  tf32x3   the kernel as shipped: Triton's tf32x3 dot, which splits both operands in two
           TF32 halves at every key tile
  split    the same three TF32 products written out, the query-block means split once a
           program (they are loop-invariant) and only the key tile split per tile

Each configuration: within the tests' tf32x3 bound of the FP64 product on 2 heads, and its
CUPTI time a call. The winner becomes SCORE_* and the form of nvfp4.py; this script goes once it has run.

    PYTHONPATH=$PWD python3 benchmarks/checks/score_term_sweep.py [--seconds W,S]
"""

from __future__ import annotations

import argparse
import sys
import types

import torch
import triton
import triton.language as tl

from vcbench.kernels.backends.triton import nvfp4
from vcbench.timing.cupti import time_kernels


@triton.jit
def _tf32_halves(x):
    """x = big + small, big x rounded to TF32 (10 mantissa bits, to nearest, ties away)."""
    big = ((x.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return big, x - big


@triton.jit
def _score_term_split(BiasQ, KIn, KMean, Out, n, nk_pad, q_blocks, key_chunks, m_tiles,
                      D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, TILES: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    chunk = pid % key_chunks
    bh = pid // key_chunks // m_tiles
    blocks = (pid // key_chunks % m_tiles) * BM + tl.arange(0, BM)
    cols = tl.arange(0, D)
    in_m = blocks < q_blocks
    means = tl.load(BiasQ + (bh * q_blocks + blocks)[:, None] * D + cols[None, :],
                    mask=in_m[:, None], other=0.0)
    m_big, m_small = _tf32_halves(means)
    k_mean = tl.load(KMean + bh * D + cols)
    for t in range(TILES):
        keys = (chunk * TILES + t) * BN + tl.arange(0, BN)
        real = keys < n
        k = tl.load(KIn + (bh * n + keys)[:, None] * D + cols[None, :], mask=real[:, None],
                    other=0.0)
        centered = tl.where(real[:, None], k.to(tl.float32) - k_mean[None, :], 0.0)
        k_big, k_small = _tf32_halves(tl.trans(centered))
        term = tl.dot(m_small, k_big, input_precision="tf32")
        term = tl.dot(m_big, k_small, term, input_precision="tf32")
        term = tl.dot(m_big, k_big, term, input_precision="tf32")
        tl.store(Out + (bh * q_blocks + blocks)[:, None] * nk_pad + keys[None, :], term,
                 mask=in_m[:, None] & (keys < nk_pad)[None, :])


KERNELS = {"tf32x3": nvfp4._score_term, "split": _score_term_split}
# (BM, BN, TILES, warps, stages); the first is what nvfp4.py shipped (timed in two calls on the
# H200, 2026-12-04: the first eight, then the rest around the fastest)
CONFIGS = [(64, 64, 8, 8, 2), (64, 64, 8, 8, 1), (64, 64, 8, 8, 3), (64, 128, 4, 8, 2),
           (64, 32, 16, 4, 2), (64, 64, 8, 4, 2), (128, 64, 8, 8, 2), (128, 32, 8, 8, 2),
           (128, 64, 8, 8, 1), (128, 64, 16, 8, 2), (128, 128, 4, 8, 1), (128, 32, 16, 4, 2),
           (128, 64, 8, 4, 2), (192, 64, 8, 8, 1), (256, 32, 8, 8, 1), (128, 64, 4, 8, 2)]


def run(kernel, cfg, ops, out, nk_pad):
    bm, bn, tiles, warps, stages = cfg
    bh, q_blocks, d = ops.bias_q.shape
    key_chunks, m_tiles = triton.cdiv(nk_pad, bn * tiles), triton.cdiv(q_blocks, bm)
    kernel[(bh * m_tiles * key_chunks,)](
        ops.bias_q, ops.k_input, ops.k_mean, out, ops.n, nk_pad, q_blocks, key_chunks, m_tiles,
        D=d, BM=bm, BN=bn, TILES=tiles, num_warps=warps, num_stages=stages)


def excess(term, ops, heads=2):
    """The largest excess over the tests' bound (<= 0 passes) on the first `heads` heads."""
    d = ops.bias_q.shape[-1]
    b = ops.bias_q[:heads].double()
    c = (ops.k_input[:heads].float() - ops.k_mean[:heads, None]).double()
    exact, mag = b @ c.transpose(1, 2), b.abs() @ c.abs().transpose(1, 2)
    err = (term[:heads, :, :ops.n].double() - exact).abs()
    return (err - (2.0**-20 + d * 2.0**-24) * mag).max().item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", default="0.3,0.7")
    w, s = (float(x) for x in ap.parse_args().seconds.split(","))
    bh, q_blocks, n, d = 40, 591, 75600, 128
    nk_pad = triton.cdiv(n, 128) * 128
    g = torch.Generator(device="cuda").manual_seed(0)
    bias_q = torch.randn(bh, q_blocks, d, device="cuda", generator=g) \
        + 4 * torch.randn(bh, 1, d, device="cuda", generator=g)
    k = (torch.randn(bh, n, d, device="cuda", generator=g)
         + 8 * torch.randn(bh, 1, d, device="cuda", generator=g)).bfloat16()
    ops = types.SimpleNamespace(bias_q=bias_q, k_input=k, k_mean=k.double().mean(1).float(), n=n)
    out = torch.empty(bh, q_blocks, nk_pad, device="cuda")
    print(f"{torch.cuda.get_device_name()}; score term B*H {bh}, {q_blocks} query blocks, "
          f"{n} keys, D {d}; {out.numel() * 4 / 1e9:.1f} GB written a call")
    print(f"{'form':7s} {'BM':>4s} {'BN':>4s} {'tiles':>5s} {'warps':>5s} {'stages':>6s} "
          f"{'excess':>10s} {'ms':>8s}  note")
    for name, kernel in KERNELS.items():
        for cfg in CONFIGS:
            try:
                out.fill_(float("nan"))
                run(kernel, cfg, ops, out, nk_pad)
                bad = excess(out, ops)
                t = time_kernels(lambda k=kernel, c=cfg: run(k, c, ops, out, nk_pad), w, s, min_calls=3)
                print(f"{name:7s} {cfg[0]:4d} {cfg[1]:4d} {cfg[2]:5d} {cfg[3]:5d} {cfg[4]:6d} "
                      f"{bad:10.2e} {t.per_call_ms():8.3f}  {'ok' if bad <= 0 else 'OVER BOUND'}",
                      flush=True)
            except Exception as err:  # noqa: BLE001 - a config past the shared memory: say so
                print(f"{name:7s} {cfg}  failed: {str(err).splitlines()[0][:80]}", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()

"""V-Smooth's k-means on the GPU: `vsmooth.kmeans`'s Lloyd iterations, one pass over V each.

The torch version materialises a (B, H, N, k) distance matrix and a one-hot matrix of the
same size per iteration (and its caller used to copy V to FP32 first): ~70 ms per Wan call.
Here one kernel per iteration reads the 16-bit V tile by tile and does all of it on chip:

    dots   = x c_hi^T + x c_lo^T          two 16-bit MMAs: c = c_hi + c_lo keeps ~16 bits of
                                          each FP32 centroid, x is exact in 16 bits
    label  = argmin_j ||c_j||^2 - 2 dots  (||x||^2 is the same for every j)
    sums  += onehot(label)^T x            one more MMA; counts from the one-hot's column sums

Each program owns TILES tiles of BLOCK tokens of one (batch, head) and writes one partial
(k, D) sum and (k,) count; torch adds the partials in a fixed order, so a run is
deterministic. Same seeding, iteration count and empty-cluster rule as the torch version;
labels can differ from it only where two centroids are within the MMA's rounding of a tie.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vcbench.kernels.backends.triton.quantize import program
from vcbench.kernels.reference.vsmooth import group, initial_centroids

BLOCK = 128
TILES = 8  # 1024 tokens per program: partial sums stay small (Wan: 74 x 40 programs)


@triton.jit
def _assign(X, CHi, CLo, CNorm, Labels, Sums, Counts, n, n_chunks, stride_b, stride_h,
            stride_n, H, K: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
            TILES: tl.constexpr, ACCUMULATE: tl.constexpr):
    # 1-D grid (bh * n_chunks + chunk), 64-bit offsets: V of a 1080p call passes 2^31 elements.
    chunk, bh = program(n_chunks)
    b = bh // H
    h = bh % H
    base = X + b * stride_b + h * stride_h
    ks = tl.arange(0, K)
    cols = tl.arange(0, D)
    c_off = bh * K * D + ks[:, None] * D + cols[None, :]
    c_hi = tl.load(CHi + c_off)
    c_lo = tl.load(CLo + c_off)
    c_norm = tl.load(CNorm + bh * K + ks)
    sums = tl.zeros([K, D], tl.float32)
    counts = tl.zeros([K], tl.int32)
    for t in range(TILES):
        rows = (chunk * TILES + t) * BLOCK + tl.arange(0, BLOCK)
        valid = rows < n
        x = tl.load(base + rows.to(tl.int64)[:, None] * stride_n + cols[None, :],
                    mask=valid[:, None], other=0.0)
        dots = tl.dot(x, tl.trans(c_hi)) + tl.dot(x, tl.trans(c_lo))
        label = tl.argmin(c_norm[None, :] - 2.0 * dots, 1)
        tl.store(Labels + bh * n + rows, label, mask=valid)
        if ACCUMULATE:
            hit = (label[:, None] == ks[None, :]) & valid[:, None]
            sums = tl.dot(tl.trans(hit.to(x.dtype)), x, sums)
            counts += tl.sum(hit.to(tl.int32), 0)
    if ACCUMULATE:
        part = bh * n_chunks + chunk
        tl.store(Sums + part * K * D + ks[:, None] * D + cols[None, :], sums)
        tl.store(Counts + part * K + ks, counts)


def takes(x: torch.Tensor, k: int) -> bool:
    """Whether `kmeans_gpu` runs these values: 16-bit CUDA, k a power of two >= 16 (the MMA's
    smallest side), at least k tokens, head dim 64 or 128."""
    return (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and k >= 16
            and k & (k - 1) == 0 and x.shape[-2] >= k and x.shape[-1] in (64, 128))


def grouping(v: torch.Tensor, config, grid=None, init=None):
    """`reference.vsmooth.group` with this k-means where it takes the values, else torch's."""
    fn = kmeans_gpu if takes(v, config.clusters) else None
    return group(v, config, grid=grid, init=init, kmeans_fn=fn)


def kmeans_gpu(x: torch.Tensor, k: int, iters: int, init: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, H, N, D) bf16/fp16 on CUDA -> labels (B, H, N) int64, centroids (B, H, k, D) FP32."""

    b, h, n, d = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    c = initial_centroids(x, k) if init is None else init.float().clone()
    n_chunks = triton.cdiv(n, BLOCK * TILES)
    labels = torch.empty(b, h, n, device=x.device, dtype=torch.int32)
    sums = torch.empty(b * h, n_chunks, k, d, device=x.device, dtype=torch.float32)
    counts = torch.empty(b * h, n_chunks, k, device=x.device, dtype=torch.int32)
    for it in range(iters + 1):
        c = c.contiguous()
        c_hi = c.to(x.dtype)
        c_lo = (c - c_hi.float()).to(x.dtype)
        last = it == iters  # the last pass only labels
        _assign[(n_chunks * b * h,)](
            x, c_hi, c_lo, (c * c).sum(-1).contiguous(), labels, sums, counts, n, n_chunks,
            x.stride(0), x.stride(1), x.stride(2), h, K=k, D=d, BLOCK=BLOCK, TILES=TILES,
            ACCUMULATE=not last, num_warps=4)
        if last:
            break
        total = counts.sum(1).reshape(b, h, k)
        mean = sums.sum(1).reshape(b, h, k, d) / total.clamp(min=1)[..., None]
        c = torch.where(total[..., None] > 0, mean, c)
    return labels.long(), c

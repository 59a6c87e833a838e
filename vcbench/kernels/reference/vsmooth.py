"""V-Smooth (paper 3.2, appendices A and B): group value tokens, subtract block means.

1. Grouping: a token order pi per (batch, head). `kmeans` (the default) sorts tokens by the
   label of an online k-means over the value vectors; `sequence` keeps the original order;
   `cube` is the static spatiotemporal cube of DeltaQuant (needs the latent grid T, H, W);
   `balanced` makes every cluster exactly one block (the costlier ablation of Table 1).
2. The permutation is applied to K and V together (Q keeps its order), which leaves the
   output of non-causal attention unchanged: P' V' = P V.
3. Block demeaning: the permuted V is cut into the kernel's fixed blocks of `block_rows`
   rows; each block's mean is subtracted and only the residual is quantized. The mean comes
   back inside the online softmax from the row sum (Equation 6, see `engine.py`).

The configuration, the grouping's result and the grouping schedule (appendix A) are
declarations: `spec/vsmooth.py`.
"""

from __future__ import annotations

import math

import torch

from vcbench.errors import UserError
from vcbench.kernels.spec.formats import round_fp16, scale_for
from vcbench.kernels.spec.granularity import PerChannel, Quantized, Quantizer
from vcbench.kernels.spec.vsmooth import ORDERS, Grouping, VSmoothConfig

SEED_SAMPLE = 4096


def initial_centroids(x: torch.Tensor, k: int, seed: int = 0) -> torch.Tensor:
    """k-means++ seeding: each next centroid is a token drawn with probability proportional to
    its squared distance from the centroids so far. The uniform draws come from a CPU generator
    with a fixed seed, so the choice is the same on every device and every run. Seeding is
    sequential in k, so it runs on an evenly strided sample of at most SEED_SAMPLE tokens."""
    *batch, n, d = x.shape
    flat = x.reshape(-1, n, d)
    if n > SEED_SAMPLE:
        flat = flat[:, :: -(-n // SEED_SAMPLE)]
        n = flat.shape[1]
    flat = flat.float()  # only the sample: 16-bit inputs are exact in FP32
    rows = torch.arange(flat.shape[0], device=x.device)
    u = torch.rand(flat.shape[0], k, generator=torch.Generator().manual_seed(seed)).to(x.device)
    pick = (u[:, 0] * n).long().clamp_(max=n - 1)
    centroids = [flat[rows, pick]]
    d2 = ((flat - centroids[0][:, None]) ** 2).sum(-1)
    for i in range(1, k):
        cdf = d2.cumsum(-1)
        pick = torch.searchsorted(cdf, u[:, i : i + 1] * cdf[:, -1:]).squeeze(1).clamp_(max=n - 1)
        centroids.append(flat[rows, pick])
        d2 = torch.minimum(d2, ((flat - centroids[-1][:, None]) ** 2).sum(-1))
    return torch.stack(centroids, 1).reshape(*batch, k, d)


def kmeans(x: torch.Tensor, k: int, iters: int, init: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched Lloyd iterations over the last two axes: x (..., N, D) -> labels (..., N),
    centroids (..., k, D). An empty cluster keeps its previous centroid."""
    x = x.float()
    k = min(k, x.shape[-2])
    c = initial_centroids(x, k) if init is None else init.float().clone()
    for it in range(iters + 1):
        # ||x||^2 is the same for every centroid, so it does not change the argmin.
        dist = (c * c).sum(-1)[..., None, :] - 2.0 * (x @ c.transpose(-1, -2))
        labels = dist.argmin(-1)
        if it == iters:  # the last pass only labels
            break
        # Cluster sums as a one-hot matrix product: tensor cores, no atomics on k addresses.
        one_hot = torch.nn.functional.one_hot(labels, c.shape[-2]).to(x.dtype)
        sums = one_hot.transpose(-1, -2) @ x
        counts = one_hot.sum(-2)
        c = torch.where(counts[..., None] > 0, sums / counts.clamp(min=1)[..., None], c)
    return labels, c


def balanced_labels(x: torch.Tensor, block_rows: int, iters: int) -> torch.Tensor:
    """Clusters of exactly `block_rows` tokens (the last takes the remainder).

    k-means with one centroid per block, then a capacity-constrained assignment: each round,
    every unassigned token proposes to its nearest cluster that still has room, and each
    cluster accepts its closest proposers up to its remaining capacity.
    """
    *batch, n, _ = x.shape
    k = math.ceil(n / block_rows)
    _, centroids = kmeans(x, k, iters)
    flat_x = x.float().reshape(-1, n, x.shape[-1])
    flat_c = centroids.reshape(-1, k, x.shape[-1])
    out = torch.empty(flat_x.shape[0], n, dtype=torch.long, device=x.device)
    for b in range(flat_x.shape[0]):
        dist = torch.cdist(flat_x[b], flat_c[b])
        capacity = torch.full((k,), block_rows, dtype=torch.long, device=x.device)
        capacity[-1] = n - block_rows * (k - 1)
        label = torch.full((n,), -1, dtype=torch.long, device=x.device)
        while (label < 0).any():
            open_dist = dist.masked_fill(capacity[None, :] <= 0, float("inf"))
            todo = (label < 0).nonzero().squeeze(1)
            choice = open_dist[todo].argmin(1)
            d = open_dist[todo, choice]
            # Rank each proposer within its chosen cluster by distance.
            order = torch.argsort(d, stable=True)
            order = order[torch.argsort(choice[order], stable=True)]
            sorted_choice = choice[order]
            first = torch.searchsorted(sorted_choice, sorted_choice, right=False)
            rank = torch.arange(len(order), device=x.device) - first
            accept = rank < capacity[sorted_choice]
            label[todo[order[accept]]] = sorted_choice[accept]
            capacity -= torch.bincount(sorted_choice[accept], minlength=k)
        out[b] = label
    return out.reshape(*batch, n)


def cube_keys(grid: tuple[int, int, int], cube: tuple[int, int, int], n: int,
              device: torch.device | str = "cpu") -> torch.Tensor:
    """Sort keys that lay tokens out cube by cube (DeltaQuant's static order).

    Tokens are assumed in (t, h, w) raster order; tokens past T*H*W (e.g. text packed after
    the video) keep their order at the end.
    """
    t, h, w = grid
    if t * h * w > n:
        raise UserError(f"grid {grid} has {t * h * w} tokens but the sequence has {n}")
    ct, ch, cw = cube
    ti, hi, wi = torch.meshgrid(torch.arange(t, device=device), torch.arange(h, device=device),
                                torch.arange(w, device=device), indexing="ij")
    nh, nw = math.ceil(h / ch), math.ceil(w / cw)
    cube_index = ((ti // ct) * nh + hi // ch) * nw + wi // cw
    within = ((ti % ct) * ch + hi % ch) * cw + wi % cw
    keys = (cube_index * (ct * ch * cw) + within).flatten()
    tail = torch.arange(n - t * h * w, device=device) + keys.max() + 1 if n > t * h * w else keys[:0]
    return torch.cat([keys, tail])


def group(v: torch.Tensor, config: VSmoothConfig, grid: tuple[int, int, int] | None = None,
          init: torch.Tensor | None = None, kmeans_fn=None) -> Grouping:
    """Compute the token order of V-Smooth for v (B, H, N, D). `kmeans_fn` runs the Lloyd
    iterations (`kmeans`'s signature; default `kmeans`): `vcbench.kernels.group` hands in the
    GPU's for 16-bit CUDA values, which runs the same iterations from the same seeding."""
    *batch, n, _ = v.shape
    if config.order == "sequence":
        perm = torch.arange(n, device=v.device).expand(*batch, n).clone()
        return Grouping(perm)
    if config.order == "cube":
        if grid is None:
            raise UserError("vsmooth_order='cube' needs the latent grid (option grid=(T, H, W))")
        keys = cube_keys(tuple(grid), config.cube, n, v.device)
        return Grouping(torch.argsort(keys, stable=True).expand(*batch, n).clone())
    if config.order == "balanced":
        labels = balanced_labels(v, config.block_rows, config.iters)
        return Grouping(torch.argsort(labels, dim=-1, stable=True))
    if config.order == "kmeans":
        iters = config.iters if init is None else config.warm_iters
        labels, centroids = (kmeans_fn or kmeans)(v, config.clusters, iters, init)
        return Grouping(torch.argsort(labels, dim=-1, stable=True), centroids)
    raise UserError(f"unknown vsmooth_order {config.order!r}; choose from {', '.join(ORDERS)}")


def permute_tokens(x: torch.Tensor, permutation: torch.Tensor) -> torch.Tensor:
    """x[..., permutation, :] per (batch, head)."""
    return torch.gather(x, -2, permutation[..., None].expand_as(x))


def token_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean over tokens (axis -2), keepdim. Summed in float64, which is exact for 16-bit
    inputs, so a GPU kernel summing in any order gets the same FP32 mean bit for bit."""
    return (x.double().sum(-2, keepdim=True) / x.shape[-2]).to(x.dtype)


def block_means(v: torch.Tensor, block_rows: int, n_valid: int) -> torch.Tensor:
    """Mean of each block of `block_rows` rows over its real tokens (rows >= n_valid are
    padding and excluded). v (B, H, Np, D) with Np a multiple of block_rows -> (B, H, Np/rows, D).
    Summed in float64 like `token_mean`, for the same reason."""
    np_ = v.shape[-2]
    valid = (torch.arange(np_, device=v.device) < n_valid).double()
    counts = valid.unflatten(0, (np_ // block_rows, block_rows)).sum(-1)
    sums = (v.double() * valid[:, None]).unflatten(-2, (np_ // block_rows, block_rows)).sum(-2)
    return (sums / counts.clamp(min=1)[:, None]).to(v.dtype)


def demean_and_quantize(v: torch.Tensor, quantizer: Quantizer, block_rows: int, n_valid: int
                        ) -> tuple[Quantized, torch.Tensor]:
    """Block demeaning (Equation 4) and the residual's quantization, as the V kernel does it.

    v: permuted V (B, H, Np, D), rows >= n_valid are padding. The V scale is fixed first, from
    the residual against the exact mean; the mean is then stored in FP16 divided by the scale
    that multiplies the accumulator in the epilogue (per-channel at 8 bits; none at 4 bits,
    where microscales act inside the MMA and the mean is stored unscaled), and the residual is
    taken against exactly what will be restored, so R + mean reconstructs V' in high precision.
    Returns (quantized residual, stored means (B, H, Np / block_rows, D)).
    """
    mean = block_means(v, block_rows, n_valid)
    exact_residual = zero_rows(v - mean.repeat_interleave(block_rows, dim=-2), n_valid)
    scale = outer = None
    if isinstance(quantizer.granularity, PerChannel):
        scale = scale_for(quantizer.granularity.amax(exact_residual), quantizer.fmt.max)
        # A channel whose residual is zero everywhere still carries its means: give it
        # scale 1 rather than 0, or the epilogue multiply would erase them (a NaN scale, of a
        # channel holding a non-finite value, stays NaN).
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        epi = quantizer.granularity.expand(scale)
    else:  # microscales act inside the MMA; only a global NVFP4 scale reaches the epilogue
        first = quantizer(exact_residual)
        epi, outer = first.epilogue_scale(), first.outer
    stored = round_fp16(mean if epi is None else mean / epi)
    restored = stored if epi is None else stored * epi
    residual = zero_rows(v - restored.repeat_interleave(block_rows, dim=-2), n_valid)
    return quantizer(residual, scale=scale, outer=outer), stored


def zero_rows(x: torch.Tensor, n_valid: int) -> torch.Tensor:
    """x with the padding rows (>= n_valid) set to zero, so they move no scale or mean."""
    if x.shape[-2] > n_valid:
        x = x.clone()
        x[..., n_valid:, :] = 0
    return x


def block_energy_share(v: torch.Tensor, block_rows: int, n_valid: int) -> torch.Tensor:
    """Share of each block's energy ||V_j||_F^2 that its mean removes: rows * ||mu_j||^2 over
    ||V_j||_F^2 (Equation 5). Shape (B, H, blocks); blocks with no energy give 0."""
    mu = block_means(v, block_rows, n_valid)
    np_ = v.shape[-2]
    valid = (torch.arange(np_, device=v.device) < n_valid).to(v.dtype)
    counts = valid.unflatten(0, (np_ // block_rows, block_rows)).sum(-1)
    energy = ((v * valid[:, None]) ** 2).unflatten(-2, (np_ // block_rows, block_rows)).sum((-2, -1))
    removed = counts * (mu**2).sum(-1)
    return torch.where(energy > 0, removed / energy.clamp(min=torch.finfo(v.dtype).tiny), 0.0)

"""Quantization granularity: which elements share one scale, and the shape of that scale.

Operands are in HND layout, shape (B, H, N, D): batch, heads, tokens, head dim. N is already
padded to a multiple of the kernel tile, so every token block is whole. A scale is kept in its
compact shape (documented per class) and broadcast with `expand`.

Whether a scale sits *inside* or *outside* the matrix product matters for emulating a kernel:
a scale that varies along the contraction axis (a microscale) is applied to each element before
the product, as a block-scaled MMA does; any other scale factors out of the sum and is applied
to the product afterwards. `Quantized.inner()` and `Quantized.outer` follow that split.

Non-finite input: a group holding a NaN or an infinity has a NaN absolute maximum (`abs_max`),
so a NaN scale and zero codes, on every device (a GPU max drops NaN: its comparisons are
false). `nonfinite_poison` then carries it to every scale of V (`Quantized.poisoned`), the
scales every kernel multiplies its output by, so that (batch, head)'s output is NaN whatever
the softmax does with NaN scores, and every other (batch, head) is untouched (+0 is added).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from vcbench.kernels.spec.formats import E4M3, Format, scale_for, true_divide


def abs_max(x: torch.Tensor, dim) -> torch.Tensor:
    """max |x| over `dim`, NaN where the group holds a NaN or an infinity (the kernels add the
    group's sum of x * 0, which is 0 for finite x and NaN otherwise)."""
    amax = x.abs().amax(dim=dim)
    return torch.where(torch.isfinite(amax), amax, torch.full_like(amax, float("nan")))


def nonfinite_poison(heads: tuple[int, int], *scales: torch.Tensor | None) -> torch.Tensor:
    """(B, H) FP32: 0 where every scale of that (batch, head) is finite, NaN where one is not.
    Each scale's leading axes are (B, H) or (B * H,); None is skipped."""
    bad = torch.zeros(heads[0] * heads[1], dtype=torch.bool, device=scales[0].device)
    for s in scales:
        if s is not None:
            bad |= ~torch.isfinite(s.reshape(bad.shape[0], -1)).all(-1)
    zero = torch.zeros(heads, dtype=torch.float32, device=bad.device)
    return torch.where(bad.view(heads), float("nan"), zero)


@dataclass(frozen=True)
class Unscaled:
    """No scale: the format holds the values as they are (BF16 operands). Scale shape (B, H),
    all ones."""

    def amax(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ones(x.shape[:-2], dtype=x.dtype, device=x.device)

    def expand(self, s: torch.Tensor) -> torch.Tensor:
        return s[..., None, None]


@dataclass(frozen=True)
class PerTensor:
    """One scale per (batch, head) slice. Scale shape (B, H)."""

    def amax(self, x: torch.Tensor) -> torch.Tensor:
        return abs_max(x, (-2, -1))

    def expand(self, s: torch.Tensor) -> torch.Tensor:
        return s[..., None, None]


@dataclass(frozen=True)
class PerBlock:
    """One scale per block of `rows` consecutive tokens (all channels). Scale shape
    (B, H, N // rows). The kernels' Q and K tiles: 128 rows by default."""

    rows: int = 128

    def amax(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-2]
        if n % self.rows:
            raise ValueError(f"{n} tokens are not a whole number of {self.rows}-row blocks")
        return abs_max(x.unflatten(-2, (n // self.rows, self.rows)), (-2, -1))

    def expand(self, s: torch.Tensor) -> torch.Tensor:
        return s.repeat_interleave(self.rows, dim=-1)[..., None]


@dataclass(frozen=True)
class PerWarp(PerBlock):
    """One scale per `rows` tokens handled by one warp of the MMA (SageAttention2's per-warp
    Q granularity: 16 rows of a 64-row warpgroup tile on sm90). Scale shape (B, H, N // rows)."""

    rows: int = 16


@dataclass(frozen=True)
class PerChannel:
    """One scale per channel over all tokens of a (batch, head). Scale shape (B, H, D).
    The V granularity of SageAttention2 and VC-Attention at 8 bits: it factors out of the
    token sum, so one epilogue multiply applies it."""

    def amax(self, x: torch.Tensor) -> torch.Tensor:
        return abs_max(x, -2)

    def expand(self, s: torch.Tensor) -> torch.Tensor:
        return s[..., None, :]


@dataclass(frozen=True)
class Microscale16:
    """NVFP4 microscaling: one E4M3 scale per 16 consecutive elements along `axis` (-1: head
    dim, for Q and K; -2: tokens, for V and P, i.e. along the contraction axis of the product
    each operand enters). Scale shape (B, H, N, D // 16) or (B, H, N // 16, D). With
    `global_scale`, a second FP32 scale per (batch, head), shape (B, H), keeps the microscales
    inside E4M3's range (NVFP4's two-level scheme)."""

    axis: int = -1
    global_scale: bool = False
    size: int = 16

    def amax(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[self.axis]
        if n % self.size:
            raise ValueError(f"axis of length {n} is not a whole number of {self.size}-groups")
        grouped = x.unflatten(self.axis, (n // self.size, self.size))
        return abs_max(grouped, self.axis)  # the group of 16 sits where `axis` pointed

    def expand(self, s: torch.Tensor) -> torch.Tensor:
        return s.repeat_interleave(self.size, dim=self.axis)


Granularity = Unscaled | PerTensor | PerBlock | PerChannel | Microscale16


@dataclass(frozen=True)
class Quantized:
    """Codes in value space plus their scales.

    `codes`: same shape as the input, values on the format's grid.
    `scale`: compact, in the granularity's documented shape.
    `outer`: FP32 global scale, shape (B, H), for two-level NVFP4; else None.
    Dequantized value = codes * expand(scale) [* outer].
    """

    codes: torch.Tensor
    scale: torch.Tensor
    fmt: Format
    granularity: Granularity
    outer: torch.Tensor | None = None

    @property
    def scale_inside_product(self) -> bool:
        return isinstance(self.granularity, Microscale16)

    def expanded_scale(self) -> torch.Tensor:
        return self.granularity.expand(self.scale)

    def epilogue_scale(self) -> torch.Tensor | None:
        """The scale that factors out of the whole token sum when this is the V operand, shaped
        to broadcast over the output (B, H, N, D); None when there is none (Unscaled, or
        PerBlock, whose scale changes per KV tile and is applied per tile)."""
        g = self.granularity
        if isinstance(g, PerChannel):
            return self.scale[..., None, :]
        if isinstance(g, PerTensor):
            return self.scale[..., None, None]
        if isinstance(g, Microscale16) and self.outer is not None:
            return self.outer[..., None, None]
        return None

    def inner(self) -> torch.Tensor:
        """What enters the matrix product: codes times any scale varying along contraction."""
        return self.codes * self.expanded_scale() if self.scale_inside_product else self.codes

    def dequantize(self) -> torch.Tensor:
        out = self.codes * self.expanded_scale()
        return out if self.outer is None else out * self.outer[..., None, None]

    def poisoned(self, poison: torch.Tensor) -> Quantized:
        """The same codes with `nonfinite_poison`'s (B, H) added to every scale (exact: +0
        where the (batch, head) is finite)."""
        def add(s):
            return s + poison.to(s.dtype).reshape(poison.shape + (1,) * (s.dim() - 2))
        return replace(self, scale=add(self.scale),
                       outer=None if self.outer is None else add(self.outer))


@dataclass(frozen=True)
class Quantizer:
    """A format plus a granularity: `Quantizer(E4M3, PerChannel())(v)` -> Quantized.

    Scale = amax / format max, so the largest element of each group lands on the largest code
    (for microscales the scale itself is rounded to E4M3). A group whose scale is zero has
    all-zero codes, and so has a group whose scale is NaN (it held a non-finite value).
    Division is true division (`div.rn`), as the kernels must do it too.
    """

    fmt: Format
    granularity: Granularity

    def __call__(self, x: torch.Tensor, scale: torch.Tensor | None = None,
                 outer: torch.Tensor | None = None) -> Quantized:
        """Quantize x. A given `scale` (compact shape) or `outer` (global, NVFP4) is used
        as is instead of being derived from x: V-Smooth fixes the V scale before it forms the
        residual, so the stored means can be pre-divided by it."""
        if isinstance(self.granularity, Unscaled):
            ones = self.granularity.amax(x)
            return Quantized(self.fmt.round(x), ones, self.fmt, self.granularity)
        if isinstance(self.granularity, Microscale16):
            amax = self.granularity.amax(x)
            if self.granularity.global_scale and outer is None:
                outer = true_divide(abs_max(x, (-2, -1)), E4M3.max * self.fmt.max)
                outer = torch.where(outer == 0, torch.ones_like(outer), outer)  # keeps NaN
            if outer is not None:
                amax = amax / outer[..., None, None]
            if scale is None:
                scale = E4M3.round(scale_for(amax, self.fmt.max))
        elif scale is None:
            scale = scale_for(self.granularity.amax(x), self.fmt.max)
        full = self.granularity.expand(scale)
        if outer is not None:
            full = full * outer[..., None, None]
        codes = self.fmt.round(torch.where(full > 0, x / torch.where(full > 0, full, 1.0), 0.0))
        return Quantized(codes=codes, scale=scale, fmt=self.fmt, granularity=self.granularity,
                         outer=outer)

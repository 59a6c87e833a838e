"""A text conditioning for random-weight models that needs no tokenizer and no download.

Each UTF-8 byte of the prompt picks a row of a fixed random table (seeded), plus a fixed
random position row; the sequence is padded with zeros to `length`. Two prompts that differ
give different embeddings, the same prompt always gives the same one, on any machine. It
stands in for a text encoder only so that the tiny models see prompt-dependent input; it
carries no meaning.
"""

from __future__ import annotations

import torch

TABLE_SEED = 20260101


class ByteConditioning:
    """prompt -> (1, length, dim) float tensor, deterministic."""

    def __init__(self, dim: int, length: int = 32, seed: int = TABLE_SEED) -> None:
        g = torch.Generator().manual_seed(seed)
        self.dim, self.length = dim, length
        self.byte_rows = torch.randn(256, dim, generator=g)
        self.position_rows = 0.1 * torch.randn(length, dim, generator=g)

    def __call__(self, prompt: str) -> torch.Tensor:
        data = list(prompt.encode("utf-8"))[: self.length]
        out = torch.zeros(1, self.length, self.dim)
        if data:
            idx = torch.tensor(data, dtype=torch.long)
            out[0, : len(data)] = self.byte_rows[idx] + self.position_rows[: len(data)]
        return out

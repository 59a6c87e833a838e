"""The patch's processor for Wan's self-attention: RoPE handed to the method, not applied first.

diffusers' `WanAttnProcessor` projects q, k, v, normalises q and k, applies RoPE eagerly in
FP32 (stored back in BF16) and calls attention. The paper fuses RoPE into the Q and K
quantizers (section 3.4, appendix B), so for the duration of a patch a self-attention module
whose processor is exactly that class gets `WanRopeProcessor`: diffusers' steps up to RoPE,
verbatim, then q, k (before RoPE), v and the RoPE tables through the patch's routed call (the
same op, counters, schedule and context as the SDPA hook's), and diffusers' steps after
attention. `vcbench.attention(..., rope=...)` computes exactly what rotating first computes
(spec.rope is diffusers' rotation), so the clip is the same; what changes is where RoPE runs.

Every other call of the module (cross-attention, I2V image attention, a call without RoPE
tables, a context-parallel processor) goes to the original processor, and so to the SDPA hook.
Other models' RoPE (HunyuanVideo, CogVideoX, LTX-Video, Mochi) is another computation
(`x * cos + rotate_half(x) * sin` over both tables, or on part of a joint sequence): they stay
on the SDPA hook, RoPE outside the method.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

WAN_PROCESSOR = ("diffusers.models.transformers.transformer_wan", "WanAttnProcessor")


def takes_over(module: torch.nn.Module) -> bool:
    """Whether the patch hands this module's RoPE to the method: a self-attention module
    (no context projections of its own) whose processor is diffusers' WanAttnProcessor."""
    processor = getattr(module, "processor", None)
    cls = type(processor)
    return ((cls.__module__, cls.__qualname__) == WAN_PROCESSOR
            and not getattr(module, "is_cross_attention", True)
            and getattr(module, "add_k_proj", None) is None)


class WanRopeProcessor:
    """diffusers' WanAttnProcessor with its self-attention call routed before RoPE."""

    def __init__(self, inner: Any, routed) -> None:
        # `routed(q, k, v, mask, cos, sin)`: the patch's routed call on HND q, k, v
        self.inner, self.routed = inner, routed
        self._wan = importlib.import_module(type(inner).__module__)

    def __getattr__(self, name: str) -> Any:  # _attention_backend, _parallel_config, ...
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def __call__(self, attn, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if (rotary_emb is None or encoder_hidden_states is not None or attn.add_k_proj is not None
                or getattr(self.inner, "_parallel_config", None) is not None):
            return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask,
                              rotary_emb)
        # diffusers' WanAttnProcessor.__call__ up to RoPE, line for line
        query, key, value = self._wan._get_qkv_projections(attn, hidden_states, None)
        query = attn.norm_q(query)
        key = attn.norm_k(key)
        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        # (B, N, H, D) -> (B, H, N, D), as diffusers' native attention hands SDPA its inputs;
        # the (1, N, 1, D) tables likewise
        cos, sin = (t.transpose(1, 2) for t in rotary_emb)
        out = self.routed(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                          attention_mask, cos, sin)
        # and after attention, as diffusers does
        hidden_states = out.transpose(1, 2).flatten(2, 3)
        hidden_states = hidden_states.type_as(query)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states

"""Softmax multi-head attention through ``scaled_dot_product_attention``."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sandbox.mixers.base import Linear, Mixer, MixerContext, register


@dataclass
class AttentionConfig:
    window: int | None = None  # sliding window (keys within the last `window` positions); None = full causal
    bias: bool = False


def causal_window_mask(seq_len: int, window: int | None, device) -> torch.Tensor | None:
    """Boolean [T, T] mask, True where query i may attend key j (j <= i, i - j < window)."""
    if window is None:
        return None
    i = torch.arange(seq_len, device=device)[:, None]
    j = torch.arange(seq_len, device=device)[None, :]
    return (j <= i) & (i - j < window)


def softmax_attention(q, k, v, mask, dropout: float = 0.0) -> torch.Tensor:
    """Causal softmax attention of ``[b, h, t, dh]`` inputs under a boolean ``mask`` (None: causal), written out.
    Used where SDPA's fused kernels cannot run: with dropout on the weights, and on the batched tensors of stacked
    replicas (vmap) under a mask, where CUDA's memory-efficient kernel, the one fused kernel that takes a mask,
    fails (a mask [t, t]: "attn_bias: wrong shape"; a mask [b, h, t, t]: "LSE is not correctly aligned")."""
    t = q.shape[-2]
    allowed = mask if mask is not None else torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    if dropout:
        weights = F.dropout(weights, dropout)
    return weights @ v


def masked_sdpa(q, k, v, mask) -> torch.Tensor:
    """SDPA under a boolean mask; written out for stacked replicas (see ``softmax_attention``)."""
    if torch._C._functorch.is_batchedtensor(q):          # a constant under torch.compile
        return softmax_attention(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@register("attention", AttentionConfig)
class Attention(Mixer):
    def __init__(self, ctx: MixerContext, cfg: AttentionConfig):
        super().__init__(ctx, cfg)
        if ctx.d_model % ctx.n_heads:
            raise ValueError(f"d_model {ctx.d_model} is not divisible by n_heads {ctx.n_heads}")
        self.n_heads = ctx.n_heads
        self.qkv = Linear(ctx.d_model, 3 * ctx.d_model, bias=cfg.bias)
        self.out = Linear(ctx.d_model, ctx.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # [b, h, t, dh]
        self.record("keys", k.transpose(1, 2))
        self.record("values", v.transpose(1, 2))
        mask = causal_window_mask(t, self.cfg.window, x.device)
        if mask is not None and self.capture is not None:     # the cache a window keeps: what the last query sees
            self.record("cache_keys", k[:, :, mask[-1]].transpose(1, 2))
            self.record("cache_values", v[:, :, mask[-1]].transpose(1, 2))
        if self.training and self.ctx.dropout:
            o = softmax_attention(q, k, v, mask, self.ctx.dropout)
        elif mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = masked_sdpa(q, k, v, mask)
        return self.out(o.transpose(1, 2).reshape(b, t, d))

    def graph_safe(self) -> bool:
        return True

    def state_size(self, seq_len: int) -> int:
        span = seq_len if self.cfg.window is None else min(seq_len, self.cfg.window)
        return 2 * span * self.ctx.d_model

"""Sliding-window softmax attention with attention-sink tokens (``swa``), plus the small
pieces the other sparse-attention mixers share: head projection, rotary embedding and the
sink/window mask.

Query ``i`` sees key ``j`` when ``j <= i`` and (``i - j < window`` or ``j < sinks``): the
"Lambda-shaped" pattern of StreamingLLM / Longformer global tokens (laLTE eq. 5 without the
LTE term). ``window`` counts the query itself, so ``window=1`` is attention to self (+ sinks).

RoPE: the backbone has no positions by default (``model.positions: none``), so a hybrid's
recurrent layers carry order. The papers' attention layers use RoPE on q and k; ``rope: true``
(the default here, as in laLTE/NSA/MoBA) applies it, ``rope: false`` leaves q, k as projected.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sandbox.mixers.attention import causal_window_mask
from sandbox.mixers.base import Linear, Mixer, MixerContext, register


def rope(x: torch.Tensor, pos: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary embedding (rotate-half convention) of vectors ``x [..., d]`` at integer positions
    ``pos`` broadcastable to ``x.shape[:-1]`` (e.g. ``[t, 1]`` for ``x [b, t, h, d]``)."""
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"rope: head dim must be even, got {d}")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv = base ** (-torch.arange(0, d, 2, device=x.device, dtype=work) / d)               # [d/2]
    ang = pos.to(work)[..., None] * inv                                                     # [..., d/2]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x.to(work).chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def sink_window_mask(seq_len: int, window: int | None, sinks: int, device) -> torch.Tensor:
    """Boolean ``[T, T]``: True where query i may attend key j (causal, in window or a sink).
    ``window=None`` means unbounded (full causal)."""
    mask = causal_window_mask(seq_len, window if window is not None else seq_len, device)
    if sinks > 0:
        j = torch.arange(seq_len, device=device)
        mask = mask | ((j[None, :] < sinks) & (j[None, :] <= j[:, None]))
    return mask


@dataclass
class SWAConfig:
    window: int = 512  # keys within the last `window` positions (the query included)
    sinks: int = 4  # the first `sinks` tokens stay visible to every later query
    rope: bool = True  # rotary embedding on q, k (see module doc)
    rope_base: float = 10000.0
    bias: bool = False

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"window: must be >= 1, got {self.window}")
        if self.sinks < 0:
            raise ValueError(f"sinks: must be >= 0, got {self.sinks}")
        if self.rope_base <= 0:
            raise ValueError(f"rope_base: must be > 0, got {self.rope_base}")


class HeadAttention(Mixer):
    """q, k, v and output projections for ``n_heads`` heads; subclasses decide the pattern."""

    def __init__(self, ctx: MixerContext, cfg):
        super().__init__(ctx, cfg)
        if ctx.d_model % ctx.n_heads:
            raise ValueError(f"n_heads: d_model {ctx.d_model} is not divisible by n_heads {ctx.n_heads}")
        self.n_heads = ctx.n_heads
        self.head_dim = ctx.d_model // ctx.n_heads
        if getattr(cfg, "rope", False) and self.head_dim % 2:
            raise ValueError(f"rope: needs an even head dim, got {self.head_dim}")
        self.qkv = Linear(ctx.d_model, 3 * ctx.d_model, bias=cfg.bias)
        self.out = Linear(ctx.d_model, ctx.d_model, bias=cfg.bias)

    def project(self, x: torch.Tensor):
        """``[b, t, d] -> q, k, v`` each ``[b, t, h, dh]`` (before RoPE)."""
        b, t, _ = x.shape
        return self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)

    def positional(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0):
        if not self.cfg.rope:
            return q, k
        pos = torch.arange(offset, offset + q.shape[1], device=q.device)[:, None]     # [t, 1]: all heads
        return rope(q, pos, self.cfg.rope_base), rope(k, pos, self.cfg.rope_base)

    def finish(self, o: torch.Tensor) -> torch.Tensor:
        """``o [b, h, t, dh]`` (the SDPA layout) -> ``[b, t, d]``."""
        b, h, t, dh = o.shape
        return self.out(o.transpose(1, 2).reshape(b, t, h * dh))


def attend(q, k, v, mask) -> torch.Tensor:
    """SDPA on ``[b, t, h, dh]`` inputs with a boolean mask broadcastable to ``[b, h, t, t]``;
    returns ``[b, h, t, dh]``."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          attn_mask=mask)


@register("swa", SWAConfig)
class SlidingWindowAttention(HeadAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x)
        q, k = self.positional(q, k)
        self.record("keys", k)
        self.record("values", v)
        mask = sink_window_mask(x.shape[1], self.cfg.window, self.cfg.sinks, x.device)
        return self.finish(attend(q, k, v, mask))

    def state_size(self, seq_len: int) -> int:
        return 2 * min(seq_len, self.cfg.window + self.cfg.sinks) * self.ctx.d_model

"""Backbone: embedding -> L pre-norm blocks [norm -> token mixer -> +, norm -> channel mixer -> +]
-> final norm -> tied LM head."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sandbox.config import ModelConfig
from sandbox.kernels.embedding import embedding
from sandbox.kernels.library import use_fused
from sandbox.kernels.norm import norm_cast
from sandbox.kernels.swiglu import swiglu
from sandbox.mixers import Mixer, MixerContext, build_mixer
from sandbox.mixers.base import Linear, gather_rows


def make_norm(kind: str, d: int) -> nn.Module:
    return nn.LayerNorm(d) if kind == "layernorm" else nn.RMSNorm(d)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, expand: float):
        super().__init__()
        hidden = max(8, int(round(expand * d_model / 8)) * 8)
        self.up = Linear(d_model, 2 * hidden, bias=False)
        self.down = Linear(hidden, d_model, bias=False)

    def forward(self, x):
        u = self.up(x)
        if use_fused(u):
            return self.down(swiglu(u))
        a, b = u.chunk(2, dim=-1)
        return self.down(F.silu(a) * b)


def normed(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` in the dtype the matrix products after it compute in. Under autocast a norm returns float32
    and every Linear of a mixer would cast that to bf16 on its own (five times in GLA, and five casts back in
    the backward): cast once, or, where ``use_fused``, have the norm's one kernel write bf16."""
    dev = x.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    if use_fused(x):
        rms = isinstance(norm, nn.RMSNorm)
        eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
        return norm_cast(x, norm.weight, None if rms else norm.bias, eps, rms, dtype)
    return norm(x).to(dtype)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, mixer: Mixer):
        super().__init__()
        self.norm1 = make_norm(cfg.norm, cfg.d_model)
        self.mixer = mixer
        self.mlp = SwiGLU(cfg.d_model, cfg.mlp_expand) if cfg.channel_mixer == "swiglu" else None
        self.norm2 = make_norm(cfg.norm, cfg.d_model) if self.mlp is not None else None

    def forward(self, x, positions=None):
        """``positions`` (int64 ``[B, P]``): return only those rows (the last block, under a head that reads a
        few positions per sequence). The mixer still sees every position, but what works per token (the
        residual, the channel mixer and its norm, the mixer's own per-token end) runs on the P rows alone."""
        h = normed(self.norm1, x)
        if positions is None:
            x = x + self.mixer(h)
        else:
            x = gather_rows(x, positions) + self.mixer.forward_at(h, positions)
        if self.mlp is not None:
            x = x + self.mlp(normed(self.norm2, x))
        return x


class LanguageModel(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, max_seq_len: int):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(vocab_size, cfg.d_model)
        self.pos = nn.Embedding(max_seq_len, cfg.d_model) if cfg.positions == "learned" else None
        self.blocks = nn.ModuleList()
        for i, name in enumerate(cfg.layer_mixers()):
            ctx = MixerContext(cfg.d_model, cfg.n_heads, i, max_seq_len, cfg.dropout)
            self.blocks.append(Block(cfg, build_mixer(name, ctx, cfg.options(name))))
        self.norm = make_norm(cfg.norm, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout) if cfg.dropout else None
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module):
        if isinstance(m, nn.Linear) and not getattr(m, "_custom_init", False):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    @property
    def mixers(self) -> list[Mixer]:
        return [b.mixer for b in self.blocks]

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, T, vocab]``, or ``[B, P, vocab]`` at ``positions`` (int64 ``[B, P]``) only:
        the head is the largest matrix product at an 8192 vocabulary, and recall tasks score
        a few positions per sequence."""
        x = embedding(self.embed.weight, tokens)   # its backward sums repeated tokens first
        if self.pos is not None:
            x = x + self.pos.weight[: tokens.shape[1]]
        if self.drop is not None:
            x = self.drop(x)
        for block in self.blocks[:-1]:
            x = block(x)
        x = self.blocks[-1](x, positions)
        return normed(self.norm, x) @ self.embed.weight.t()

    def aux_loss(self) -> torch.Tensor | None:
        losses = [l for l in (m.aux_loss() for m in self.mixers) if l is not None]
        return torch.stack(losses).sum() if losses else None

    def state_size(self, seq_len: int) -> int:
        return sum(m.state_size(seq_len) for m in self.mixers)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

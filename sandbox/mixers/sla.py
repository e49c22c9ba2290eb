"""Softmax Linear Attention (SLA; §3.2 and §5.1, eqs. 10-16): head-level softmax competition.

Two gates over the H heads, ``G^Q = softmax(x W_GQ)`` (read competition) and ``G^K =
softmax(x W_GK)`` (write competition), ``W_GQ, W_GK: d x H``, on top of a base mixer:
    S_{h,t} = Lambda_{h,t} S_{h,t-1} + (G^K_{h,t} phi(k_{h,t}))^T v_{h,t},
    y_{h,t} = (G^Q_{h,t} phi(q_{h,t})) S_{h,t}.
For the delta rule (Gated DeltaNet, eq. 14) G^K scales the value inside the error term,
``beta_t (G^K v_t - phi(k_t) S_{t-1})``; for the additive bases scaling the value equals
scaling the key, so one rule serves all three: ``v <- G^K v``, ``q <- G^Q q``. With one head
both gates are 1 and SLA is its base. The base runs with its default options, except ``conv_size``
(the short convolution on q, k, v, applied before the gates), which SLA passes on.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from sandbox.mixers.base import Linear, Mixer, MixerContext, build_mixer, mixer_config_class, register
from sandbox.mixers.sse import Kernel


@dataclass
class SLAConfig:
    base: Literal["retnet", "gla", "gated_deltanet"] = "gla"
    impl: Kernel = "auto"  # linear_recurrence impl of the base
    conv_size: int = 0  # the base's short causal conv on q, k, v; 0 = off

    def __post_init__(self):
        if self.conv_size < 0:
            raise ValueError(f"conv_size: must be >= 0, got {self.conv_size}")


@register("sla", SLAConfig)
class SLA(Mixer):
    def __init__(self, ctx: MixerContext, cfg: SLAConfig):
        super().__init__(ctx, cfg)
        base_cfg = dataclasses.replace(mixer_config_class(cfg.base)(), impl=cfg.impl, conv_size=cfg.conv_size)
        self.core = build_mixer(cfg.base, ctx, base_cfg)
        self.gate_q = Linear(ctx.d_model, ctx.n_heads, bias=False)
        self.gate_k = Linear(ctx.d_model, ctx.n_heads, bias=False)

    def forward(self, x):
        core = self.core
        core.capture = self.capture  # the base records keys, values, gates, final state here
        p = core.features(x)
        gq, gk = self.gate_q(x).softmax(-1), self.gate_k(x).softmax(-1)  # [B, T, H]
        p["q"] = p["q"] * gq[..., None].to(p["q"].dtype)  # (autocast: softmax is float32)
        p["v"] = p["v"] * gk[..., None].to(p["v"].dtype)
        for name, key in (("keys", "k"), ("values", "v"), ("gates", "g")):
            if p[key] is not None:
                self.record(name, p[key])
        self.record("routing", gk[:, :, None])  # write competition: head weights [B, T, 1, H]
        self.record("routing_read", gq[:, :, None])
        return core.finish(core.recur(p), x, p)

    def aux_loss(self):
        return self.core.aux_loss()

    def graph_safe(self) -> bool:
        return self.core.graph_safe()

    def state_size(self, seq_len: int) -> int:
        return self.core.state_size(seq_len)

"""Mixture-of-Memories (MoM; Du et al. 2025, arXiv 2502.13685), the baseline the SSE paper compares with.

A router ``softmax(x W_r)`` picks the top-k of M memories per token. Every memory has its own
key and value projections (the parameter count the SSE paper contrasts with its shared ones);
the query projection, the decay gate (and beta for the delta rule) are shared. A token writes
its selected memories with weight 1 and reads them weighted by the router probabilities
renormalised over the selection: ``o_t = sum_{m in top-k} p_t^m q_t M_t^m``. An optional shared
memory with its own key/value projections is always written and read with weight 1. Keys use
the base mixer's feature map (GLA: identity; Gated DeltaNet: SiLU + L2 norm). Balance loss as
in MoE: ``alpha * M/k * sum_m f_m P_m``.

Runs on the partitioned recurrence of ``sse_impl`` (masking or varlen), like SSE.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sandbox.mixers.base import Linear, MixerContext, register
from sandbox.mixers.feature_maps import feature_map
from sandbox.mixers.sse import Kernel, PartitionedMixer, PartitionImpl, Transition, _positive
from sandbox.mixers.sse_impl import route


@dataclass
class MoMConfig:
    n: int = 4  # memories M
    k: int = 1  # memories per token
    shared_memory: bool = False
    balance_alpha: float = 0.01
    transition: Transition = "gla"
    expand_k: float | None = None  # null: the base's
    expand_v: float | None = None
    impl: PartitionImpl = "auto"
    kernel: Kernel = "auto"

    def __post_init__(self):
        for name in ("n", "k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.k > self.n:
            raise ValueError(f"k: must be <= n ({self.n}), the number of memories; got {self.k}")
        if self.balance_alpha < 0:
            raise ValueError(f"balance_alpha: must be >= 0, got {self.balance_alpha}")
        _positive(self, "expand_k", "expand_v")


@register("mom", MoMConfig)
class MoM(PartitionedMixer):
    def __init__(self, ctx: MixerContext, cfg: MoMConfig):
        cfg.__post_init__()
        super().__init__(ctx, cfg, cfg.n, cfg.k, cfg.shared_memory)
        d, H, K, V, N = ctx.d_model, self.H, self.K, self.V, cfg.n
        # memory 0 uses the core's k/v projections, memories 1..M-1 these, the shared memory its own
        self.mem_kv = Linear(d, (N - 1) * H * (K + V), bias=False) if N > 1 else None
        self.shared_kv = Linear(d, H * (K + V), bias=False) if cfg.shared_memory else None

    def route(self, x):
        return route(self.router(x), self.k, self.k, False, True, 1.0, over_selected=True)

    def keys(self, logits):
        return self.key_norm(feature_map(self.q_feature, logits))

    def streams(self, x, p, rt):
        B, T, _ = x.shape
        H, K, V, N = self.H, self.K, self.V, self.n
        q = self.query_map(p["q"])
        ks, vs = p["k"][:, :, None], p["v"][:, :, None]
        if self.mem_kv is not None:
            ek, ev = self.mem_kv(x).view(B, T, N - 1, H, K + V).split([K, V], -1)
            ks, vs = torch.cat([ks, ek], 2), torch.cat([vs, ev], 2)
        shared = None
        if self.shared_kv is not None:
            sk, sv = self.shared_kv(x).view(B, T, H, K + V).split([K, V], -1)
            shared = {"q": q, "k": self.keys(sk), "v": sv, "g": p["g"], "beta": p["beta"]}
        unsq = lambda z: None if z is None else z[:, :, None]  # noqa: E731
        return {"q": q[:, :, None], "k": self.keys(ks), "v": vs, "g": unsq(p["g"]), "beta": unsq(p["beta"]),
                "shared": shared}

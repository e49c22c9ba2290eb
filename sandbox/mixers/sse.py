"""Sparse State Expansion (SSE; arXiv 2507.16577 §4, appendix B; ICLR 2026 gate form).

The state of each head is expanded into N partitions of c rows (c = the state rows of the base
mixer). Per token: partition logits ``e_t = x_t W_e``, top-k partitions ``T_t`` for writing
(top-k' for reading, ``read_topk``); keys ``k_t^i = softmax(x_t W_k + e_t^i) / k`` for i in
T_t, which equals ``softmax(x_t W_k) / k``: the bias only steers the selection (the paper's
form, ``gate: none``). Only selected partitions are written and decayed:
    S_t^i = Lambda_t S_{t-1}^i + w_t^i k_t^T v_t   (i in T_t),    o_t = sum_{i in T'_t} r_t^i q_t S_t^i
with w = 1/k, r = 1 (``gate: none``) or, in the ICLR form, w and/or r = softmax(e_t)^i, the
softmax over all N partitions (``gate: write | read | write_read``); with ``gate: none``
W_e learns only through the balance loss. ``transition: gla`` uses GLA's diagonal gate,
``gated_deltanet`` the gated delta rule (SSE-GDN; there the partition weight scales beta).
``row_topk`` makes the update row-sparse inside the selected partitions (softmax over the top
rows, other rows neither written nor decayed). ``shared_params: false`` gives every partition
its own q/k/v projections (the "w/o shared-params" ablation). ``conv_size`` puts the base's
short causal convolution on the q/k/v projections, the partitions' own ones included (off by
default, as in the paper's models). The always-selected shared partition uses LoRA deltas
(rank ``lora_rank``) on the q/k projections and the shared v, and is written and read with
weight 1. The balance loss is partition-level:
``alpha * N/k * sum_i f_i P_i`` (f_i: fraction of tokens writing partition i; P_i: mean of
softmax(e_t)_i).

``PartitionedMixer`` is the common part of SSE and MoM (``mom.py``): a base mixer of the
linear family supplies projections, decay gates and the output stage; the partitions run in
``sse_impl.partitioned_recurrence`` (masking or varlen).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from sandbox.kernels.short_conv import short_conv
from sandbox.kernels.topk_mask import topk_mask
from sandbox.mixers.base import Linear, Mixer, MixerContext, register
from sandbox.mixers.feature_maps import balance_loss, feature_map, softmax_topk
from sandbox.mixers.linear import LinearMixer, conv_state
from sandbox.mixers.linear_family import GatedDeltaNetConfig, GLAConfig
from sandbox.mixers.sse_impl import Routing, partitioned_recurrence, resolve_impl, route

Transition = Literal["gla", "gated_deltanet"]
PartitionImpl = Literal["auto", "masking", "varlen"]
Kernel = Literal["auto", "torch", "naive", "triton"]
BASES = {"gla": GLAConfig, "gated_deltanet": GatedDeltaNetConfig}


def _positive(cfg, *names):
    for name in names:
        val = getattr(cfg, name)
        if val is not None and not val > 0:
            raise ValueError(f"{name}: must be > 0, got {val}")


class PartitionedMixer(Mixer):
    """N routed state partitions (+ an optional always-on one) over a linear-family base.

    The base (``transition``: GLA or Gated DeltaNet, its default options) is a ``LinearMixer``
    held as ``self.core`` with identity feature maps, so ``core.features`` returns raw query
    and key projections; the base's own maps are applied here (``query_map``/``key_norm``).
    Subclasses define ``route(x)`` and ``streams(x, p, routing)``.
    """

    def __init__(self, ctx: MixerContext, cfg, n: int, k: int, shared: bool):
        super().__init__(ctx, cfg)
        base = BASES[cfg.transition]()
        over = {"feature_map": "identity", "qk_norm": False, "impl": cfg.kernel}
        over.update({f: getattr(cfg, f) for f in ("expand_k", "expand_v", "conv_size")
                     if getattr(cfg, f, None) is not None})
        self.core = LinearMixer(ctx, dataclasses.replace(base, **over))
        self.q_feature, self.qk_norm = base.feature_map, base.qk_norm
        self.H, self.K, self.V = self.core.H, self.core.K, self.core.V
        self.n, self.k, self.shared = n, k, shared
        self.router = Linear(ctx.d_model, n, bias=False)
        self._aux = None

    def query_map(self, q):
        q = feature_map(self.q_feature, q)
        return F.normalize(q, dim=-1) if self.qk_norm else q

    def key_norm(self, k):
        return F.normalize(k, dim=-1) if self.qk_norm else k

    def route(self, x) -> Routing:
        raise NotImplementedError  # abstract: SSE and MoM each route their own way

    def streams(self, x, p, routing: Routing) -> dict:
        """q, k, v, g, beta with a partition axis ``[B, T, 1 or N, H, *]`` and ``shared`` (or None)."""
        raise NotImplementedError  # abstract: SSE and MoM each build their own streams

    def forward(self, x):
        cfg = self.cfg
        self.core.capture = self.capture    # the core records its short convolution's state here
        p = self.core.features(x)
        rt = self.route(x)
        s = self.streams(x, p, rt)
        capture = self.capture is not None
        o, S = partitioned_recurrence(s["q"], s["k"], s["v"], s["g"], s["beta"], rt, shared=s["shared"],
                                      impl=resolve_impl(cfg.impl, x.shape[1], cfg.n), kernel=cfg.kernel,
                                      scale=self.core.scale, output_final_state=capture)
        self._aux = None
        if cfg.balance_alpha > 0:
            self._aux = balance_loss(rt.probs[:, :, None], rt.write_mask[:, :, None], self.k, cfg.balance_alpha)
        if capture:
            self._record(s, rt, S)
        return self.core.finish(o, x, p)

    def _record(self, s, rt, S):
        """Keys and the final state as the expanded state: rows of partition i at i*c..(i+1)*c."""
        B, T, N = rt.write.shape
        w = rt.write if s["beta"] is None else rt.write_mask.to(rt.write.dtype)
        keys = (s["k"] * w[..., None, None]).permute(0, 1, 3, 2, 4)  # [B, T, H, N, K]
        keys = keys.reshape(B, T, self.H, N * self.K)
        if s["shared"] is not None:
            keys = torch.cat([keys, s["shared"]["k"]], dim=-1)
        self.record("keys", keys)
        top = rt.indices[..., 0]
        v = s["v"][:, :, 0] if s["v"].shape[2] == 1 else s["v"].gather(
            2, top[:, :, None, None, None].expand(B, T, 1, *s["v"].shape[3:]))[:, :, 0]
        self.record("values", v)  # the value written to the top partition
        if s["g"] is not None:  # effective log-decay per expanded row: 0 where not written
            diag = lambda g, nd: g if g.ndim == nd else g[..., None].expand(*g.shape, self.K)  # noqa: E731
            g = diag(s["g"], 5).expand(B, T, N, self.H, self.K) * rt.write_mask[..., None, None]
            g = g.permute(0, 1, 3, 2, 4).reshape(B, T, self.H, N * self.K)
            if s["shared"] is not None:
                g = torch.cat([g, diag(s["shared"]["g"], 4)], dim=-1)
            self.record("gates", g)
        self.record("routing", rt.indices[:, :, None])
        self.record("partition_weights", rt.write)
        self.record("read_weights", rt.read)
        P = S.shape[1]
        self.record("final_state", S.permute(0, 2, 1, 3, 4).reshape(B, self.H, P * self.K, self.V))

    def aux_loss(self):
        aux, self._aux = self._aux, None   # handed over once (base.py)
        return aux

    def eager_reason(self) -> str | None:
        if resolve_impl(self.cfg.impl, self.ctx.max_seq_len, self.cfg.n) == "masking":
            return None     # fixed shapes
        return "impl varlen sorts the routed tokens into segments of data-dependent sizes"

    def state_size(self, seq_len: int) -> int:
        """The partitions' states and the last ``conv_size - 1`` inputs of each short convolution's channels."""
        convs = [c for c in (self.core.conv, getattr(self, "part_conv", None)) if c is not None]
        conv = sum(c.shape[0] * (c.shape[1] - 1) for c in convs)
        return (self.n + int(self.shared)) * self.H * self.K * self.V + conv


@dataclass
class SSEConfig:
    n: int = 4  # partitions
    k: int = 1  # partitions written per token
    read_topk: int | None = None  # partitions read per token (k'); null = k
    gate: Literal["none", "write", "read", "write_read"] = "write_read"  # ICLR form; none = arXiv form
    key_map: Literal["softmax", "silu"] = "softmax"
    row_topk: int | None = None  # row-sparse update inside the selected partitions
    shared_params: bool = True  # false: own q/k/v projections per partition
    shared_partition: bool = True  # always-selected partition (LoRA q/k, shared v)
    lora_rank: int | None = None  # null: min(64, d_model // 16), at least 1
    balance_alpha: float = 0.01
    transition: Transition = "gla"
    expand_k: float | None = None  # null: the base's (gla 0.5, gated_deltanet 1.0)
    expand_v: float | None = None  # null: the base's (gla 1.0, gated_deltanet 2.0)
    conv_size: int = 0  # short causal conv (+ silu) on the q, k, v projections, as the base's; 0 = off
    impl: PartitionImpl = "auto"  # masking | varlen | auto (varlen from seq_len 2048 with n >= 10)
    kernel: Kernel = "auto"  # linear_recurrence impl

    def __post_init__(self):
        for name in ("n", "k", "read_topk", "row_topk", "lora_rank"):
            val = getattr(self, name)
            if val is not None and val < 1:
                raise ValueError(f"{name}: must be >= 1{' or null' if name not in ('n', 'k') else ''}, got {val}")
        if self.k > self.n:
            raise ValueError(f"k: must be <= n ({self.n}), the number of partitions; got {self.k}")
        if self.read_topk is not None and self.read_topk > self.n:
            raise ValueError(f"read_topk: must be <= n ({self.n}), the number of partitions; got {self.read_topk}")
        if self.balance_alpha < 0:
            raise ValueError(f"balance_alpha: must be >= 0, got {self.balance_alpha}")
        if self.conv_size < 0:
            raise ValueError(f"conv_size: must be >= 0, got {self.conv_size}")
        _positive(self, "expand_k", "expand_v")

    def state_rows(self, d_model: int, n_heads: int) -> int:
        base = BASES[self.transition]()
        return max(1, round(d_model * (self.expand_k or base.expand_k) / n_heads))

    def check_model(self, model) -> None:
        rows = self.state_rows(model.d_model, model.n_heads)
        if self.row_topk is not None and self.row_topk > rows:
            raise ValueError(f"row_topk: must be <= {rows}, the state rows per partition and head; got {self.row_topk}")


@register("sse", SSEConfig)
class SSE(PartitionedMixer):
    def __init__(self, ctx: MixerContext, cfg: SSEConfig):
        cfg.__post_init__()
        rows = cfg.state_rows(ctx.d_model, ctx.n_heads)
        if cfg.row_topk is not None and cfg.row_topk > rows:
            raise ValueError(f"row_topk: must be <= {rows}, the state rows per partition and head; got {cfg.row_topk}")
        super().__init__(ctx, cfg, cfg.n, cfg.k, cfg.shared_partition)
        d, H, K, V, N = ctx.d_model, self.H, self.K, self.V, cfg.n
        self.k_read = cfg.read_topk or cfg.k
        # partition 0 uses the core's q/k/v projections, partitions 1..N-1 these
        self.part_qkv = None if cfg.shared_params or N == 1 else Linear(d, (N - 1) * H * (2 * K + V), bias=False)
        self.part_conv = None   # their short conv (the core's convolves partition 0's)
        if self.part_qkv is not None and cfg.conv_size:
            self.part_conv = nn.Parameter(torch.randn(self.part_qkv.out_features, cfg.conv_size) / cfg.conv_size ** 0.5)
        self.lora_rank = cfg.lora_rank or max(1, min(64, d // 16))
        self.lora = None
        if cfg.shared_partition:
            r = self.lora_rank
            self.lora = nn.ModuleDict({n: nn.Sequential(Linear(d, r, bias=False), Linear(r, H * K, bias=False))
                                       for n in ("q", "k")})

    def route(self, x):
        gate = self.cfg.gate
        return route(self.router(x), self.k, self.k_read, gate in ("write", "write_read"),
                     gate in ("read", "write_read"), 1.0 / self.k, over_selected=False)

    def key_map(self, logits):
        """Keys and the row mask (None: every row) of logits ``[..., K]``."""
        cfg = self.cfg
        mask = None
        if cfg.row_topk is not None:
            if cfg.key_map == "softmax":
                keys, mask = softmax_topk(logits, cfg.row_topk)
            else:
                mask = topk_mask(logits, cfg.row_topk)
                keys = F.silu(logits) * mask
        else:
            keys = logits.softmax(-1) if cfg.key_map == "softmax" else F.silu(logits)
        return self.key_norm(keys), mask

    def _gate(self, g, mask):
        """Log-decay for keys with row mask ``mask``: unselected rows keep gate 1."""
        if g is None or mask is None:
            return g
        if g.ndim == mask.ndim - 1:
            g = g[..., None]
        return torch.where(mask, g, torch.zeros((), dtype=g.dtype, device=g.device))

    def streams(self, x, p, rt):
        B, T, _ = x.shape
        H, K, V, N = self.H, self.K, self.V, self.n
        q, lk, v = p["q"], p["k"], p["v"]
        qs, ks, vs = q[:, :, None], lk[:, :, None], v[:, :, None]
        if self.part_qkv is not None:
            extra = self.part_qkv(x)
            if self.part_conv is not None:
                if self.capture is not None:
                    self.record("part_conv_state", conv_state(extra, self.cfg.conv_size))
                extra, = short_conv(extra, self.part_conv)
            eq, ek, ev = extra.view(B, T, N - 1, H, 2 * K + V).split([K, K, V], -1)
            qs, ks, vs = torch.cat([qs, eq], 2), torch.cat([ks, ek], 2), torch.cat([vs, ev], 2)
        keys, mask = self.key_map(ks)
        g = None if p["g"] is None else p["g"][:, :, None]
        out = {"q": self.query_map(qs), "k": keys, "v": vs, "beta": None if p["beta"] is None else p["beta"][:, :, None]}
        shared = None
        if self.lora is not None:
            sq = self.query_map(q + self.lora["q"](x).view(B, T, H, K))
            sk, smask = self.key_map(lk + self.lora["k"](x).view(B, T, H, K))
            shared = {"q": sq, "k": sk, "v": v, "g": self._gate(p["g"], smask), "beta": p["beta"]}
        out["g"] = self._gate(g, mask)  # row_topk makes both gates diagonal, else both stay as they are
        out["shared"] = shared
        return out

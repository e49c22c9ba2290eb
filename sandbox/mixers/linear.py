"""The recurrence core of the linear-attention family (its members are configurations of it, in
``linear_family.py``).

Per head: ``S_t = Lambda_t * S_{t-1} + phi(k_t)^T v_t`` (or the delta rule), ``o_t = q_t S_t``,
computed by ``sandbox.kernels.linear_recurrence``. ``LinearConfig`` holds every switch of
the core; each registered mixer is a dataclass that only changes defaults.
``linear_attention`` is the core with its own defaults, so any combination (e.g. a delta rule
with elu+1 keys) can be assembled from YAML.

Row-sparse top-k (SSE §3.2): with ``topk`` set, keys are ``softmax(top-k(key logits))``
(exactly zero off the k chosen rows) and the log-decay of unchosen rows is 0 at that step,
so those rows are neither written nor decayed. A scalar or constant decay is then applied
as a diagonal one. For decay-key coupled mixers the key logits are ``-f`` (f = gate logits,
since ``1 - alpha`` grows as f falls); their chosen rows keep their gate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from sandbox.kernels import IMPLS, linear_recurrence
from sandbox.kernels.library import use_fused
from sandbox.kernels.rms_gate import rms_gate
from sandbox.kernels.short_conv import short_conv
from sandbox.kernels.split_linear import split_linear
from sandbox.mixers.base import Linear, Mixer, MixerContext, gather_rows
from sandbox.mixers.feature_maps import FEATURE_MAPS, balance_loss, chosen_indices, feature_map, softmax_topk

TRANSITIONS = ("none", "constant", "scalar", "diagonal", "delta", "gated_delta")
FeatureMap = Literal["identity", "relu", "silu", "elu1", "softmax"]
Transition = Literal["none", "constant", "scalar", "diagonal", "delta", "gated_delta"]
GateFn = Literal["logsigmoid", "softplus"]
Norm = Literal["none", "rms", "layer"]
Impl = Literal["auto", "torch", "naive", "triton"]


@dataclass
class LinearConfig:
    expand_k: float = 1.0  # key dim per head = d_model * expand_k / n_heads (rows of the state)
    expand_v: float = 1.0  # value dim per head = d_model * expand_v / n_heads
    feature_map: FeatureMap = "identity"  # phi on queries and keys
    qk_norm: bool = False  # L2-normalise q and k after phi
    normalize: bool = False  # divide by q_t . (decayed sum of keys), as in Katharopoulos et al.
    transition: Transition = "none"
    gate_fn: GateFn = "logsigmoid"  # logsigmoid: log(lb + (1-lb) sigmoid(f)) / normalizer;
    #                                 softplus: -exp(A) * softplus(f + dt_bias) (Mamba2 style)
    gate_normalizer: float = 1.0
    gate_rank: int | None = None  # low-rank gate projection (GLA: 16)
    gate_lower_bound: float = 0.0
    key_from_gate: bool = False  # decay-key coupling: k = 1 - exp(g) (HGRN2, MetaLA, GSA)
    scale: float | None = None  # output scale; None = key dim ** -0.5
    output_norm: Norm = "none"  # per head
    output_gate: bool = False  # silu(x W_g) * o
    conv_size: int = 0  # short causal depthwise conv (+ silu) on q, k, v projections; 0 = off
    topk: int | None = None  # row-sparse softmax-top-k keys
    balance_alpha: float = 0.0  # SSE balance loss coefficient (needs topk)
    impl: Impl = "auto"

    def __post_init__(self):
        """Errors read ``field: reason`` (the config loader turns them into ``model.<mixer>.field``)."""
        for fld, choices in (("feature_map", FEATURE_MAPS), ("transition", TRANSITIONS),
                             ("gate_fn", ("logsigmoid", "softplus")), ("output_norm", ("none", "rms", "layer")),
                             ("impl", IMPLS)):
            if getattr(self, fld) not in choices:
                raise ValueError(f"{fld}: must be one of {', '.join(choices)}; got {getattr(self, fld)!r}")
        for fld in ("expand_k", "expand_v", "gate_normalizer"):
            if not getattr(self, fld) > 0:
                raise ValueError(f"{fld}: must be > 0, got {getattr(self, fld)}")
        if self.key_from_gate and self.transition != "diagonal":
            raise ValueError(f"key_from_gate: needs transition 'diagonal', got {self.transition!r}")
        if self.gate_rank is not None and self.gate_rank < 1:
            raise ValueError(f"gate_rank: must be >= 1 or null, got {self.gate_rank}")
        if not 0.0 <= self.gate_lower_bound < 1.0:
            raise ValueError(f"gate_lower_bound: must be in [0, 1), got {self.gate_lower_bound}")
        if self.conv_size < 0:
            raise ValueError(f"conv_size: must be >= 0, got {self.conv_size}")
        if self.topk is not None and self.topk < 1:
            raise ValueError(f"topk: must be >= 1 or null, got {self.topk}")
        if self.balance_alpha < 0 or (self.balance_alpha > 0 and self.topk is None):
            raise ValueError(f"balance_alpha: must be >= 0 and needs topk, got {self.balance_alpha} with topk={self.topk}")
        if self.normalize and self.transition in ("delta", "gated_delta"):
            raise ValueError("normalize: not defined for the delta rule (transition delta/gated_delta)")

    def state_rows(self, d_model: int, n_heads: int) -> int:
        """K: rows of the state per head (the dimension that keys, gates and top-k act on)."""
        return max(1, round(d_model * self.expand_k / n_heads))

    def check_model(self, model) -> None:
        """Combinations with the model shape (called by the config loader)."""
        rows = self.state_rows(model.d_model, model.n_heads)
        if self.topk is not None and self.topk > rows:
            raise ValueError(f"topk: must be <= {rows}, the state rows per head; got {self.topk}")


def conv_state(inputs: torch.Tensor, conv_size: int) -> torch.Tensor:
    """What a short causal convolution carries to continue after ``inputs [B, T, C]``: its last
    ``conv_size - 1`` inputs per channel, zeros standing for those before the sequence's start."""
    return F.pad(inputs, (0, 0, conv_size - 1, 0))[:, inputs.shape[1]:]


class LinearMixer(Mixer):
    """The recurrence core: projections, phi / top-k, transition, recurrence, output."""

    def __init__(self, ctx: MixerContext, cfg: LinearConfig):
        super().__init__(ctx, cfg)
        cfg.__post_init__()  # re-check: fields may have been set after construction
        d, H = ctx.d_model, ctx.n_heads
        self.H = H
        self.K = self.state_rows()
        self.V = max(1, round(d * cfg.expand_v / H))
        self.QK = self.qk_dim()
        if cfg.topk is not None and not 1 <= cfg.topk <= self.K:
            raise ValueError(f"topk: must be in [1, {self.K}], the state rows per head; got {cfg.topk}")
        self.scale = cfg.scale if cfg.scale is not None else self.QK ** -0.5
        self.q_proj = Linear(d, H * self.QK, bias=False)
        self.k_proj = None if cfg.key_from_gate else Linear(d, H * self.K, bias=False)
        self.v_proj = Linear(d, H * self.V, bias=False)
        self.conv = None
        if cfg.conv_size > 0:
            ch = H * self.QK + (0 if self.k_proj is None else H * self.K) + H * self.V
            self.conv = nn.Parameter(torch.randn(ch, cfg.conv_size) / math.sqrt(cfg.conv_size))
        self.gate_width = self._gate_width()
        self.gate_proj = None
        if self.gate_width:
            w = self.gate_width
            if cfg.gate_rank:
                self.gate_proj = nn.Sequential(Linear(d, cfg.gate_rank, bias=False), Linear(cfg.gate_rank, w))
            else:
                self.gate_proj = Linear(d, w, bias=cfg.gate_fn == "logsigmoid")
            if cfg.gate_fn == "softplus":
                self.A_log = nn.Parameter(torch.empty(w).uniform_(1, 16).log())
                dt = torch.empty(w).uniform_(math.log(1e-3), math.log(1e-1)).exp()
                self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        if cfg.transition == "constant":  # RetNet: gamma_h = 1 - 2^(-5-h)
            self.register_buffer("log_gamma", torch.log1p(-(2.0 ** (-5.0 - torch.arange(H, dtype=torch.float64)))).float())
        self.beta_proj = Linear(d, H) if cfg.transition in ("delta", "gated_delta") else None
        if cfg.output_norm != "none":
            self.norm_weight = nn.Parameter(torch.ones(H, self.V))
            self.norm_bias = nn.Parameter(torch.zeros(H, self.V)) if cfg.output_norm == "layer" else None
        self.g_proj = Linear(d, H * self.V, bias=False) if cfg.output_gate else None
        self.o_proj = Linear(H * self.V, d, bias=False)
        self._aux = None

    # -- configuration ---------------------------------------------------------------------
    def state_rows(self) -> int:
        return self.cfg.state_rows(self.ctx.d_model, self.ctx.n_heads)

    def qk_dim(self) -> int:
        """Width of each query (equal to K except for GSA)."""
        return self.K

    def _gate_width(self) -> int:
        t = self.cfg.transition
        if t == "diagonal":
            return self.H * self.K
        if t in ("scalar", "gated_delta"):
            return self.H
        return 0

    # -- forward pieces --------------------------------------------------------------------
    def log_decay(self, f: torch.Tensor):
        """Gate logits -> (log-decay <= 0, step size dt or None)."""
        cfg = self.cfg
        if cfg.gate_fn == "softplus":
            dt = F.softplus(f + self.dt_bias)
            return -self.A_log.exp() * dt, dt
        if cfg.gate_lower_bound > 0:
            lb = cfg.gate_lower_bound
            g = torch.log(lb + (1 - lb) * torch.sigmoid(f))
        else:
            g = F.logsigmoid(f)
        return g / cfg.gate_normalizer, None

    def project(self, x: torch.Tensor) -> dict:
        """The bias-free projections of x by name (q, k, v, the gate's input, the output gate's), as one matrix
        product: x is read once and one larger product replaces up to five small ones, forward and backward
        (at d_model 128 each is too small to fill the GPU). The weights stay separate parameters.

        The product's width is padded with zero rows to a multiple of 8, so that each row of its output (and of
        its gradient) starts on a 16-byte boundary in bf16. A scalar gate per head makes the width odd (Gated
        DeltaNet d128: 770), and for rows of 770 cuBLAS fell back to slower, 2-element-aligned CUTLASS kernels
        for the products that read or write them; padded to 776 it uses its usual ones (results/throughput/
        README.md, "What made it faster"). The padding's outputs are dropped, so nothing else changes.

        With a short convolution, its input (the q, k and v columns, which lead the product) is one piece,
        "qkv", so the convolution reads it as it is and its gradient comes back as one tensor. The backward
        concatenates the pieces' gradients as a plain copy (``split_linear``), not as one pointwise kernel
        that evaluates every piece's backward at every column."""
        gate = self.gate_proj[0] if isinstance(self.gate_proj, nn.Sequential) else self.gate_proj
        mods = {"q": self.q_proj, "k": self.k_proj, "v": self.v_proj,
                "gate": gate if gate is not None and gate.bias is None else None, "og": self.g_proj}
        mods = {n: m for n, m in mods.items() if m is not None}
        names, sizes = list(mods), [m.out_features for m in mods.values()]
        if self.conv is not None:       # the convolution's input, the leading q, k, v columns, as one piece
            n = len(self.qkv_sizes())
            names, sizes = ["qkv"] + names[n:], [sum(sizes[:n])] + sizes[n:]
        w = torch.cat([m.weight for m in mods.values()])
        pad = -w.shape[0] % 8
        if pad:
            w = torch.cat([w, w.new_zeros(pad, w.shape[1])])
        return dict(zip(names, split_linear(x, w, sizes + [pad] if pad else sizes)))

    def qkv_sizes(self) -> list[int]:
        """Widths of the q, k (where the mixer has its own keys) and v projections, in that order."""
        return [m.out_features for m in (self.q_proj, self.k_proj, self.v_proj) if m is not None]

    def features(self, x: torch.Tensor) -> dict:
        """Queries, keys, values, log-decays and betas for the recurrence, [B, T, H, *]."""
        cfg = self.cfg
        B, T, _ = x.shape
        H, K = self.H, self.K
        proj = self.project(x)
        if self.conv is not None:
            if self.capture is not None:
                self.record("conv_state", conv_state(proj["qkv"], cfg.conv_size))
            parts = list(short_conv(proj["qkv"], self.conv, self.qkv_sizes()))
        else:
            parts = [proj[n] for n in ("q", "k", "v") if n in proj]
        q = parts[0].view(B, T, H, self.QK)
        v = parts[-1].view(B, T, H, self.V)
        p = {"q": feature_map(cfg.feature_map, q), "v": v, "g": None, "beta": None, "dt": None, "og": proj.get("og")}
        f = None
        if self.gate_proj is not None:
            if "gate" not in proj:                          # a full-rank gate with a bias
                f = self.gate_proj(x)
            elif isinstance(self.gate_proj, nn.Sequential):  # low rank: its second, biased factor
                f = self.gate_proj[1](proj["gate"])
            else:
                f = proj["gate"]
            f = f.view(B, T, H, -1)
            f = f.to(torch.promote_types(f.dtype, torch.float32))  # log-decays in >= fp32 under autocast
            if cfg.transition != "diagonal":  # one scalar per head
                f = f[..., 0]
            p["g"], p["dt"] = self.log_decay(f)
        elif cfg.transition == "constant":
            p["g"] = self.log_gamma.to(x.dtype).expand(B, T, H)
        if cfg.key_from_gate:
            logits = -f
            p["k"] = -torch.expm1(p["g"])  # 1 - alpha
        else:
            logits = parts[1].view(B, T, H, K)
            p["k"] = feature_map(cfg.feature_map, logits)
        if cfg.topk is not None:
            p["k"], mask = softmax_topk(logits, cfg.topk)
            if self.capture is not None:
                p["routing"] = chosen_indices(logits, mask, cfg.topk)
            if p["g"] is not None:
                g = p["g"] if p["g"].ndim == 4 else p["g"][..., None].expand(B, T, H, K)
                p["g"] = g.masked_fill(~mask, 0.0)
            self._aux = balance_loss(p["k"], mask, cfg.topk, cfg.balance_alpha) if cfg.balance_alpha > 0 else None
        if cfg.qk_norm:
            p["q"], p["k"] = F.normalize(p["q"], dim=-1), F.normalize(p["k"], dim=-1)
        if self.beta_proj is not None:
            p["beta"] = torch.sigmoid(self.beta_proj(x))
        return p

    def recur(self, p: dict) -> torch.Tensor:
        """Run the recurrence; returns o [B, T, H, V] and records the final state when capturing."""
        v = p["v"]
        if self.cfg.normalize:
            v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
        o, S = linear_recurrence(p["q"], p["k"], v, p["g"], p["beta"], scale=self.scale,
                                 output_final_state=self.capture is not None, impl=self.cfg.impl)
        if self.cfg.normalize:
            o = o[..., :-1] / (o[..., -1:] + 1e-6)
            if S is not None:
                self.record("final_normalizer", S[..., -1])
                S = S[..., :-1]
        if S is not None:
            self.record("final_state", S)
        return o

    def finish(self, o: torch.Tensor, x: torch.Tensor, p: dict) -> torch.Tensor:
        """Per-head output norm, output gate, output projection."""
        cfg = self.cfg
        if cfg.output_norm == "rms" and use_fused(o):
            return self.o_proj(rms_gate(o, self.norm_weight, p.get("og"), 1e-6))
        if cfg.output_norm == "rms":
            o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm_weight
        elif cfg.output_norm == "layer":
            o = F.layer_norm(o, (self.V,), eps=1e-5) * self.norm_weight + self.norm_bias
        o = o.reshape(*o.shape[:2], self.H * self.V)
        if p.get("og") is not None:
            o = o * F.silu(p["og"])
        return self.o_proj(o)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_at(x, None)

    def forward_at(self, x: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        """The recurrence over every position; ``finish`` (per token: norm, gate, projection) at ``positions``
        only (``None``: every position)."""
        p = self.features(x)
        for name in ("q", "k", "v", "g"):
            if p[name] is not None:
                self.record({"q": "queries", "k": "keys", "v": "values", "g": "gates"}[name], p[name])
        if "routing" in p:
            self.record("routing", p["routing"])
        o = self.recur(p)
        if positions is not None:
            B, T = x.shape[:2]
            o, x = gather_rows(o, positions), gather_rows(x, positions)
            p = {n: gather_rows(t, positions) if isinstance(t, torch.Tensor) and t.shape[:2] == (B, T) else t
                 for n, t in p.items()}
        return self.finish(o, x, p)

    def aux_loss(self):
        aux, self._aux = self._aux, None   # handed over once (base.py)
        return aux

    def graph_safe(self) -> bool:
        return True  # fixed shapes; the kernels' only host reads are on the varlen path

    def state_size(self, seq_len: int) -> int:
        n = self.H * self.K * (self.V + (1 if self.cfg.normalize else 0))
        if self.conv is not None:
            n += self.conv.shape[0] * (self.cfg.conv_size - 1)
        return n

"""The registered members of the linear-attention family: each is a dataclass that only changes the
defaults of ``LinearConfig`` (``linear.py``), plus two small subclasses of the core (Mamba2's input
step size and skip, MetaLA's self-augmentation). GSA lives in ``gsa.py``, SSE in ``sse.py``."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sandbox.mixers.base import MixerContext, register
from sandbox.mixers.linear import FeatureMap, GateFn, LinearConfig, LinearMixer, Norm, Transition


@dataclass
class LinearAttentionConfig(LinearConfig):
    """Katharopoulos et al.: phi = elu + 1 on q and k, no decay, normalised output."""
    feature_map: FeatureMap = "elu1"
    normalize: bool = True


@dataclass
class RetNetConfig(LinearConfig):
    """RetNet: constant per-head decay 1 - 2^(-5-h), per-head group norm, swish output gate (no xPos)."""
    expand_v: float = 2.0
    transition: Transition = "constant"
    output_norm: Norm = "layer"
    output_gate: bool = True


@dataclass
class GLAConfig(LinearConfig):
    """GLA: diagonal gate sigmoid(x W1 W2)^(1/16), per-head RMSNorm, swish output gate."""
    expand_k: float = 0.5
    transition: Transition = "diagonal"
    gate_normalizer: float = 16.0
    gate_rank: int | None = 16
    output_norm: Norm = "rms"
    output_gate: bool = True


@dataclass
class Mamba2Config(LinearConfig):
    """Mamba2 (SSD) as linear attention: C = q, B = k, x*dt = v, scalar decay -exp(A) dt, D skip,
    gated RMSNorm; the short convolution is off by default."""
    expand_v: float = 2.0
    transition: Transition = "scalar"
    gate_fn: GateFn = "softplus"
    scale: float | None = 1.0
    output_norm: Norm = "rms"
    output_gate: bool = True


@dataclass
class HGRN2Config(LinearConfig):
    """HGRN2: forget gate f = lb + (1-lb) sigmoid(x W_f) per row, key = 1 - f, swish queries, RMSNorm."""
    feature_map: FeatureMap = "silu"
    transition: Transition = "diagonal"
    key_from_gate: bool = True
    output_norm: Norm = "rms"


@dataclass
class DeltaNetConfig(LinearConfig):
    """DeltaNet: silu + L2-normalised q, k, beta = sigmoid(x W_b), delta rule, per-head RMSNorm."""
    feature_map: FeatureMap = "silu"
    qk_norm: bool = True
    transition: Transition = "delta"
    output_norm: Norm = "rms"


@dataclass
class GatedDeltaNetConfig(LinearConfig):
    """Gated DeltaNet: DeltaNet plus a Mamba2-style scalar decay and a gated RMSNorm output."""
    expand_v: float = 2.0
    feature_map: FeatureMap = "silu"
    qk_norm: bool = True
    transition: Transition = "gated_delta"
    gate_fn: GateFn = "softplus"
    output_norm: Norm = "rms"
    output_gate: bool = True


@dataclass
class MetaLAConfig(LinearConfig):
    """MetaLA: no key projection, key = 1 - alpha with alpha = sigmoid(x W)^(1/16) per row,
    self-augmentation, per-head LayerNorm, swish output gate."""
    expand_k: float = 0.5
    transition: Transition = "diagonal"
    gate_normalizer: float = 16.0
    key_from_gate: bool = True
    output_norm: Norm = "layer"
    output_gate: bool = True
    self_augment: bool = True


@register("linear_attention", LinearAttentionConfig)
class LinearAttention(LinearMixer):
    pass


@register("retnet", RetNetConfig)
class RetNet(LinearMixer):
    pass


@register("gla", GLAConfig)
class GLA(LinearMixer):
    pass


@register("hgrn2", HGRN2Config)
class HGRN2(LinearMixer):
    pass


@register("deltanet", DeltaNetConfig)
class DeltaNet(LinearMixer):
    pass


@register("gated_deltanet", GatedDeltaNetConfig)
class GatedDeltaNet(LinearMixer):
    pass


@register("mamba2", Mamba2Config)
class Mamba2(LinearMixer):
    """Values are scaled by the step size dt (the SSM input term) and a D-weighted skip is added."""

    def __init__(self, ctx: MixerContext, cfg: Mamba2Config):
        super().__init__(ctx, cfg)
        self.D = nn.Parameter(torch.ones(self.H))

    def features(self, x):
        p = super().features(x)
        p["skip"] = p["v"]
        p["v"] = p["v"] * p["dt"][..., None]
        return p

    def finish(self, o, x, p):
        return super().finish(o + self.D[:, None] * p["skip"], x, p)


@register("metala", MetaLAConfig)
class MetaLA(LinearMixer):
    """Self-augmentation: o_t += sigmoid((q_t . (w_aug * k_t)) v_t), before the output norm."""

    def __init__(self, ctx: MixerContext, cfg: MetaLAConfig):
        super().__init__(ctx, cfg)
        self.aug = nn.Parameter(torch.zeros(self.H, self.K)) if cfg.self_augment else None

    def finish(self, o, x, p):
        if self.aug is not None:
            w = (p["q"] * p["k"] * self.aug).sum(-1, keepdim=True)
            o = o + torch.sigmoid(w * p["v"])
        return super().finish(o, x, p)

"""Gated slot attention (GSA) as two passes of the linear-recurrence core.

With m slots per head, forget gate alpha_t in (0,1)^m and slot writes s_t = 1 - alpha_t:
    K~_t = diag(alpha_t) K~_{t-1} + s_t^T k_t      (m x d_k)
    V~_t = diag(alpha_t) V~_{t-1} + s_t^T v_t      (m x d_v)
    o_t  = V~_t^T softmax(K~_t q_t * d_k^-0.5)
Pass 1 reads K~ q with ``slot_scores`` (chunked, Triton on a GPU, no per-slot copies of q and k; its
reference, impl "naive", is the core loop with one [d_k, 1] state per (head, slot)). Pass 2 is
the core recurrence with queries = slot probabilities, keys = s_t, diagonal gate alpha_t.
With ``topk``, s_t = softmax(top-k(-f)) over the slots and unchosen slots keep alpha = 1 in
both passes.
"""
from __future__ import annotations

from dataclasses import dataclass

from sandbox.kernels import linear_recurrence, recurrent_reference
from sandbox.kernels.slot_scores import slot_scores
from sandbox.mixers.base import Linear, MixerContext, register
from sandbox.mixers.feature_maps import feature_map
from sandbox.mixers.linear import FeatureMap, LinearConfig, LinearMixer, Norm, Transition


@dataclass
class GSAConfig(LinearConfig):
    """expand_k sets the query/key width d_k; num_slots sets the state rows m."""
    num_slots: int = 64
    feature_map: FeatureMap = "silu"
    transition: Transition = "diagonal"
    key_from_gate: bool = True
    gate_normalizer: float = 8.0
    output_norm: Norm = "rms"

    def __post_init__(self):
        super().__post_init__()
        if self.num_slots < 1:
            raise ValueError(f"num_slots: must be >= 1, got {self.num_slots}")
        if self.transition != "diagonal" or not self.key_from_gate or self.normalize:
            raise ValueError("transition: gsa needs transition 'diagonal', key_from_gate true, normalize false")

    def state_rows(self, d_model: int, n_heads: int) -> int:
        return self.num_slots


@register("gsa", GSAConfig)
class GSA(LinearMixer):
    def __init__(self, ctx: MixerContext, cfg: GSAConfig):
        super().__init__(ctx, cfg)
        self.k1_proj = Linear(ctx.d_model, self.H * self.QK, bias=False)

    def qk_dim(self) -> int:
        return max(1, round(self.ctx.d_model * self.cfg.expand_k / self.ctx.n_heads))

    def features(self, x):
        p = super().features(x)  # q: [B,T,H,dk]; k: slot writes [B,T,H,m]; g: [B,T,H,m]
        B, T, _ = x.shape
        p["k1"] = feature_map(self.cfg.feature_map, self.k1_proj(x).view(B, T, self.H, self.QK))
        return p

    def recur(self, p):
        q, k1, g, v = p["q"], p["k1"], p["g"], p["v"]
        # the slot writes once in the operands' dtype (bf16 under autocast), for both passes: the second pass
        # rounds them so anyway, and the first reads them (and writes their gradient) at half a float32's bytes
        s = p["k"].to(v.dtype)
        B, T, H, m = s.shape
        dk = self.QK
        capture = self.capture is not None
        if self.cfg.impl == "naive":  # ground truth: one [d_k, 1] state per (head, slot), m copies of q and k
            per_slot = lambda z: z[:, :, :, None, :].expand(B, T, H, m, dk).reshape(B, T, H * m, dk)  # noqa: E731
            scores, S1 = recurrent_reference(per_slot(q), per_slot(k1), s.reshape(B, T, H * m, 1),
                                             g.reshape(B, T, H * m), scale=self.scale,
                                             output_final_state=capture)
        else:
            scores, S1 = slot_scores(q, k1, s, g, scale=self.scale, output_final_state=capture,
                                     impl=self.cfg.impl)
        probs = scores.view(B, T, H, m).softmax(-1)
        o, S2 = linear_recurrence(probs, s, v, g, scale=1.0, output_final_state=capture, impl=self.cfg.impl)
        if capture:
            self.record("slot_probs", probs)
            self.record("final_key_state", S1.view(B, H, m, dk))
            self.record("final_state", S2)
        return o

    def state_size(self, seq_len: int) -> int:
        n = self.H * self.K * (self.QK + self.V)
        if self.conv is not None:
            n += self.conv.shape[0] * (self.cfg.conv_size - 1)
        return n

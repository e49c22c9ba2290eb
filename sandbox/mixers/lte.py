"""Learnable token eviction (``lte``, laLTE §3.1): sliding window + attention sink + a small
per-head CNN that decides which KV pairs stay visible after leaving the window.

Pattern (eq. 5), per head h, query i, key j <= i::

    j visible  <=>  j < sinks  or  i - j < window  or  r[j, h] > 0.5

Retention score ``r = sigmoid(CNN(k_pre_rope || v))``: per head a 3-layer grouped 1-D CNN
(kernel 3, dilation 2: receptive field 13 = 6 tokens either side; channels 2*dh -> dh -> dh/2
-> dh/4, each conv followed by SiLU and dropout) and a per-head linear head (a kernel-1
grouped conv). Each conv zero-pads 2 on both sides ("same"), so the score of token j reads
tokens j-6 .. j+6; it is only used once j has left the window (``window >= 13`` is
required), when those tokens are all in the past of the query, so nothing leaks.

Training (this module): one attention over the full causal sequence under the pattern above
(``swa.Retained``: FlexAttention's block mask in a compiled step on CUDA, a boolean mask for SDPA
elsewhere). The keep decision is the hard threshold ``r > 0.5`` (no top-b while training: the cap
is approached through the penalty below). Gradient to the scores (eq. 6): values pass through a
straight-through gate ``v' = v * m`` with ``m = 1`` in the forward, and
``dL/dr[j, h] = <v[j, h], dL/dv'[j, h]>`` (summed over every query that reads v_j, as the paper
writes it and its released code does).

Sparsity penalty (eq. 7) and the lambda feedback loop (appendix A, algorithm 1), per head::

    aux   = sum_h lambda_h * mean_{batch, j} ReLU(r[j, h] - 0.5)
    c_h   = mean over the batch of #{j : r[j, h] > 0.5}                (retention count)
    c_ema = a c + (1 - a) c_ema,  a = 2 / (1 + u/2)
    every u steps:  s = 1[c_ema > cap] - 1[c_ema < 0.95 cap];  lambda *= alpha**s
                    lambda = min(lambda, 1);  lambda < lambda_init -> 0;
                    c_ema > cap and lambda == 0 -> lambda_init

Both j-sums run over the tokens that leave the window inside the training sequence
(``sinks <= j <= T-1-window``), so ``c_h`` is exactly what the inference cache would hold per
head at the last position; the mean (not the paper's sum) over tokens keeps the penalty's
scale independent of T. lambda, c_ema and the step counter are buffers updated on the device
inside ``forward`` when training (no host sync); they are saved with the checkpoint.

``scorer: mlp`` is the paper's LTE-MLP ablation (§4.2): the CNN replaced by a per-head 2-layer MLP on the token's
own ``k_pre_rope || v`` (kernel-1 grouped convolutions, 2*dh -> dh -> 1), which sees no neighbour, past or future.
The cache scores it at the same step as the CNN (its score needs no look-ahead, so waiting changes nothing).

``dense_steps`` (not in the paper; 0 by default) keeps every token for the first training steps
while the scores already learn through eq. 6 and the lambda loop already runs: at init the
value-gate gradient tends to push all scores down before attention has learned to read far
tokens, which in short runs can evict everything for good (the authors' code has a similar
warm-up switch, off in their runs).

Inference with the per-head cap (§3.1.3: circular window + compacted out-of-window segment)
lives in ``lte_cache.py``; ``use_cache(model)`` switches LTE layers to it.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from sandbox.mixers.base import MixerContext, register
from sandbox.mixers.lte_cache import run_with_cache
from sandbox.mixers.swa import HeadAttention, Retained, SinkWindow, SWAConfig, attend

KERNEL, DILATION, LAYERS = 3, 2, 3
RECEPTIVE_FIELD = 1 + LAYERS * (KERNEL - 1) * DILATION      # 13
HALF_FIELD = RECEPTIVE_FIELD // 2                           # 6
TOLERANCE = 0.95                                            # lambda decreases below 0.95 * cap


@dataclass
class LTEConfig(SWAConfig):
    window: int = 768  # laLTE: w = 768
    sinks: int = 4  # laLTE: s = 4
    cap: int = 512  # b: out-of-window KV pairs per head (target in training, hard cap in inference)
    dropout: float = 0.1  # after each conv of the retention CNN
    lambda_init: float = 1e-9  # also the floor below which lambda snaps to 0
    lambda_alpha: float = 1.5  # multiplicative step of lambda (the released config: 1.5 up)
    lambda_every: int = 32  # u: update lambda every u training steps
    dense_steps: int = 0  # keep every token for the first N training steps (scores still learn); 0 = paper
    scorer: Literal["cnn", "mlp"] = "cnn"  # mlp: the LTE-MLP ablation, no context (module docstring)

    def __post_init__(self):
        super().__post_init__()
        if self.window < RECEPTIVE_FIELD:
            raise ValueError(f"window: must be >= {RECEPTIVE_FIELD} (the CNN's receptive field), got {self.window}")
        if self.cap < 0:
            raise ValueError(f"cap: must be >= 0, got {self.cap}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout: must be in [0, 1), got {self.dropout}")
        if not 0.0 < self.lambda_init <= 1.0:
            raise ValueError(f"lambda_init: must be in (0, 1], got {self.lambda_init}")
        if self.lambda_alpha <= 1.0:
            raise ValueError(f"lambda_alpha: must be > 1, got {self.lambda_alpha}")
        if self.lambda_every < 1:
            raise ValueError(f"lambda_every: must be >= 1, got {self.lambda_every}")
        if self.dense_steps < 0:
            raise ValueError(f"dense_steps: must be >= 0, got {self.dense_steps}")
        if self.scorer not in ("cnn", "mlp"):
            raise ValueError(f"scorer: must be cnn or mlp, got {self.scorer!r}")


class RetentionCNN(nn.Module):
    """Per-head grouped CNN: ``[b, t, h, 2*dh]`` -> retention logits ``[b, t, h]``. With ``kernel=1, layers=1``
    it is the LTE-MLP ablation's per-token 2-layer MLP (one hidden layer, then the head)."""

    def __init__(self, n_heads: int, head_dim: int, dropout: float, kernel: int = KERNEL, layers: int = LAYERS):
        super().__init__()
        if head_dim < 4:
            raise ValueError(f"n_heads: lte needs a head dim >= 4 (channels halve three times), got {head_dim}")
        widths = [2 * head_dim, head_dim, head_dim // 2, head_dim // 4][:layers + 1]
        self.convs = nn.ModuleList(
            nn.Conv1d(n_heads * a, n_heads * b, kernel, dilation=DILATION, padding=DILATION * (kernel - 1) // 2,
                      groups=n_heads) for a, b in zip(widths[:-1], widths[1:]))
        self.head = nn.Conv1d(n_heads * widths[-1], n_heads, 1, groups=n_heads)
        self.dropout = nn.Dropout(dropout)
        with torch.no_grad():              # start dense: sigmoid(0.5) > 0.5 keeps every token
            self.head.bias.fill_(0.5)

    def forward(self, kv: torch.Tensor) -> torch.Tensor:
        b, t, h, c = kv.shape
        z = kv.permute(0, 2, 3, 1).reshape(b, h * c, t)        # channels grouped head by head
        for conv in self.convs:
            z = self.dropout(F.silu(_conv(conv, z)))
        return _conv(self.head, z).transpose(1, 2)             # [b, t, h]


def _conv(conv: nn.Conv1d, z: torch.Tensor) -> torch.Tensor:
    """``conv(z)`` with its weights cast to z's dtype, as autocast does, except under vmap (stacked replicas),
    where autocast leaves a convolution's batched weights in float32 and the convolution refuses the mix."""
    return F.conv1d(z, conv.weight.to(z.dtype), conv.bias.to(z.dtype), padding=conv.padding,
                    dilation=conv.dilation, groups=conv.groups)


def value_gate(v: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Straight-through value mask (eq. 6): ``v`` in the forward, ``dL/dr = <v, dL/dv>`` per token and head.
    Written as ``v + (r - r.detach()) v.detach()``, whose second term is zero, rather than as an
    ``autograd.Function``: vmap (stacked replicas) refuses a Function without a rule, and torch.compile inside
    vmap differentiates a Function's forward, ignoring its backward (pytorch/pytorch#129845)."""
    return v + (r - r.detach()).to(v.dtype)[..., None] * v.detach()


@register("lte", LTEConfig)
class LearnableTokenEviction(HeadAttention):
    def __init__(self, ctx: MixerContext, cfg: LTEConfig):
        super().__init__(ctx, cfg)
        shape = {"cnn": {}, "mlp": {"kernel": 1, "layers": 1}}[cfg.scorer]
        self.cnn = RetentionCNN(self.n_heads, self.head_dim, cfg.dropout, **shape)
        h = self.n_heads
        self.register_buffer("lam", torch.full((h,), cfg.lambda_init, dtype=torch.float32))
        self.register_buffer("count_ema", torch.zeros(h, dtype=torch.float32))
        self.register_buffer("lam_step", torch.zeros((), dtype=torch.int64))
        self.inference_cache = False      # set by use_cache(model)
        self._aux: torch.Tensor | None = None

    def retention(self, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Scores ``r [b, t, h]`` in (0, 1) from pre-RoPE keys and values ``[b, t, h, dh]``."""
        return torch.sigmoid(self.cnn(torch.cat([k, v], dim=-1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._aux = None
        q, k, v = self.project(x)
        if self.inference_cache and not self.training:
            return self.finish(run_with_cache(self, q, k, v))
        t = x.shape[1]
        w, s = self.cfg.window, self.cfg.sinks
        r = self.retention(k, v)                                   # [b, t, h]
        keep = r > 0.5
        if self.training and torch.is_grad_enabled():
            v = value_gate(v, r)
            if self.cfg.dense_steps:
                keep = keep | (self.lam_step < self.cfg.dense_steps)      # warm-up: nothing evicted
        q, k = self.positional(q, k)
        o = attend(q, k, v, Retained(SinkWindow(t, w, s, x.device), keep.transpose(1, 2)))

        eligible = r[:, s:max(s, t - w)]                           # tokens leaving the window in-sequence
        count = (eligible.detach() > 0.5).float().sum(1).mean(0)   # [h]
        self.record("keys", k)
        self.record("values", v)
        self.record("retention", r)
        self.record("retained_count", count)
        if self.training and torch.is_grad_enabled() and eligible.shape[1] > 0:
            lam = self.lam.clone()                                 # the value before this step's update
            self._aux = (lam * F.relu(eligible.float() - 0.5).mean(dim=(0, 1))).sum()
            self._update_lambda(count)
        return self.finish(o)

    @torch.no_grad()
    def _update_lambda(self, count: torch.Tensor) -> None:
        """Algorithm 1, lines 6-13, as tensor ops on the device."""
        cfg = self.cfg
        a = 2.0 / (1.0 + cfg.lambda_every / 2.0)
        first = self.lam_step == 0
        ema = torch.where(first, count, a * count + (1 - a) * self.count_ema)
        self.count_ema.copy_(ema)
        over = ema > cfg.cap
        direction = over.float() - (ema < TOLERANCE * cfg.cap).float()
        lam = (self.lam * torch.pow(cfg.lambda_alpha, direction)).clamp(max=1.0)
        lam = torch.where(lam < cfg.lambda_init, torch.zeros_like(lam), lam)
        lam = torch.where(over & (lam == 0), torch.full_like(lam, cfg.lambda_init), lam)
        self.lam.copy_(torch.where(self.lam_step % cfg.lambda_every == 0, lam, self.lam))
        self.lam_step += 1

    def aux_loss(self) -> torch.Tensor | None:
        aux, self._aux = self._aux, None   # handed over once (base.py)
        return aux

    def state_size(self, seq_len: int) -> int:
        """The inference cache: window + sinks + cap KV pairs per head."""
        return 2 * min(seq_len, self.cfg.window + self.cfg.sinks + self.cfg.cap) * self.ctx.d_model


@contextmanager
def use_cache(model):
    """Within the block, LTE layers of ``model`` in eval mode run through the capped cache."""
    layers = [m for m in model.modules() if isinstance(m, LearnableTokenEviction)]
    before = [m.inference_cache for m in layers]
    for m in layers:
        m.inference_cache = True
    try:
        yield layers
    finally:
        for m, flag in zip(layers, before):
            m.inference_cache = flag

"""Inference for ``lte`` with the capped per-head KV cache of laLTE §3.1.3.

Per layer, batch row and head the cache holds three segments:

* the **window**: a circular buffer of the last ``window`` tokens (slot ``t % window``), keys
  kept before RoPE together with their positions, values, and each token's retention score
  once it is known;
* the **sinks**: the first ``sinks`` tokens, moved here when they leave the window;
* the **out-of-window segment**: at most ``cap`` tokens per head, compacted (new entries take
  the first free slot). When a token leaves the window with ``r > 0.5`` it is copied there; if
  the segment is full it replaces the lowest-scoring entry, but only when it scores higher.

Scores are computed as soon as the CNN's receptive field is complete: token ``p`` is scored at
step ``p + 6`` from the window entries ``p-6 .. p+6`` (the same "same"-padded convolutions as in
training, so scores agree). The paper batches this lazily and keeps post-RoPE keys (undoing
RoPE for the CNN); keeping pre-RoPE keys and positions here gives the same attention.

Whenever no head's out-of-window retention exceeds ``cap``, the outputs equal the training mask
(``tests/test_hybrids.py`` checks this); beyond it the cache is the paper's top-score policy.

``run_with_cache`` is what an LTE layer calls in eval mode under ``lte.use_cache(model)``; the
other layers of a model still process the sequence in parallel, which for causal layers is the
same as decoding token by token. ``sandbox.analysis.lte_eval`` scores a task that way
(``sandbox lte-eval RUN_DIR [--set task.seq_len=8192]``).
"""
from __future__ import annotations

import math

import torch

from sandbox.mixers.swa import rope


class LTECache:
    """Decoding state of one LTE layer for ``b`` sequences (all at the same position)."""

    def __init__(self, mixer, b: int, device, dtype):
        cfg = mixer.cfg
        h, dh = mixer.n_heads, mixer.head_dim
        self.mixer, self.t = mixer, 0
        self.window, self.sinks, self.cap = cfg.window, cfg.sinks, cfg.cap
        w = self.window
        self.win_k = torch.zeros(b, h, w, dh, device=device, dtype=dtype)      # pre-RoPE keys
        self.win_v = torch.zeros(b, h, w, dh, device=device, dtype=dtype)
        self.win_r = torch.full((b, h, w), float("nan"), device=device, dtype=dtype)
        self.win_pos = torch.full((w,), -1, device=device, dtype=torch.int64)
        self.sink_k = torch.zeros(b, h, self.sinks, dh, device=device, dtype=dtype)
        self.sink_v = torch.zeros(b, h, self.sinks, dh, device=device, dtype=dtype)
        self.n_sinks = 0
        self.out_k = torch.zeros(b, h, self.cap, dh, device=device, dtype=dtype)
        self.out_v = torch.zeros(b, h, self.cap, dh, device=device, dtype=dtype)
        self.out_r = torch.full((b, h, self.cap), -math.inf, device=device, dtype=dtype)   # -inf: free
        self.out_pos = torch.full((b, h, self.cap), -1, device=device, dtype=torch.int64)

    def retained(self) -> torch.Tensor:
        """Occupied out-of-window slots per head ``[b, h]``."""
        return (self.out_r > -math.inf).sum(-1)

    def _evict(self) -> None:
        """Token ``t - window`` leaves the window: to the sinks, the capped segment, or gone."""
        p = self.t - self.window
        slot = p % self.window
        k, v, r = self.win_k[:, :, slot], self.win_v[:, :, slot], self.win_r[:, :, slot]
        if p < self.sinks:
            self.sink_k[:, :, p], self.sink_v[:, :, p] = k, v
            self.n_sinks = p + 1
            return
        if self.cap == 0:
            return
        low = self.out_r.argmin(-1, keepdim=True)                               # free slots are -inf
        admit = (r > 0.5) & (r > self.out_r.gather(-1, low).squeeze(-1))       # [b, h]
        idx = low[..., None].expand(-1, -1, -1, k.shape[-1])
        for buf, new in ((self.out_k, k), (self.out_v, v)):
            old = buf.gather(2, idx).squeeze(2)
            buf.scatter_(2, idx, torch.where(admit[..., None], new, old)[:, :, None])
        self.out_r.scatter_(-1, low, torch.where(admit, r, self.out_r.gather(-1, low).squeeze(-1))[..., None])
        self.out_pos.scatter_(-1, low, torch.where(admit, torch.full_like(admit, p, dtype=torch.int64),
                                                   self.out_pos.gather(-1, low).squeeze(-1))[..., None])

    def _score(self) -> None:
        """Score token ``t - 6`` from the window entries ``t-12 .. t`` (zeros before position 0)."""
        p = self.t - 6
        if p < 0:
            return
        lo = max(0, p - 6)
        slots = torch.arange(lo, self.t + 1, device=self.win_pos.device) % self.window
        kv = torch.cat([self.win_k[:, :, slots], self.win_v[:, :, slots]], dim=-1)     # [b, h, L, 2dh]
        logits = self.mixer.cnn(kv.transpose(1, 2))                                     # [b, L, h]
        self.win_r[:, :, p % self.window] = torch.sigmoid(logits[:, p - lo]).to(self.win_r.dtype)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One token: ``q, k, v [b, h, dh]`` (pre-RoPE) -> attention output ``[b, h, dh]``."""
        if self.t >= self.window:
            self._evict()
        slot = self.t % self.window
        self.win_k[:, :, slot], self.win_v[:, :, slot] = k, v
        self.win_r[:, :, slot] = float("nan")
        self.win_pos[slot] = self.t
        self._score()
        out = self._attend(q)
        self.t += 1
        return out

    def held(self):
        """The cache's slots, sinks, then the capped segment, then the window: pre-RoPE keys and values
        ``[b, h, n, dh]`` and whether each slot holds a token ``[b, h, n]``."""
        b, h, ns = self.out_r.shape[0], self.out_r.shape[1], self.n_sinks
        keys = torch.cat([self.sink_k[:, :, :ns], self.out_k, self.win_k], dim=2)
        vals = torch.cat([self.sink_v[:, :, :ns], self.out_v, self.win_v], dim=2)
        valid = torch.cat([torch.ones(b, h, ns, dtype=torch.bool, device=keys.device), self.out_r > -math.inf,
                           (self.win_pos >= 0).expand(b, h, -1)], dim=2)
        return keys, vals, valid

    def _attend(self, q: torch.Tensor) -> torch.Tensor:
        b, h, dh = q.shape
        ns = self.n_sinks
        keys, vals, valid = self.held()
        if self.mixer.cfg.rope:
            base = self.mixer.cfg.rope_base
            pos = torch.cat([torch.arange(ns, device=q.device).expand(b, h, -1), self.out_pos,
                             self.win_pos.expand(b, h, -1)], dim=2)
            keys = rope(keys, pos, base)
            q = rope(q, torch.full((), self.t, device=q.device), base)
        scores = torch.einsum("bhd,bhnd->bhn", q, keys) / math.sqrt(dh)
        p = torch.softmax(scores.masked_fill(~valid, -math.inf), dim=-1)
        return torch.einsum("bhn,bhnd->bhd", p.to(vals.dtype), vals)


@torch.no_grad()
def run_with_cache(mixer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Feed a whole sequence ``q, k, v [b, t, h, dh]`` through a fresh cache token by token;
    returns ``[b, h, t, dh]``. Records the final out-of-window occupancy per head as
    ``retained_count`` (mean over the batch) when capturing."""
    cache = LTECache(mixer, q.shape[0], q.device, q.dtype)
    outs = [cache.step(q[:, i], k[:, i], v[:, i]) for i in range(q.shape[1])]
    mixer.record("retained_count", cache.retained().float().mean(0))
    for name, z in zip(("cache_keys", "cache_values", "cache_valid"), cache.held()):
        mixer.record(name, z)
    return torch.stack(outs, dim=2)

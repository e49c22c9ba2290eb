"""Query-aware block-sparse attention: MoBA (``moba``) and Native Sparse Attention (``nsa``).

Both score blocks of past keys per query and head, keep the top ones (``topk``: fixed shapes), and
run softmax attention over the chosen blocks' tokens (``swa.ChosenBlocks``: FlexAttention's block
mask in a compiled step on CUDA, a boolean ``[b, h, t, t]`` mask for SDPA elsewhere).

**MoBA** (Lu et al. 2025): blocks of ``block_size`` tokens; block key = mean of the block's
(post-RoPE) keys; gate = q . mean key; blocks after the query's own block are excluded, the
own block is always selected (causal inside) and counts toward ``top_k``. The paper's
pre-training runs use block 512 / top-3 at 8k; with ``top_k >= #blocks`` it is full attention.

**NSA** (Yuan et al. 2025), three branches combined by per-head sigmoid gates from ``x``:

* compressed: overlapping blocks of ``cmp_block`` (l) tokens every ``cmp_stride`` (d) tokens,
  each mapped to one key and one value by a learned linear map of the flattened block plus a
  learned intra-block position embedding (the paper's "MLP with intra-block position
  encoding", here one linear layer); a query sees a compressed block once it is complete;
* selected: the compressed-attention probabilities, summed over the compressed blocks that
  overlap each selection block of ``slc_block`` (l') tokens, rank the selection blocks; the top
  ``slc_count`` (n) are attended, always including the initial block and the 2 local blocks
  (the query's own and the previous one), as in the paper;
* sliding: a window of ``window`` tokens.

Each branch has its own keys and values (the paper does this "to prevent shortcut learning");
the paper's defaults l=32, d=16, l'=64, n=16, w=512 are the config defaults, with the
constraints d <= l, d | l and d | l'. Not implemented: GQA group sharing of the selection (every
head selects its own blocks; the sandbox has no KV-head grouping), and NSA's kernel-level
constraints (the laLTE paper notes NSA needs >= 16 query heads per KV group on GPUs).
RoPE (when on) is applied to queries/keys of the selected and sliding branches; compressed keys
carry their position through the intra-block embedding and their block order only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from sandbox.mixers.base import Linear, MixerContext, register
from sandbox.mixers.swa import ChosenBlocks, HeadAttention, SinkWindow, attend


def topk_block_mask(score: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the ``k`` highest entries along the last dim, never choosing ``-inf``."""
    k = min(k, score.shape[-1])
    idx = score.topk(k, dim=-1).indices
    chosen = torch.zeros_like(score, dtype=torch.bool).scatter(-1, idx, True)    # out of place: vmap has its rule
    return chosen & (score > -math.inf)


def _check_positive(cfg, *fields):
    for f in fields:
        if getattr(cfg, f) < 1:
            raise ValueError(f"{f}: must be >= 1, got {getattr(cfg, f)}")


@dataclass
class MoBAConfig:
    block_size: int = 512
    top_k: int = 3  # blocks per query, the query's own block included
    rope: bool = True
    rope_base: float = 10000.0
    bias: bool = False

    def __post_init__(self):
        _check_positive(self, "block_size", "top_k")


@register("moba", MoBAConfig)
class MoBA(HeadAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        B = self.cfg.block_size
        n = -(-t // B)
        q, k, v = self.project(x)
        q, k = self.positional(q, k)
        pad = n * B - t
        ksum = nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).view(b, n, B, self.n_heads, -1).sum(2)
        # tokens per block (the last may be partial), made on the device: a host scalar written into a device
        # tensor is a copy a CUDA graph cannot capture
        sizes = (t - torch.arange(n, device=x.device) * B).clamp(max=B).to(k.dtype)
        kmean = ksum / sizes[None, :, None, None]                               # [b, n, h, dh]
        gate = torch.einsum("bthd,bnhd->bhtn", q.float(), kmean.float())
        own = torch.arange(t, device=x.device)[:, None] // B
        blk = torch.arange(n, device=x.device)[None, :]
        gate = gate.masked_fill(blk > own, -math.inf).masked_fill(blk == own, math.inf)
        sel = topk_block_mask(gate, self.cfg.top_k)
        self.record("keys", k)
        self.record("values", v)
        self.record("routing", sel)
        return self.finish(attend(q, k, v, ChosenBlocks(sel, B)))


@dataclass
class NSAConfig:
    cmp_block: int = 32  # l
    cmp_stride: int = 16  # d
    slc_block: int = 64  # l'
    slc_count: int = 16  # n, including the initial block and the 2 local blocks
    window: int = 512  # sliding branch
    rope: bool = True
    rope_base: float = 10000.0
    bias: bool = False

    def __post_init__(self):
        _check_positive(self, "cmp_block", "cmp_stride", "slc_block", "window")
        if self.cmp_stride > self.cmp_block or self.cmp_block % self.cmp_stride:
            raise ValueError(f"cmp_stride: must divide cmp_block={self.cmp_block}, got {self.cmp_stride}")
        if self.slc_block % self.cmp_stride:
            raise ValueError(f"slc_block: must be a multiple of cmp_stride={self.cmp_stride}, got {self.slc_block}")
        if self.slc_count < 3:
            raise ValueError(f"slc_count: must be >= 3 (1 initial + 2 local blocks are always selected), "
                             f"got {self.slc_count}")


@register("nsa", NSAConfig)
class NativeSparseAttention(HeadAttention):
    def __init__(self, ctx: MixerContext, cfg: NSAConfig):
        super().__init__(ctx, cfg)
        d, dh, l = ctx.d_model, self.head_dim, cfg.cmp_block
        self.qkv = Linear(d, 7 * d, bias=cfg.bias)             # q + (k, v) for 3 branches
        self.gate = Linear(d, 3 * self.n_heads, bias=True)
        self.cmp_pos = nn.Parameter(torch.zeros(2, l, dh))     # intra-block positions (k, v)
        self.cmp_k = Linear(l * dh, dh, bias=False)
        self.cmp_v = Linear(l * dh, dh, bias=False)

    def compress(self, k: torch.Tensor, v: torch.Tensor):
        """``[b, t, h, dh]`` -> compressed ``[b, nc, h, dh]`` keys and values (nc may be 0)."""
        l, d = self.cfg.cmp_block, self.cfg.cmp_stride
        out = []
        for z, pos, lin in ((k, self.cmp_pos[0], self.cmp_k), (v, self.cmp_pos[1], self.cmp_v)):
            if z.shape[1] < l:
                out.append(z.new_zeros(z.shape[0], 0, *z.shape[2:]))
                continue
            blocks = z.unfold(1, l, d).permute(0, 1, 2, 4, 3) + pos           # [b, nc, h, l, dh]
            out.append(lin(blocks.flatten(-2)))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        b, t, _ = x.shape
        h, dh = self.n_heads, self.head_dim
        q, kc, vc, ks, vs, kw, vw = self.qkv(x).view(b, t, 7, h, dh).unbind(2)

        # compressed branch (queries without RoPE; a query sees complete blocks only)
        kcmp, vcmp = self.compress(kc, vc)
        nc = kcmp.shape[1]
        ends = torch.arange(nc, device=x.device) * cfg.cmp_stride + cfg.cmp_block - 1
        seen = ends[None, :] <= torch.arange(t, device=x.device)[:, None]       # [t, nc]
        logits = torch.einsum("bthd,bchd->bhtc", q, kcmp) / math.sqrt(dh)
        p_cmp = torch.softmax(logits.masked_fill(~seen, torch.finfo(logits.dtype).min), dim=-1) * seen
        o_cmp = torch.einsum("bhtc,bchd->bhtd", p_cmp, vcmp)

        # selected branch: rank selection blocks by the compressed attention they overlap
        L = cfg.slc_block
        ns = -(-t // L)
        starts = torch.arange(nc, device=x.device) * cfg.cmp_stride
        j = torch.arange(ns, device=x.device)
        overlap = (starts[:, None] < (j[None, :] + 1) * L) & (starts[:, None] + cfg.cmp_block > j[None, :] * L)
        score = (p_cmp @ overlap.to(p_cmp.dtype)).float()                      # [b, h, t, ns]
        own = torch.arange(t, device=x.device)[:, None] // L
        forced = (j[None, :] == 0) | (j[None, :] == own) | (j[None, :] == own - 1)
        score = score.masked_fill(forced, math.inf).masked_fill(j[None, :] > own, -math.inf)
        sel = topk_block_mask(score, cfg.slc_count)
        qr, ks = self.positional(q, ks)
        _, kw = self.positional(q, kw)
        o_slc = attend(qr, ks, vs, ChosenBlocks(sel, L))

        # sliding branch
        o_swa = attend(qr, kw, vw, SinkWindow(t, cfg.window, 0, x.device))

        g = torch.sigmoid(self.gate(x)).view(b, t, h, 3).permute(0, 2, 1, 3)    # [b, h, t, 3]
        o = g[..., 0:1] * o_cmp.to(o_slc.dtype) + g[..., 1:2] * o_slc + g[..., 2:3] * o_swa
        self.record("keys", ks)
        self.record("values", vs)
        self.record("routing", sel)
        self.record("gates", g)
        if self.capture is not None:
            # the rest of its cache: the compressed blocks, the raw keys and values that a later block compresses
            # (from the next block's start on) and the window the last query sees
            tail = nc * cfg.cmp_stride
            held = SinkWindow(t, cfg.window, 0, x.device).dense()[-1]
            for name, z in (("cmp_keys", kcmp), ("cmp_values", vcmp), ("cmp_tail_keys", kc[:, tail:]),
                            ("cmp_tail_values", vc[:, tail:]), ("window_keys", kw[:, held]),
                            ("window_values", vw[:, held])):
                self.record(name, z)
        return self.finish(o)

    def state_size(self, seq_len: int) -> int:
        """Selected-branch KV (all tokens) + compressed KV + the raw KV of the compressed branch from the next
        block's start on (a later block compresses them) + the sliding window's KV."""
        nc = 0 if seq_len < self.cfg.cmp_block else (seq_len - self.cfg.cmp_block) // self.cfg.cmp_stride + 1
        tail = seq_len - nc * self.cfg.cmp_stride
        return 2 * (seq_len + nc + tail + min(seq_len, self.cfg.window)) * self.ctx.d_model

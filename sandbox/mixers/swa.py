"""Sliding-window softmax attention with attention-sink tokens (``swa``), plus the small
pieces the other sparse-attention mixers share: head projection, rotary embedding, and
attention under a pattern.

Query ``i`` sees key ``j`` when ``j <= i`` and (``i - j < window`` or ``j < sinks``): the
"Lambda-shaped" pattern of StreamingLLM / Longformer global tokens (laLTE eq. 5 without the
LTE term). ``window`` counts the query itself, so ``window=1`` is attention to self (+ sinks).

RoPE: the backbone has no positions by default (``model.positions: none``), so a hybrid's
recurrent layers carry order. The papers' attention layers use RoPE on q and k; ``rope: true``
(the default here, as in laLTE/NSA/MoBA) applies it, ``rope: false`` leaves q, k as projected.

Attention under a pattern (``attend``): every sparse mixer states which keys each query sees as a
pattern object with two forms of it, a boolean mask for ``scaled_dot_product_attention`` and a
FlexAttention ``mask_mod`` with the occupancy of each ``TILE x TILE`` tile (the block mask, built
on the device from the pattern's own tensors: no host read, fixed shapes). Inside a compiled step
on CUDA, outside ``vmap``, attention is FlexAttention's compiled kernel, which skips the tiles no
query of a tile sees and never holds a ``[b, h, t, t]`` mask. Everywhere else it is SDPA with the
boolean mask: eager FlexAttention is a dense reference implementation, it has no backward on the
CPU, and it has no ``vmap`` rule (stacked replicas). Under ``vmap`` the masked attention is written
out (``attention.masked_sdpa``): CUDA's fused kernel that takes a mask rejects batched tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sandbox.mixers.attention import causal_window_mask, masked_sdpa
from sandbox.mixers.base import Linear, Mixer, MixerContext, register


def rope(x: torch.Tensor, pos: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary embedding (rotate-half convention) of vectors ``x [..., d]`` at integer positions
    ``pos`` broadcastable to ``x.shape[:-1]`` (e.g. ``[t, 1]`` for ``x [b, t, h, d]``)."""
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"rope: head dim must be even, got {d}")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv = base ** (-torch.arange(0, d, 2, device=x.device, dtype=work) / d)               # [d/2]
    ang = pos.to(work)[..., None] * inv                                                     # [..., d/2]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x.to(work).chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def sink_window_mask(seq_len: int, window: int | None, sinks: int, device) -> torch.Tensor:
    """Boolean ``[T, T]``: True where query i may attend key j (causal, in window or a sink).
    ``window=None`` means unbounded (full causal)."""
    mask = causal_window_mask(seq_len, window if window is not None else seq_len, device)
    if sinks > 0:
        j = torch.arange(seq_len, device=device)
        mask = mask | ((j[None, :] < sinks) & (j[None, :] <= j[:, None]))
    return mask


@dataclass
class SWAConfig:
    window: int = 512  # keys within the last `window` positions (the query included)
    sinks: int = 4  # the first `sinks` tokens stay visible to every later query
    rope: bool = True  # rotary embedding on q, k (see module doc)
    rope_base: float = 10000.0
    bias: bool = False

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"window: must be >= 1, got {self.window}")
        if self.sinks < 0:
            raise ValueError(f"sinks: must be >= 0, got {self.sinks}")
        if self.rope_base <= 0:
            raise ValueError(f"rope_base: must be > 0, got {self.rope_base}")


class HeadAttention(Mixer):
    """q, k, v and output projections for ``n_heads`` heads; subclasses decide the pattern."""

    def __init__(self, ctx: MixerContext, cfg):
        super().__init__(ctx, cfg)
        if ctx.d_model % ctx.n_heads:
            raise ValueError(f"n_heads: d_model {ctx.d_model} is not divisible by n_heads {ctx.n_heads}")
        self.n_heads = ctx.n_heads
        self.head_dim = ctx.d_model // ctx.n_heads
        if getattr(cfg, "rope", False) and self.head_dim % 2:
            raise ValueError(f"rope: needs an even head dim, got {self.head_dim}")
        self.qkv = Linear(ctx.d_model, 3 * ctx.d_model, bias=cfg.bias)
        self.out = Linear(ctx.d_model, ctx.d_model, bias=cfg.bias)

    def project(self, x: torch.Tensor):
        """``[b, t, d] -> q, k, v`` each ``[b, t, h, dh]`` (before RoPE)."""
        b, t, _ = x.shape
        return self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)

    def positional(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0):
        if not self.cfg.rope:
            return q, k
        pos = torch.arange(offset, offset + q.shape[1], device=q.device)[:, None]     # [t, 1]: all heads
        return rope(q, pos, self.cfg.rope_base), rope(k, pos, self.cfg.rope_base)

    def finish(self, o: torch.Tensor) -> torch.Tensor:
        """``o [b, h, t, dh]`` (the SDPA layout) -> ``[b, t, d]``."""
        b, h, t, dh = o.shape
        return self.out(o.transpose(1, 2).reshape(b, t, h * dh))

    def eager_reason(self) -> str | None:
        return None     # masks from index arithmetic and top-k on the device: fixed shapes, no host read


# FlexAttention's tile (its default sparse block): a block mask lists, per tile of TILE queries, the
# tiles of TILE keys that any of them sees.
TILE = 128
# FlexAttention where ``use_flex`` allows it; benchmarks/hybrid_speed.py turns it off to time the compiled
# step with SDPA's boolean masks instead.
FLEX = True


def use_flex(q: torch.Tensor) -> bool:
    """Whether attention on ``q [b, h, t, dh]`` runs as FlexAttention: on CUDA inside torch.compile (eagerly
    it is a dense reference), outside vmap (it has no batching rule), head dim >= 16 (its kernel's least)."""
    return (FLEX and q.is_cuda and torch.compiler.is_compiling() and q.shape[-1] >= 16
            and not torch._C._functorch.is_batchedtensor(q))


def _tiles(t: int) -> int:
    return -(-t // TILE)


def _tile_any_all(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per tile of a boolean ``[t, t]`` mask: whether it holds a True, and whether it is all True."""
    t, n = mask.shape[-1], _tiles(mask.shape[-1])
    m = F.pad(mask, (0, n * TILE - t, 0, n * TILE - t)).view(n, TILE, n, TILE)
    return m.any(3).any(1), m.all(3).all(1)


class SinkWindow:
    """Query i sees key j when ``j <= i`` and (``i - j < window`` or ``j < sinks``); ``window=None``:
    every ``j <= i``."""

    def __init__(self, t: int, window: int | None, sinks: int, device):
        self.t, self.window, self.sinks, self.device = t, window, sinks, device
        span = t if window is None else window

        def mask_mod(b, h, i, j):     # a function of exactly (b, h, i, j): FlexAttention counts the arguments
            return (j <= i) & ((i - j < span) | (j < sinks))
        self.mask_mod = mask_mod

    def dense(self) -> torch.Tensor:
        """Boolean ``[t, t]``."""
        return sink_window_mask(self.t, self.window, self.sinks, self.device)

    def tiles(self):
        """``(any, all)``, each ``[1, 1, tiles, tiles]``: tiles holding a visible pair, tiles all visible."""
        some, every = _tile_any_all(self.dense())
        return some[None, None], every[None, None]


class Retained:
    """``base`` plus every earlier key j that ``keep [b, h, t]`` marks (LTE, laLTE eq. 5)."""

    def __init__(self, base: SinkWindow, keep: torch.Tensor):
        self.base, self.keep = base, keep

        def mask_mod(b, h, i, j):
            return base.mask_mod(b, h, i, j) | (keep[b, h, j] & (j <= i))
        self.mask_mod = mask_mod

    def dense(self) -> torch.Tensor:
        """Boolean ``[b, h, t, t]``."""
        t = self.base.t
        causal = torch.ones(t, t, dtype=torch.bool, device=self.keep.device).tril()
        return self.base.dense() | (self.keep[:, :, None, :] & causal)

    def tiles(self):
        some, every = self.base.tiles()
        b, h, t = self.keep.shape
        n = _tiles(t)
        kept = F.pad(self.keep, (0, n * TILE - t)).view(b, h, n, TILE).any(-1)            # [b, h, tiles]
        tile = torch.arange(n, device=self.keep.device)
        return some | (kept[:, :, None, :] & (tile[None, :] <= tile[:, None])), every


class ChosenBlocks:
    """Query i sees key j when ``j <= i`` and ``chosen [b, h, t, n_blocks]`` marks j's block of ``block``
    tokens for query i (MoBA, NSA's selected branch)."""

    def __init__(self, chosen: torch.Tensor, block: int):
        self.chosen, self.block = chosen, block

        def mask_mod(b, h, i, j):
            return chosen[b, h, i, j // block] & (j <= i)
        self.mask_mod = mask_mod

    def dense(self) -> torch.Tensor:
        """Boolean ``[b, h, t, t]``."""
        t = self.chosen.shape[2]
        causal = torch.ones(t, t, dtype=torch.bool, device=self.chosen.device).tril()
        return self.chosen.repeat_interleave(self.block, dim=-1)[..., :t] & causal

    def tiles(self):
        b, h, t, nb = self.chosen.shape
        n = _tiles(t)
        rows = F.pad(self.chosen, (0, 0, 0, n * TILE - t)).view(b, h, n, TILE, nb).any(3)   # [b, h, tiles, nb]
        blk = torch.arange(nb, device=self.chosen.device)[:, None]
        tile = torch.arange(n, device=self.chosen.device)[None, :]
        overlap = (blk * self.block < (tile + 1) * TILE) & ((blk + 1) * self.block > tile * TILE)   # [nb, tiles]
        return (rows[..., None] & overlap).any(-2) & (tile <= tile.T), None


def block_mask(pattern, t: int) -> BlockMask:
    """FlexAttention's block mask of ``pattern`` over ``t`` tokens: the tiles some query sees, those it sees
    whole kept apart (their ``mask_mod`` is skipped), as index lists of fixed length."""
    # imported here, not with the module: FlexAttention imports sympy and torch's symbolic shapes, 0.3-0.7 s
    # that every command importing the mixers would wait for, while only a compiled step uses it
    from torch.nn.attention.flex_attention import BlockMask
    some, every = pattern.tiles()
    if every is None:
        every = torch.zeros_like(some)
    shape = torch.broadcast_shapes(some.shape, every.shape)
    some, every = some.expand(shape), every.expand(shape)

    def ordered(tiles: torch.Tensor):
        tiles = tiles.to(torch.int8)
        return (tiles.sum(-1, dtype=torch.int32),
                torch.argsort(tiles, dim=-1, descending=True, stable=True).to(torch.int32))

    partial, full = ordered(some & ~every), ordered(every)
    return BlockMask.from_kv_blocks(*partial, *full, BLOCK_SIZE=TILE, mask_mod=pattern.mask_mod,
                                    seq_lengths=(t, t))


def flex_attend(q, k, v, pattern) -> torch.Tensor:
    """FlexAttention on ``[b, h, t, dh]`` inputs under ``pattern``."""
    from torch.nn.attention.flex_attention import flex_attention
    return flex_attention(q, k, v, block_mask=block_mask(pattern, q.shape[-2]))


def attend(q, k, v, pattern) -> torch.Tensor:
    """Softmax attention of ``q, k, v [b, t, h, dh]`` where ``pattern`` (``SinkWindow``, ``Retained``,
    ``ChosenBlocks``) lets each query see; returns ``[b, h, t, dh]``. FlexAttention where ``use_flex``, else
    attention under the pattern's boolean mask (see the module doc)."""
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))
    if use_flex(q):
        return flex_attend(q, k, v, pattern)
    return masked_sdpa(q, k, v, pattern.dense())


@register("swa", SWAConfig)
class SlidingWindowAttention(HeadAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x)
        q, k = self.positional(q, k)
        self.record("keys", k)
        self.record("values", v)
        pattern = SinkWindow(x.shape[1], self.cfg.window, self.cfg.sinks, x.device)
        if self.capture is not None:        # the cache it keeps: the sinks and the window the last query sees
            held = pattern.dense()[-1]
            self.record("cache_keys", k[:, held])
            self.record("cache_values", v[:, held])
        return self.finish(attend(q, k, v, pattern))

    def state_size(self, seq_len: int) -> int:
        return 2 * min(seq_len, self.cfg.window + self.cfg.sinks) * self.ctx.d_model

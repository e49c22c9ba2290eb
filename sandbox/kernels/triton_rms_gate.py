"""The per-head RMS norm and silu output gate of the linear mixers (``rms_gate.py``) as two Triton kernels.

A row is one (token, head): V values of ``o``, normalised by ``rstd = 1 / sqrt(mean(o^2) + eps)``, scaled by
the head's weight row and, with a gate, multiplied by ``silu(og)``. ``og`` [N, H * V] has the same row layout
as ``o`` [N, H, V], so both are read at ``(n * H + h) * V``.

Grid: (P, H). Program (p, h) loads head h's weight row once and walks tiles of BR tokens p, p + P, ... of that
head, all math in float32. ``_forward`` writes y and keeps ``rstd`` per row. ``_backward`` recomputes xhat and
the gate from o, og and rstd, writes d_o and d_og, and adds ``dn * xhat`` into a [BR, V] tile that it sums into
its own row of weight-gradient partials [P, H, V] at the end; the wrapper adds those in a fixed order (no
atomics, so a run repeats to the bit).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE, TILE_BWD = 4096, 2048  # values per [BR, V] tile: 32 (16) per thread of 4 warps for each of the forward's
#                              (backward's) live tiles, so they stay in registers
PROGRAMS = 1024              # at most ~8 programs per SM of an H200 (132 SMs); more rows loop, and the partials
#                              of dw stay small ([<= 1024, V] float32)


@triton.jit
def _forward(o, w, og, y, rstd, N, H, V, eps, HAS_GATE: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr):
    p, h = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, BV)
    mc = cols < V
    wh = tl.load(w + h * V + cols, mask=mc, other=0.0).to(tl.float32)[None, :]
    for tile in range(p, tl.cdiv(N, BR), tl.num_programs(0)):
        t = tile * BR + tl.arange(0, BR)
        row = t.to(tl.int64) * H + h
        m = (t < N)[:, None] & mc[None, :]
        off = row[:, None] * V + cols[None, :]
        x = tl.load(o + off, mask=m, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(x * x, axis=1) / V + eps)
        out = x * r[:, None] * wh
        if HAS_GATE:
            g = tl.load(og + off, mask=m, other=0.0).to(tl.float32)
            out = out * g * tl.sigmoid(g)
        tl.store(y + off, out.to(y.dtype.element_ty), mask=m)
        tl.store(rstd + row, r, mask=t < N)


@triton.jit
def _backward(dy, o, w, og, rstd, do, dog, dwp, N, H, V,
              HAS_GATE: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr):
    p, h = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, BV)
    mc = cols < V
    wh = tl.load(w + h * V + cols, mask=mc, other=0.0).to(tl.float32)[None, :]
    acc = tl.zeros([BR, BV], dtype=tl.float32)
    for tile in range(p, tl.cdiv(N, BR), tl.num_programs(0)):
        t = tile * BR + tl.arange(0, BR)
        row = t.to(tl.int64) * H + h
        m = (t < N)[:, None] & mc[None, :]
        off = row[:, None] * V + cols[None, :]
        r = tl.load(rstd + row, mask=t < N, other=0.0)[:, None]   # 0 past the end: those rows add nothing
        xhat = tl.load(o + off, mask=m, other=0.0).to(tl.float32) * r
        dn = tl.load(dy + off, mask=m, other=0.0).to(tl.float32)
        if HAS_GATE:
            g = tl.load(og + off, mask=m, other=0.0).to(tl.float32)
            sg = tl.sigmoid(g)
            tl.store(dog + off, (dn * xhat * wh * sg * (1 + g * (1 - sg))).to(dog.dtype.element_ty), mask=m)
            dn = dn * g * sg
        acc += dn * xhat
        dnw = dn * wh
        c = tl.sum(dnw * xhat, axis=1)[:, None] / V
        tl.store(do + off, (r * (dnw - xhat * c)).to(do.dtype.element_ty), mask=m)
    tl.store(dwp + (p * H + h) * V + cols, tl.sum(acc, axis=0), mask=mc)


def _grid(N: int, H: int, V: int, tile: int, br: int | None, programs: int | None) -> tuple[int, int, int]:
    bv = triton.next_power_of_2(V)
    br = br or max(1, tile // bv)
    return bv, br, min(triton.cdiv(N, br), max(1, (programs or PROGRAMS) // H))


def rms_gate_triton(o: torch.Tensor, w: torch.Tensor, og: torch.Tensor | None, eps: float, dtype: torch.dtype,
                    br: int | None = None, programs: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """o [..., H, V], w [H, V], og [..., H * V] or None: (y [..., H * V] in ``dtype``, rstd [..., H] float32).
    ``br`` (tokens per tile) and ``programs`` (along the tokens, in all heads) override the defaults."""
    *lead, H, V = o.shape
    o = o.contiguous()
    og = og.contiguous() if og is not None else None
    N = o.numel() // (H * V)
    y = torch.empty(*lead, H * V, dtype=dtype, device=o.device)
    rstd = torch.empty(*lead, H, dtype=torch.float32, device=o.device)
    bv, br, P = _grid(N, H, V, TILE, br, programs)
    _forward[(P, H)](o, w.contiguous(), og if og is not None else o, y, rstd, N, H, V, eps,
                     HAS_GATE=og is not None, BR=br, BV=bv)
    return y, rstd


def rms_gate_grad_triton(dy: torch.Tensor, o: torch.Tensor, w: torch.Tensor, og: torch.Tensor | None,
                         rstd: torch.Tensor, br: int | None = None, programs: int | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """For the output gradient dy [..., H * V]: (d_o in o's dtype, dw [H, V] float32, d_og in og's dtype or None)."""
    H, V = o.shape[-2:]
    o, dy = o.contiguous(), dy.contiguous()
    og = og.contiguous() if og is not None else None
    N = o.numel() // (H * V)
    do = torch.empty_like(o)
    dog = torch.empty_like(og) if og is not None else None
    bv, br, P = _grid(N, H, V, TILE_BWD, br, programs)
    dwp = torch.empty(P, H, V, dtype=torch.float32, device=o.device)
    _backward[(P, H)](dy, o, w.contiguous(), og if og is not None else o, rstd.contiguous(), do,
                      dog if dog is not None else do, dwp, N, H, V, HAS_GATE=og is not None, BR=br, BV=bv)
    return do, dwp.sum(0), dog

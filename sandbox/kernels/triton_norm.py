"""The row norms of ``norm.py`` (LayerNorm, or RMSNorm with ``RMS``) as one Triton kernel each way.

A row is the last dimension of x [N, D]. A program holds BN whole rows as a [BN, BD] tile (BD: D rounded up to a
power of two, the extra columns masked), so each row's statistics are one reduction in registers, in float32.

``_forward``: one tile per program. Writes ``y = xhat * w (+ b)`` in y's dtype, ``xhat = (x - mean) * rstd``
(no mean for RMS), and keeps rstd (and mean) per row for the backward.

``_backward``: P programs walk the tiles p, p + P, ... Each recomputes xhat from x and the saved statistics,
writes ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = dy * w`` (no ``mean(g)`` for RMS), and
adds ``dy * xhat`` (and dy) into [BN, BD] accumulators that it sums into its own row of the [P, D] partials of dw
(and db) at the end. The wrapper adds those rows in a fixed order: no atomics, so a rerun repeats to the bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE, TILE_BWD = 4096, 2048  # values per [BN, BD] tile: 32 (16) per thread of 4 warps for each tile the forward
#                              (backward, with two accumulators) keeps live, so none spill out of registers
PROGRAMS = 1024              # backward programs at most: ~8 per SM of an H200 (132 SMs); more tiles loop, and the
#                              [P, D] float32 partials of dw and db stay small
WARPS = 4                    # the tiles above are sized for 128 threads; a row wider than TILE is a program alone


@triton.jit
def _forward(x, w, b, y, mean, rstd, N, D, stride, eps,
             RMS: tl.constexpr, HAS_BIAS: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.arange(0, BD)
    mr, mc = rows < N, cols < D
    m = mr[:, None] & mc[None, :]
    r64 = rows.to(tl.int64)[:, None]
    xc = tl.load(x + r64 * stride + cols[None, :], mask=m, other=0.0).to(tl.float32)
    if not RMS:
        mu = tl.sum(xc, axis=1) / D
        xc = tl.where(mc[None, :], xc - mu[:, None], 0.0)   # padding columns stay out of the variance
        tl.store(mean + rows, mu, mask=mr)
    r = tl.rsqrt(tl.sum(xc * xc, axis=1) / D + eps)
    out = xc * r[:, None] * tl.load(w + cols, mask=mc, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        out += tl.load(b + cols, mask=mc, other=0.0).to(tl.float32)[None, :]
    tl.store(y + r64 * D + cols[None, :], out.to(y.dtype.element_ty), mask=m)
    tl.store(rstd + rows, r, mask=mr)


@triton.jit
def _backward(dy, x, w, mean, rstd, dx, dwp, dbp, N, D, stride,
              RMS: tl.constexpr, HAS_BIAS: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    p = tl.program_id(0)
    cols = tl.arange(0, BD)
    mc = cols < D
    wv = tl.load(w + cols, mask=mc, other=0.0).to(tl.float32)[None, :]
    acc_w = tl.zeros([BN, BD], dtype=tl.float32)
    acc_b = tl.zeros([BN, BD], dtype=tl.float32)
    for tile in range(p, tl.cdiv(N, BN), tl.num_programs(0)):
        rows = tile * BN + tl.arange(0, BN)
        mr = rows < N
        m = mr[:, None] & mc[None, :]
        r64 = rows.to(tl.int64)[:, None]
        r = tl.load(rstd + rows, mask=mr, other=0.0)[:, None]   # 0 past the end: those rows add nothing
        xhat = tl.load(x + r64 * stride + cols[None, :], mask=m, other=0.0).to(tl.float32)
        if not RMS:
            xhat = tl.where(mc[None, :], xhat - tl.load(mean + rows, mask=mr, other=0.0)[:, None], 0.0)
        xhat = xhat * r
        d = tl.load(dy + r64 * D + cols[None, :], mask=m, other=0.0).to(tl.float32)
        g = d * wv
        dxv = g - xhat * (tl.sum(g * xhat, axis=1) / D)[:, None]
        if not RMS:
            dxv -= (tl.sum(g, axis=1) / D)[:, None]
        tl.store(dx + r64 * D + cols[None, :], (r * dxv).to(dx.dtype.element_ty), mask=m)
        acc_w += d * xhat
        if HAS_BIAS:
            acc_b += d
    tl.store(dwp + p * D + cols, tl.sum(acc_w, axis=0), mask=mc)
    if HAS_BIAS:
        tl.store(dbp + p * D + cols, tl.sum(acc_b, axis=0), mask=mc)


def _blocks(D: int, tile: int, block_n: int | None) -> tuple[int, int]:
    bd = triton.next_power_of_2(D)
    return bd, block_n or max(1, tile // bd)


def _rows(x2d: torch.Tensor) -> torch.Tensor:
    return x2d if x2d.stride(1) == 1 else x2d.contiguous()


def norm_forward(x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool,
                 out_dtype: torch.dtype, block_n: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """x2d [N, D]: (y [N, D] in ``out_dtype``, mean [N] float32 or None for RMS, rstd [N] float32).
    ``block_n`` (rows per program, a power of two) overrides the default."""
    x2d, weight = _rows(x2d), weight.contiguous()
    bias = bias.contiguous() if bias is not None else None
    N, D = x2d.shape
    y = torch.empty(N, D, dtype=out_dtype, device=x2d.device)
    rstd = torch.empty(N, dtype=torch.float32, device=x2d.device)
    mean = None if rms else torch.empty_like(rstd)
    bd, bn = _blocks(D, TILE, block_n)
    if N:
        _forward[(triton.cdiv(N, bn),)](x2d, weight, bias if bias is not None else weight, y,
                                        mean if mean is not None else rstd, rstd, N, D, x2d.stride(0), eps,
                                        RMS=rms, HAS_BIAS=bias is not None, BN=bn, BD=bd, num_warps=WARPS)
    return y, mean, rstd


def norm_backward(dy: torch.Tensor, x2d: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor | None,
                  rstd: torch.Tensor, rms: bool, has_bias: bool, block_n: int | None = None,
                  programs: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """For the output gradient dy [N, D]: (dx [N, D] in x's dtype, dw [D] float32, db [D] float32 or None).
    ``block_n`` (rows per tile) and ``programs`` override the defaults."""
    x2d, dy, weight = _rows(x2d), dy.contiguous(), weight.contiguous()
    N, D = x2d.shape
    dx = torch.empty(N, D, dtype=x2d.dtype, device=x2d.device)
    bd, bn = _blocks(D, TILE_BWD, block_n)
    P = min(triton.cdiv(N, bn), programs or PROGRAMS)
    dwp = torch.empty(P, D, dtype=torch.float32, device=x2d.device)
    dbp = torch.empty_like(dwp) if has_bias else None
    if P:
        _backward[(P,)](dy, x2d, weight, mean if mean is not None else rstd, rstd, dx, dwp,
                        dbp if dbp is not None else dwp, N, D, x2d.stride(0),
                        RMS=rms, HAS_BIAS=has_bias, BN=bn, BD=bd, num_warps=WARPS)
    return dx, dwp.sum(0), dbp.sum(0) if dbp is not None else None

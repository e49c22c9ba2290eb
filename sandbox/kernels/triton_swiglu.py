"""SwiGLU's up projection and gate (``swiglu.py``) as two Triton kernels.

For x [G, M, D] and the up weight w [G, 2H, D] of group g (stacked replicas each bring their own; one model
has G = 1): ``a = x w[:H]^T``, ``b = x w[H:]^T``, both rounded to x's dtype as a product written to memory
would be, and ``y = silu(a) * b`` [G, M, H].

``_forward``: one program per (H block, M block, group) forms its a and b tiles with two products over D
and writes y. The product [M, 2H] never reaches memory (unfused, it was written and read back by the gate).
The H blocks of one M block are neighbours in the grid, so they read the same rows of x from L2.

``_backward``, for the output gradient dy: the same products again (nothing was saved but x), then
``da = dy * b * silu'(a)`` and ``db = dy * silu(a)`` written side by side as the up projection's output
gradient [G, M, 2H], from which the caller forms dx and dw with two matrix products.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# tiles measured on the H200 (benchmarks/swiglu_speed.py) at a stack of 9 Figure 8 runs' rows (M 81920 per
# group, D 128, H 256, bf16)
BM, BH, BK, WARPS, STAGES = 128, 64, 64, 4, 3


@triton.jit
def _products(x, w, g, rows, cols, M, D, H, BM: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr,
              PREC: tl.constexpr):
    """a and b of one tile, rounded to x's dtype, in float32 (float32 inputs multiplied as such, not as tf32)."""
    xg = x + g.to(tl.int64) * M * D
    wg = w + g.to(tl.int64) * 2 * H * D
    mr, mc = rows < M, cols < H
    acc_a = tl.zeros([BM, BH], dtype=tl.float32)
    acc_b = tl.zeros([BM, BH], dtype=tl.float32)
    for k0 in range(0, D, BK):
        kk = k0 + tl.arange(0, BK)
        mk = kk < D
        xt = tl.load(xg + rows[:, None].to(tl.int64) * D + kk[None, :], mask=mr[:, None] & mk[None, :], other=0.0)
        mw = mc[:, None] & mk[None, :]
        wa = tl.load(wg + cols[:, None] * D + kk[None, :], mask=mw, other=0.0)
        wb = tl.load(wg + (H + cols[:, None]) * D + kk[None, :], mask=mw, other=0.0)
        acc_a = tl.dot(xt, tl.trans(wa), acc_a, input_precision=PREC)
        acc_b = tl.dot(xt, tl.trans(wb), acc_b, input_precision=PREC)
    dt = x.dtype.element_ty
    return acc_a.to(dt).to(tl.float32), acc_b.to(dt).to(tl.float32)


@triton.jit
def _forward(x, w, y, M, D, H, BM: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    g = tl.program_id(1)
    for h0 in range(0, H, BH):
        cols = h0 + tl.arange(0, BH)
        a, b = _products(x, w, g, rows, cols, M, D, H, BM, BH, BK, PREC)
        out = a * tl.sigmoid(a) * b
        m = (rows < M)[:, None] & (cols < H)[None, :]
        tl.store(y + (g.to(tl.int64) * M + rows[:, None]) * H + cols[None, :], out.to(y.dtype.element_ty), mask=m)


@triton.jit
def _backward(x, w, dy, dh, M, D, H, BM: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    g = tl.program_id(1)
    r = g.to(tl.int64) * M + rows[:, None]
    dt = dh.dtype.element_ty
    for h0 in range(0, H, BH):
        cols = h0 + tl.arange(0, BH)
        a, b = _products(x, w, g, rows, cols, M, D, H, BM, BH, BK, PREC)
        m = (rows < M)[:, None] & (cols < H)[None, :]
        d = tl.load(dy + r * H + cols[None, :], mask=m, other=0.0).to(tl.float32)
        s = tl.sigmoid(a)
        da = d * b * s * (1.0 + a * (1.0 - s))
        db = d * a * s
        tl.store(dh + r * (2 * H) + cols[None, :], da.to(dt), mask=m)
        tl.store(dh + r * (2 * H) + H + cols[None, :], db.to(dt), mask=m)


def _grid(G, M, bm):
    return (triton.cdiv(M, bm), G)


def _prec(x: torch.Tensor) -> str:
    return "ieee" if x.dtype == torch.float32 else "tf32"     # (the latter unused for 16-bit inputs)


def swiglu_triton(x: torch.Tensor, w: torch.Tensor, tiles=None) -> torch.Tensor:
    """x [G, M, D], w [G, 2H, D] (same dtype): y [G, M, H] in x's dtype."""
    bm, bh, bk, warps, stages = tiles or (BM, BH, BK, WARPS, STAGES)
    G, M, D = x.shape
    H = w.shape[1] // 2
    x, w = x.contiguous(), w.contiguous()
    y = torch.empty(G, M, H, dtype=x.dtype, device=x.device)
    _forward[_grid(G, M, bm)](x, w, y, M, D, H, BM=bm, BH=bh, BK=bk, PREC=_prec(x), num_warps=warps,
                                     num_stages=stages)
    return y


def swiglu_grad_triton(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, tiles=None) -> torch.Tensor:
    """The up projection's output gradient [G, M, 2H] (x's dtype) for y's gradient dy [G, M, H]."""
    bm, bh, bk, warps, stages = tiles or (BM, BH, BK, WARPS, STAGES)
    G, M, D = x.shape
    H = w.shape[1] // 2
    x, w, dy = x.contiguous(), w.contiguous(), dy.contiguous()
    dh = torch.empty(G, M, 2 * H, dtype=x.dtype, device=x.device)
    _backward[_grid(G, M, bm)](x, w, dy, dh, M, D, H, BM=bm, BH=bh, BK=bk, PREC=_prec(x),
                                      num_warps=warps, num_stages=stages)
    return dh

"""The short causal depthwise convolution with its silu (``short_conv.py``) as two Triton kernels.

``y[n, t, c] = silu(sum_j w[g, c, j] * x[n, t + j - (W - 1), c])``, with x zero before t = 0 and
g = n // per (stacked replicas each bring their own weights; one model has g = 0 throughout).

``_forward``: one program per (sequence, BT positions, BC channels) sums the W shifted rows in
float32 and writes silu of it in x's dtype. Nothing is saved: the backward recomputes the sums.

``_backward``, for the output gradient dy: one program per (sequence, BC channels) walks the sequence
BT positions at a time. At tile k it recomputes the pre-activation a, forms ``da = dy * silu'(a)`` and
adds ``da[t] * x[t + j - (W - 1)]`` to a running tile per tap (the weight gradient, summed once at the
end into the program's own row of partials, which the caller adds in a fixed order: no atomics, so a
run repeats to the bit). Then it writes tile k - 1's input gradient, ``dx[t] = sum_m w[W - 1 - m]
da[t + m]``, which reaches W - 1 rows into tile k. Registers cannot be shifted by rows, so da goes
through a ring of three tiles per program in global memory (L1 and L2 hold it; it is not read back from
HBM), written, then read at the shifted rows after a barrier of the program's threads. Three tiles, so
that a tile is rewritten only after every thread has passed the barrier following its last read. The
next tile's own rows of x and dy are loaded while this one computes; the shifted rows of x then come
from cache. It holds one tile per tap, for 4 taps: shorter filters get leading zero taps.

The output, and so its gradient, comes as up to three dense pieces of columns (a linear mixer's q, k and v,
``short_conv.py`` says why): each program finds, per column, its piece's base and row stride (``_columns``).

Before, da went to memory in x's dtype and a second kernel formed dx from it, which was slower
(results/kernels/README.md; benchmarks/short_conv_speed.py). dx is as precise as before (da is rounded to
x's dtype on its way through the ring, as it was in memory; the bits differ only where the compiler fuses
multiply-adds differently).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# the fastest tiles and warps timed at a stack of 9 Figure 8 runs (results/kernels/README.md)
BT, BC = 16, 128                       # forward: a tile each
BT_BWD, BC_BWD, WARPS_BWD = 8, 64, 4   # backward: a channel block each, walking the sequence
TAPS = 4                               # the backward holds one tile per tap; shorter filters get leading zero taps
PIECES = 3                             # the output (and its gradient) as up to three pieces of columns (q, k, v)


@triton.jit
def _columns(p0, p1, p2, e1, e2, n, T, C, c):
    """Where column c of sequence n starts, and its row stride, in the pieces [N, T, width] (each dense) that
    hold columns [0, e1), [e1, e2) and [e2, C)."""
    in1, in2 = c >= e1, c >= e2
    start = tl.where(in2, e2, tl.where(in1, e1, 0))
    width = tl.where(in2, C - e2, tl.where(in1, e2 - e1, e1))
    base = tl.where(in2, p2, tl.where(in1, p1, p0))
    return base + n.to(tl.int64) * T * width + (c - start), width


@triton.jit
def _forward(x, w, y0, y1, y2, e1, e2, T, C, per, sxn, sxt, W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    n = tl.program_id(0)
    t = tl.program_id(1) * BT + tl.arange(0, BT)
    c = tl.program_id(2) * BC + tl.arange(0, BC)
    mc = c < C
    ycol, ywidth = _columns(y0, y1, y2, e1, e2, n, T, C, c)
    wrow = w + (n // per).to(tl.int64) * C * W + c * W
    xrow = x + n.to(tl.int64) * sxn
    acc = tl.zeros([BT, BC], dtype=tl.float32)
    for j in tl.static_range(W):
        s = t + (j - (W - 1))
        m = ((s >= 0) & (s < T))[:, None] & mc[None, :]
        xv = tl.load(xrow + s[:, None] * sxt + c[None, :], mask=m, other=0.0).to(tl.float32)
        acc += xv * tl.load(wrow + j, mask=mc, other=0.0).to(tl.float32)[None, :]
    out = acc * tl.sigmoid(acc)
    mo = (t < T)[:, None] & mc[None, :]
    tl.store(ycol[None, :] + t[:, None] * ywidth[None, :], out.to(y0.dtype.element_ty), mask=mo)


@triton.jit
def _ring_rows(own, last, cur, r, cc, m: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, mask):
    """da at rows r + m of tile ``last`` in the ring, running on into tile ``cur`` (float32)."""
    src = tl.where(r + m < BT, last * BT + r + m, cur * BT + r + m - BT)
    return tl.load(own + src * BC + cc, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _backward(dy0, dy1, dy2, e1, e2, x, w, dx, dwp, ring, T, C, per, sxn, sxt, BT: tl.constexpr, BC: tl.constexpr):
    tl.static_assert(BT >= 4)                # the last tap's rows reach 3 into the next tile, no further
    n = tl.program_id(0)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    mc = c < C
    wrow = w + (n // per).to(tl.int64) * C * 4 + c * 4
    w0 = tl.load(wrow + 0, mask=mc, other=0.0).to(tl.float32)[None, :]
    w1 = tl.load(wrow + 1, mask=mc, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(wrow + 2, mask=mc, other=0.0).to(tl.float32)[None, :]
    w3 = tl.load(wrow + 3, mask=mc, other=0.0).to(tl.float32)[None, :]
    xrow = x + n.to(tl.int64) * sxn
    dycol, dywidth = _columns(dy0, dy1, dy2, e1, e2, n, T, C, c)
    dxrow = dx + n.to(tl.int64) * T * C
    own = ring + (n.to(tl.int64) * tl.num_programs(1) + tl.program_id(1)) * (3 * BT * BC)
    acc0 = tl.zeros([BT, BC], dtype=tl.float32)
    acc1 = tl.zeros([BT, BC], dtype=tl.float32)
    acc2 = tl.zeros([BT, BC], dtype=tl.float32)
    acc3 = tl.zeros([BT, BC], dtype=tl.float32)
    r = tl.arange(0, BT)[:, None]
    cc = tl.arange(0, BC)[None, :]
    nt = tl.cdiv(T, BT)
    t = tl.arange(0, BT)
    mt = (t < T)[:, None] & mc[None, :]
    x3n = tl.load(xrow + t[:, None] * sxt + c[None, :], mask=mt, other=0.0)
    gn = tl.load(dycol[None, :] + t[:, None] * dywidth[None, :], mask=mt, other=0.0)
    for k in range(nt + 1):               # tile k's da, then tile k - 1's dx (it needs da 3 rows into tile k)
        t = k * BT + tl.arange(0, BT)
        mt = (t < T)[:, None] & mc[None, :]
        x3 = x3n.to(tl.float32)
        g = gn.to(tl.float32)
        tn = t + BT                        # the next tile's own rows, loaded while this one computes
        mn = (tn < T)[:, None] & mc[None, :]
        x3n = tl.load(xrow + tn[:, None] * sxt + c[None, :], mask=mn, other=0.0)
        gn = tl.load(dycol[None, :] + tn[:, None] * dywidth[None, :], mask=mn, other=0.0)
        x0 = tl.load(xrow + (t - 3)[:, None] * sxt + c[None, :], mask=(t >= 3)[:, None] & mt, other=0.0).to(tl.float32)
        x1 = tl.load(xrow + (t - 2)[:, None] * sxt + c[None, :], mask=(t >= 2)[:, None] & mt, other=0.0).to(tl.float32)
        x2 = tl.load(xrow + (t - 1)[:, None] * sxt + c[None, :], mask=(t >= 1)[:, None] & mt, other=0.0).to(tl.float32)
        a = x0 * w0 + x1 * w1 + x2 * w2 + x3 * w3
        sg = tl.sigmoid(a)
        d = g * sg * (1.0 + a * (1.0 - sg))        # zero past the sequence's end (g is)
        acc0 += d * x0
        acc1 += d * x1
        acc2 += d * x2
        acc3 += d * x3
        cur = k % 3
        last = (k + 2) % 3
        tl.store(own + (cur * BT + r) * BC + cc, d.to(dx.dtype.element_ty))
        tl.debug_barrier()
        s = t - BT                                 # tile k - 1
        ms = ((s >= 0) & (s < T))[:, None] & mc[None, :]
        out = _ring_rows(own, last, cur, r, cc, 0, BT, BC, ms) * w3
        out += _ring_rows(own, last, cur, r, cc, 1, BT, BC, ms) * w2
        out += _ring_rows(own, last, cur, r, cc, 2, BT, BC, ms) * w1
        out += _ring_rows(own, last, cur, r, cc, 3, BT, BC, ms) * w0
        tl.store(dxrow + s[:, None] * C + c[None, :], out.to(dx.dtype.element_ty), mask=ms)
    o = dwp + n.to(tl.int64) * C * 4 + c * 4
    tl.store(o + 0, tl.sum(acc0, axis=0), mask=mc)
    tl.store(o + 1, tl.sum(acc1, axis=0), mask=mc)
    tl.store(o + 2, tl.sum(acc2, axis=0), mask=mc)
    tl.store(o + 3, tl.sum(acc3, axis=0), mask=mc)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [N, T, C] with unit channel stride (a column slice of a wider product stays a view)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _bounds(widths: list[int]) -> tuple[int, int]:
    """The first columns of the second and third pieces (C where there is none)."""
    if not 1 <= len(widths) <= PIECES:
        raise ValueError(f"short conv: 1 to {PIECES} pieces of columns, got {len(widths)}")
    ends = [sum(widths[:i + 1]) for i in range(len(widths))] + [sum(widths)] * (PIECES - len(widths))
    return ends[0], ends[1]


def short_conv_triton(x: torch.Tensor, w: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """x [N, T, C], w [G, C, W] (G divides N): the output [N, T, C] in x's dtype, as pieces [N, T, size] (each
    dense) of the given widths, one to three, which add up to C."""
    N, T, C = x.shape
    G, _, W = w.shape
    x, w = _rows(x), w.contiguous()
    ys = [torch.empty(N, T, n, dtype=x.dtype, device=x.device) for n in sizes]
    e1, e2 = _bounds(sizes)
    p = ys + ys[-1:] * (PIECES - len(ys))
    grid = (N, triton.cdiv(T, BT), triton.cdiv(C, BC))
    _forward[grid](x, w, *p, e1, e2, T, C, N // G, x.stride(0), x.stride(1), W=W, BT=BT, BC=BC, num_warps=4)
    return ys


def short_conv_grad_triton(dys: list[torch.Tensor], x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``short_conv_triton`` for its output's pieces' gradients dys (as its pieces): (dx [N, T, C] in
    x's dtype, dw [G, C, W] float32)."""
    N, T, C = x.shape
    G, _, W = w.shape
    if W > TAPS:      # short_conv.py sends longer filters to its torch form
        raise ValueError(f"short_conv_grad_triton: filters of at most {TAPS} taps, got {W}")
    x, w = _rows(x), w.contiguous()
    dys = [d.contiguous() for d in dys]
    e1, e2 = _bounds([d.shape[-1] for d in dys])
    w4 = F.pad(w, (TAPS - W, 0))                       # tap j of W is tap j + TAPS - W of TAPS
    dx = torch.empty(N, T, C, dtype=x.dtype, device=x.device)
    dwp = torch.empty(N, C, TAPS, dtype=torch.float32, device=x.device)
    grid = (N, triton.cdiv(C, BC_BWD))
    ring = torch.empty(N * grid[1] * 3 * BT_BWD * BC_BWD, dtype=x.dtype, device=x.device)
    # num_stages=1: no software pipelining, which could move the ring's loads above the barrier
    _backward[grid](*dys, *dys[-1:] * (PIECES - len(dys)), e1, e2, x, w4, dx, dwp, ring, T, C, N // G,
                    x.stride(0), x.stride(1), BT=BT_BWD, BC=BC_BWD, num_warps=WARPS_BWD, num_stages=1)
    return dx, dwp.view(G, N // G, C, TAPS).sum(1)[..., TAPS - W:]

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
x may be wider than the convolution (a whole projection, whose last columns feed the gate): those columns
pass through as one more piece, and their gradient is written beside dx's, so that dx is the projection's
whole output gradient. They are columns of the same tiles, with an identity filter and no silu, and the tiles
of columns end at x's last column, so that a row's passed columns are read and written with the convolution's
last columns beside them (a copy kernel of its own for them was nearly as slow as the concatenation saved).

Before, da went to memory in x's dtype and a second kernel formed dx from it: on the H200 at a stack
of 9 Figure 8 runs, 0.79 ms per call against 0.57 now (benchmarks/short_conv_speed.py). dx is as precise
as before (da is rounded to x's dtype on its way through the ring, as it was in memory; the bits differ
only where the compiler fuses multiply-adds differently).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# tiles measured on the H200 at a stack of 9 Figure 8 runs (x [2304, 320, 256] bf16): forward 0.31 ms per call
# (0.38 with 64 x 64 tiles); backward 0.57 (16 positions: 0.72, 32: 0.66; 32 or 128 channels, 2 or 8 warps: slower)
BT, BC = 16, 128                       # forward: a tile each
BT_BWD, BC_BWD, WARPS_BWD = 8, 64, 4   # backward: a channel block each, walking the sequence
TAPS = 4                               # the backward holds one tile per tap; shorter filters get leading zero taps
PIECES = 3                             # the output (and its gradient) as up to three pieces of columns (q, k, v)


@triton.jit
def _columns(p0, p1, p2, p3, e1, e2, e3, n, T, Cx, c):
    """Where column c of sequence n starts, and its row stride, in the pieces [N, T, width] (each dense) that
    hold columns [0, e1), [e1, e2), [e2, e3) (the convolution's) and [e3, Cx) (those passed through)."""
    in1, in2, in3 = c >= e1, c >= e2, c >= e3
    start = tl.where(in3, e3, tl.where(in2, e2, tl.where(in1, e1, 0)))
    width = tl.where(in3, Cx - e3, tl.where(in2, e3 - e2, tl.where(in1, e2 - e1, e1)))
    base = tl.where(in3, p3, tl.where(in2, p2, tl.where(in1, p1, p0)))
    return base + n.to(tl.int64) * T * width + (c - start), width


@triton.jit
def _forward(x, w, y0, y1, y2, y3, e1, e2, e3, T, Cx, first, per, sxn, sxt, W: tl.constexpr, BT: tl.constexpr,
             BC: tl.constexpr):
    n = tl.program_id(0)
    t = tl.program_id(1) * BT + tl.arange(0, BT)
    c = first + tl.program_id(2) * BC + tl.arange(0, BC)
    mc = (c >= 0) & (c < Cx)
    conv = mc & (c < e3)
    ycol, ywidth = _columns(y0, y1, y2, y3, e1, e2, e3, n, T, Cx, c)
    wrow = w + (n // per).to(tl.int64) * e3 * W + c * W
    xrow = x + n.to(tl.int64) * sxn
    acc = tl.zeros([BT, BC], dtype=tl.float32)
    for j in tl.static_range(W):
        s = t + (j - (W - 1))
        m = ((s >= 0) & (s < T))[:, None] & mc[None, :]
        xv = tl.load(xrow + s[:, None] * sxt + c[None, :], mask=m, other=0.0)
        acc += xv.to(tl.float32) * tl.load(wrow + j, mask=conv, other=0.0).to(tl.float32)[None, :]
    out = tl.where(conv[None, :], (acc * tl.sigmoid(acc)).to(y0.dtype.element_ty), xv)   # xv: row t itself
    mo = (t < T)[:, None] & mc[None, :]
    tl.store(ycol[None, :] + t[:, None] * ywidth[None, :], out, mask=mo)


@triton.jit
def _ring_rows(own, last, cur, r, cc, m: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, mask):
    """da at rows r + m of tile ``last`` in the ring, running on into tile ``cur`` (float32)."""
    src = tl.where(r + m < BT, last * BT + r + m, cur * BT + r + m - BT)
    return tl.load(own + src * BC + cc, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _backward(dy0, dy1, dy2, dy3, e1, e2, e3, x, w, dx, dwp, ring, T, Cx, first, per, sxn, sxt, sdn, sdt,
              BT: tl.constexpr, BC: tl.constexpr):
    tl.static_assert(BT >= 4)                # the last tap's rows reach 3 into the next tile, no further
    n = tl.program_id(0)
    c = first + tl.program_id(1) * BC + tl.arange(0, BC)
    mc = (c >= 0) & (c < Cx)
    conv = mc & (c < e3)
    wrow = w + (n // per).to(tl.int64) * e3 * 4 + c * 4
    w0 = tl.load(wrow + 0, mask=conv, other=0.0).to(tl.float32)[None, :]
    w1 = tl.load(wrow + 1, mask=conv, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(wrow + 2, mask=conv, other=0.0).to(tl.float32)[None, :]
    w3 = tl.load(wrow + 3, mask=conv, other=1.0).to(tl.float32)[None, :]   # a passed column: the identity
    xrow = x + n.to(tl.int64) * sxn
    dycol, dywidth = _columns(dy0, dy1, dy2, dy3, e1, e2, e3, n, T, Cx, c)
    dxrow = dx + n.to(tl.int64) * sdn
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
        d = tl.where(conv[None, :], g * sg * (1.0 + a * (1.0 - sg)), g)   # zero past the sequence's end (g is)
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
        tl.store(dxrow + s[:, None] * sdt + c[None, :], out.to(dx.dtype.element_ty), mask=ms)
    o = dwp + n.to(tl.int64) * e3 * 4 + c * 4
    tl.store(o + 0, tl.sum(acc0, axis=0), mask=conv)
    tl.store(o + 1, tl.sum(acc1, axis=0), mask=conv)
    tl.store(o + 2, tl.sum(acc2, axis=0), mask=conv)
    tl.store(o + 3, tl.sum(acc3, axis=0), mask=conv)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [N, T, C] with unit channel stride (a column slice of a wider product stays a view)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _bounds(widths: list[int]) -> tuple[int, int]:
    """The first columns of the second and third pieces (C where there is none)."""
    if not 1 <= len(widths) <= PIECES:
        raise ValueError(f"short conv: 1 to {PIECES} pieces of columns, got {len(widths)}")
    ends = [sum(widths[:i + 1]) for i in range(len(widths))] + [sum(widths)] * (PIECES - len(widths))
    return ends[0], ends[1]


def _tiles(Cx: int, bc: int) -> tuple[int, int]:
    """Tiles of bc columns that end at column Cx, and the first one's first column (<= 0): so that the columns
    passed through share their rows' memory segments with the convolution's last columns, not a tile of their
    own (a tile of 16 columns of rows of 784 moved at about a tenth of the H200's bandwidth)."""
    n = triton.cdiv(Cx, bc)
    return n, Cx - n * bc


def short_conv_triton(x: torch.Tensor, w: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """x [N, T, C'], w [G, C, W] (G divides N, C <= C'): the convolution of x's first C columns in x's dtype, as
    pieces [N, T, size] (each dense) of the given widths, one to three, which add up to C; where C' > C, then
    x's other columns, as they are, as one more piece."""
    N, T, Cx = x.shape
    G, C, W = w.shape
    x, w = _rows(x), w.contiguous()
    ys = [torch.empty(N, T, n, dtype=x.dtype, device=x.device) for n in sizes + [Cx - C] * (Cx > C)]
    e1, e2 = _bounds(sizes)
    p = ys[:len(sizes)] + ys[len(sizes) - 1:len(sizes)] * (PIECES - len(sizes)) + ys[-1:]
    nc, first = _tiles(Cx, BC)
    _forward[(N, triton.cdiv(T, BT), nc)](x, w, *p, e1, e2, C, T, Cx, first, N // G, x.stride(0), x.stride(1),
                                          W=W, BT=BT, BC=BC, num_warps=4)
    return ys


def short_conv_grad_triton(dys: list[torch.Tensor], x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``short_conv_triton`` for its outputs' gradients dys (as its pieces, and the gradient of x's
    other columns last where x is wider than w): (dx [N, T, C'] in x's dtype, dw [G, C, W] float32)."""
    N, T, Cx = x.shape
    G, C, W = w.shape
    if W > TAPS:      # short_conv.py sends longer filters to its torch form
        raise ValueError(f"short_conv_grad_triton: filters of at most {TAPS} taps, got {W}")
    x, w = _rows(x), w.contiguous()
    dys = [d.contiguous() for d in dys]
    k = len(dys) - (Cx > C)                            # the convolution's pieces
    e1, e2 = _bounds([d.shape[-1] for d in dys[:k]])
    w4 = F.pad(w, (TAPS - W, 0))                       # tap j of W is tap j + TAPS - W of TAPS
    dx = torch.empty(N, T, Cx, dtype=x.dtype, device=x.device)
    dwp = torch.empty(N, C, TAPS, dtype=torch.float32, device=x.device)
    nc, first = _tiles(Cx, BC_BWD)
    ring = torch.empty(N * nc * 3 * BT_BWD * BC_BWD, dtype=x.dtype, device=x.device)
    # num_stages=1: no software pipelining, which could move the ring's loads above the barrier
    _backward[(N, nc)](*dys[:k], *dys[k - 1:k] * (PIECES - k), dys[-1], e1, e2, C, x, w4, dx, dwp, ring, T, Cx, first,
                       N // G, x.stride(0), x.stride(1), dx.stride(0), dx.stride(1), BT=BT_BWD, BC=BC_BWD,
                       num_warps=WARPS_BWD, num_stages=1)
    return dx, dwp.view(G, N // G, C, TAPS).sum(1)[..., TAPS - W:]

"""The short causal depthwise convolution with its silu (``short_conv.py``) as three Triton kernels.

``y[n, t, c] = silu(sum_j w[g, c, j] * x[n, t + j - (W - 1), c])``, with x zero before t = 0 and
g = n // per (stacked replicas each bring their own weights; one model has g = 0 throughout).

``_forward``: one program per (sequence, BT positions, BC channels) sums the W shifted rows in
float32 and writes silu of it in x's dtype. Nothing is saved: the backward recomputes the sums.

The backward, for the output gradient dy:

1. ``_backward_pre``: one program per (sequence, BC channels) walks the sequence BT positions at a time,
   recomputes the pre-activation a, writes ``da = dy * silu'(a)`` (in x's dtype) and keeps, per tap,
   a running tile of ``da[t] * x[t + j - (W - 1)]``, summed once at the end into the program's own row of
   weight-gradient partials; the caller adds the rows in a fixed order (no atomics, so a run repeats to
   the bit). It holds one tile per tap, for 4 taps: shorter filters get leading zero taps.
2. ``_backward_x``: ``dx[t] = sum_m w[W - 1 - m] da[t + m]``.

Shifted loads of a tile fall in rows a neighbouring load just read, so they come from cache. A sum per
tile in the first kernel (instead of per sequence) cost twice its time: the reductions, not the bytes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# tiles measured on the H200 at a stack of 9 Figure 8 runs (x [2304, 320, 256] bf16): forward 0.31 ms, the two
# backward kernels 0.51 and 0.22 ms per call, against 0.38, 1.16 and 0.48 with 64 x 64 tiles everywhere
BT, BC = 16, 128          # forward and dx: a tile each
BT_PRE, BC_PRE = 16, 64   # da and the weight gradient: a channel block each, walking the sequence
TAPS = 4                  # the backward's first kernel holds one tile per tap; shorter filters get leading zero taps


@triton.jit
def _forward(x, w, y, T, C, per, sxn, sxt, W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    n = tl.program_id(0)
    t = tl.program_id(1) * BT + tl.arange(0, BT)
    c = tl.program_id(2) * BC + tl.arange(0, BC)
    mc = c < C
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
    tl.store(y + n.to(tl.int64) * T * C + t[:, None] * C + c[None, :], out.to(y.dtype.element_ty), mask=mo)


@triton.jit
def _backward_pre(dy, x, w, da, dwp, T, C, per, sxn, sxt, sdn, sdt, BT: tl.constexpr, BC: tl.constexpr):
    n = tl.program_id(0)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    mc = c < C
    wrow = w + (n // per).to(tl.int64) * C * 4 + c * 4
    w0 = tl.load(wrow + 0, mask=mc, other=0.0).to(tl.float32)[None, :]
    w1 = tl.load(wrow + 1, mask=mc, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(wrow + 2, mask=mc, other=0.0).to(tl.float32)[None, :]
    w3 = tl.load(wrow + 3, mask=mc, other=0.0).to(tl.float32)[None, :]
    xrow = x + n.to(tl.int64) * sxn
    dyrow = dy + n.to(tl.int64) * sdn
    darow = da + n.to(tl.int64) * T * C
    acc0 = tl.zeros([BT, BC], dtype=tl.float32)       # the weight gradient of each tap, summed over positions
    acc1 = tl.zeros([BT, BC], dtype=tl.float32)
    acc2 = tl.zeros([BT, BC], dtype=tl.float32)
    acc3 = tl.zeros([BT, BC], dtype=tl.float32)
    for t0 in range(0, T, BT):
        t = t0 + tl.arange(0, BT)
        mt = (t < T)[:, None] & mc[None, :]
        x0 = tl.load(xrow + (t - 3)[:, None] * sxt + c[None, :], mask=(t >= 3)[:, None] & mt, other=0.0).to(tl.float32)
        x1 = tl.load(xrow + (t - 2)[:, None] * sxt + c[None, :], mask=(t >= 2)[:, None] & mt, other=0.0).to(tl.float32)
        x2 = tl.load(xrow + (t - 1)[:, None] * sxt + c[None, :], mask=(t >= 1)[:, None] & mt, other=0.0).to(tl.float32)
        x3 = tl.load(xrow + t[:, None] * sxt + c[None, :], mask=mt, other=0.0).to(tl.float32)
        a = x0 * w0 + x1 * w1 + x2 * w2 + x3 * w3
        sg = tl.sigmoid(a)
        g = tl.load(dyrow + t[:, None] * sdt + c[None, :], mask=mt, other=0.0).to(tl.float32)
        d = g * sg * (1.0 + a * (1.0 - sg))
        tl.store(darow + t[:, None] * C + c[None, :], d.to(da.dtype.element_ty), mask=mt)
        acc0 += d * x0
        acc1 += d * x1
        acc2 += d * x2
        acc3 += d * x3
    out = dwp + n.to(tl.int64) * C * 4 + c * 4
    tl.store(out + 0, tl.sum(acc0, axis=0), mask=mc)
    tl.store(out + 1, tl.sum(acc1, axis=0), mask=mc)
    tl.store(out + 2, tl.sum(acc2, axis=0), mask=mc)
    tl.store(out + 3, tl.sum(acc3, axis=0), mask=mc)


@triton.jit
def _backward_x(da, w, dx, T, C, per, W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    n = tl.program_id(0)
    t = tl.program_id(1) * BT + tl.arange(0, BT)
    c = tl.program_id(2) * BC + tl.arange(0, BC)
    mc = c < C
    wrow = w + (n // per).to(tl.int64) * C * W + c * W
    row = da + n.to(tl.int64) * T * C
    acc = tl.zeros([BT, BC], dtype=tl.float32)
    for m in tl.static_range(W):                      # the gradient at t + m reaches x[t] through tap W - 1 - m
        tm = t + m
        g = tl.load(row + tm[:, None] * C + c[None, :], mask=(tm < T)[:, None] & mc[None, :], other=0.0)
        acc += g * tl.load(wrow + (W - 1 - m), mask=mc, other=0.0).to(tl.float32)[None, :]
    mo = (t < T)[:, None] & mc[None, :]
    tl.store(dx + n.to(tl.int64) * T * C + t[:, None] * C + c[None, :], acc.to(dx.dtype.element_ty), mask=mo)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [N, T, C] with unit channel stride (a column slice of a wider product stays a view)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def short_conv_triton(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [N, T, C], w [G, C, W] (G divides N): y [N, T, C] in x's dtype."""
    N, T, C = x.shape
    G, _, W = w.shape
    x, w = _rows(x), w.contiguous()
    y = torch.empty(N, T, C, dtype=x.dtype, device=x.device)
    grid = (N, triton.cdiv(T, BT), triton.cdiv(C, BC))
    _forward[grid](x, w, y, T, C, N // G, x.stride(0), x.stride(1), W=W, BT=BT, BC=BC, num_warps=4)
    return y


def short_conv_grad_triton(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``short_conv_triton`` for its output gradient dy: (dx [N, T, C] in x's dtype, dw [G, C, W] float32)."""
    N, T, C = x.shape
    G, _, W = w.shape
    if W > TAPS:      # short_conv.py sends longer filters to its torch form
        raise ValueError(f"short_conv_grad_triton: filters of at most {TAPS} taps, got {W}")
    x, dy, w = _rows(x), _rows(dy), w.contiguous()
    w4 = F.pad(w, (TAPS - W, 0))                       # tap j of W is tap j + TAPS - W of TAPS
    da = torch.empty(N, T, C, dtype=x.dtype, device=x.device)
    dwp = torch.empty(N, C, TAPS, dtype=torch.float32, device=x.device)
    _backward_pre[(N, triton.cdiv(C, BC_PRE))](dy, x, w4, da, dwp, T, C, N // G, x.stride(0), x.stride(1), dy.stride(0),
                                               dy.stride(1), BT=BT_PRE, BC=BC_PRE, num_warps=4)
    dx = torch.empty(N, T, C, dtype=x.dtype, device=x.device)
    _backward_x[(N, triton.cdiv(T, BT), triton.cdiv(C, BC))](da, w, dx, T, C, N // G, W=W, BT=BT, BC=BC, num_warps=4)
    return dx, dwp.view(G, N // G, C, TAPS).sum(1)[..., TAPS - W:]

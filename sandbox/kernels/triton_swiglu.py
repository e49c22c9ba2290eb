"""The SwiGLU activation (``swiglu.py``) as two Triton kernels over rows ``u = [a | b]`` of width 2H.

``_forward`` writes ``h = silu(a) * b`` [N, H]. ``_backward`` reads ``dh`` [N, H] and ``u`` and writes
``du = [da | db]`` [N, 2H] as one tensor, ``da = dh * b * sig(a) * (1 + a * (1 - sig(a)))`` and
``db = dh * silu(a)``, so no cat of the two halves follows. Both compute in float32 and store in u's dtype.

Grid: (row tiles, column tiles). Program (i, j) handles a [BR, BH] tile: rows i * BR ..., columns j * BH ... of
each half (the b-half at the same columns plus H).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE = 4096  # values per [BR, BH] tile: 32 per thread of 4 warps, wide loads that still fit in registers
MAX_BH = 1024  # column tile cap: wider halves take several column tiles rather than one row per program
WARPS = 4


@triton.jit
def _tile(u, N, H, su, BR: tl.constexpr, BH: tl.constexpr):
    """This program's tile: its rows (int64, as a column), columns, mask, and both halves of u in float32."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    m = (rows < N)[:, None] & (cols < H)[None, :]
    r = rows.to(tl.int64)[:, None]
    pa = u + r * su + cols[None, :]
    a = tl.load(pa, mask=m, other=0.0).to(tl.float32)
    b = tl.load(pa + H, mask=m, other=0.0).to(tl.float32)
    return r, cols, m, a, b


@triton.jit
def _forward(u, h, N, H, su, BR: tl.constexpr, BH: tl.constexpr):
    r, cols, m, a, b = _tile(u, N, H, su, BR, BH)
    out = a * tl.sigmoid(a) * b
    tl.store(h + r * H + cols[None, :], out.to(h.dtype.element_ty), mask=m)


@triton.jit
def _backward(dh, u, du, N, H, sd, su, BR: tl.constexpr, BH: tl.constexpr):
    r, cols, m, a, b = _tile(u, N, H, su, BR, BH)
    g = tl.load(dh + r * sd + cols[None, :], mask=m, other=0.0).to(tl.float32)
    s = tl.sigmoid(a)
    da = g * b * s * (1 + a * (1 - s))
    db = g * a * s
    pd = du + r * (2 * H) + cols[None, :]
    tl.store(pd, da.to(du.dtype.element_ty), mask=m)
    tl.store(pd + H, db.to(du.dtype.element_ty), mask=m)


def _tiles(N: int, H: int) -> tuple[tuple[int, int], int, int]:
    bh = min(MAX_BH, triton.next_power_of_2(H))
    br = max(1, TILE // bh)
    return (triton.cdiv(N, br), triton.cdiv(H, bh)), br, bh


def _unit_cols(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(1) == 1 else x.contiguous()


def swiglu_forward(u2d: torch.Tensor) -> torch.Tensor:
    """u [N, 2H] -> h = silu(u[:, :H]) * u[:, H:] [N, H] in u's dtype."""
    N, H2 = u2d.shape
    assert H2 % 2 == 0, "u's last dimension holds the two halves"
    u2d = _unit_cols(u2d)
    H = H2 // 2
    h = torch.empty(N, H, dtype=u2d.dtype, device=u2d.device)
    if N == 0 or H == 0:
        return h
    grid, br, bh = _tiles(N, H)
    _forward[grid](u2d, h, N, H, u2d.stride(0), BR=br, BH=bh, num_warps=WARPS)
    return h


def swiglu_backward(dh2d: torch.Tensor, u2d: torch.Tensor) -> torch.Tensor:
    """dh [N, H], u [N, 2H] -> du [N, 2H] (the a-half's gradient, then the b-half's) in u's dtype."""
    N, H2 = u2d.shape
    H = H2 // 2
    assert H2 % 2 == 0 and dh2d.shape == (N, H), (dh2d.shape, u2d.shape)
    u2d, dh2d = _unit_cols(u2d), _unit_cols(dh2d)
    du = torch.empty(N, H2, dtype=u2d.dtype, device=u2d.device)
    if N == 0 or H == 0:
        return du
    grid, br, bh = _tiles(N, H)
    _backward[grid](dh2d, u2d, du, N, H, dh2d.stride(0), u2d.stride(0), BR=br, BH=bh, num_warps=WARPS)
    return du

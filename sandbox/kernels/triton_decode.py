"""Single-step (decode) update of the linear recurrence, in place, in Triton.

    S <- diag(exp(g)) S;  S <- S + k^T w  with w = v, or w = beta (v - k S) (delta rule);  o = scale * q S

q, k: [B, H, K]; v: [B, H, V]; state: [B, H, K, V] float32, updated in place; g: None, [B, H] or
[B, H, K] log-decay; beta: None or [B, H].

``rows`` ([B, H, R] integer row indices, e.g. the top-k rows of a row-sparse mixer, or the
rows ``p * P + arange(P)`` of the partitions an SSE token is routed to): only those state rows
are read-modified-written; every other row is left bit-identical (the contract's unselected
rows have k = 0 and gate 1).  The output still reads every row (q is dense).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sandbox.kernels.triton_chunk_common import tile_and_row


@triton.jit
def _decode_dense(q, k, v, g, beta, S, o, scale,
                  K: tl.constexpr, V: tl.constexpr, GATE: tl.constexpr, DELTA: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr):
    i_v, i_bh = tile_and_row(tl.cdiv(V, BV))
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    b_v = tl.load(v + i_bh * V + o_v, mask=m_v, other=0.).to(tl.float32)
    if GATE == 1:
        dec_s = tl.exp(tl.load(g + i_bh).to(tl.float32))
    if DELTA:
        kS = tl.zeros([BV], dtype=tl.float32)
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            b_S = tl.load(S + (i_bh * K + o_k[:, None]) * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.)
            b_k = tl.load(k + i_bh * K + o_k, mask=m_k, other=0.).to(tl.float32)
            if GATE == 2:
                b_k = b_k * tl.exp(tl.load(g + i_bh * K + o_k, mask=m_k, other=0.).to(tl.float32))
            if GATE == 1:
                b_k = b_k * dec_s
            kS += tl.sum(b_k[:, None] * b_S, axis=0)
        b_w = tl.load(beta + i_bh).to(tl.float32) * (b_v - kS)
    else:
        b_w = b_v
    b_o = tl.zeros([BV], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        p_S = S + (i_bh * K + o_k[:, None]) * V + o_v[None, :]
        m_S = m_k[:, None] & m_v[None, :]
        b_S = tl.load(p_S, mask=m_S, other=0.)
        if GATE == 2:
            b_S = b_S * tl.exp(tl.load(g + i_bh * K + o_k, mask=m_k, other=0.).to(tl.float32))[:, None]
        if GATE == 1:
            b_S = b_S * dec_s
        b_k = tl.load(k + i_bh * K + o_k, mask=m_k, other=0.).to(tl.float32)
        b_S += b_k[:, None] * b_w[None, :]
        tl.store(p_S, b_S, mask=m_S)
        b_q = tl.load(q + i_bh * K + o_k, mask=m_k, other=0.).to(tl.float32)
        b_o += tl.sum(b_q[:, None] * b_S, axis=0)
    tl.store(o + i_bh * V + o_v, (b_o * scale).to(o.dtype.element_ty), mask=m_v)


@triton.jit
def _decode_rows(q, k, v, g, beta, S, o, rows, scale, R,
                 K: tl.constexpr, V: tl.constexpr, GATE: tl.constexpr, DELTA: tl.constexpr,
                 BK: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr):
    i_v, i_bh = tile_and_row(tl.cdiv(V, BV))
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    # output from the old state (all rows, read only)
    b_o = tl.zeros([BV], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_S = tl.load(S + (i_bh * K + o_k[:, None]) * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.)
        b_q = tl.load(q + i_bh * K + o_k, mask=m_k, other=0.).to(tl.float32)
        b_o += tl.sum(b_q[:, None] * b_S, axis=0)
    # the selected rows
    o_r = tl.arange(0, BR)
    m_r = o_r < R
    idx = tl.load(rows + i_bh * R + o_r, mask=m_r, other=0)
    p_S = S + (i_bh * K + idx[:, None]) * V + o_v[None, :]
    m_S = m_r[:, None] & m_v[None, :]
    b_S = tl.load(p_S, mask=m_S, other=0.)
    b_new = b_S
    if GATE == 2:
        b_new = b_new * tl.exp(tl.load(g + i_bh * K + idx, mask=m_r, other=0.).to(tl.float32))[:, None]
    b_k = tl.load(k + i_bh * K + idx, mask=m_r, other=0.).to(tl.float32)
    b_v = tl.load(v + i_bh * V + o_v, mask=m_v, other=0.).to(tl.float32)
    if DELTA:
        b_w = tl.load(beta + i_bh).to(tl.float32) * (b_v - tl.sum(b_k[:, None] * b_new, axis=0))
    else:
        b_w = b_v
    b_new += b_k[:, None] * b_w[None, :]
    tl.store(p_S, b_new, mask=m_S)
    b_qr = tl.load(q + i_bh * K + idx, mask=m_r, other=0.).to(tl.float32)
    b_o += tl.sum(b_qr[:, None] * (b_new - b_S), axis=0)
    tl.store(o + i_bh * V + o_v, (b_o * scale).to(o.dtype.element_ty), mask=m_v)


def decode_step(q, k, v, state, g=None, beta=None, *, scale=1.0, rows=None):
    """One recurrence step for every (batch, head); updates ``state`` in place and returns o [B, H, V]."""
    if q.dim() != 3 or k.shape != q.shape:
        raise ValueError(f"q, k: must both be [B, H, K], got {tuple(q.shape)} and {tuple(k.shape)}")
    B, H, K = q.shape
    if v.dim() != 3 or v.shape[:2] != (B, H):
        raise ValueError(f"v: must be [B, H, V] with B, H = {B, H}, got {tuple(v.shape)}")
    V = v.shape[-1]
    if state.shape != (B, H, K, V) or state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError(f"state: must be a contiguous float32 [B, H, K, V] = {(B, H, K, V)} tensor")
    gate = 0 if g is None else (1 if g.shape == (B, H) else 2)
    if g is not None and g.shape not in ((B, H), (B, H, K)):
        raise ValueError(f"g: must be [B, H] or [B, H, K], got {tuple(g.shape)}")
    if beta is not None and beta.shape != (B, H):
        raise ValueError(f"beta: must be [B, H], got {tuple(beta.shape)}")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    gp = g.contiguous() if g is not None else q
    bp = beta.contiguous() if beta is not None else q
    o = torch.empty(B, H, V, device=q.device, dtype=v.dtype)
    BV = max(16, min(64, triton.next_power_of_2(V)))
    BK = max(16, min(64, triton.next_power_of_2(K)))
    grid = (triton.cdiv(V, BV) * B * H,)
    if rows is None:
        _decode_dense[grid](q, k, v, gp, bp, state, o, float(scale), K=K, V=V, GATE=gate, DELTA=beta is not None,
                            BK=BK, BV=BV, num_warps=4)
        return o
    if gate == 1:
        raise ValueError("rows: a scalar gate decays every row; pass a diagonal gate [B, H, K] with rows")
    if rows.dim() != 3 or rows.shape[:2] != (B, H):
        raise ValueError(f"rows: must be [B, H, R] integer indices, got {tuple(rows.shape)}")
    R = rows.shape[-1]
    BR = max(16, triton.next_power_of_2(R))
    _decode_rows[grid](q, k, v, gp, bp, state, o, rows.to(torch.int32).contiguous(), float(scale), R, K=K, V=V,
                       GATE=gate, DELTA=beta is not None, BK=BK, BV=BV, BR=BR, num_warps=4)
    return o

"""Backward of the chunked gated linear attention in ``triton_chunk.py``.

Notation as there: per sequence and head, S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t, o_t = scale * q_t S_t;
gc = chunk-local cumulative log-decay, gl = its last row (the chunk's total decay).
For chunk c with S_c = state at its start and dS_c = gradient of the state at its end coming from
later chunks (and the final state):
    dq = scale * exp(gc) * (dO S_c^T),   dk = exp(gl - gc) * (v dS_c^T),   dv = (k * exp(gl - gc)) dS_c
plus the intra-chunk parts, from dA = scale * dO v^T (masked to j <= i) and A:
    dq_i += sum_{j <= i} dA_ij exp(gc_i - gc_j) k_j,  dk_j += sum_{i >= j} dA_ij exp(gc_i - gc_j) q_i,  dv += A^T dO.
(one product each when the chunk decays by less than exp(LIM) in a K tile, else the forward's 16-row split).
The gate gradient is dg_t = sum_{s >= t} (q_s dq_s - k_s dk_s) + rowsum(S_T dS_T) per segment; the sum over
all later chunks equals rowsum(S_end_c * dS_c) (the same identity at a chunk boundary), and with
S_end_c = exp(gl) S_c + (k * exp(gl - gc))^T v that is
    carry_c = exp(gl) * rowsum(S_c * dS_c) + sum_t k_t * dk_inter_t,
so dg needs no scan across chunks.

Kernels (gc, qg, kg, A and the chunk-start states S_c come from the forward):
  1. ``_states``   in reverse (sequential over chunks): dS_c for every chunk, and d(initial state).
  2. ``_bwd_dA``   (parallel over chunks): dA, fp32; only for heads of more than one K tile (K > 64): with
                   one, the K-tile program of 3. forms it (the dO and v tiles it needs are loaded there).
  3. ``_bwd_chunk`` (parallel over chunks x (NK + NV) tiles): dq, dk and dg of one K tile, or dv of one
                   V tile; intra and inter parts together, written in the input dtype.  (Separate dq and
                   dk programs were slower: docs/kernels.md, "Tried and dropped".)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sandbox.kernels.triton_chunk_common import (BC, BT, _block_decay, _bwd_tiles, _bwd_warps, _chunk_bounds,
                                                 _gate_kind, _pick, diag_block_limit, row_stride, run_states)


@triton.jit
def _bwd_dA(v, do, dA, cidx, T, scale, SV, H, V: tl.constexpr, IS_VARLEN: tl.constexpr, BT: tl.constexpr,
            BV: tl.constexpr):
    """dA = scale * dO v^T over one chunk, masked to j <= i: fp32, [TT, H, BT] like A.  Its own kernel so
    that the gradient programs only load it (accumulating it there beside dq and dk made them spill)."""
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    t0, t1 = _chunk_bounds(i_c, cidx, T, IS_VARLEN, BT)
    o_t = tl.arange(0, BT)
    rows = t0 + o_t
    m = rows < t1
    acc = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m[:, None] & (o_v < V)[None, :]
        b_do = tl.load(do + (rows[:, None] * H + i_h) * V + o_v[None, :], mask=m_tv, other=0.)
        b_v = tl.load(v + rows[:, None] * SV + i_h * V + o_v[None, :], mask=m_tv, other=0.)
        acc += tl.dot(b_do, tl.trans(b_v))
    acc = tl.where((o_t[None, :] <= o_t[:, None]) & m[None, :], acc * scale, 0.)
    tl.store(dA + (rows[:, None] * H + i_h) * BT + o_t[None, :], acc, mask=m[:, None])


@triton.jit
def _bwd_chunk(q, k, v, gc, kg, A, dA, do, h, dh, dq, dk, dv, dg, cidx, T, TT, scale, SQ, SK, SV, SKG,
               H, K: tl.constexpr, V: tl.constexpr, GATE: tl.constexpr, IS_VARLEN: tl.constexpr,
               BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NK: tl.constexpr,
               NV: tl.constexpr, LIM: tl.constexpr):
    """One chunk and head.  Tile i_t < NK: dq, dk (and dg) of K tile i_t, the inter-chunk parts from the
    stored states, the intra-chunk parts from dA.  Otherwise dv of V tile i_t - NK.  The NK + NV tiles of
    a chunk are neighbours in the grid: they share its rows and states in L2.  With one K tile (NK = 1)
    the K-tile program forms dA itself from the dO and v tiles it loads anyway; with more, ``_bwd_dA``
    forms it once for all of them.  SQ, SK, SV, SKG: the row strides of q, k, v and kg (``as_rows``); the
    gradients are contiguous."""
    i_ct, i_h = tl.program_id(0), tl.program_id(1)
    i_c, i_t = i_ct // (NK + NV), i_ct % (NK + NV)
    t0, t1 = _chunk_bounds(i_c, cidx, T, IS_VARLEN, BT)
    o_t = tl.arange(0, BT)
    rows = t0 + o_t
    m = rows < t1
    p_s = (i_c * H + i_h).to(tl.int64) * K * V  # this chunk's [K, V] states
    if i_t < NK:
        o_k = i_t * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m[:, None] & m_k[None, :]
        b_dq = tl.zeros([BT, BK], dtype=tl.float32)
        b_dk = tl.zeros([BT, BK], dtype=tl.float32)
        hs = tl.zeros([BK], dtype=tl.float32)  # rowsum(S_c * dS_c)
        if NK == 1:
            acc = tl.zeros([BT, BT], dtype=tl.float32)  # dA, formed here
        for i_v in range(0, tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            m_v = o_v < V
            m_tv = m[:, None] & m_v[None, :]
            m_h = m_k[:, None] & m_v[None, :]
            b_do = tl.load(do + (rows[:, None] * H + i_h) * V + o_v[None, :], mask=m_tv, other=0.)
            b_v = tl.load(v + rows[:, None] * SV + i_h * V + o_v[None, :], mask=m_tv, other=0.)
            b_S = tl.load(h + p_s + o_k[:, None] * V + o_v[None, :], mask=m_h, other=0.)
            b_dS = tl.load(dh + p_s + o_k[:, None] * V + o_v[None, :], mask=m_h, other=0.)
            b_dq += tl.dot(b_do, tl.trans(b_S.to(b_do.dtype)))
            b_dk += tl.dot(b_v, tl.trans(b_dS.to(b_v.dtype)))
            if NK == 1:
                acc += tl.dot(b_do, tl.trans(b_v))
            if GATE > 0:
                hs += tl.sum(b_S.to(tl.float32) * b_dS.to(tl.float32), axis=1)
        p_k = (rows[:, None] * H + i_h) * K + o_k[None, :]
        b_q = tl.load(q + rows[:, None] * SQ + i_h * K + o_k[None, :], mask=m_tk, other=0.)
        b_k = tl.load(k + rows[:, None] * SK + i_h * K + o_k[None, :], mask=m_tk, other=0.)
        if NK == 1:
            b_dA = tl.where((o_t[None, :] <= o_t[:, None]) & m[None, :], acc * scale, 0.)
        else:
            b_dA = tl.load(dA + (rows[:, None] * H + i_h) * BT + o_t[None, :], mask=m[:, None], other=0.)
        dt = b_k.dtype
        rc = tl.minimum(rows, t1 - 1)  # gc loads past the end repeat the last row: no overflow there
        if GATE == 2:
            b_g = tl.load(gc + (rc[:, None] * H + i_h) * K + o_k[None, :], mask=m_k[None, :], other=0.)
            gl = tl.load(gc + ((t1 - 1) * H + i_h) * K + o_k, mask=m_k, other=0.)
            b_dq = b_dq * scale * tl.exp(b_g)
            b_dk = b_dk * tl.exp(gl[None, :] - b_g)
            # gradient flowing into later chunks through this chunk's decay: rowsum(S_end * dS_c)
            carry = tl.exp(gl) * hs + tl.sum(b_k.to(tl.float32) * b_dk, axis=0)
            g0 = tl.load(gc + (t0 * H + i_h) * K + o_k, mask=m_k, other=0.)
            if tl.max(g0 - gl, axis=0) < LIM:
                # the whole chunk decays by less than exp(LIM) in this tile: one product each, with gc
                # at the chunk's first row as the reference
                dAb = b_dA.to(dt)
                ke = (b_k.to(tl.float32) * tl.exp(g0[None, :] - b_g)).to(dt)
                qe = (b_q.to(tl.float32) * tl.exp(b_g - g0[None, :])).to(dt)
                b_dq += tl.dot(dAb, ke) * tl.exp(b_g - g0[None, :])
                b_dk += tl.dot(tl.trans(dAb), qe) * tl.exp(g0[None, :] - b_g)
            else:
                b_dq = _intra_dq(b_dq, b_dA, b_k, b_g, k, gc, t0, t1, i_h, o_k, m_k, SK, H, K, BT, BC, BK, LIM)
                b_dk = _intra_dk(b_dk, b_dA, b_q, b_g, gc, t0, t1, i_h, o_k, m_k, H, K, BT, BC, BK, LIM)
        else:
            if GATE == 1:
                b_g1 = tl.load(gc + rc * H + i_h)
                gl1 = tl.load(gc + (t1 - 1) * H + i_h)
                b_dq = b_dq * scale * tl.exp(b_g1)[:, None]
                b_dk = b_dk * tl.exp(gl1 - b_g1)[:, None]
                carry = tl.exp(gl1) * hs + tl.sum(b_k.to(tl.float32) * b_dk, axis=0)
                b_dA = b_dA * tl.exp(tl.where(rows[None, :] <= rows[:, None], b_g1[:, None] - b_g1[None, :],
                                              float("-inf")))
            else:
                b_dq = b_dq * scale
            b_dq += tl.dot(b_dA.to(dt), b_k)
            b_dk += tl.dot(tl.trans(b_dA).to(dt), b_q)
        tl.store(dq + p_k, b_dq.to(dq.dtype.element_ty), mask=m_tk)
        tl.store(dk + p_k, b_dk.to(dk.dtype.element_ty), mask=m_tk)
        if GATE > 0:
            d = b_q.to(tl.float32) * b_dq - b_k.to(tl.float32) * b_dk
        if GATE == 2:
            b_dg = carry[None, :] + tl.sum(d, axis=0)[None, :] - tl.cumsum(d, axis=0) + d
            tl.store(dg + p_k, b_dg.to(dg.dtype.element_ty), mask=m_tk)
        if GATE == 1:
            # this K tile's share; the NK shares are added up on the host
            d1 = tl.sum(d, axis=1)
            b_dg1 = tl.sum(carry, axis=0) + tl.sum(d1, axis=0) - tl.cumsum(d1, axis=0) + d1
            tl.store(dg + i_t.to(tl.int64) * TT * H + rows * H + i_h, b_dg1.to(dg.dtype.element_ty), mask=m)
    else:
        o_v = (i_t - NK) * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_tv = m[:, None] & m_v[None, :]
        b_dv = tl.zeros([BT, BV], dtype=tl.float32)
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            b_kg = tl.load(kg + rows[:, None] * SKG + i_h * K + o_k[None, :], mask=m[:, None] & m_k[None, :],
                           other=0.)
            b_dS = tl.load(dh + p_s + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.)
            b_dv += tl.dot(b_kg, b_dS.to(b_kg.dtype))
        p_v = (rows[:, None] * H + i_h) * V + o_v[None, :]
        b_do = tl.load(do + p_v, mask=m_tv, other=0.)
        b_A = tl.load(A + (rows[:, None] * H + i_h) * BT + o_t[None, :], mask=m[:, None], other=0.)
        b_dv += tl.dot(tl.trans(b_A).to(b_do.dtype), b_do)
        tl.store(dv + p_v, b_dv.to(dv.dtype.element_ty), mask=m_tv)


@triton.jit
def _intra_dq(b_dq, dA, b_k, b_g, k, gc, t0, t1, i_h, o_k, m_k, SK, H, K: tl.constexpr,
              BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, LIM: tl.constexpr):
    """dq_i += sum_{j <= i} dA_ij exp(gc_i - gc_j) k_j for one K tile under the diagonal gate.  Row block r
    (BC rows) meets every earlier column through one product with gc at its first row as the reference
    (every exponent <= 0); its own pairs join that product when the block decays by less than exp(LIM)
    in this tile's channels, else ``_exact_diag`` sums them."""
    o_t = tl.arange(0, BT)
    blk = o_t // BC
    fast = _block_decay(gc, t0, t1, i_h, o_k, m_k, H, K, BT, BC) < LIM
    acc = tl.zeros([BT, BK], dtype=tl.float32)
    dAb = dA.to(b_k.dtype)
    for r in tl.static_range(BT // BC):
        ref = tl.load(gc + (tl.minimum(t0 + r * BC, t1 - 1) * H + i_h) * K + o_k, mask=m_k, other=0.)
        hi = r * BC + BC * _pick(fast.to(tl.int32), r)  # columns below hi go through the product
        ke = b_k.to(tl.float32) * tl.exp(tl.where((o_t < hi)[:, None], ref[None, :] - b_g, float("-inf")))
        acc += tl.dot(tl.where((blk == r)[:, None], dAb, 0.), ke.to(b_k.dtype))
    rs = tl.minimum(t0 + blk * BC, t1 - 1)  # each row's reference row
    b_R = tl.load(gc + (rs[:, None] * H + i_h) * K + o_k[None, :], mask=m_k[None, :], other=0.)
    b_dq += acc * tl.exp(b_g - b_R)
    if tl.min(fast.to(tl.int32), axis=0) == 0:
        b_dq = _exact_diag(b_dq, dA, b_k, b_g, fast, k, gc, t0, t1, i_h, o_k, m_k, SK, H, K, BT, BC, False)
    return b_dq


@triton.jit
def _intra_dk(b_dk, dA, b_q, b_g, gc, t0, t1, i_h, o_k, m_k, H, K: tl.constexpr,
              BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, LIM: tl.constexpr):
    """dk_j += sum_{i >= j} dA_ij exp(gc_i - gc_j) q_i, the transpose of ``_intra_dq``: column block r goes
    through one product with gc at the block's last row as the reference."""
    o_t = tl.arange(0, BT)
    m = t0 + o_t < t1
    blk = o_t // BC
    fast = _block_decay(gc, t0, t1, i_h, o_k, m_k, H, K, BT, BC) < LIM
    acc = tl.zeros([BT, BK], dtype=tl.float32)
    dAt = tl.trans(dA.to(b_q.dtype))
    for r in tl.static_range(BT // BC):
        ref = tl.load(gc + (tl.minimum(t0 + r * BC + BC - 1, t1 - 1) * H + i_h) * K + o_k, mask=m_k, other=0.)
        lo = r * BC + BC * (1 - _pick(fast.to(tl.int32), r))  # rows from lo on go through the product
        qe = b_q.to(tl.float32) * tl.exp(tl.where(((o_t >= lo) & m)[:, None], b_g - ref[None, :], float("-inf")))
        acc += tl.dot(tl.where((blk == r)[:, None], dAt, 0.), qe.to(b_q.dtype))
    re = tl.minimum(t0 + blk * BC + BC - 1, t1 - 1)  # each row's block's last row
    b_R = tl.load(gc + (re[:, None] * H + i_h) * K + o_k[None, :], mask=m_k[None, :], other=0.)
    b_dk += acc * tl.exp(b_R - b_g)
    if tl.min(fast.to(tl.int32), axis=0) == 0:
        b_dk = _exact_diag(b_dk, dA, b_q, b_g, fast, gc, gc, t0, t1, i_h, o_k, m_k, H * K, H, K, BT, BC, True)
    return b_dk


@triton.jit
def _exact_diag(acc, dA, b_x, b_g, fast, q_or_k, gc, t0, t1, i_h, o_k, m_k, SK, H, K: tl.constexpr,
                BT: tl.constexpr, BC: tl.constexpr, FOR_DK: tl.constexpr):
    """The pairs inside the diagonal blocks that are not fast, exactly, one column j at a time:
    w_ij = dA_ij exp(gc_i - gc_j) for i >= j in j's block; dq_i += w_ij k_j (b_x unused, q_or_k = k), or
    dk_j += sum_i w_ij q_i (b_x = q tile).  SK: k's row stride."""
    o_t = tl.arange(0, BT)
    m = t0 + o_t < t1
    blk = o_t // BC
    slow = fast.to(tl.int32) == 0
    for j in range(0, BT):
        if _pick(slow.to(tl.int32), j // BC) != 0:
            tj = tl.minimum(t0 + j, t1 - 1)  # rows past the end only meet masked rows
            g_j = tl.load(gc + (tj * H + i_h) * K + o_k, mask=m_k, other=0.)
            c_j = tl.sum(tl.where(o_t[None, :] == j, dA, 0.), axis=1)  # column j of dA
            w = c_j[:, None] * tl.exp(tl.where(((blk == j // BC) & (o_t >= j) & m)[:, None], b_g - g_j[None, :],
                                               float("-inf")))
            if FOR_DK:
                acc += tl.where((o_t == j)[:, None], tl.sum(w * b_x.to(tl.float32), axis=0)[None, :], 0.)
            else:
                k_j = tl.load(q_or_k + tj * SK + i_h * K + o_k, mask=m_k, other=0.).to(tl.float32)
                acc += w * k_j[None, :]
    return acc


def _bwd(q, k, v, g, gc, qg, kg, hs, scale, A, do, dht, geo, need_dh0):
    B, T, H, K, V, N, varlen, cidx, NC, cu, coff = geo
    gate = _gate_kind(g)
    TT = B * T
    gp = gc if gc is not None else q
    if gate == 0:
        qg, kg = q, k
    dev = q.device
    # the chunk-start states come from the forward; only the gradient pass runs here
    dh, dh0 = run_states(qg, do, gp, gate, dht, need_dh0, geo, scale, True)
    bk, bv = _bwd_tiles(K, V)
    NK, NV = triton.cdiv(K, bk), triton.cdiv(V, bv)
    dA = q                          # with one K tile, _bwd_chunk forms dA itself
    if NK > 1:
        dA = torch.empty(TT, H, BT, device=dev, dtype=torch.float32)
        _bwd_dA[(NC, H)](v, do, dA, cidx, T, scale, row_stride(v), H, V=V, IS_VARLEN=varlen, BT=BT, BV=bv, num_warps=4)
    dq = torch.empty(TT, H, K, device=dev, dtype=q.dtype)
    dk = torch.empty(TT, H, K, device=dev, dtype=k.dtype)
    dv = torch.empty(TT, H, V, device=dev, dtype=v.dtype)
    dg = None
    if gate == 2:
        dg = torch.empty_like(g)
    elif gate == 1:
        dg = torch.empty(NK, TT, H, device=dev, dtype=g.dtype if NK == 1 else torch.float32)
    _bwd_chunk[(NC * (NK + NV), H)](q, k, v, gp, kg, A, dA, do, hs, dh, dq, dk, dv, dg if dg is not None else q,
                                        cidx, T, TT, scale, row_stride(q), row_stride(k), row_stride(v),
                                        row_stride(kg), H, K=K, V=V, GATE=gate, IS_VARLEN=varlen, BT=BT, BC=BC,
                                        BK=bk, BV=bv, NK=NK, NV=NV, LIM=diag_block_limit(q.dtype),
                                        num_warps=_bwd_warps(K, V))
    if gate == 1:
        dg = (dg[0] if NK == 1 else dg.sum(0).to(g.dtype)).view(B, T, H)
    return dq.view(B, T, H, K), dk.view(B, T, H, K), dv.view(B, T, H, V), dg, dh0

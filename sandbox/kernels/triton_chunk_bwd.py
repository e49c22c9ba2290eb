"""Backward of the chunked gated linear attention in ``triton_chunk.py``.

Notation as there: per sequence and head, S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t, o_t = scale * q_t S_t;
gc = chunk-local cumulative log-decay, gl = its last row (the chunk's total decay).
For chunk c with S_c = state at its start and dS_c = gradient of the state at its end coming from
later chunks (and the final state):
    dq = scale * exp(gc) * (dO S_c^T),   dk = exp(gl - gc) * (v dS_c^T),   dv = (k * exp(gl - gc)) dS_c
plus the intra-chunk parts.  The gate gradient is dg_t = sum_{s >= t} (q_s dq_s - k_s dk_s) + rowsum(S_T dS_T)
per segment; the sum over all later chunks equals rowsum(S_end_c * dS_c) (the same identity at a chunk
boundary), and with S_end_c = exp(gl) S_c + (k * exp(gl - gc))^T v that is
    carry_c = exp(gl) * rowsum(S_c * dS_c) + sum_t k_t * dk_inter_t,
so dg needs no scan across chunks.

Kernels (three launches; gc, qg, kg and the chunk-start states S_c come from the forward):
  1. ``_bwd_intra``   (parallel over chunks x 16-row sub-blocks) intra-chunk dq, dk, dv in fp32, with the
                      same split as ``_fwd_intra`` (reference-row products, exact sums for blocks that
                      decay by more than exp(40)).
  2. ``_states``      in reverse (sequential over chunks): dS_c for every chunk, and d(initial state).
  3. ``_bwd_inter``   (parallel over chunks x (K tiles + V tiles) x heads): dq, dk (and dg) for one
                      K tile, or dv for one V tile, from the stored states plus the intra parts;
                      writes the input dtype directly.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sandbox.kernels.triton_chunk import run_states
from sandbox.kernels.triton_chunk_common import (BT, _chunk_bounds, _diag_block_fits, _gate_kind, _intra_cfg,
                                                 _load_gate, _par_tiles, _sub_block, diag_block_limit)


@triton.jit
def _bwd_intra(q, k, v, gc, A, do, dq, dk, dv, cidx, T, scale,
               H, K: tl.constexpr, V: tl.constexpr, GATE: tl.constexpr, IS_VARLEN: tl.constexpr,
               BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, LIM: tl.constexpr):
    i_cb, i_h = tl.program_id(0), tl.program_id(1)
    t1, ts, bs, rows, cols, rl, cl = _sub_block(i_cb, cidx, T, IS_VARLEN, BT, BC)
    if ts < t1:
        o_r = tl.arange(0, BC)
        o_c = tl.arange(0, BT)
        m_r = rows < t1
        m_c = cols < t1
        be = bs + BC - 1
        # dA rows of this block (and, for the diagonal gate, its columns); dv of this block
        dA_r = tl.zeros([BC, BT], dtype=tl.float32)
        if GATE == 2:
            dA_c = tl.zeros([BT, BC], dtype=tl.float32)
            dAd = tl.zeros([BC, BC], dtype=tl.float32)
            fast = _diag_block_fits(gc, ts, t1, i_h, H, K, BC, BK, LIM)
            hi = tl.where(fast, bs + BC, bs)  # dq: columns < hi through the reference-row product
            lo = tl.where(fast, bs, be + 1)  # dk: rows >= lo likewise
        b_Ac = tl.load(A + (cols[:, None] * H + i_h) * BT + bs + o_r[None, :], mask=m_c[:, None], other=0.)
        for i_v in range(0, tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            m_v = o_v < V
            b_doc = tl.load(do + (cols[:, None] * H + i_h) * V + o_v[None, :], mask=m_c[:, None] & m_v[None, :], other=0.)
            b_vc = tl.load(v + (cols[:, None] * H + i_h) * V + o_v[None, :], mask=m_c[:, None] & m_v[None, :], other=0.)
            b_dor = tl.load(do + (rows[:, None] * H + i_h) * V + o_v[None, :], mask=m_r[:, None] & m_v[None, :], other=0.)
            dA_r += tl.dot(b_dor, tl.trans(b_vc))
            if GATE == 2:
                b_vr = tl.load(v + (rows[:, None] * H + i_h) * V + o_v[None, :], mask=m_r[:, None] & m_v[None, :], other=0.)
                dA_c += tl.dot(b_doc, tl.trans(b_vr))
                dAd += tl.dot(b_dor, tl.trans(b_vr))
            b_dv = tl.dot(tl.trans(b_Ac.to(b_doc.dtype)), b_doc)
            tl.store(dv + (rows[:, None] * H + i_h) * V + o_v[None, :], b_dv, mask=m_r[:, None] & m_v[None, :])
        m_A = (o_c[None, :] <= (bs + o_r)[:, None]) & m_c[None, :]
        dA_r = tl.where(m_A, dA_r * scale, 0.)
        if GATE == 2:
            m_Ac = (o_c[:, None] >= (bs + o_r)[None, :]) & m_c[:, None]
            dA_c = tl.where(m_Ac, dA_c * scale, 0.)
            dAd = tl.where((o_r[None, :] <= o_r[:, None]) & m_r[None, :], dAd * scale, 0.)
        if GATE == 1:
            gc_c = tl.load(gc + cl * H + i_h)
            gc_r = tl.load(gc + rl * H + i_h)
            dA_r = dA_r * tl.exp(tl.where(m_A & m_r[:, None], gc_r[:, None] - gc_c[None, :], float("-inf")))
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            m_ck = m_c[:, None] & m_k[None, :]
            m_rk = m_r[:, None] & m_k[None, :]
            b_qc = tl.load(q + (cols[:, None] * H + i_h) * K + o_k[None, :], mask=m_ck, other=0.)
            b_kc = tl.load(k + (cols[:, None] * H + i_h) * K + o_k[None, :], mask=m_ck, other=0.)
            if GATE == 2:
                gc_c = tl.load(gc + (cl[:, None] * H + i_h) * K + o_k[None, :], mask=m_k[None, :], other=0.)
                gc_r = tl.load(gc + (rl[:, None] * H + i_h) * K + o_k[None, :], mask=m_k[None, :], other=0.)
                ref = tl.load(gc + (ts * H + i_h) * K + o_k, mask=m_k, other=0.)  # the block's first row
                ref2 = tl.load(gc + ((tl.minimum(ts + BC, t1) - 1) * H + i_h) * K + o_k, mask=m_k, other=0.)  # its last
                # pairs with earlier sub-blocks
                kg = (b_kc.to(tl.float32) * tl.exp(tl.where((o_c < hi)[:, None], ref[None, :] - gc_c, float("-inf"))))
                b_dq = tl.dot(tl.where((o_c < hi)[None, :], dA_r, 0.).to(b_kc.dtype), kg.to(b_kc.dtype))
                b_dq = b_dq * tl.exp(gc_r - ref[None, :])
                qg = (b_qc.to(tl.float32) * tl.exp(tl.where(((o_c >= lo) & m_c)[:, None], gc_c - ref2[None, :],
                                                           float("-inf"))))
                b_dk = tl.dot(tl.trans(tl.where((o_c >= lo)[:, None], dA_c, 0.).to(b_qc.dtype)), qg.to(b_qc.dtype))
                b_dk = b_dk * tl.exp(ref2[None, :] - gc_r)
                if not fast:
                    b_qr = tl.load(q + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=m_rk, other=0.).to(tl.float32)
                    # the diagonal sub-block, exactly, one column j at a time (dAd[i, j] exp(gc_i - gc_j), i >= j)
                    for j in range(0, BC):
                        tj = tl.minimum(ts + j, t1 - 1)  # rows past the end only meet masked rows
                        k_j = tl.load(k + (tj * H + i_h) * K + o_k, mask=m_k, other=0.).to(tl.float32)
                        g_j = tl.load(gc + (tj * H + i_h) * K + o_k, mask=m_k, other=0.)
                        c_j = tl.sum(tl.where(o_r[None, :] == j, dAd, 0.), axis=1)  # column j of dAd
                        w = tl.exp(tl.where(((o_r >= j) & m_r)[:, None], gc_r - g_j[None, :], float("-inf")))
                        w = c_j[:, None] * w
                        b_dq += w * k_j[None, :]
                        b_dk += tl.where(o_r[:, None] == j, tl.sum(w * b_qr, axis=0)[None, :], 0.)
            else:
                b_dq = tl.dot(dA_r.to(b_kc.dtype), b_kc)
                b_dk = tl.dot(tl.trans(dA_r.to(b_qc.dtype)), b_qc)
            tl.store(dq + (rows[:, None] * H + i_h) * K + o_k[None, :], b_dq, mask=m_rk)
            tl.store(dk + (rows[:, None] * H + i_h) * K + o_k[None, :], b_dk, mask=m_rk)


@triton.jit
def _bwd_inter(q, k, v, gc, kg, do, h, dh, dq_i, dk_i, dv_i, dq, dk, dv, dg, cidx, T, TT, scale,
               H, K: tl.constexpr, V: tl.constexpr, GATE: tl.constexpr, IS_VARLEN: tl.constexpr,
               BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NK: tl.constexpr):
    """Tile axis < NK: dq, dk, dg of K tile i_t; otherwise dv of V tile i_t - NK; one chunk, one head."""
    i_c, i_t, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t0, t1 = _chunk_bounds(i_c, cidx, T, IS_VARLEN, BT)
    rows = t0 + tl.arange(0, BT)
    m = rows < t1
    p_s = (i_c * H + i_h).to(tl.int64) * K * V  # this chunk's [K, V] states
    if i_t < NK:
        o_k = i_t * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m[:, None] & m_k[None, :]
        b_dq = tl.zeros([BT, BK], dtype=tl.float32)
        b_dk = tl.zeros([BT, BK], dtype=tl.float32)
        hs = tl.zeros([BK], dtype=tl.float32)  # rowsum(S_c * dS_c)
        for i_v in range(0, tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            m_v = o_v < V
            m_tv = m[:, None] & m_v[None, :]
            m_h = m_k[:, None] & m_v[None, :]
            b_do = tl.load(do + (rows[:, None] * H + i_h) * V + o_v[None, :], mask=m_tv, other=0.)
            b_v = tl.load(v + (rows[:, None] * H + i_h) * V + o_v[None, :], mask=m_tv, other=0.)
            b_S = tl.load(h + p_s + o_k[:, None] * V + o_v[None, :], mask=m_h, other=0.)
            b_dS = tl.load(dh + p_s + o_k[:, None] * V + o_v[None, :], mask=m_h, other=0.)
            b_dq += tl.dot(b_do, tl.trans(b_S.to(b_do.dtype)))
            b_dk += tl.dot(b_v, tl.trans(b_dS.to(b_v.dtype)))
            if GATE > 0:
                hs += tl.sum(b_S.to(tl.float32) * b_dS.to(tl.float32), axis=1)
        b_dq = b_dq * scale
        p_k = (rows[:, None] * H + i_h) * K + o_k[None, :]
        b_q = tl.load(q + p_k, mask=m_tk, other=0.).to(tl.float32)
        b_k = tl.load(k + p_k, mask=m_tk, other=0.).to(tl.float32)
        if GATE > 0:
            b_gc, gl = _load_gate(gc, rows, m, t1 - 1, i_h, o_k, m_k, H, K, GATE)
            b_dq = b_dq * tl.exp(b_gc)
            b_dk = b_dk * tl.exp(gl[None, :] - b_gc)
            # gradient flowing into later chunks through this chunk's decay: rowsum(S_end * dS_c)
            carry = tl.exp(gl) * hs + tl.sum(b_k * b_dk, axis=0)
        b_dq += tl.load(dq_i + p_k, mask=m_tk, other=0.)
        b_dk += tl.load(dk_i + p_k, mask=m_tk, other=0.)
        tl.store(dq + p_k, b_dq.to(dq.dtype.element_ty), mask=m_tk)
        tl.store(dk + p_k, b_dk.to(dk.dtype.element_ty), mask=m_tk)
        if GATE == 2:
            d = b_q * b_dq - b_k * b_dk
            b_dg = carry[None, :] + tl.sum(d, axis=0)[None, :] - tl.cumsum(d, axis=0) + d
            tl.store(dg + p_k, b_dg.to(dg.dtype.element_ty), mask=m_tk)
        if GATE == 1:
            # this K tile's share; the NK shares are added up on the host
            d = tl.sum(b_q * b_dq - b_k * b_dk, axis=1)
            b_dg = tl.sum(carry, axis=0) + tl.sum(d, axis=0) - tl.cumsum(d, axis=0) + d
            tl.store(dg + i_t.to(tl.int64) * TT * H + rows * H + i_h, b_dg.to(dg.dtype.element_ty), mask=m)
    else:
        o_v = (i_t - NK) * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_tv = m[:, None] & m_v[None, :]
        b_dv = tl.zeros([BT, BV], dtype=tl.float32)
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            b_kg = tl.load(kg + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=m[:, None] & m_k[None, :], other=0.)
            b_dS = tl.load(dh + p_s + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.)
            b_dv += tl.dot(b_kg, b_dS.to(b_kg.dtype))
        p_v = (rows[:, None] * H + i_h) * V + o_v[None, :]
        b_dv += tl.load(dv_i + p_v, mask=m_tv, other=0.)
        tl.store(dv + p_v, b_dv.to(dv.dtype.element_ty), mask=m_tv)


def _bwd(q, k, v, g, gc, qg, kg, hs, scale, A, do, dht, geo, need_dh0):
    B, T, H, K, V, N, varlen, cidx, NC, cu, coff = geo
    gate = _gate_kind(g)
    TT = B * T
    gp = gc if gc is not None else q
    if gate == 0:
        qg, kg = q, k
    dev = q.device
    f32 = torch.float32
    dq_i = torch.empty(TT, H, K, device=dev, dtype=f32)
    dk_i = torch.empty(TT, H, K, device=dev, dtype=f32)
    dv_i = torch.empty(TT, H, V, device=dev, dtype=f32)
    bc, bki, bvi, nwi = _intra_cfg(gate, K, V)
    _bwd_intra[(NC * (BT // bc), H)](q, k, v, gp, A, do, dq_i, dk_i, dv_i, cidx, T, scale, H, K=K, V=V,
                                      GATE=gate, IS_VARLEN=varlen, BT=BT, BC=bc, BK=bki, BV=bvi,
                                      LIM=diag_block_limit(q.dtype), num_warps=nwi)
    # the chunk-start states come from the forward; only the gradient pass runs here
    dh, dh0 = run_states(qg, do, gp, gate, dht, need_dh0, geo, scale, True)
    bk, bv = _par_tiles(K, V)
    NK, NV = triton.cdiv(K, bk), triton.cdiv(V, bv)
    dq = torch.empty(TT, H, K, device=dev, dtype=q.dtype)
    dk = torch.empty(TT, H, K, device=dev, dtype=k.dtype)
    dv = torch.empty(TT, H, V, device=dev, dtype=v.dtype)
    dg = None
    if gate == 2:
        dg = torch.empty_like(g)
    elif gate == 1:
        dg = torch.empty(NK, TT, H, device=dev, dtype=g.dtype if NK == 1 else f32)
    _bwd_inter[(NC, NK + NV, H)](q, k, v, gp, kg, do, hs, dh, dq_i, dk_i, dv_i, dq, dk, dv,
                                 dg if dg is not None else q, cidx, T, TT, scale, H, K=K, V=V, GATE=gate,
                                 IS_VARLEN=varlen, BT=BT, BK=bk, BV=bv, NK=NK, num_warps=8)
    if gate == 1:
        dg = (dg[0] if NK == 1 else dg.sum(0).to(g.dtype)).view(B, T, H)
    return dq.view(B, T, H, K), dk.view(B, T, H, K), dv.view(B, T, H, V), dg, dh0

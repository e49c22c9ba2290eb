"""Chunked gated linear attention in Triton: forward and backward.

Recurrence (per sequence and head, state S is [K, V], fp32):
    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t,    o_t = scale * q_t S_t
with g = None (no transition), [B, T, H] (scalar log-decay) or [B, T, H, K]
(diagonal log-decay).  Optional initial / final state and packed
variable-length segments (``cu_seqlens``, empty segments allowed).

Layout of the work (chunk length BT = 64, sub-blocks of BC = 16 rows):
  forward   1. ``_gate_prep``  (parallel over chunks x K tiles): gc = chunk-local cumulative log-decay
               (fp32), qg = q exp(gc), kg = k exp(gl - gc) (gl = the chunk's total decay).
            2. ``_fwd_intra``  (parallel over chunks; one program holds the whole 64 x 64 block): the masked
               intra-chunk matrix A[i, j] = scale * sum_k q_ik k_jk exp(gc_ik - gc_jk) for j <= i (stored in the
               value dtype, ``a_dtype``).  A chunk
               that decays by less than exp(40) from its first row to its last takes one product per K
               tile with gc at its first row as the reference.  Otherwise row block r (16 rows) meets the
               earlier columns through one product with gc at its first row
               as the reference (every exponent <= 0).  The block's own pairs join that product when the
               block decays by less than exp(40) (the keys then grow by at most that), else they are
               summed exactly, column by column (``_diag_exact``).
            3. ``_states``     (parallel over (K tile, V tile) x sequence*head, sequential over chunks):
               the only sequential pass; stores the state at every chunk start (bf16 for bf16 inputs).
            4. ``_fwd_o``      (parallel over chunks x V tiles): o = scale * qg S_c + A v.
  backward  (``triton_chunk_bwd.py``): ``_states`` in reverse (the state gradient at every chunk end; the
            chunk-start states are kept from the forward), ``_bwd_dA`` (dA = scale dO v^T per chunk) and
            ``_bwd_chunk`` (per chunk and K or V tile: dq, dk and dg with their intra-chunk parts, or dv).
Partial sums over K tiles of the scalar gate's dg go to an fp32 buffer that torch adds up.
"""
from __future__ import annotations

import torch
import torch.utils.flop_counter
import triton
import triton.language as tl

from sandbox.kernels.library import op
from sandbox.kernels.triton_chunk_common import (BC, BT, _bwd_tiles, _chunk_bounds, _chunk_decay, _diag_decay,
                                                 _gate_kind, _geometry, _intra_bk, _p2, _par_tiles, _pick, as_rows,
                                                 chunk_table, diag_block_limit, fold_replicas, row_stride, run_states)
from sandbox.kernels.triton_chunk_bwd import _bwd

__all__ = ["chunk_gla", "chunk_table"]

@triton.jit
def _gate_prep(q, k, g, gc, qg, kg, cidx, T, SQ, SK, H, K: tl.constexpr, GATE: tl.constexpr, IS_VARLEN: tl.constexpr,
               BT: tl.constexpr, BK: tl.constexpr, NK: tl.constexpr):
    """Per chunk and [BT, BK] tile: gc = chunk-local cumulative log-decay (fp32), qg = q exp(gc) and
    kg = k exp(gl - gc) in the input dtype (gl = the chunk's total).  The state recurrences then only
    scale by exp(gl) and multiply, and every later kernel loads gc instead of scanning g again."""
    i_ck, i_h = tl.program_id(0), tl.program_id(1)
    i_c, i_k = i_ck // NK, i_ck % NK  # the K tiles of one chunk run side by side (its g rows stay in L2)
    t0, t1 = _chunk_bounds(i_c, cidx, T, IS_VARLEN, BT)
    rows = t0 + tl.arange(0, BT)
    m = rows < t1
    o_k = i_k * BK + tl.arange(0, BK)
    p = (rows[:, None] * H + i_h) * K + o_k[None, :]
    mk = m[:, None] & (o_k < K)[None, :]
    if GATE == 2:
        b = tl.cumsum(tl.load(g + p, mask=mk, other=0.).to(tl.float32), axis=0)
        tl.store(gc + p, b, mask=mk)
        gl = tl.sum(tl.where(rows == t1 - 1, 1., 0.)[:, None] * b, axis=0)[None, :]
    else:
        b1 = tl.cumsum(tl.load(g + rows * H + i_h, mask=m, other=0.).to(tl.float32), axis=0)
        if i_k == 0:
            tl.store(gc + rows * H + i_h, b1, mask=m)
        b = b1[:, None]
        gl = tl.sum(tl.where(rows == t1 - 1, b1, 0.), axis=0)
    b_q = tl.load(q + rows[:, None] * SQ + i_h * K + o_k[None, :], mask=mk, other=0.).to(tl.float32)
    b_k = tl.load(k + rows[:, None] * SK + i_h * K + o_k[None, :], mask=mk, other=0.).to(tl.float32)
    tl.store(qg + p, (b_q * tl.exp(b)).to(qg.dtype.element_ty), mask=mk)
    tl.store(kg + p, (b_k * tl.exp(tl.where(mk, gl - b, 0.))).to(kg.dtype.element_ty), mask=mk)


@triton.jit
def _fwd_intra(q, k, gc, A, cidx, T, scale, SQ, SK,
               H, K: tl.constexpr, GATE: tl.constexpr, IS_VARLEN: tl.constexpr,
               BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, LIM: tl.constexpr):
    """A[i, j] = scale * sum_k q_ik k_jk exp(gc_ik - gc_jk) for j <= i, one whole chunk per program.
    Diagonal gate: one product per K tile when the chunk decays by less than exp(LIM) (``_chunk_decay``),
    with gc at its first row as the reference.  Otherwise row block r (BC rows) meets every earlier column
    through one product with a reference row, gc at the block's first row (every exponent <= 0); its own
    pairs join that product when the block decays by less than exp(LIM) (``_diag_decay``), else
    ``_diag_exact`` sums them."""
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    t0, t1 = _chunk_bounds(i_c, cidx, T, IS_VARLEN, BT)
    o_t = tl.arange(0, BT)
    rows = t0 + o_t
    m = rows < t1
    blk = o_t // BC
    acc = tl.zeros([BT, BT], dtype=tl.float32)
    if GATE == 2:
        fast = tl.where(_diag_decay(gc, t0, t1, i_h, H, K, BT, BC, BK) < LIM, 1, 0)  # per row block
        whole = _chunk_decay(gc, t0, t1, i_h, H, K, BK) < LIM  # then one product per K tile
        rc = tl.minimum(rows, t1 - 1)  # gc loads past the end repeat the last row: no overflow there
        rs = tl.minimum(t0 + blk * BC, t1 - 1)  # each row's reference row
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m[:, None] & m_k[None, :]
        b_q = tl.load(q + rows[:, None] * SQ + i_h * K + o_k[None, :], mask=m_tk, other=0.)
        b_k = tl.load(k + rows[:, None] * SK + i_h * K + o_k[None, :], mask=m_tk, other=0.)
        if GATE == 2:
            b_g = tl.load(gc + (rc[:, None] * H + i_h) * K + o_k[None, :], mask=m_k[None, :], other=0.)
            if whole:
                g0 = tl.load(gc + (t0 * H + i_h) * K + o_k, mask=m_k, other=0.)
                qw = (b_q.to(tl.float32) * tl.exp(b_g - g0[None, :])).to(b_k.dtype)
                kw = (b_k.to(tl.float32) * tl.exp(g0[None, :] - b_g)).to(b_k.dtype)
                acc += tl.dot(qw, tl.trans(kw))
            else:
                b_R = tl.load(gc + (rs[:, None] * H + i_h) * K + o_k[None, :], mask=m_k[None, :], other=0.)
                qe = (b_q.to(tl.float32) * tl.exp(b_g - b_R)).to(b_k.dtype)
                for r in tl.static_range(BT // BC):
                    ref = tl.load(gc + (tl.minimum(t0 + r * BC, t1 - 1) * H + i_h) * K + o_k, mask=m_k, other=0.)
                    hi = r * BC + BC * _pick(fast, r)  # columns the product covers
                    ke = b_k.to(tl.float32) * tl.exp(tl.where((o_t < hi)[:, None], ref[None, :] - b_g,
                                                              float("-inf")))
                    acc += tl.dot(tl.where((blk == r)[:, None], qe, 0.), tl.trans(ke.to(b_k.dtype)))
        else:
            acc += tl.dot(b_q, tl.trans(b_k))
    m_A = (o_t[None, :] <= o_t[:, None]) & m[None, :] & m[:, None]
    if GATE == 1:
        b_g1 = tl.load(gc + tl.minimum(rows, t1 - 1) * H + i_h)
        acc = acc * tl.exp(tl.where(m_A, b_g1[:, None] - b_g1[None, :], float("-inf")))
    acc = tl.where(m_A, acc * scale, 0.)
    p_A = A + (rows[:, None] * H + i_h) * BT + o_t[None, :]
    if GATE == 2:
        # the diagonal blocks of slow row blocks come from _diag_exact, not from the product
        o_b = tl.arange(0, BT // BC)
        row_fast = tl.sum(tl.where(o_b[None, :] == blk[:, None], fast[None, :], 0), axis=1)
        m_slow = (blk[:, None] == blk[None, :]) & (row_fast == 0)[:, None]
        tl.store(p_A, acc.to(A.dtype.element_ty), mask=m[:, None] & (m_slow == 0))
        for r in tl.static_range(BT // BC):
            ts = t0 + r * BC
            if (ts < t1) & (_pick(fast, r) == 0):
                o_r = tl.arange(0, BC)
                m_r = ts + o_r < t1
                accd = _diag_exact(q, k, gc, ts, t1, i_h, SQ, SK, H, K, BC, BK)
                tl.store(A + ((ts + o_r)[:, None] * H + i_h) * BT + r * BC + o_r[None, :],
                         (accd * scale).to(A.dtype.element_ty),
                         mask=m_r[:, None])
    else:
        tl.store(p_A, acc.to(A.dtype.element_ty), mask=m[:, None])


@triton.jit
def _diag_exact(q, k, gc, ts, t1, i_h, SQ, SK, H, K: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr):
    """The BC x BC diagonal block starting at row ts, summed exactly one column j at a time:
    sum_k q_ik k_jk exp(gc_ik - gc_jk) for j <= i (zero elsewhere and on rows past t1)."""
    o_r = tl.arange(0, BC)
    rows = ts + o_r
    m_r = rows < t1
    rl = tl.minimum(rows, t1 - 1)
    accd = tl.zeros([BC, BC], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = tl.load(q + rows[:, None] * SQ + i_h * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :],
                      other=0.).to(tl.float32)
        b_g = tl.load(gc + (rl[:, None] * H + i_h) * K + o_k[None, :], mask=m_k[None, :], other=0.)
        for j in range(0, BC):
            tj = tl.minimum(ts + j, t1 - 1)  # rows past the end only meet masked rows
            k_j = tl.load(k + tj * SK + i_h * K + o_k, mask=m_k, other=0.).to(tl.float32)
            g_j = tl.load(gc + (tj * H + i_h) * K + o_k, mask=m_k, other=0.)
            e = tl.exp(tl.where(((o_r >= j) & m_r)[:, None], b_g - g_j[None, :], float("-inf")))
            accd += tl.where(o_r[None, :] == j, tl.sum(b_q * k_j[None, :] * e, axis=1)[:, None], 0.)
    return accd


@triton.jit
def _fwd_o(qg, v, A, hs, o, cidx, T, scale, SQ, SV, H, K: tl.constexpr, V: tl.constexpr, IS_VARLEN: tl.constexpr,
           BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr):
    """o = scale * qg S_c + A v for one chunk and one V tile, from the stored chunk-start states.  The V
    tiles of one chunk are neighbours in the grid, so its qg and A rows are read from L2 after the first."""
    i_cv, i_h = tl.program_id(0), tl.program_id(1)
    i_c, i_v = i_cv // NV, i_cv % NV
    t0, t1 = _chunk_bounds(i_c, cidx, T, IS_VARLEN, BT)
    o_t = tl.arange(0, BT)
    rows = t0 + o_t
    m = rows < t1
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    p_s = (i_c * H + i_h).to(tl.int64) * K * V
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = tl.load(qg + rows[:, None] * SQ + i_h * K + o_k[None, :], mask=m[:, None] & m_k[None, :], other=0.)
        b_S = tl.load(hs + p_s + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.)
        b_o += tl.dot(b_q, b_S.to(b_q.dtype))
    b_v = tl.load(v + rows[:, None] * SV + i_h * V + o_v[None, :], mask=m[:, None] & m_v[None, :], other=0.)
    b_A = tl.load(A + (rows[:, None] * H + i_h) * BT + o_t[None, :], mask=m[:, None], other=0.)
    b_o = b_o * scale + tl.dot(b_A.to(b_v.dtype), b_v)
    tl.store(o + (rows[:, None] * H + i_h) * V + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=m[:, None] & m_v[None, :])


# ----------------------------------------------------------------------------- host side

def a_dtype(q, v) -> torch.dtype:
    """The dtype A is stored in. Every product that reads A casts it to the value dtype first (o = A v in the
    forward, dv = A^T dO in the backward), so storing it rounded gives the same bits and half the bytes
    (A is written once and read twice). float32 where q and v differ in dtype (the backward casts dO to q's),
    and where the backward's V tile is under 32: with a bf16 A there, the check at K 128, V 16 hit an illegal
    memory access (Triton 3.6, b4f4797; the kernel was not isolated), and an earlier backward had read a bf16
    A wrongly at that shape; V tiles of 32 and 64 pass every check (docs/kernels.md, "Tried and dropped")."""
    same = v.dtype == q.dtype
    return v.dtype if same and _bwd_tiles(q.shape[-1], v.shape[-1])[1] >= 32 else torch.float32


def gate_prep(q, k, g, gate, cidx, NC, T, H, K, varlen):
    """(gc, qg, kg): chunk-local cumulative log-decay (fp32, g's shape) and the decayed q and k;
    (q, q, k) without a gate (gc then unused)."""
    if gate == 0:
        return q, q, k
    gc = torch.empty(g.shape, device=g.device, dtype=torch.float32)
    qg, kg = q.new_empty(q.shape), k.new_empty(k.shape)
    bk = max(16, min(64, _p2(K)))
    nk = triton.cdiv(K, bk)
    _gate_prep[(NC * nk, H)](q, k, g, gc, qg, kg, cidx, T, row_stride(q), row_stride(k), H, K=K, GATE=gate,
                             IS_VARLEN=varlen, BT=BT, BK=bk, NK=nk, num_warps=4)
    return gc, qg, kg


def _fwd(q, k, v, g, scale, h0, output_final_state, cu_seqlens):
    geo = _geometry(q, v, cu_seqlens)
    B, T, H, K, V, N, varlen, cidx, NC, cu, coff = geo
    gate = _gate_kind(g)
    TT = B * T
    gc, qg, kg = gate_prep(q, k, g, gate, cidx, NC, T, H, K, varlen)
    A = torch.empty(TT, H, BT, device=q.device, dtype=a_dtype(q, v))
    _fwd_intra[(NC, H)](q, k, gc, A, cidx, T, scale, row_stride(q), row_stride(k), H, K=K, GATE=gate,
                        IS_VARLEN=varlen, BT=BT, BC=BC, BK=_intra_bk(K), LIM=diag_block_limit(q.dtype), num_warps=4,
                        num_stages=1)  # one stage: faster than three (results/kernels/README.md)
    hs, ht = run_states(kg, v, gc, gate, h0, output_final_state, geo, 1.0, False)
    # 4 warps where a program's state is one K tile (K <= 64), 8 for more: the faster at each
    # (results/kernels/README.md; benchmarks/gla_profile.py --warps "fwd_o=8,4")
    o = torch.empty(TT, H, V, device=q.device, dtype=q.dtype)
    bk, bv = _par_tiles(K, V)
    nv = triton.cdiv(V, bv)
    _fwd_o[(NC * nv, H)](qg, v, A, hs, o, cidx, T, scale, row_stride(qg), row_stride(v), H, K=K, V=V, IS_VARLEN=varlen,
                         BT=BT, BK=bk, BV=bv, NV=nv, num_warps=4 if K <= 64 else 8)
    return o.view(B, T, H, V), ht, A, (gc, qg, kg), hs, geo


# ----------------------------------------------------------------------------- torch custom ops
# The kernels reach torch as two custom ops, so that torch.compile treats them as opaque calls (it
# traces the model around them) and torch.func.vmap folds stacked model replicas into their batch.
# The forward returns what the backward needs (custom ops save only inputs and outputs); tensors a
# case does not use come back empty. Neither op may return an alias of an input.
# Both take their inputs in any layout (``flexible_layout``): q, k and v are read in place where ``as_rows``
# allows, the rest made contiguous. With exact strides, Inductor copied q, k and v wherever it had padded the
# projection's rows (it pads row strides of 1024 elements or more: 1552 -> 1600 at GLA d512), once for each op.

_FWD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor? g, Tensor? h0, Tensor? cu_seqlens, float scale, "
               "bool output_final_state) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
_BWD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor? g, Tensor gc, Tensor qg, Tensor kg, Tensor hs, Tensor A, "
               "Tensor do, Tensor? dht, Tensor? cu_seqlens, Tensor cidx, Tensor coff, float scale, bool need_dh0) "
               "-> (Tensor, Tensor, Tensor, Tensor, Tensor)")


def _none(x):
    return x if x is not None and x.numel() else None


def _contiguous(x):
    return x.contiguous() if x is not None else None


def _empty(like, dtype=None):
    """A fresh empty tensor (every output of a custom op must be its own tensor)."""
    return like.new_empty(0, dtype=dtype if dtype is not None else like.dtype)


@op("sandbox::chunk_gla_fwd", schema=_FWD_SCHEMA, tags=(torch.Tag.flexible_layout,))
def _op_fwd(q, k, v, g, h0, cu_seqlens, scale, output_final_state):
    """(o, final state, A, gc, qg, kg, chunk-start states, chunk table, first chunk of each segment)."""
    q, k, v = as_rows(q), as_rows(k), as_rows(v)
    g, h0 = _contiguous(g), _contiguous(h0)
    o, ht, A, (gc, qg, kg), hs, geo = _fwd(q, k, v, g, scale, h0, output_final_state, cu_seqlens)
    varlen = cu_seqlens is not None
    if g is None:                             # _fwd hands back q and k themselves
        gc, qg, kg = _empty(q), _empty(q), _empty(q)
    return (o, ht if ht is not None else _empty(q, torch.float32), A, gc, qg, kg, hs,
            geo[7] if varlen else _empty(q, torch.int32), geo[10] if varlen else _empty(q, torch.int32))


@_op_fwd.register_fake
def _op_fwd_fake(q, k, v, g, h0, cu_seqlens, scale, output_final_state):
    if cu_seqlens is not None:
        raise NotImplementedError("chunk_gla: packed segments (cu_seqlens) cannot be traced (their chunk count "
                                  "depends on the data)")
    B, T, H, K = q.shape
    V, NC = v.shape[-1], B * triton.cdiv(T, BT)
    f32 = torch.float32
    gated = g is not None
    return (q.new_empty(B, T, H, V), q.new_empty(B, H, K, V, dtype=f32) if output_final_state else _empty(q, f32),
            q.new_empty(B * T, H, BT, dtype=a_dtype(q, v)), g.new_empty(g.shape, dtype=f32) if gated else _empty(q),
            q.new_empty(q.shape) if gated else _empty(q), k.new_empty(k.shape) if gated else _empty(q),
            q.new_empty(NC, H, K, V, dtype=torch.bfloat16 if k.dtype == torch.bfloat16 else f32),
            _empty(q, torch.int32), _empty(q, torch.int32))


@op("sandbox::chunk_gla_bwd", schema=_BWD_SCHEMA, tags=(torch.Tag.flexible_layout,))
def _op_bwd(q, k, v, g, gc, qg, kg, hs, A, do, dht, cu_seqlens, cidx, coff, scale, need_dh0):
    """(dq, dk, dv, dg, d initial state); dg and dh0 empty where there is no gate or no initial state."""
    B, T, H, K = q.shape
    varlen = cu_seqlens is not None
    if varlen:   # the forward's chunk table: building it again would cost a host sync
        geo = (B, T, H, K, v.shape[-1], cu_seqlens.numel() - 1, True, cidx, cidx.shape[0],
               cu_seqlens.to(torch.int32).contiguous(), coff)
    else:
        geo = _geometry(q, v, None)
    q, k, v = as_rows(q), as_rows(k), as_rows(v)      # as the forward read them
    g, gc, qg, kg, hs, A, do, dht = (_contiguous(x) for x in (g, gc, qg, kg, hs, A, do, dht))
    dq, dk, dv, dg, dh0 = _bwd(q, k, v, g, _none(gc), _none(qg), _none(kg), hs, scale, A, do, dht, geo, need_dh0)
    return (dq, dk, dv, dg if dg is not None else _empty(q),
            dh0 if dh0 is not None else _empty(q, torch.float32))


@_op_bwd.register_fake
def _op_bwd_fake(q, k, v, g, gc, qg, kg, hs, A, do, dht, cu_seqlens, cidx, coff, scale, need_dh0):
    B, T, H, K = q.shape
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            torch.empty_like(g) if g is not None else _empty(q),
            q.new_empty(B, H, K, v.shape[-1], dtype=torch.float32) if need_dh0 else _empty(q, torch.float32))


def _setup(ctx, inputs, output):
    q, k, v, g, h0, cu_seqlens, scale, _ = inputs
    _, _, A, gc, qg, kg, hs, cidx, coff = output
    ctx.save_for_backward(q, k, v, g, gc, qg, kg, hs, A, h0, cu_seqlens, cidx, coff)
    ctx.scale = scale


def _backward(ctx, do, dht, *_unused):
    q, k, v, g, gc, qg, kg, hs, A, h0, cu_seqlens, cidx, coff = ctx.saved_tensors
    need_dh0 = h0 is not None and ctx.needs_input_grad[4]
    dht = dht.contiguous() if _none(dht) is not None else None      # an unused final state comes back empty
    dq, dk, dv, dg, dh0 = torch.ops.sandbox.chunk_gla_bwd(q, k, v, g, gc, qg, kg, hs, A, do.to(q.dtype).contiguous(),
                                                          dht, cu_seqlens, cidx, coff, ctx.scale, need_dh0)
    return dq, dk, dv, dg if g is not None else None, dh0 if need_dh0 else None, None, None, None


_op_fwd.register_autograd(_backward, setup_context=_setup)


@_op_fwd.register_vmap
def _op_fwd_vmap(info, in_dims, q, k, v, g, h0, cu_seqlens, scale, output_final_state):
    """Stacked replicas [R, B, ...] run as one batch of R * B sequences."""
    if cu_seqlens is not None or in_dims[5] is not None:
        raise NotImplementedError("chunk_gla: vmap over packed segments (cu_seqlens) is not supported")
    R = info.batch_size
    q, k, v = (x.movedim(d, 0).flatten(0, 1) if d is not None else fold_replicas(x, d, R)
               for x, d in zip((q, k, v), in_dims[:3]))      # a projection's column slices stay views (as_rows)
    g, h0 = (fold_replicas(x, d, R) for x, d in zip((g, h0), in_dims[3:5]))
    out = torch.ops.sandbox.chunk_gla_fwd(q, k, v, g, h0, None, scale, output_final_state)
    o, ht = out[0], out[1]
    o = o.view(R, -1, *o.shape[1:])
    ht = ht.view(R, -1, *ht.shape[1:]) if output_final_state else ht
    # the intermediates only feed the backward recorded for the folded call: hand them out unbatched
    return (o, ht, *out[2:]), (0, 0 if output_final_state else None) + (None,) * 7


def chunk_gla(q, k, v, g=None, *, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Triton chunked gated linear attention; same contract as ``linear_recurrence`` without ``beta``.

    q, k: [B, T, H, K]; v: [B, T, H, V]; g: None, [B, T, H] or [B, T, H, K] log-decay (<= 0);
    initial_state: [N, H, K, V] float32; cu_seqlens: [N + 1] boundaries of a B == 1 batch.
    Returns (o [B, T, H, V] in q's dtype, final_state [N, H, K, V] float32 or None).
    """
    B, T, H, K = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k: shape {tuple(k.shape)} must equal q's {tuple(q.shape)}")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v: shape {tuple(v.shape)} must be [B, T, H, V] matching q {tuple(q.shape)}")
    if g is not None and g.shape not in (q.shape[:3], q.shape):
        raise ValueError(f"g: shape {tuple(g.shape)} must be [B, T, H] or [B, T, H, K]")
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"cu_seqlens: needs batch size 1, got {B}")
    if max(q.numel(), v.numel()) >= 2 ** 31:
        raise ValueError("q, v: tensors of 2**31 elements or more are not supported (32-bit offsets)")
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(q.device)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if initial_state is not None and tuple(initial_state.shape) != (N, H, K, v.shape[-1]):
        raise ValueError(f"initial_state: shape {tuple(initial_state.shape)} must be {(N, H, K, v.shape[-1])}")
    if initial_state is not None:
        initial_state = initial_state.float().contiguous()
    o, ht = torch.ops.sandbox.chunk_gla_fwd(q, k, v, g, initial_state, cu_seqlens, float(scale),
                                            bool(output_final_state))[:2]
    return o, ht if output_final_state else None


def _flops_fwd(B, T, H, K, V):
    """Multiply-adds x 2 of the forward: the masked intra-chunk products (Q K^T, A V, computed in full), the
    state update k^T v and the output q S."""
    return 2 * B * T * H * (BT * (K + V) + 2 * K * V)


@torch.utils.flop_counter.register_flop_formula(torch.ops.sandbox.chunk_gla_fwd)
def _fwd_flop_formula(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return _flops_fwd(*q_shape, v_shape[-1])


@torch.utils.flop_counter.register_flop_formula(torch.ops.sandbox.chunk_gla_bwd)
def _bwd_flop_formula(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * _flops_fwd(*q_shape, v_shape[-1])       # dA, dq and dk intra, dv intra, and three state products

"""GSA's first pass (slot scores) in Triton: forward and backward.

Per sequence and head, with m slots, chunk-local cumulative log-gates and slot writes s:
    K~_t = diag(exp(g_t)) K~_{t-1} + s_t^T k_t      (m x d_k state, gated on the slot side)
    o_t  = scale * K~_t q_t                        (m scores)
The gate acts on the rows of the state that the output keeps (the slots), not on the ones it sums
over, so this is not the core recurrence of ``triton_chunk.py``; it is its transpose.

Chunks of C = 16 steps, as the torch form (``slot_scores.py``, which states why C = 16 and the clamp
of the log-gate at -8 keep every exponential finite): with gc the chunk-local cumulative log-gate
[C, m], gc_mid its row C/2 - 1, gl its last row and A = scale * tril(q k^T) [C, C]:
    o     = exp(gc - gc_mid) * (A @ (exp(gc_mid - gc) * s)) + scale * exp(gc) * (q @ h_c^T)
    h_c+1 = exp(gl)[:, None] * h_c + (exp(gl - gc) * s)^T @ k
Forward: ``_fwd_states`` (sequential over chunks, stores gc and every chunk-start state h_c, in q's dtype:
the kernels after it only read h_c as a matrix-product operand in that dtype) and ``_fwd_o`` (parallel over
chunks). Backward: ``_bwd_walk``, one sequential pass from the last chunk that carries the state's gradient
and computes each chunk's dq, dk, ds and dg (the reverse cumulative sum of the gate's per-step term
do * o - s * ds) on the way. It replaced three kernels (the state gradients stored for a parallel pass over the
chunks, then the reverse sum over the sequence as a third), which moved about twice the bytes.
The final state is returned without a gradient (the model only reads it for inspection).
"""
from __future__ import annotations

import torch
import torch.utils.flop_counter
import triton
import triton.language as tl

from sandbox.kernels.library import op
from sandbox.kernels.triton_chunk_common import fold_replicas, tile_and_row

C = 16  # chunk length (slot_scores.CHUNK)
# Warps per launch by the key tile's width BK (the state tile is 64 slots x BK), the fastest of 1-8 for each kernel
# at d_k 32, 64 and 128 (`benchmarks/slot_scores_speed.py`; the measurements left results/ in cddea1c and are in git
# history before it); other widths take the nearest row.
WARPS_BY_BK = {32: {"fwd_states": 2, "fwd_o": 1, "bwd_walk": 4},
               64: {"fwd_states": 2, "fwd_o": 1, "bwd_walk": 4},
               128: {"fwd_states": 4, "fwd_o": 2, "bwd_walk": 8}}
FWD_O_CHUNKS = 4   # chunks per program of ``_fwd_o`` (measured against 1 and 2 in the same files)


def warps_row(BK: int) -> dict[str, int]:
    return WARPS_BY_BK[min(WARPS_BY_BK, key=lambda w: abs(w.bit_length() - BK.bit_length()))]


@triton.jit
def _last_row(x, C: tl.constexpr):
    return tl.sum(tl.where(tl.arange(0, C)[:, None] == C - 1, x, 0.), axis=0)


@triton.jit
def _load_gc(gc, i_b, c, i_h, T, H, M, p_m, m_tm, m_t, o_m, m_m, C: tl.constexpr):
    """gc of chunk c [C, BM], its rows past the sequence's end held at its last step (no decay there), as the
    forward's running sum has them, with its middle row (the intra-chunk reference, within reach of every row)
    and its last row (the chunk's total) [BM]. The two rows are loaded again (from the cache) rather than picked
    out of the tile: a pick is a reduction across the tile's rows, through shared memory."""
    row = i_b * T + tl.minimum(c * C + C - 1, T - 1)
    last = tl.load(gc + (row.to(tl.int64) * H + i_h) * M + o_m, mask=m_m, other=0.)
    row = i_b * T + tl.minimum(c * C + C // 2 - 1, T - 1)
    mid = tl.load(gc + (row.to(tl.int64) * H + i_h) * M + o_m, mask=m_m, other=0.)
    b = tl.where(m_t[:, None], tl.load(gc + p_m, mask=m_tm, other=0.), last[None, :])
    return b, mid, last


@triton.jit
def _rows(i_b, c, i_h, T, H, C: tl.constexpr):
    """Chunk c of sequence i_b: which of its C rows lie inside the sequence, and their flat token index times
    H plus the head (the row offset into any [B, T, H, *] tensor)."""
    rows = c * C + tl.arange(0, C)
    return rows < T, (i_b * T + rows).to(tl.int64) * H + i_h


@triton.jit
def _tile(i_m, M, K: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """Slot tile i_m and all d_k columns: offsets and masks."""
    o_m = i_m * BM + tl.arange(0, BM)
    o_k = tl.arange(0, BK)
    return o_m, o_k, o_m < M, o_k < K


@triton.jit
def _fwd_states(k, s, g, gc, h, ht, T, H, M, NT, K: tl.constexpr, STORE_HT: tl.constexpr,
                C: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    i_m, i_bh = tile_and_row(tl.cdiv(M, BM))
    i_b, i_h = i_bh // H, i_bh % H
    o_m, o_k, m_m, m_k = _tile(i_m, M, K, BM, BK)
    m_h = m_m[:, None] & m_k[None, :]
    S = tl.zeros([BM, BK], dtype=tl.float32)
    for c in range(0, NT):
        m_t, tok = _rows(i_b, c, i_h, T, H, C)
        p_m = tok[:, None] * M + o_m[None, :]
        m_tm = m_t[:, None] & m_m[None, :]
        ch = ((i_b * NT + c) * H + i_h).to(tl.int64)
        tl.store(h + (ch * M + o_m[:, None]) * K + o_k[None, :], S.to(h.dtype.element_ty), mask=m_h)
        b_gc = tl.cumsum(tl.load(g + p_m, mask=m_tm, other=0.).to(tl.float32), axis=0)
        tl.store(gc + p_m, b_gc, mask=m_tm)
        gl = _last_row(b_gc, C)
        b_s = tl.load(s + p_m, mask=m_tm, other=0.).to(tl.float32)
        b_k = tl.load(k + tok[:, None] * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.)
        w = (tl.exp(gl[None, :] - b_gc) * b_s).to(b_k.dtype)
        S = S * tl.exp(gl)[:, None] + tl.dot(tl.trans(w), b_k)
    if STORE_HT:
        tl.store(ht + (i_bh.to(tl.int64) * M + o_m[:, None]) * K + o_k[None, :], S, mask=m_h)


@triton.jit
def _fwd_o(q, k, s, gc, h, o, scale, T, H, M, NT, K: tl.constexpr, C: tl.constexpr, BM: tl.constexpr,
           BK: tl.constexpr, NM: tl.constexpr, CPP: tl.constexpr):
    """CPP consecutive chunks per program, one after another (the loads of the next overlap this one's work)."""
    i_cm, i_h = tl.program_id(0), tl.program_id(1)
    i_c, i_m = i_cm // NM, i_cm % NM
    NP = tl.cdiv(NT, CPP)
    i_b = i_c // NP
    o_m, o_k, m_m, m_k = _tile(i_m, M, K, BM, BK)
    o_t = tl.arange(0, C)
    for j in range(CPP):
        c = (i_c % NP) * CPP + j
        m_t, tok = _rows(i_b, c, i_h, T, H, C)
        p_m = tok[:, None] * M + o_m[None, :]
        m_tm = m_t[:, None] & m_m[None, :]
        m_tk = m_t[:, None] & m_k[None, :]
        b_q = tl.load(q + tok[:, None] * K + o_k[None, :], mask=m_tk, other=0.)
        b_k = tl.load(k + tok[:, None] * K + o_k[None, :], mask=m_tk, other=0.)
        A = tl.dot(b_q, tl.trans(b_k)) * scale
        A = tl.where(o_t[:, None] >= o_t[None, :], A, 0.)
        b_gc, mid, _ = _load_gc(gc, i_b, c, i_h, T, H, M, p_m, m_tm, m_t, o_m, m_m, C)
        mid = mid[None, :]
        b_s = tl.load(s + p_m, mask=m_tm, other=0.).to(tl.float32)
        ch = ((i_b * NT + tl.minimum(c, NT - 1)) * H + i_h).to(tl.int64)   # c >= NT: every row masked
        b_h = tl.load(h + (ch * M + o_m[:, None]) * K + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0.)
        intra = tl.exp(b_gc - mid) * tl.dot(A, tl.exp(mid - b_gc) * b_s)
        inter = tl.exp(b_gc) * tl.dot(b_q, tl.trans(b_h.to(b_q.dtype))) * scale
        tl.store(o + p_m, intra + inter, mask=m_tm)


@triton.jit
def _bwd_walk(q, k, s, gc, h, o, do, dq, dk, ds, dg, scale, T, H, M, NT, K: tl.constexpr, C: tl.constexpr,
              BM: tl.constexpr, BK: tl.constexpr, NM: tl.constexpr):
    """One program per (sequence, head) walks the chunks from the last, each slot tile in turn, holding the
    gradient dS of the state at the current chunk's end [BM, BK] and the running sum of the later steps' gate
    terms. Per chunk: dq, dk, ds and dg (the reverse cumulative sum of do * o - s * ds), then dS moves to the
    chunk's start. The slot tiles' shares of dq and dk add up in dq and dk (only this program touches them)."""
    i_bh = tl.program_id(0)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = tl.arange(0, C)
    causal = o_t[:, None] >= o_t[None, :]
    for i_m in tl.static_range(NM):
        o_m, o_k, m_m, m_k = _tile(i_m, M, K, BM, BK)
        m_h = m_m[:, None] & m_k[None, :]
        dS = tl.zeros([BM, BK], dtype=tl.float32)
        later = tl.zeros([BM], dtype=tl.float32)          # sum of the gate terms of every later chunk
        for i in range(0, NT):
            c = NT - 1 - i
            m_t, tok = _rows(i_b, c, i_h, T, H, C)
            m_tk = m_t[:, None] & m_k[None, :]
            m_tm = m_t[:, None] & m_m[None, :]
            p_k = tok[:, None] * K + o_k[None, :]
            p_m = tok[:, None] * M + o_m[None, :]
            b_q = tl.load(q + p_k, mask=m_tk, other=0.)
            b_k = tl.load(k + p_k, mask=m_tk, other=0.)
            dt = b_q.dtype
            A = tl.where(causal, tl.dot(b_q, tl.trans(b_k)) * scale, 0.)
            b_gc, mid, last = _load_gc(gc, i_b, c, i_h, T, H, M, p_m, m_tm, m_t, o_m, m_m, C)
            mid, gl = mid[None, :], last[None, :]
            b_s = tl.load(s + p_m, mask=m_tm, other=0.).to(tl.float32)
            b_do = tl.load(do + p_m, mask=m_tm, other=0.).to(tl.float32)
            b_o = tl.load(o + p_m, mask=m_tm, other=0.)
            ch = ((i_b * NT + c) * H + i_h).to(tl.int64)
            b_h = tl.load(h + (ch * M + o_m[:, None]) * K + o_k[None, :], mask=m_h, other=0.).to(dt)
            b_dh = dS.to(dt)                                 # the chunk-end state's gradient, as an operand
            dm = tl.exp(b_gc - mid) * b_do                   # do relative to the chunk's middle
            sm = tl.exp(mid - b_gc) * b_s                    # s relative to the chunk's middle
            dA = tl.where(causal, tl.dot(dm, tl.trans(sm)), 0.) * scale
            qdo = (tl.exp(b_gc) * b_do).to(dt)
            decay = tl.exp(gl - b_gc)                        # from each step to the chunk's end
            b_dq = tl.dot(qdo, b_h) * scale + tl.dot(dA, b_k.to(tl.float32))
            b_dk = tl.dot((decay * b_s).to(dt), b_dh) + tl.dot(tl.trans(dA), b_q.to(tl.float32))
            b_ds = tl.exp(mid - b_gc) * tl.dot(tl.trans(A), dm) + decay * tl.dot(b_k, tl.trans(b_dh))
            tl.store(ds + p_m, b_ds.to(ds.dtype.element_ty), mask=m_tm)
            # a step's gate scales every later score of its slot: dg is the reverse cumulative sum of this
            b_dG = tl.where(m_tm, b_do * b_o - b_s * b_ds, 0.)
            total = tl.sum(b_dG, axis=0)
            tl.store(dg + p_m, total[None, :] - tl.cumsum(b_dG, axis=0) + b_dG + later[None, :], mask=m_tm)
            later += total
            if i_m > 0:                                      # the earlier slot tiles' shares
                b_dq += tl.load(dq + p_k, mask=m_tk, other=0.).to(tl.float32)
                b_dk += tl.load(dk + p_k, mask=m_tk, other=0.).to(tl.float32)
            tl.store(dq + p_k, b_dq.to(dq.dtype.element_ty), mask=m_tk)
            tl.store(dk + p_k, b_dk.to(dk.dtype.element_ty), mask=m_tk)
            dS = dS * tl.exp(last)[:, None] + tl.dot(tl.trans(qdo), b_q) * scale


def _tiles(M: int, K: int) -> tuple[int, int]:
    BK = max(16, triton.next_power_of_2(K))
    BM = max(16, min(64, triton.next_power_of_2(M)))
    return BM, BK


def _fwd(q, k, s, g, scale, output_final_state):
    B, T, H, K = q.shape
    M = s.shape[-1]
    NT = triton.cdiv(T, C)
    BM, BK = _tiles(M, K)
    NM = triton.cdiv(M, BM)
    f32 = torch.float32
    gc = torch.empty(B, T, H, M, device=q.device, dtype=f32)
    h = torch.empty(B * NT, H, M, K, device=q.device, dtype=q.dtype)  # only ever read as matmul operands
    ht = torch.empty(B if output_final_state else 0, H, M, K, device=q.device, dtype=f32)
    o = torch.empty(B, T, H, M, device=q.device, dtype=f32)
    w = warps_row(BK)
    _fwd_states[(NM * B * H,)](k, s, g, gc, h, ht, T, H, M, NT, K=K, STORE_HT=output_final_state, C=C, BM=BM,
                             BK=BK, num_warps=w["fwd_states"])
    _fwd_o[(B * triton.cdiv(NT, FWD_O_CHUNKS) * NM, H)](q, k, s, gc, h, o, scale, T, H, M, NT, K=K, C=C, BM=BM,
                                                        BK=BK, NM=NM, CPP=FWD_O_CHUNKS, num_warps=w["fwd_o"])
    return o, ht, gc, h


def _bwd(q, k, s, gc, h, o, do, scale):
    B, T, H, K = q.shape
    M = s.shape[-1]
    BM, BK = _tiles(M, K)
    NM = triton.cdiv(M, BM)
    # several slot tiles add their shares of dq and dk: in float32 then, rounded once after
    acc = q.dtype if NM == 1 else torch.float32
    dq = torch.empty(q.shape, device=q.device, dtype=acc)
    dk = torch.empty(k.shape, device=k.device, dtype=acc)
    ds = torch.empty(B, T, H, M, device=q.device, dtype=s.dtype)
    dg = torch.empty(B, T, H, M, device=q.device, dtype=torch.float32)
    _bwd_walk[(B * H,)](q, k, s, gc, h, o, do, dq, dk, ds, dg, scale, T, H, M, triton.cdiv(T, C), K=K, C=C,
                        BM=BM, BK=BK, NM=NM, num_warps=warps_row(BK)["bwd_walk"])
    return dq.to(q.dtype), dk.to(k.dtype), ds, dg


# ----------------------------------------------------------------------------- torch custom ops
# As in triton_chunk.py: opaque to torch.compile, vmapped by folding stacked replicas into the batch.

@op("sandbox::slot_scores_fwd")
def _op_fwd(q: torch.Tensor, k: torch.Tensor, s: torch.Tensor, g: torch.Tensor, scale: float,
            output_final_state: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o fp32, final state or empty, gc, chunk-start states)."""
    return _fwd(q, k, s, g, scale, output_final_state)


@_op_fwd.register_fake
def _op_fwd_fake(q, k, s, g, scale, output_final_state):
    B, T, H, K = q.shape
    M, f32 = s.shape[-1], torch.float32
    return (s.new_empty(B, T, H, M, dtype=f32), q.new_empty(B if output_final_state else 0, H, M, K, dtype=f32),
            s.new_empty(B, T, H, M, dtype=f32), q.new_empty(B * triton.cdiv(T, C), H, M, K))


@op("sandbox::slot_scores_bwd")
def _op_bwd(q: torch.Tensor, k: torch.Tensor, s: torch.Tensor, gc: torch.Tensor, h: torch.Tensor,
            o: torch.Tensor, do: torch.Tensor, scale: float
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, ds, dg)."""
    return _bwd(q, k, s, gc, h, o, do, scale)


@_op_bwd.register_fake
def _op_bwd_fake(q, k, s, gc, h, o, do, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(s), torch.empty_like(gc)


def _setup(ctx, inputs, output):
    q, k, s, g, scale, _ = inputs
    o, _, gc, h = output
    ctx.save_for_backward(q, k, s, gc, h, o)
    ctx.scale = scale
    ctx.g_dtype = g.dtype


def _backward(ctx, do, *_unused):
    q, k, s, gc, h, o = ctx.saved_tensors
    dq, dk, ds, dg = torch.ops.sandbox.slot_scores_bwd(q, k, s, gc, h, o, do.float().contiguous(), ctx.scale)
    return dq, dk, ds, dg.to(ctx.g_dtype), None, None


_op_fwd.register_autograd(_backward, setup_context=_setup)


@_op_fwd.register_vmap
def _op_fwd_vmap(info, in_dims, q, k, s, g, scale, output_final_state):
    """Stacked replicas [R, B, ...] run as one batch of R * B sequences."""
    R = info.batch_size
    q, k, s, g = (fold_replicas(x, d, R) for x, d in zip((q, k, s, g), in_dims[:4]))
    o, ht, gc, h = torch.ops.sandbox.slot_scores_fwd(q, k, s, g, scale, output_final_state)
    o = o.view(R, -1, *o.shape[1:])
    ht = ht.view(R, -1, *ht.shape[1:]) if output_final_state else ht
    # the intermediates only feed the backward recorded for the folded call: hand them out unbatched
    return (o, ht, gc, h), (0, 0 if output_final_state else None, None, None)


def slot_scores_triton(q, k, s, g, *, scale=1.0, output_final_state=False):
    """q, k: [B, T, H, d_k]; s, g: [B, T, H, m] (slot writes, log-gates <= 0, already clamped).

    Returns ``(o [B, T, H, m] fp32, final state [B, H, m, d_k] fp32 without gradient, or None)``; ds comes back
    in s's dtype (written so by the kernel: a 16-bit s moves half the bytes of a float32 one, in and out).
    """
    dt = q.dtype if q.dtype in (torch.bfloat16, torch.float16) else k.dtype
    q, k = q.to(dt).contiguous(), k.to(dt).contiguous()
    o, ht = torch.ops.sandbox.slot_scores_fwd(q, k, s.contiguous(), g.contiguous(), float(scale),
                                              bool(output_final_state))[:2]
    return o, (ht.detach() if output_final_state else None)


def _flops_fwd(B, T, H, K, M):
    """Multiply-adds x 2 of the forward, per chunk of C: q k^T, A (s scaled), q h^T and the state write s^T k."""
    return 2 * B * T * H * (C * K + C * M + 2 * K * M)


@torch.utils.flop_counter.register_flop_formula(torch.ops.sandbox.slot_scores_fwd)
def _fwd_flop_formula(q_shape, k_shape, s_shape, *args, out_shape=None, **kwargs) -> int:
    return _flops_fwd(*q_shape, s_shape[-1])


@torch.utils.flop_counter.register_flop_formula(torch.ops.sandbox.slot_scores_bwd)
def _bwd_flop_formula(q_shape, k_shape, s_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * _flops_fwd(*q_shape, s_shape[-1])    # dA, dq, dk, ds and the reverse state pass

"""Delta rule (DeltaNet / Gated DeltaNet) in chunked WY form: torch for the per-chunk WY representation,
Triton for the sequential pass over chunks (forward and backward).

Recurrence (per sequence and head, state S [K, V] fp32), scalar log-decay g (or none):
    S_t = exp(g_t) S_{t-1};  S_t = S_t + beta_t k_t^T (v_t - k_t S_t);  o_t = scale * q_t S_t

Per chunk of C = 64 steps, with gc the chunk-local cumulative log-decay and S_0 the incoming state:
    A_kk[t, s] = beta_t (k_t . k_s) exp(gc_t - gc_s)           (s < t)
    (I + A_kk) [W | U] = [beta * k * exp(gc) | beta * v]       (WY representation: (I + A_kk)^-1 in Triton)
    v_new = U - W S_0                                          (the chunk's pseudo-values)
    o     = scale * (q * exp(gc)) S_0 + A_qk v_new,  A_qk[t, s] = scale * (q_t . k_s) exp(gc_t - gc_s) (s <= t)
    S_C   = exp(gc_C) S_0 + (k * exp(gc_C - gc))^T v_new
The first three lines are batched over all chunks at once in torch (autograd differentiates them);
the last three are a sequential scan over chunks: ``_delta_fwd`` / ``_delta_bwd`` below, wrapped in
``DeltaScan`` (its backward is written by hand: dv_new, dS, and per-chunk partials of dq, dk, dW, dA).
Key head dim K up to 256 (one program holds all K rows of a V tile of the state); any V (tiled by the grid).
"""
from __future__ import annotations

import torch
import torch.utils.flop_counter
import triton
import triton.language as tl

from sandbox.kernels.library import op
from sandbox.kernels.triton_chunk_common import chunk_table, fold_replicas, tile_and_row

C = 64


@triton.jit
def _delta_fwd(qg, kl, w, u, aqk, el, h0, hs, vn, o, ht, co, H,
               K: tl.constexpr, V: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr,
               C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    i_v, i_nh = tile_and_row(tl.cdiv(V, BV))
    i_n = i_nh // H
    i_h = i_nh % H
    c0 = tl.load(co + i_n)
    c1 = tl.load(co + i_n + 1)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, C)
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    p_h = (i_nh * K + o_k[:, None]) * V + o_v[None, :]
    if HAS_H0:
        S = tl.load(h0 + p_h, mask=m_h, other=0.)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    for c in range(c0, c1):
        ch = (c * H + i_h).to(tl.int64)
        tl.store(hs + ch * K * V + o_k[:, None] * V + o_v[None, :], S, mask=m_h)
        p_tk = ch * C * K + o_t[:, None] * K + o_k[None, :]
        p_tv = ch * C * V + o_t[:, None] * V + o_v[None, :]
        b_w = tl.load(w + p_tk, mask=m_k[None, :], other=0.)
        b_u = tl.load(u + p_tv, mask=m_v[None, :], other=0.)
        dt = b_w.dtype
        Sc = S.to(dt)
        b_vn = b_u.to(tl.float32) - tl.dot(b_w, Sc)
        tl.store(vn + p_tv, b_vn, mask=m_v[None, :])
        b_vnc = b_vn.to(dt)
        b_q = tl.load(qg + p_tk, mask=m_k[None, :], other=0.)
        b_A = tl.load(aqk + ch * C * C + o_t[:, None] * C + o_t[None, :])
        b_o = tl.dot(b_q, Sc) + tl.dot(b_A, b_vnc)
        tl.store(o + p_tv, b_o, mask=m_v[None, :])
        b_kl = tl.load(kl + p_tk, mask=m_k[None, :], other=0.)
        S = S * tl.load(el + ch) + tl.dot(tl.trans(b_kl), b_vnc)
    if STORE_HT:
        tl.store(ht + p_h, S, mask=m_h)


@triton.jit
def _delta_bwd(qg, kl, w, aqk, el, hs, vn, do, dht, dh0, dvn_o, dqg, dkl, dw, daqk, del_, co, H, NC,
               K: tl.constexpr, V: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
               C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    i_v, i_nh = tile_and_row(tl.cdiv(V, BV))
    i_n = i_nh // H
    i_h = i_nh % H
    c0 = tl.load(co + i_n)
    c1 = tl.load(co + i_n + 1)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, C)
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    p_h = (i_nh * K + o_k[:, None]) * V + o_v[None, :]
    if HAS_DHT:
        dS = tl.load(dht + p_h, mask=m_h, other=0.)
    else:
        dS = tl.zeros([BK, BV], dtype=tl.float32)
    part = i_v.to(tl.int64) * NC * H  # offset (in chunks*heads) of this V tile's partial buffers
    for i in range(0, c1 - c0):
        c = c1 - 1 - i
        ch = (c * H + i_h).to(tl.int64)
        p_tk = ch * C * K + o_t[:, None] * K + o_k[None, :]
        p_tv = ch * C * V + o_t[:, None] * V + o_v[None, :]
        S0 = tl.load(hs + ch * K * V + o_k[:, None] * V + o_v[None, :], mask=m_h, other=0.)
        b_vn = tl.load(vn + p_tv, mask=m_v[None, :], other=0.)
        b_do = tl.load(do + p_tv, mask=m_v[None, :], other=0.)
        b_A = tl.load(aqk + ch * C * C + o_t[:, None] * C + o_t[None, :])
        b_kl = tl.load(kl + p_tk, mask=m_k[None, :], other=0.)
        b_q = tl.load(qg + p_tk, mask=m_k[None, :], other=0.)
        b_w = tl.load(w + p_tk, mask=m_k[None, :], other=0.)
        dt = b_w.dtype
        b_do = b_do.to(dt)
        b_vn = b_vn.to(dt)
        S0c = S0.to(dt)
        dSc = dS.to(dt)
        b_dvn = tl.dot(tl.trans(b_A), b_do) + tl.dot(b_kl, dSc)
        tl.store(dvn_o + p_tv, b_dvn.to(dvn_o.dtype.element_ty), mask=m_v[None, :])
        b_dvnc = b_dvn.to(dt)
        pp_tk = (part + ch) * C * K + o_t[:, None] * K + o_k[None, :]
        tl.store(daqk + (part + ch) * C * C + o_t[:, None] * C + o_t[None, :],
                 tl.dot(b_do, tl.trans(b_vn)).to(daqk.dtype.element_ty))
        tl.store(dqg + pp_tk, tl.dot(b_do, tl.trans(S0c)).to(dqg.dtype.element_ty), mask=m_k[None, :])
        tl.store(dkl + pp_tk, tl.dot(b_vn, tl.trans(dSc)).to(dkl.dtype.element_ty), mask=m_k[None, :])
        tl.store(dw + pp_tk, (-tl.dot(b_dvnc, tl.trans(S0c))).to(dw.dtype.element_ty), mask=m_k[None, :])
        tl.store(del_ + part + ch, tl.sum(tl.sum(dS * S0, axis=1), axis=0))
        dS = dS * tl.load(el + ch) + tl.dot(tl.trans(b_q), b_do) - tl.dot(tl.trans(b_w), b_dvnc)
    if STORE_DH0:
        tl.store(dh0 + p_h, dS, mask=m_h)


@triton.jit
def _diag_block_inv(a, base, blk: tl.constexpr, C: tl.constexpr):
    """(I + A_bb)^-1 of the 16 x 16 diagonal block ``blk`` of one C x C matrix by forward substitution: row i
    is e_i - sum_{j<i} A[i, j] T[j, :], the rows kept in registers."""
    o = tl.arange(0, 16)
    T = tl.where(o[:, None] == o[None, :], 1., 0.)
    for i in range(1, 16):
        a_i = tl.load(a + base + (blk * 16 + i) * C + blk * 16 + o, mask=o < i, other=0.)
        row = tl.where(o == i, 1., 0.) - tl.sum(a_i[:, None] * T, axis=0)
        T = tl.where(o[:, None] == i, row[None, :], T)
    return T


@triton.jit
def _block(a, base, i: tl.constexpr, j: tl.constexpr, C: tl.constexpr):
    o = tl.arange(0, 16)
    return tl.load(a + base + (i * 16 + o[:, None]) * C + j * 16 + o[None, :])


@triton.jit
def _put(t, base, x, i: tl.constexpr, j: tl.constexpr, C: tl.constexpr):
    o = tl.arange(0, 16)
    tl.store(t + base + (i * 16 + o[:, None]) * C + j * 16 + o[None, :], x)


@triton.jit
def _mm(x, y):
    return tl.dot(x, y, input_precision="ieee")     # fp32 throughout: tf32 would cost the solve its accuracy


@triton.jit
def _unit_lower_inv(a, t, C: tl.constexpr):
    """T = (I + A)^-1 of one 64 x 64 matrix, A strictly lower triangular (fp32), in 16 x 16 blocks: the four
    diagonal blocks by forward substitution (15 sequential row updates each, against 63 for the whole
    matrix), then the blocks below them row by row, T_ij = -T_ii sum_{j <= k < i} A_ik T_kj."""
    tl.static_assert(C == 64)
    base = tl.program_id(0).to(tl.int64) * C * C
    T0 = _diag_block_inv(a, base, 0, C)
    T1 = _diag_block_inv(a, base, 1, C)
    T2 = _diag_block_inv(a, base, 2, C)
    T3 = _diag_block_inv(a, base, 3, C)
    A10, A20, A21 = _block(a, base, 1, 0, C), _block(a, base, 2, 0, C), _block(a, base, 2, 1, C)
    A30, A31, A32 = _block(a, base, 3, 0, C), _block(a, base, 3, 1, C), _block(a, base, 3, 2, C)
    T10 = -_mm(T1, _mm(A10, T0))
    T21 = -_mm(T2, _mm(A21, T1))
    T20 = -_mm(T2, _mm(A20, T0) + _mm(A21, T10))
    T32 = -_mm(T3, _mm(A32, T2))
    T31 = -_mm(T3, _mm(A31, T1) + _mm(A32, T21))
    T30 = -_mm(T3, _mm(A30, T0) + _mm(A31, T10) + _mm(A32, T20))
    zero = tl.zeros([16, 16], dtype=tl.float32)
    _put(t, base, T0, 0, 0, C)
    _put(t, base, zero, 0, 1, C)
    _put(t, base, zero, 0, 2, C)
    _put(t, base, zero, 0, 3, C)
    _put(t, base, T10, 1, 0, C)
    _put(t, base, T1, 1, 1, C)
    _put(t, base, zero, 1, 2, C)
    _put(t, base, zero, 1, 3, C)
    _put(t, base, T20, 2, 0, C)
    _put(t, base, T21, 2, 1, C)
    _put(t, base, T2, 2, 2, C)
    _put(t, base, zero, 2, 3, C)
    _put(t, base, T30, 3, 0, C)
    _put(t, base, T31, 3, 1, C)
    _put(t, base, T32, 3, 2, C)
    _put(t, base, T3, 3, 3, C)


# The WY representation's triangular solve as the inverse of (I + A) (then one matrix product): cuBLAS's
# batched triangular solve (forward and backward) was a quarter of a Gated DeltaNet step (results/throughput/).
@op("sandbox::unit_lower_inverse")
def unit_lower_inverse(a: torch.Tensor) -> torch.Tensor:
    """``(I + a)^-1`` for ``a [..., C, C]`` fp32, strictly lower triangular (what is above its diagonal is
    not read)."""
    t = torch.empty_like(a)
    n = a.numel() // (C * C)
    if n:
        _unit_lower_inv[(n,)](a.contiguous(), t, C=C, num_warps=4)
    return t


@unit_lower_inverse.register_fake
def _unit_lower_inverse_fake(a):
    return torch.empty_like(a)


def _inverse_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _inverse_backward(ctx, dt):
    (t,) = ctx.saved_tensors
    tt = t.mT
    return -(tt @ dt @ tt).tril(-1)      # d(M^-1) = -M^-1 dM M^-1, and only A's strictly lower part is free


unit_lower_inverse.register_autograd(_inverse_backward, setup_context=_inverse_setup)


@unit_lower_inverse.register_vmap
def _unit_lower_inverse_vmap(info, in_dims, a):
    if in_dims[0] is None:
        return unit_lower_inverse(a), None
    return unit_lower_inverse(a.movedim(in_dims[0], 0)), 0


def _blocks(K, V):
    BK = max(16, triton.next_power_of_2(K))
    BV = max(16, min({16: 64, 32: 64, 64: 64, 128: 32}.get(BK, 16), triton.next_power_of_2(V)))
    return BK, BV


def _operand_dtype(x: torch.Tensor, K: int) -> torch.dtype:
    """Dtype of the scan's matrix operands: the input's 16-bit type, else fp32 (tf32 dots) up to K = 128 and
    bf16 above (fp32 tiles of a 64 x 256 chunk do not fit in shared memory)."""
    if x.dtype in (torch.bfloat16, torch.float16):
        return x.dtype
    return torch.float32 if K <= 128 else torch.bfloat16


# The sequential chunk scan reaches torch as two custom ops (opaque to torch.compile; torch.func.vmap folds
# stacked model replicas into its chunks): (q_g, k_l, W, U, A_qk, e_l, h0) -> (o, final state), tensors in
# chunk layout [NC, H, C, *], chunks of sequence n at co[n]:co[n+1]. The forward also returns the states
# at chunk starts and the corrected values, which the backward needs.

@op("sandbox::delta_scan_fwd",
    schema="(Tensor qg, Tensor kl, Tensor w, Tensor u, Tensor aqk, Tensor el, Tensor? h0, "
           "Tensor co, int N, bool output_final_state) -> (Tensor, Tensor, Tensor, Tensor)")
def _scan_fwd(qg, kl, w, u, aqk, el, h0, co, N, output_final_state):
    NC, H, _, K = qg.shape
    V = u.shape[-1]
    BK, BV = _blocks(K, V)
    dev = qg.device
    hs = torch.empty(NC, H, K, V, device=dev, dtype=torch.float32)
    vn = torch.empty(NC, H, C, V, device=dev, dtype=torch.float32)
    o = torch.empty(NC, H, C, V, device=dev, dtype=torch.float32)
    ht = torch.empty(N if output_final_state else 0, H, K, V, device=dev, dtype=torch.float32)
    _delta_fwd[(triton.cdiv(V, BV) * N * H,)](qg, kl, w, u, aqk, el, h0 if h0 is not None else qg, hs, vn, o,
                                            ht if output_final_state else qg, co, H, K=K, V=V,
                                            HAS_H0=h0 is not None, STORE_HT=output_final_state, C=C,
                                            BK=BK, BV=BV, num_warps=8, num_stages=1)
    return o, ht, hs, vn


@_scan_fwd.register_fake
def _scan_fwd_fake(qg, kl, w, u, aqk, el, h0, co, N, output_final_state):
    NC, H, _, K = qg.shape
    V = u.shape[-1]
    f32 = torch.float32
    return (qg.new_empty(NC, H, C, V, dtype=f32), qg.new_empty(N if output_final_state else 0, H, K, V, dtype=f32),
            qg.new_empty(NC, H, K, V, dtype=f32), qg.new_empty(NC, H, C, V, dtype=f32))


@op("sandbox::delta_scan_bwd",
    schema="(Tensor qg, Tensor kl, Tensor w, Tensor aqk, Tensor el, Tensor hs, Tensor vn, "
           "Tensor do, Tensor? dht, Tensor co, int N, bool need_dh0) "
           "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
def _scan_bwd(qg, kl, w, aqk, el, hs, vn, do, dht, co, N, need_dh0):
    """(d q_g, d k_l, d W, d U, d A_qk, d e_l, d h0 or empty)."""
    NC, H, _, K = qg.shape
    V = vn.shape[-1]
    BK, BV = _blocks(K, V)
    if BK <= 64:    # value tiles up to 128 wide: Gated DeltaNet's V 128 in one tile, so no partials to sum
        BV = max(BV, min(128, triton.next_power_of_2(V)))
    NV = triton.cdiv(V, BV)
    dev = qg.device
    f32, dt = torch.float32, qg.dtype
    # one V tile (V <= BV): the kernel writes the gradients in the operands' dtype and nothing is summed or cast
    # after it; several V tiles write fp32 partials, one per tile, summed below (Gated DeltaNet d128 in two
    # tiles of 64 paid 10 reductions and 10 casts for them: results/throughput/README.md)
    pt = dt if NV == 1 else f32
    dvn = torch.empty(NC, H, C, V, device=dev, dtype=dt)
    dqg = torch.empty(NV, NC, H, C, K, device=dev, dtype=pt)
    dkl = torch.empty(NV, NC, H, C, K, device=dev, dtype=pt)
    dw = torch.empty(NV, NC, H, C, K, device=dev, dtype=pt)
    daqk = torch.empty(NV, NC, H, C, C, device=dev, dtype=pt)
    de = torch.empty(NV, NC, H, device=dev, dtype=f32)
    dh0 = torch.empty(N if need_dh0 else 0, H, K, V, device=dev, dtype=f32)
    _delta_bwd[(NV * N * H,)](qg, kl, w, aqk, el, hs, vn, do.contiguous(),
                            dht.contiguous() if dht is not None else qg, dh0 if need_dh0 else qg,
                            dvn, dqg, dkl, dw, daqk, de, co, H, NC, K=K, V=V, HAS_DHT=dht is not None,
                            STORE_DH0=need_dh0, C=C, BK=BK, BV=BV, num_warps=8, num_stages=1)
    if NV == 1:
        return dqg[0], dkl[0], dw[0], dvn, daqk[0], de[0], dh0
    return dqg.sum(0).to(dt), dkl.sum(0).to(dt), dw.sum(0).to(dt), dvn, daqk.sum(0).to(dt), de.sum(0), dh0


@_scan_bwd.register_fake
def _scan_bwd_fake(qg, kl, w, aqk, el, hs, vn, do, dht, co, N, need_dh0):
    NC, H, _, K = qg.shape
    V = vn.shape[-1]
    return (torch.empty_like(qg), torch.empty_like(kl), torch.empty_like(w), qg.new_empty(NC, H, C, V),
            torch.empty_like(aqk), el.new_empty(NC, H), qg.new_empty(N if need_dh0 else 0, H, K, V,
                                                                      dtype=torch.float32))


def _scan_setup(ctx, inputs, output):
    qg, kl, w, u, aqk, el, h0, co, N, _ = inputs
    _, _, hs, vn = output
    ctx.save_for_backward(qg, kl, w, aqk, el, hs, vn, co, h0)
    ctx.N = N


def _scan_backward(ctx, do, dht, *_unused):
    qg, kl, w, aqk, el, hs, vn, co, h0 = ctx.saved_tensors
    need_dh0 = h0 is not None and ctx.needs_input_grad[6]
    dht = dht if dht is not None and dht.numel() else None
    dqg, dkl, dw, du, daqk, de, dh0 = torch.ops.sandbox.delta_scan_bwd(qg, kl, w, aqk, el, hs, vn, do, dht, co,
                                                                       ctx.N, need_dh0)
    return dqg, dkl, dw, du, daqk, de, dh0 if need_dh0 else None, None, None, None


_scan_fwd.register_autograd(_scan_backward, setup_context=_scan_setup)


@_scan_fwd.register_vmap
def _scan_fwd_vmap(info, in_dims, qg, kl, w, u, aqk, el, h0, co, N, output_final_state):
    """Stacked replicas: R scans of N sequences run as one scan of R * N (the chunk offsets repeat)."""
    if in_dims[7] is not None:
        raise NotImplementedError("delta scan: vmap over the chunk offsets is not supported")
    R = info.batch_size
    qg, kl, w, u, aqk, el, h0 = (fold_replicas(x, d, R) for x, d in zip((qg, kl, w, u, aqk, el, h0), in_dims[:7]))
    NC = qg.shape[0] // R
    starts = (co[:-1][None, :] + NC * torch.arange(R, device=co.device, dtype=co.dtype)[:, None]).reshape(-1)
    co = torch.cat([starts, co.new_full((1,), R * NC)])
    o, ht, hs, vn = torch.ops.sandbox.delta_scan_fwd(qg, kl, w, u, aqk, el, h0, co, R * N, output_final_state)
    ht = ht.view(R, N, *ht.shape[1:]) if output_final_state else ht[:0]
    return (o.view(R, NC, *o.shape[1:]), ht, hs, vn), (0, 0 if output_final_state else None, None, None)


def _layout(B, T, cu_seqlens, device):
    """Chunk layout: row index [NC, C] into the flat [B*T] time axis, validity mask, chunk offsets [N+1]."""
    if cu_seqlens is None:
        nt = triton.cdiv(T, C)
        starts = (torch.arange(B, device=device)[:, None] * T + torch.arange(nt, device=device)[None, :] * C).reshape(-1)
        ends = (torch.arange(B, device=device)[:, None] * T + T).expand(B, nt).reshape(-1)
        co = torch.arange(B + 1, device=device, dtype=torch.int32) * nt
    else:
        table, _ = chunk_table(cu_seqlens, C)
        starts, ends = table[:, 0].long(), table[:, 1].long()
        cu = cu_seqlens.long()
        nch = (cu[1:] - cu[:-1] + C - 1) // C
        co = torch.cat([nch.new_zeros(1), nch.cumsum(0)]).to(torch.int32)
    idx = starts[:, None] + torch.arange(C, device=device)[None, :]
    valid = idx < ends[:, None]
    return idx, valid, co


def chunk_delta_rule(q, k, v, beta, g=None, *, scale=1.0, initial_state=None, output_final_state=False,
                     cu_seqlens=None):
    """Chunked delta rule; same contract as ``linear_recurrence`` with ``beta`` (g: None or [B, T, H]).

    Returns (o [B, T, H, V] in v's dtype, final_state [N, H, K, V] float32 or None).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"k, v: shapes {tuple(k.shape)}, {tuple(v.shape)} do not match q {tuple(q.shape)}")
    if beta is None or beta.shape != (B, T, H):
        raise ValueError(f"beta: must be [B, T, H] = {(B, T, H)}")
    if g is not None and g.shape != (B, T, H):
        raise ValueError(f"g: the Triton delta rule takes a scalar gate [B, T, H], got {tuple(g.shape)}")
    if K > 256:
        raise ValueError(f"K: the Triton delta rule holds at most 256 key rows per head, got {K}")
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"cu_seqlens: needs batch size 1, got {B}")
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(q.device)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if initial_state is not None and tuple(initial_state.shape) != (N, H, K, V):
        raise ValueError(f"initial_state: shape {tuple(initial_state.shape)} must be {(N, H, K, V)}")
    f32 = torch.float32
    idx, valid, co = _layout(B, T, cu_seqlens, q.device)
    NC = idx.shape[0]
    TT = B * T
    flat = idx.clamp(max=TT - 1).reshape(-1)
    vm = valid.reshape(NC, C, 1, 1)

    # Sequences of whole chunks (no cu_seqlens, T a multiple of C) are already in chunk order: a view, where the
    # general layout gathers rows (and its backward scatters them) for every input and the output.
    aligned = cu_seqlens is None and T % C == 0

    def chunks(x):  # [B, T, H, D] -> [NC, H, C, D] fp32, zero on padding rows
        if aligned:
            x = x.reshape(NC, C, H, -1).to(f32)
        else:
            x = x.reshape(TT, H, -1).to(f32)[flat].view(NC, C, H, -1) * vm
        return x.permute(0, 2, 1, 3)

    qc, kc, vc = chunks(q), chunks(k), chunks(v)
    bc = chunks(beta[..., None])[..., 0]                          # [NC, H, C]
    tri = torch.ones(C, C, dtype=torch.bool, device=q.device)
    if g is not None:
        gc = chunks(g[..., None])[..., 0].cumsum(-1)             # [NC, H, C]
        diff = gc[..., :, None] - gc[..., None, :]
        d_strict = diff.masked_fill(~tri.tril(-1), float("-inf")).exp()
        d_incl = diff.masked_fill(~tri.tril(0), float("-inf")).exp()
        eg = gc.exp()[..., None]
        gl = gc[..., -1:]
        kl = kc * (gl - gc).exp()[..., None]
        el = gl[..., 0].exp()
    else:
        d_strict = tri.tril(-1).to(f32)
        d_incl = tri.tril(0).to(f32)
        eg = None
        kl = kc
        el = torch.ones(NC, H, device=q.device, dtype=f32)
    akk = bc[..., None] * (kc @ kc.transpose(-1, -2)) * d_strict
    kw = bc[..., None] * (kc * eg if eg is not None else kc)
    rhs = torch.cat([kw, bc[..., None] * vc], dim=-1)
    sol = unit_lower_inverse(akk.contiguous()) @ rhs
    w, u = sol[..., :K], sol[..., K:]
    aqk = (qc @ kc.transpose(-1, -2)) * d_incl * scale
    qg = (qc * eg if eg is not None else qc) * scale
    h0 = initial_state.to(f32).contiguous() if initial_state is not None else None
    dt = _operand_dtype(q, K)
    o, ht = torch.ops.sandbox.delta_scan_fwd(*(x.to(dt).contiguous() for x in (qg, kl, w, u, aqk)),
                                             el.contiguous(), h0, co, N, bool(output_final_state))[:2]
    o = o.permute(0, 2, 1, 3).reshape(NC * C, H, V)
    if not aligned:
        # back to [B, T, H, V]: position of each time row in the chunk layout (padding rows all land
        # on a spare slot TT: a scatter with fixed shapes, no host sync, so a CUDA graph can hold it)
        pos = torch.empty(TT + 1, dtype=torch.long, device=q.device)
        pos.scatter_(0, torch.where(valid, idx, TT).reshape(-1), torch.arange(NC * C, device=q.device))
        o = o[pos[:TT]]
    return o.view(B, T, H, V).to(v.dtype), ht if output_final_state else None


def _scan_flops(qg_shape, u_shape) -> int:
    """Multiply-adds x 2 of the scan's forward per chunk: W S, U - W S, q S, A_qk v, k^T v."""
    NC, H, Cn, K = qg_shape
    V = u_shape[-1]
    return 2 * NC * H * Cn * (3 * K * V + Cn * V + K * V)


@torch.utils.flop_counter.register_flop_formula(torch.ops.sandbox.delta_scan_fwd)
def _scan_fwd_flop_formula(qg_shape, kl_shape, w_shape, u_shape, *args, out_shape=None, **kwargs) -> int:
    return _scan_flops(qg_shape, u_shape)


@torch.utils.flop_counter.register_flop_formula(torch.ops.sandbox.delta_scan_bwd)
def _scan_bwd_flop_formula(qg_shape, kl_shape, w_shape, aqk_shape, el_shape, hs_shape, vn_shape, *args,
                           out_shape=None, **kwargs) -> int:
    return 2 * _scan_flops(qg_shape, vn_shape)

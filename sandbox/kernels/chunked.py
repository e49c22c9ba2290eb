"""Chunked torch form of the linear recurrence (same contract as ``recurrent_reference``).

The sequence is cut into chunks of ``chunk_size`` steps. Inside a chunk, with ``b_t`` the
inclusive cumulative log-decay from the chunk start (a scalar or a K-vector per step):

* intra-chunk: ``A[t, s] = sum_k q_t[k] k_s[k] exp(b_t[k] - b_s[k])`` for ``s <= t`` (masked
  matmul); exponents are differences of positions inside the chunk with ``s <= t``, so
  every factor is ``<= 1`` and strong decay underflows to zero instead of overflowing;
* inter-chunk: ``o_t += (q_t * exp(b_t)) S_0`` and
  ``S_C = exp(b_C) * S_0 + sum_s (k_s * exp(b_C - b_s))^T u_s`` (again factors <= 1).

Without the delta rule ``u = v``. With it, the pseudo-values come from the UT transform:
``(I + diag(beta) M) U = diag(beta) (V - (K * exp(b)) S_0)`` with ``M`` the strictly lower
part of the same decayed ``K K^T`` matrix, solved by one unit-lower-triangular solve per
chunk (``U = U0 - W S_0``, with ``U0`` and ``W`` independent of the incoming state).

Variable-length segments (``cu_seqlens``) are gathered into a zero-padded batch; padded
steps have ``k = 0, g = 0, beta = 0``, so they neither write nor decay the state.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sandbox.kernels.reference import accumulate_dtype, check_inputs


def _decayed_scores(a, b, logdecay, strict: bool, sub: int = 16):
    """``[..., C, C]`` matrix ``sum_k a_t[k] b_s[k] exp(L_t[k] - L_s[k])`` on ``s <= t`` (``s < t`` if strict).

    a, b: ``[..., C, K]``; logdecay: None, ``[..., C]`` (scalar) or ``[..., C, K]`` (diagonal).
    A diagonal decay is split into sub-blocks of ``sub`` steps: blocks on the diagonal are
    computed pairwise; a block below it is a matmul of ``a_t exp(L_t - L_r)`` and
    ``b_s exp(L_r - L_s)`` with ``r`` the step just before the row block (both factors <= 1).
    """
    C = a.shape[-2]
    mask = torch.ones(C, C, dtype=torch.bool, device=a.device).tril(-1 if strict else 0)
    if logdecay is None:
        return (a @ b.transpose(-1, -2)).masked_fill(~mask, 0.0)
    if logdecay.ndim == a.ndim - 1:  # scalar per step
        diff = logdecay[..., :, None] - logdecay[..., None, :]
        return (a @ b.transpose(-1, -2)) * diff.masked_fill(~mask, float("-inf")).exp()
    if C <= sub or C % sub:
        return _pairwise(a, b, logdecay, mask)
    n, K = C // sub, a.shape[-1]
    blocks = lambda x: x.reshape(*x.shape[:-2], n, sub, K)  # noqa: E731
    ab, bb, Lb = blocks(a), blocks(b), blocks(logdecay)
    diag = _pairwise(ab, bb, Lb, mask[:sub, :sub])  # [..., n, sub, sub]
    eye = torch.eye(n, dtype=a.dtype, device=a.device)
    out = torch.einsum("...isr,ij->...isjr", diag, eye).reshape(*a.shape[:-2], C, C)
    ref = Lb[..., :-1, -1, :]  # [..., n-1, K]: step just before row blocks 1..n-1
    a_ref = ab[..., 1:, :, :] * (Lb[..., 1:, :, :] - ref[..., :, None, :]).exp()  # [..., n-1, sub, K]
    before = torch.arange(C, device=a.device)[None, :] < (torch.arange(1, n, device=a.device)[:, None] * sub)
    expo = (ref[..., :, None, :] - logdecay[..., None, :, :]).masked_fill(~before[..., None], float("-inf"))
    b_ref = b[..., None, :, :] * expo.exp()  # [..., n-1, C, K], zero on and after the row block
    below = (a_ref @ b_ref.transpose(-1, -2)).reshape(*a.shape[:-2], C - sub, C)
    return out + F.pad(below, (0, 0, sub, 0))


def _pairwise(a, b, logdecay, mask):
    diff = logdecay[..., :, None, :] - logdecay[..., None, :, :]  # [..., C, C, K]
    weight = diff.masked_fill(~mask[..., None], float("-inf")).exp()
    return torch.einsum("...tk,...sk,...tsk->...ts", a, b, weight)


def _to_padded(x, segments, length):
    """Gather segments of a [1, T, ...] tensor into [N, length, ...] with zero padding."""
    rows = []
    for s, e in segments:
        piece = x[0, s:e]
        pad = [0, 0] * (piece.ndim - 1) + [0, length - (e - s)]
        rows.append(F.pad(piece, pad))
    return torch.stack(rows)


def _chunk_padded(q, k, v, g, beta, S, chunk_size):
    """Core on [N, T, H, *] tensors in the accumulation dtype, T a multiple of chunk_size.

    Returns o [N, T, H, V] (unscaled) and the final state [N, H, K, V].
    """
    N, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    n = T // C

    def chunks(x):  # [N, T, H, *] -> [N, H, n, C, *]
        y = x.reshape(N, n, C, H, *x.shape[3:])
        return y.permute(0, 3, 1, 2, *range(4, y.ndim))

    qc, kc, vc = chunks(q), chunks(k), chunks(v)
    if g is None:
        b = None
        q_in, k_out, k_in = qc, kc, kc
        last = None
    else:
        b = chunks(g).cumsum(3)  # [N, H, n, C] or [N, H, n, C, K]
        last = b[:, :, :, -1:]  # [N, H, n, 1(, K)]
        e_in = b.exp()
        e_out = (last - b).exp()
        if b.ndim == 4:
            e_in, e_out = e_in[..., None], e_out[..., None]
        q_in, k_in, k_out = qc * e_in, kc * e_in, kc * e_out
    A = _decayed_scores(qc, kc, b, strict=False)  # [N, H, n, C, C]
    if beta is not None:
        bc = chunks(beta)[..., None]  # [N, H, n, C, 1]
        M = _decayed_scores(kc, kc, b, strict=True)
        eye = torch.eye(C, dtype=q.dtype, device=q.device)
        Tm = eye + bc * M
        rhs = torch.cat([bc * vc, bc * k_in], dim=-1)
        sol = torch.linalg.solve_triangular(Tm, rhs, upper=False, unitriangular=True)
        U0, W = sol[..., :V], sol[..., V:]
    else:
        U0, W = vc, None
    outs = []
    for i in range(n):
        U = U0[:, :, i] if W is None else U0[:, :, i] - W[:, :, i] @ S
        outs.append(q_in[:, :, i] @ S + A[:, :, i] @ U)
        if last is None:
            S = S + k_out[:, :, i].transpose(-1, -2) @ U
        else:
            decay = last[:, :, i].exp()  # [N, H, 1] or [N, H, 1, K]
            decay = decay[..., None] if decay.ndim == 3 else decay.transpose(-1, -2)
            S = decay * S + k_out[:, :, i].transpose(-1, -2) @ U
    o = torch.stack(outs, dim=2)  # [N, H, n, C, V]
    return o.permute(0, 2, 3, 1, 4).reshape(N, T, H, V), S


def chunk_reference(q, k, v, g=None, beta=None, *, scale=1.0, initial_state=None,
                    output_final_state=False, cu_seqlens=None, chunk_size=64):
    """Chunked torch form; returns ``(o [B, T, H, V], final_state [N, H, K, V] or None)``."""
    N = check_inputs(q, k, v, g, beta, initial_state, cu_seqlens)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    acc = accumulate_dtype(q)
    xs = [q, k, v, g, beta]
    if cu_seqlens is not None:
        c = cu_seqlens.tolist()
        segments = list(zip(c, c[1:]))
        length = max([e - s for s, e in segments])
        xs = [None if x is None else _to_padded(x, segments, length) for x in xs]
    else:
        length = T
    Tp = max(chunk_size, -(-length // chunk_size) * chunk_size)
    xs = [None if x is None else F.pad(x.to(acc), [0, 0] * (x.ndim - 2) + [0, Tp - length]) for x in xs]
    S0 = q.new_zeros(N, H, K, V, dtype=acc) if initial_state is None else initial_state.to(acc)
    o, S = _chunk_padded(*xs, S0, chunk_size)
    o = (scale * o).to(v.dtype)
    if cu_seqlens is not None:
        o = torch.cat([o[i, : e - s] for i, (s, e) in enumerate(segments)])[None]
    else:
        o = o[:, :T]
    return o, (S if output_final_state else None)

"""Per-step reference of the linear recurrence: the ground truth every faster form is tested against.

Per (sequence, head) the state ``S`` is a ``[K, V]`` matrix.

* Without ``beta``:  ``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t``
* With ``beta`` (delta rule): ``S_t = diag(exp(g_t)) S_{t-1}``, then
  ``S_t = S_t + beta_t k_t^T (v_t - k_t S_t)``
* Output: ``o_t = scale * q_t S_t``

``g`` is a log-decay (<= 0): ``None``, ``[B, T, H]`` (one scalar per head and step) or
``[B, T, H, K]`` (diagonal over the K rows). The diagonal gate is also accepted with the
delta rule (a superset of the contract, needed by row-sparse gated delta mixers).
The state accumulates in float32, or float64 when the inputs are float64.
"""
from __future__ import annotations

import torch


def accumulate_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def check_inputs(q, k, v, g, beta, initial_state, cu_seqlens) -> int:
    """Validate shapes; return N, the number of sequences (B, or segments with cu_seqlens)."""
    if q.ndim != 4:
        raise ValueError(f"q must be [B, T, H, K], got shape {tuple(q.shape)}")
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    B, T, H, K = q.shape
    if v.ndim != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, T, H, V] with B, T, H = {B, T, H}, got {tuple(v.shape)}")
    if g is not None and g.shape not in ((B, T, H), (B, T, H, K)):
        raise ValueError(f"g must be [B, T, H] or [B, T, H, K] = {(B, T, H, K)}, got {tuple(g.shape)}")
    if beta is not None and beta.shape != (B, T, H):
        raise ValueError(f"beta must be [B, T, H] = {(B, T, H)}, got {tuple(beta.shape)}")
    if cu_seqlens is None:
        n = B
    else:
        if B != 1:
            raise ValueError(f"cu_seqlens needs a batch of size 1 (packed segments), got B={B}")
        if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 2:
            raise ValueError(f"cu_seqlens must be 1-D with at least 2 entries, got shape {tuple(cu_seqlens.shape)}")
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}")
        c = cu_seqlens.tolist()
        if c[0] != 0 or c[-1] != T or any(b < a for a, b in zip(c, c[1:])):
            raise ValueError(f"cu_seqlens must rise from 0 to T={T} without decreasing, got {c}")
        n = len(c) - 1
    V = v.shape[-1]
    if initial_state is not None and initial_state.shape != (n, H, K, V):
        raise ValueError(f"initial_state must be [N, H, K, V] = {(n, H, K, V)}, got {tuple(initial_state.shape)}")
    return n


def _segments(cu_seqlens, B: int, T: int):
    """(batch index, start, end) of each sequence."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    c = cu_seqlens.tolist()
    return [(0, s, e) for s, e in zip(c, c[1:])]


def recurrent_reference(q, k, v, g=None, beta=None, *, scale=1.0, initial_state=None,
                        output_final_state=False, cu_seqlens=None):
    """Plain per-step loop; returns ``(o [B, T, H, V], final_state [N, H, K, V] or None)``."""
    check_inputs(q, k, v, g, beta, initial_state, cu_seqlens)
    B, T, H, K = q.shape
    V = v.shape[-1]
    acc = accumulate_dtype(q)
    outs, finals = [], []
    for n, (b, start, end) in enumerate(_segments(cu_seqlens, B, T)):
        if initial_state is None:
            S = q.new_zeros(H, K, V, dtype=acc)
        else:
            S = initial_state[n].to(acc)
        for t in range(start, end):
            qt, kt, vt = q[b, t].to(acc), k[b, t].to(acc), v[b, t].to(acc)  # [H, K], [H, K], [H, V]
            if g is not None:
                decay = g[b, t].to(acc).exp()
                S = S * (decay[:, None, None] if decay.ndim == 1 else decay[:, :, None])
            if beta is None:
                S = S + kt[:, :, None] * vt[:, None, :]
            else:
                err = vt - torch.einsum("hk,hkv->hv", kt, S)
                S = S + beta[b, t].to(acc)[:, None, None] * kt[:, :, None] * err[:, None, :]
            outs.append(scale * torch.einsum("hk,hkv->hv", qt, S))
        finals.append(S)
    if outs:
        o = torch.stack(outs).view(B, T, H, V).to(v.dtype)
    else:
        o = v.new_zeros(B, T, H, V)
    final = torch.stack(finals) if output_final_state else None
    return o, final

"""GSA's first pass (slot scores) in chunked torch form, without per-slot copies of q and k.

Per head, with m slots, forget gate alpha_t = exp(g_t) in (0, 1]^m and slot writes s_t:
    K~_t = diag(alpha_t) K~_{t-1} + s_t^T k_t      (m x d_k, K~_0 = 0)
    o_t  = scale * K~_t q_t                        (m scores)
Cutting the sequence into chunks of C steps, with G the inclusive cumulative log-gate from
the chunk start ([C, m]) and A = tril(q k^T) ([C, C], shared by all slots):
    intra = exp(G - G_mid) * (A @ (exp(G_mid - G) * s))      (G_mid: G at the chunk's middle step)
    inter = exp(G) * (q @ K~_prev^T)
    K~    = exp(G_C)[:, None] * K~_prev + (exp(G_C - G) * s)^T @ k
The largest tensors are the per-chunk states [n, m, d_k] (T m d_k / C), not T m d_k.
On a GPU the same chunked form runs as Triton kernels (``triton_slot_scores.py``); this torch form is
the reference they are checked against besides the per-token loop, and the CPU path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sandbox.kernels.reference import accumulate_dtype

CHUNK = 16
# Why exp cannot overflow: inter and state factors are exp of decays (<= 1). The intra factors
# exceed 1, so they are taken relative to the chunk's middle step: |G - G_mid| <= (CHUNK / 2)
# * |LOG_GATE_MIN| = 64, and exp(+-64) (6e27, 1.6e-28) stays in the normal fp32/bf16 range with
# ~24 nats (3e10) of headroom for the sum of C terms A * s (from the chunk start it would reach
# exp(128) = inf). The clamp only acts on gates alpha < e^-8 = 3.4e-4 (GSA: sigmoid(f) < e^-64,
# f < -64); it then keeps at most 3.4e-4 of the old slot state, below bf16 resolution.
LOG_GATE_MIN = -8.0


def slot_scores(q, k, s, g, *, scale=1.0, output_final_state=False, impl="auto"):
    """q, k: [B, T, H, d_k]; s, g: [B, T, H, m] (slot writes, log-gates <= 0).

    Returns ``(o [B, T, H, m] in float32 (float64 for float64 q), final state [B, H, m, d_k] or None)``: the
    scores stay in their accumulation dtype whatever the inputs' (GSA takes their softmax). impl: "triton" (the
    final state then carries no gradient), "torch", or "auto" = Triton on CUDA for d_k <= 256.
    """
    if impl == "triton" or (impl == "auto" and q.is_cuda and q.shape[-1] <= 256):
        from sandbox.kernels.triton_slot_scores import slot_scores_triton
        return slot_scores_triton(q, k, s, g.clamp_min(LOG_GATE_MIN), scale=scale,
                                  output_final_state=output_final_state)
    B, T, H, dk = q.shape
    C, acc = CHUNK, accumulate_dtype(q)
    n = max(1, -(-T // C))

    def chunks(x):  # [B, T, H, *] -> [B, H, n, C, *], zero-padded: padded steps neither write nor decay
        x = F.pad(x.to(acc), (0, 0, 0, 0, 0, n * C - T))
        return x.view(B, n, C, H, -1).permute(0, 3, 1, 2, 4)

    with torch.autocast(q.device.type, enabled=False):
        qc, kc, sc = chunks(q) * scale, chunks(k), chunks(s)
        G = chunks(g.clamp_min(LOG_GATE_MIN)).cumsum(3)  # [B, H, n, C, m]
        A = (qc @ kc.transpose(-1, -2)).tril()  # [B, H, n, C, C]
        mid = G[..., C // 2 - 1: C // 2, :]
        intra = (G - mid).exp() * (A @ ((mid - G).exp() * sc))
        last = G[..., -1, :]  # [B, H, n, m]
        writes = ((last[..., None, :] - G).exp() * sc).transpose(-1, -2) @ kc  # [B, H, n, m, dk]
        S, states = q.new_zeros(B, H, s.shape[-1], dk, dtype=acc), []
        for i in range(n):
            states.append(S)
            S = last[:, :, i, :, None].exp() * S + writes[:, :, i]
        inter = G.exp() * (qc @ torch.stack(states, 2).transpose(-1, -2))
        o = (intra + inter).permute(0, 2, 3, 1, 4).reshape(B, n * C, H, -1)[:, :T]
    return o, (S if output_final_state else None)

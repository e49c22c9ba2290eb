"""Partitioned linear recurrence: N state partitions written and read by routed tokens (SSE, MoM).

Every token t has, per partition p, a write weight ``w[t, p]`` (0 off its write set) and a
read weight ``r[t, p]`` (0 off its read set). Per partition and head the state follows the
core recurrence of ``sandbox.kernels.linear_recurrence`` with
    q_t^p = r[t, p] * q_t,   k_t^p = w[t, p] * k_t,   log-decay g_t^p = g_t * [p written at t]
(additive update), or for the delta rule ``beta_t^p = w[t, p] * beta_t`` and ``k_t^p = k_t * [p
written]``, so a partition a token does not write is neither written nor decayed. The output is
``o_t = sum_p q_t^p S_t^p`` plus an optional always-on *shared* partition (weight 1).

Two implementations with the same outputs and gradients (SSE paper, appendix B):
  * ``masking`` (algorithm 1): every token is replicated over all N partitions, the weights
    zero the unselected copies, and partitions become extra heads of one kernel call;
  * ``varlen`` (algorithm 2): the (token, partition) pairs that write or read are sorted by
    (sequence, partition, time) and run as one packed ``cu_seqlens`` call, one segment per
    (sequence, partition); the shared partition is appended as B more segments.

Inputs with a partition axis ``[B, T, P, H, *]`` take P = N (own tensors per partition, e.g.
separate projections) or P = 1 (shared by all partitions).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sandbox.kernels import linear_recurrence

PARTITION_IMPLS = ("auto", "masking", "varlen")
# impl "auto" picks varlen only for long sequences over many partitions: masking's step grows with
# the partitions n while varlen's barely does, so varlen wins from about n = 10 at T 4096 and loses
# at fewer partitions or shorter sequences (results/sse/README.md, "masking against varlen").
VARLEN_MIN_LEN = 2048
VARLEN_MIN_PARTITIONS = 10


@dataclass
class Routing:
    """Per-token routing over N partitions (all ``[B, T, N]`` except ``indices``)."""

    indices: torch.Tensor  # [B, T, k] written partitions, best first
    write_mask: torch.Tensor
    write: torch.Tensor  # write weights, 0 off write_mask
    read_mask: torch.Tensor
    read: torch.Tensor  # read weights, 0 off read_mask
    probs: torch.Tensor  # softmax of the logits over all N (for the balance loss)


def route(logits: torch.Tensor, k: int, k_read: int, write_gate: bool, read_gate: bool,
          ungated_write: float, over_selected: bool) -> Routing:
    """Top-k partitions for writing and top-k' for reading from logits ``[B, T, N]``.

    A gated side weighs its selected partitions by the softmax of the logits, taken over all N
    partitions (SSE's e_t) or, with ``over_selected``, over that side's selected ones alone (MoM's
    top-k-then-softmax); an ungated side uses ``ungated_write`` (writes) or 1 (reads). Over the
    selected ones alone, a single selected partition always weighs 1: with k = 1 such a gate
    would change nothing and pass the router no gradient."""
    top = logits.topk(max(k, k_read), dim=-1).indices
    # masks by comparison: vmap has no batching rule for scatter_ and would loop over a stack's replicas
    part = torch.arange(logits.shape[-1], device=logits.device)
    wmask, rmask = ((top[..., :n_sel, None] == part).any(-2) for n_sel in (k, k_read))
    probs = logits.softmax(-1)
    if over_selected:
        gated = lambda m: logits.masked_fill(~m, float("-inf")).softmax(-1)  # noqa: E731
    else:
        gated = lambda m: probs * m  # noqa: E731
    write = gated(wmask) if write_gate else wmask.to(logits.dtype) * ungated_write
    read = gated(rmask) if read_gate else rmask.to(logits.dtype)
    return Routing(top[..., :k], wmask, write, rmask, read, probs)


def _weighted(q, k, v, g, beta, wmask, w, r):
    """Per (token, partition) inputs of the kernel; weights broadcast as ``[..., 1]`` against heads."""
    q = q * r[..., None]
    if beta is None:
        k = k * w[..., None]
    else:
        k = k * wmask[..., None].to(k.dtype)
        beta = beta * w
    if g is not None:
        m = wmask if g.ndim == q.ndim - 1 else wmask[..., None]
        g = g * m.to(g.dtype)
    return q, k, v, g, beta


def partitioned_recurrence(q, k, v, g, beta, routing: Routing, *, shared: dict | None = None,
                           impl: str = "masking", kernel: str = "auto", scale: float = 1.0,
                           output_final_state: bool = False):
    """Run N routed partitions (+ the shared one); returns ``(o [B, T, H, V], S or None)``.

    q, k: ``[B, T, P, H, K]`` (k: keys after the feature map, before the partition weight);
    v: ``[B, T, P, H, V]``; g: None, ``[B, T, P, H]`` or ``[B, T, P, H, K]``; beta: None or
    ``[B, T, P, H]``; shared: dict with q, k, v, g, beta of the always-on partition without the
    P axis (g of the same kind as the partitions' g). S: ``[B, N(+1), H, K, V]``, the shared
    partition last.
    """
    if impl not in ("masking", "varlen"):
        raise ValueError(f"impl: must be masking or varlen, got {impl!r}")
    fn = _masking if impl == "masking" else _varlen
    return fn(q, k, v, g, beta, routing, shared, dict(scale=scale, impl=kernel,
                                                       output_final_state=output_final_state))


def _same_dtype(xs):
    """q and k in v's dtype: under autocast the routing weights (float32) would promote them, and
    the kernels expect one dtype for q, k and v (the state still accumulates in float32)."""
    q, k, v, g, beta = xs
    return [q.to(v.dtype), k.to(v.dtype), v, g, beta]


def _masking(q, k, v, g, beta, rt, shared, kw):
    B, T, N = rt.write.shape
    H = q.shape[3]
    full = lambda z: None if z is None else z.expand(B, T, N, *z.shape[3:])  # noqa: E731
    wm, w, r = rt.write_mask[..., None], rt.write[..., None], rt.read[..., None]
    q, k, v, g, beta = _weighted(full(q), full(k), full(v), full(g), full(beta), wm, w, r)
    heads = lambda z: None if z is None else z.reshape(B, T, N * H, *z.shape[4:])  # noqa: E731
    xs = [heads(z) for z in (q, k, v, g, beta)]
    if shared is not None:
        xs = [None if a is None else torch.cat([a, shared[n]], dim=2)
              for a, n in zip(xs, ("q", "k", "v", "g", "beta"))]
    o, S = linear_recurrence(*_same_dtype(xs), **kw)
    P = N + (shared is not None)
    o = o.view(B, T, P, H, -1).sum(2)
    return o, None if S is None else S.view(B, P, H, *S.shape[2:])


def _varlen(q, k, v, g, beta, rt, shared, kw):
    B, T, N = rt.write.shape
    H, V = q.shape[3], v.shape[-1]
    member = rt.write_mask | rt.read_mask
    b, p, t = member.transpose(1, 2).nonzero(as_tuple=True)  # sorted by (sequence, partition, time)
    counts = member.sum(1).flatten()  # [B * N] segment lengths, (sequence, partition) order
    L = b.numel()

    def pick(z):
        if z is None:
            return None
        return z[b, t, p] if z.shape[2] > 1 else z[b, t, 0]

    wm, w, r = (x[b, t, p][:, None] for x in (rt.write_mask, rt.write, rt.read))
    xs = _weighted(pick(q), pick(k), pick(v), pick(g), pick(beta), wm, w, r)
    bounds = [torch.zeros(1, dtype=torch.long, device=q.device), counts.cumsum(0)]
    if shared is not None:
        xs = [None if a is None else torch.cat([a, shared[n].reshape(B * T, *shared[n].shape[2:])])
              for a, n in zip(xs, ("q", "k", "v", "g", "beta"))]
        bounds.append(L + T * torch.arange(1, B + 1, device=q.device))
    cu = torch.cat(bounds)
    o, S = linear_recurrence(*[None if a is None else a[None] for a in _same_dtype(xs)], cu_seqlens=cu, **kw)
    out = o.new_zeros(B * T, H, V).index_add(0, b * T + t, o[0, :L])
    out = out.view(B, T, H, V)
    if shared is not None:
        out = out + o[0, L:].view(B, T, H, V)
    if S is not None:
        parts = S[: B * N].view(B, N, *S.shape[1:])
        if shared is not None:
            parts = torch.cat([parts, S[B * N:, None]], dim=1)
        S = parts
    return out, S


def resolve_impl(impl: str, seq_len: int, partitions: int) -> str:
    if impl == "auto":
        long_and_wide = seq_len >= VARLEN_MIN_LEN and partitions >= VARLEN_MIN_PARTITIONS
        return "varlen" if long_and_wide else "masking"
    return impl

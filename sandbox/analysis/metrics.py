"""Metrics of a recurrent state and of routing decisions: pure functions on tensors.

Shapes follow the capture hook of ``sandbox.mixers.base.Mixer``: keys ``[B, T, H, K]``,
values ``[B, T, H, V]``, log-decay gates ``[B, T, H]`` or ``[B, T, H, K]``, routing
``[B, T, *groups, k]`` (chosen indices) or ``[B, T, *groups, n]`` (soft weights), final
state ``[B, H, K, V]`` (K state rows of V entries each).

Definitions (SSE paper, arXiv 2507.16577):
  * row-wise cosine similarity (Fig. 3, Definition 1): cos(S^i, S^j) between state rows;
  * singular-value entropy (Fig. 5, footnote 8): ``H = -1/log n * sum_i p_i log p_i`` with
    ``p_i = sigma_i^2 / sum_j sigma_j^2`` over the n = min(K, V) singular values;
  * receptive field (Appendix C, Definitions 3-4, Fig. 9): at query position t and channel c,
    ``M_t = max{t - s : prod_{j=s+1..t} alpha_j^c >= threshold, 0 <= s <= t}``, i.e. how many
    steps back the cumulative decay stays above the threshold (capped by t, the tokens there are).
"""
from __future__ import annotations

import math

import torch


# ---- state ----------------------------------------------------------------------------------

def row_cosine_similarity(state: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """``[..., K, V] -> [..., K, K]`` cosine similarity between rows; NaN where a row is zero
    (never written, e.g. a top-k row nobody chose)."""
    s = state.double()
    norm = s.norm(dim=-1, keepdim=True)
    unit = s / norm.clamp_min(eps)
    sim = unit @ unit.transpose(-1, -2)
    dead = (norm.squeeze(-1) <= eps)
    return sim.masked_fill(dead[..., :, None] | dead[..., None, :], float("nan"))


def mean_offdiagonal(sim: torch.Tensor, absolute: bool = True) -> float:
    """Mean over the off-diagonal entries of ``[..., K, K]`` (all leading dims pooled),
    ignoring NaN; ``absolute`` averages |cos| so anti-aligned rows count as similar."""
    K = sim.shape[-1]
    if K < 2:
        return float("nan")
    off = ~torch.eye(K, dtype=torch.bool, device=sim.device)
    vals = sim[..., off]
    vals = vals[~torch.isnan(vals)]
    if vals.numel() == 0:
        return float("nan")
    return float((vals.abs() if absolute else vals).mean())


def singular_value_entropy(state: torch.Tensor) -> torch.Tensor:
    """Normalised singular-value entropy of each ``[K, V]`` matrix: ``[..., K, V] -> [...]``
    in [0, 1] (1 = all singular values equal, 0 = rank one); NaN for a zero matrix or n = 1."""
    s = torch.linalg.svdvals(state.double())
    n = s.shape[-1]
    e = s.pow(2)
    total = e.sum(-1, keepdim=True)
    p = e / total
    plogp = torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros_like(p))
    h = -plogp.sum(-1) / math.log(n) if n > 1 else torch.full(p.shape[:-1], float("nan"), dtype=p.dtype)
    return h.masked_fill(total.squeeze(-1) <= 0, float("nan"))


# ---- decay gates ----------------------------------------------------------------------------

def receptive_field(log_gates: torch.Tensor, threshold: float = 1e-3) -> torch.Tensor:
    """Receptive field of every (position, channel): ``[B, T, *C] -> [B, T, prod(C)]`` (int64).

    ``log_gates`` are log-decays (<= 0); a channel is one decay lane (a head for scalar
    gates, a state row of a head for diagonal ones), flattened head-major. A step with log
    decay 0 (a top-k row left untouched) costs nothing, so such a channel can see back to
    the sequence start.
    """
    if not 0 < threshold < 1:
        raise ValueError(f"threshold: must be in (0, 1), got {threshold}")
    if log_gates.ndim < 2:
        raise ValueError(f"log_gates: expected [batch, seq, ...], got shape {tuple(log_gates.shape)}")
    g = log_gates.double().clamp_max(0.0).flatten(2) if log_gates.ndim > 2 else log_gates.double().clamp_max(0)[..., None]
    B, T, C = g.shape
    # A_s = -sum_{j<=s} g_j is non-decreasing; prod_{j=s+1..t} alpha_j = exp(A_s - A_t).
    A = (-g.cumsum(1)).transpose(1, 2).contiguous()              # [B, C, T]
    budget = -math.log(threshold)
    first = torch.searchsorted(A, A - budget * (1 + 1e-12), side="left")   # smallest valid s
    t = torch.arange(T, device=g.device)
    return (t - first).transpose(1, 2)


# ---- routing --------------------------------------------------------------------------------

def usage(routing: torch.Tensor, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """How often each choice (state row, partition, memory, head) is taken.

    ``routing`` is either integer indices ``[B, T, *groups, k]`` (k choices per token; a
    ``[B, T]`` tensor means one choice per token) or float soft weights / a boolean selection
    mask ``[B, T, *groups, n]``.
    Returns ``(use [*groups, n], balanced [*groups, 1])``: for indices, the fraction of tokens
    that select each choice (it sums to k); for weights, the mean weight. ``balanced`` is the
    level every choice has under perfectly even use (k/n), the target of a balance loss.
    """
    if routing.ndim < 2:
        raise ValueError(f"routing: expected [batch, seq, ...], got shape {tuple(routing.shape)}")
    if routing.dtype == torch.bool:                            # a selection mask: 0/1 weights
        routing = routing.double()
    if routing.dtype.is_floating_point:
        if routing.ndim < 3:
            raise ValueError("routing: soft weights need a choice dimension, [batch, seq, ..., n]")
        use = routing.double().mean(dim=(0, 1))
    else:
        idx = routing[..., None] if routing.ndim == 2 else routing
        n = int(idx.max()) + 1 if n is None else n
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise ValueError(f"routing: indices must lie in [0, {n}), got [{int(idx.min())}, {int(idx.max())}]")
        tokens = idx.shape[0] * idx.shape[1]
        groups = idx.shape[2:-1]
        flat = idx.movedim(-1, 2).reshape(-1, math.prod(groups)).T          # [groups, B*T*k]
        counts = torch.zeros(flat.shape[0], n, dtype=torch.float64, device=idx.device)
        counts.scatter_add_(1, flat, torch.ones(flat.shape, dtype=torch.float64, device=idx.device))
        use = (counts / tokens).view(*groups, n)
    return use, use.sum(-1, keepdim=True) / use.shape[-1]


def usage_summary(use: torch.Tensor) -> dict:
    """Scalar balance numbers of a usage tensor ``[*groups, n]`` (pooled over groups)."""
    share = use / use.sum(-1, keepdim=True).clamp_min(1e-300)
    n = use.shape[-1]
    ent = -(torch.where(share > 0, share * share.clamp_min(1e-300).log(), torch.zeros_like(share))).sum(-1)
    return {"choices": n,
            "max_over_balanced": float((share.max(-1).values * n).mean()),
            "usage_entropy": float((ent / math.log(n)).mean()) if n > 1 else float("nan"),
            "unused_fraction": float((use <= 0).double().mean())}


# ---- token clusters -------------------------------------------------------------------------

def key_rows(keys: torch.Tensor) -> torch.Tensor:
    """The state row each token writes to most: argmax of its key vector ``[..., K] -> [...]``."""
    return keys.argmax(-1)


def correlation_ratio(points: torch.Tensor, labels: torch.Tensor) -> float:
    """Share of the variance of ``points [N, D]`` explained by the grouping ``labels [N]``
    (between-group sum of squares / total): 1 = each group is one point, 0 = no structure."""
    x = points.double()
    centred = x - x.mean(0)
    total = centred.pow(2).sum()
    if total <= 0:
        return float("nan")
    _, inv = torch.unique(labels, return_inverse=True)
    g = int(inv.max()) + 1
    sums = torch.zeros(g, x.shape[1], dtype=x.dtype).index_add_(0, inv, centred)
    counts = torch.bincount(inv, minlength=g).double()
    between = (sums.pow(2).sum(-1) / counts).sum()
    return float(between / total)


def pca_2d(x: torch.Tensor) -> torch.Tensor:
    """Project ``[N, D]`` onto its two leading principal axes -> ``[N, 2]`` (zero-padded if D < 2)."""
    xc = x.double() - x.double().mean(0)
    _, _, vh = torch.linalg.svd(xc, full_matrices=False)
    y = xc @ vh[:2].T
    return torch.cat([y, y.new_zeros(y.shape[0], 2 - y.shape[1])], 1) if y.shape[1] < 2 else y


def tsne_2d(x: torch.Tensor, perplexity: float = 30.0, iters: int = 1000, seed: int = 0) -> torch.Tensor:
    """Exact t-SNE (van der Maaten & Hinton 2008) of ``[N, D]`` into 2-D; O(N^2) memory, so keep
    N to a few thousand. PCA initialisation, early exaggeration 12 for the first 250 steps,
    momentum 0.5 -> 0.8 and per-coordinate gains."""
    x = x.double()
    N = x.shape[0]
    if N < 4:
        return pca_2d(x)
    perplexity = min(perplexity, (N - 1) / 3)
    d2 = torch.cdist(x, x).pow(2)
    eye = torch.eye(N, dtype=torch.bool)
    # per-point precision by bisection on log(beta) so that the entropy of P_i = log(perplexity)
    lo = torch.full((N, 1), -50.0, dtype=x.dtype)
    hi = torch.full((N, 1), 50.0, dtype=x.dtype)
    target = math.log(perplexity)
    scale = d2.masked_fill(eye, float("inf")).min(1, keepdim=True).values.clamp_min(1e-12)
    for _ in range(64):
        mid = (lo + hi) / 2
        logits = (-(d2 / scale) * mid.exp()).masked_fill(eye, float("-inf"))
        p = logits.softmax(1)
        h = -(p * logits.log_softmax(1).masked_fill(eye, 0)).sum(1, keepdim=True)
        too_flat = h > target                                 # raise beta to sharpen
        lo = torch.where(too_flat, mid, lo)
        hi = torch.where(too_flat, hi, mid)
    P = (p + p.T) / (2 * N)
    P = P.clamp_min(1e-12).masked_fill(eye, 0).float()          # the descent runs in float32
    y = pca_2d(x).float()
    y = y / y[:, 0].std().clamp_min(1e-12) * 1e-4
    gen = torch.Generator().manual_seed(seed)
    y = y + 1e-6 * torch.randn(y.shape, generator=gen).to(y.dtype)
    lr = max(N / 12 / 4, 50.0)
    update = torch.zeros_like(y)
    gains = torch.ones_like(y)
    for it in range(iters):
        exag = 12.0 if it < 250 else 1.0
        w = 1.0 / (1.0 + torch.cdist(y, y).pow(2))
        w = w.masked_fill(eye, 0)
        Q = (w / w.sum()).clamp_min(1e-12)
        m = (exag * P - Q) * w
        grad = 4 * (m.sum(1, keepdim=True) * y - m @ y)
        same = (grad > 0) == (update > 0)
        gains = torch.where(same, gains * 0.8, gains + 0.2).clamp_min(0.01)
        update = (0.5 if it < 250 else 0.8) * update - lr * gains * grad
        y = y + update
        y = y - y.mean(0)
    return y.double()

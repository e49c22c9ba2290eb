"""Feature maps phi for linear attention, and row-sparse softmax-top-k keys (SSE paper, eq. 7).

``feature_map(name, x)`` applies phi over the last (head) dimension. ``softmax_topk(logits, k)``
returns keys that are a softmax over the k largest logits and exactly zero elsewhere,
together with the boolean mask of the selected rows (``topk_mask``).
``balance_loss`` is the row-usage balance term of SSE §3.2: ``alpha * c/k * sum_i f_i * P_i``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

FEATURE_MAPS = ("identity", "relu", "silu", "elu1", "softmax")


def feature_map(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "identity":
        return x
    if name == "relu":
        return F.relu(x)
    if name == "silu":
        return F.silu(x)
    if name == "elu1":
        return F.elu(x) + 1.0
    if name == "softmax":
        return x.softmax(dim=-1)
    raise ValueError(f"feature_map must be one of {FEATURE_MAPS}, got {name!r}")


def topk_mask(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the k largest entries over the last dim (no gradient): entry i is chosen when fewer than
    k entries beat it, an entry beating i when it is larger, or equal and earlier. So exactly k are chosen per
    row, ties going to the earlier entry.

    By pairwise comparison rather than ``torch.topk``: on rows this short (GLA's 32 key rows, GSA's 64 slots)
    topk runs a sort per row, 6.0 of the 30.2 ms of a stack of 9 Figure 8 GLA top-8 runs on the H200, where
    compiled, the comparisons and their count are one reduction kernel. Eager, it holds a [..., c, c] bool."""
    c = logits.shape[-1]
    if not 1 <= k <= c:
        raise ValueError(f"topk must be in [1, {c}] (the key dimension), got {k}")
    x = logits.detach()
    i = torch.arange(c, device=x.device)
    earlier = i[None, :] < i[:, None]                    # [i, j]: entry j comes before entry i
    xi, xj = x[..., :, None], x[..., None, :]
    return ((xj > xi) | ((xj == xi) & earlier)).sum(-1) < k


def softmax_topk(logits: torch.Tensor, k: int):
    """k_t = softmax(top-k(logits)) over the last dim; returns (keys, mask of the chosen entries)."""
    mask = topk_mask(logits, k)
    return logits.masked_fill(~mask, float("-inf")).softmax(dim=-1), mask


def chosen_indices(logits: torch.Tensor, mask: torch.Tensor, k: int) -> torch.Tensor:
    """The k entries ``mask`` chose, largest logit first (``[..., k]``; for recording the routing)."""
    return logits.detach().masked_fill(~mask, float("-inf")).topk(k, dim=-1).indices


def balance_loss(keys: torch.Tensor, mask: torch.Tensor, k: int, alpha: float) -> torch.Tensor:
    """``alpha * c/k * sum_i f_i * P_i`` per head, averaged over heads.

    keys, mask: ``[B, T, H, c]``. ``f_i`` is the fraction of tokens that select row i (no
    gradient), ``P_i`` the mean key weight of row i. Equals ``alpha`` under uniform usage.
    """
    c = keys.shape[-1]
    f = mask.to(keys.dtype).mean(dim=(0, 1))  # [H, c]
    p = keys.mean(dim=(0, 1))  # [H, c]
    return alpha * c / k * (f * p).sum(-1).mean()

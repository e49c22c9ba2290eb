"""Feature maps phi for linear attention, and row-sparse softmax-top-k keys (SSE paper, eq. 7).

``feature_map(name, x)`` applies phi over the last (head) dimension. ``softmax_topk(logits, k)``
returns keys that are a softmax over the k largest logits and exactly zero elsewhere,
together with the boolean mask of the selected rows (``topk_mask``).
``balance_loss`` is the row-usage balance term of SSE §3.2: ``alpha * c/k * sum_i f_i * P_i``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sandbox.kernels.topk_mask import topk_mask

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

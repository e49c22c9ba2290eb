"""Which entries of each row are its k largest: ``topk_mask(x, k)``, a boolean mask over the last dim.

Entry i is chosen when fewer than k entries beat it, an entry beating i when it is larger, or equal and
earlier. So exactly k are chosen per row, ties going to the earlier entry. No gradient flows through it.

Why an op of its own. ``torch.topk`` on rows this short (GLA's 32 key rows, GSA's 64 slots) sorts each row, a
fifth of a stacked GLA top-8 step. The same count written as torch comparisons compiled into one reduction, but
Inductor then inlines whatever computed x into it and redoes that for every pair (costly for GSA's slots, whose
logits come out of the gate's log-sigmoid). As a custom op, x is computed once, and on CUDA the Triton kernel of
``triton_topk_mask.py`` finds each row's k-th largest entry by radix selection in registers, faster than both
counting the pairs and ``torch.topk`` (results/throughput/README.md). Elsewhere, and for float64, the torch form
below counts the pairs (it holds a [rows, c, c] bool). Rows fold: under ``vmap`` a stack's replicas are more rows.
"""
from __future__ import annotations

import torch

from sandbox.kernels.library import op


def _pairwise(x: torch.Tensor, k: int) -> torch.Tensor:
    c = x.shape[-1]
    i = torch.arange(c, device=x.device)
    earlier = i[None, :] < i[:, None]                    # [i, j]: entry j comes before entry i
    xi, xj = x[..., :, None], x[..., None, :]
    return ((xj > xi) | ((xj == xi) & earlier)).sum(-1) < k


@op("sandbox::topk_mask")
def _op(x: torch.Tensor, k: int) -> torch.Tensor:
    if x.is_cuda and x.dtype != torch.float64:
        from sandbox.kernels.triton_topk_mask import topk_mask_triton   # Triton only where it runs
        return topk_mask_triton(x, k)
    return _pairwise(x, k)


@_op.register_fake
def _op_fake(x, k):
    return torch.empty(x.shape, dtype=torch.bool, device=x.device)


@_op.register_vmap
def _op_vmap(info, in_dims, x, k):
    """A row-wise op: the replicas' rows are more rows."""
    return torch.ops.sandbox.topk_mask(x.movedim(in_dims[0], 0), k), 0


def topk_mask(x: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the k largest entries of each row of x ``[..., c]`` (ties to the earlier entry)."""
    c = x.shape[-1]
    if not 1 <= k <= c:
        raise ValueError(f"topk must be in [1, {c}] (the key dimension), got {k}")
    return torch.ops.sandbox.topk_mask(x.detach(), k)

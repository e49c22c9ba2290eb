"""Embedding lookup whose backward sums each token's gradient rows in a fixed order.

The weight gradient of a lookup is a scatter-add of the output gradient's rows into the table. On a
GPU that is one atomic add per token and column, and MQAR inputs repeat one token most of the time
(the filler 0 takes 60-90% of the positions): tens of thousands of adds queue on the same row.
torch.compile's code for it (fused with the first norm's backward) was the costliest kernel of the
SSE Figure 8 step (results/throughput/README.md, "The embedding backward"), and atomic adds finish in
no fixed order, so the same run could give other bits each time.

Here the ids are sorted, tiles of BT sorted positions sum each token's rows with one small matrix
product, and each table row then adds its token's tile sums in tile order (``triton_embedding.py``):
no atomics, and the result depends only on the inputs.

``embedding(weight, ids)`` is a torch custom op (opaque to torch.compile, which would otherwise
decompose the backward back into one add per token) with a vmap rule that folds stacked replicas
into the table's rows. On CUDA the lookup and the backward are Triton kernels (``triton_embedding.py``,
which also run on CPU tensors under ``TRITON_INTERPRET=1``, for the tests); elsewhere ``weight[ids]`` and
torch's ``index_add_``.
"""
from __future__ import annotations

import torch

from sandbox.kernels.library import op


@op("sandbox::embedding_grad")
def _grad_op(ids: torch.Tensor, grad: torch.Tensor, num_rows: int) -> torch.Tensor:
    if grad.is_cuda:
        from sandbox.kernels.triton_embedding import embedding_grad_triton   # Triton only where it runs
        return embedding_grad_triton(ids, grad, num_rows)
    return torch.zeros(num_rows, grad.shape[1], dtype=torch.float32, device=grad.device).index_add_(
        0, ids, grad.float())


@_grad_op.register_fake
def _grad_op_fake(ids, grad, num_rows):
    return grad.new_empty(num_rows, grad.shape[1], dtype=torch.float32)


@op("sandbox::embedding")
def _op(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    if weight.is_cuda:
        from sandbox.kernels.triton_embedding import embedding_triton
        return embedding_triton(weight, ids)
    return weight[ids]


@_op.register_fake
def _op_fake(weight, ids):
    return weight.new_empty(*ids.shape, weight.shape[1])


def _setup(ctx, inputs, output):
    weight, ids = inputs
    ctx.save_for_backward(ids)
    ctx.rows, ctx.dtype = weight.shape[0], weight.dtype


def _backward(ctx, grad):
    (ids,) = ctx.saved_tensors
    g = torch.ops.sandbox.embedding_grad(ids.reshape(-1), grad.reshape(-1, grad.shape[-1]), ctx.rows)
    return g.to(ctx.dtype), None


_op.register_autograd(_backward, setup_context=_setup)


@_op.register_vmap
def _op_vmap(info, in_dims, weight, ids):
    """Stacked replicas: tables [R, V, D] become one [R * V, D] table and replica r's ids point into
    its own block of rows."""
    R = info.batch_size
    wd, idd = in_dims
    if wd is None:                               # one table, batched ids: plain extra leading axes
        return torch.ops.sandbox.embedding(weight, ids), idd
    weight = weight.movedim(wd, 0)
    ids = ids.movedim(idd, 0) if idd is not None else ids.expand(R, *ids.shape)
    V = weight.shape[1]
    offset = (torch.arange(R, device=ids.device) * V).view(R, *([1] * (ids.dim() - 1)))
    return torch.ops.sandbox.embedding(weight.reshape(R * V, -1), ids + offset), 0


def embedding(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``weight[ids]`` (``[*ids.shape, D]``); its weight gradient sums each token's rows in a fixed order."""
    return torch.ops.sandbox.embedding(weight, ids)

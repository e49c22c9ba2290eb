"""The training loss: cross-entropy of rows of logits against their targets, per row, as one op.

``cross_entropy(logits, target)``: ``nll [N]`` (float32, float64 for float64 logits), 0 where the target is
``IGNORE`` (-100), for logits ``[N, V]`` in any float dtype (computed in float32 or wider).

Why an op of its own: torch.compile's code for ``F.cross_entropy(logits.float(), ...)`` read the bf16 logits
well below the GPU's bandwidth in its forward (an online-softmax reduction), and its backward evaluated the
gradient of the target pick as a second reduction over each row. Here the forward is one Triton kernel that
reads each row once (``triton_cross_entropy.py``) and keeps only its log-sum-exp. The backward,
``(softmax - onehot(target)) * grad``, is an op too (``sandbox::cross_entropy_grad``), one Triton kernel that
reads each row once and writes its gradient: as plain torch an uncompiled step ran it as six kernels over the
[N, V] logits in float32 (0.68 ms of a 5.1 ms GLA d128 step on an H200: results/throughput/eager_profile.md),
which only torch.compile fused. Elsewhere than CUDA both are plain torch (``torch.logsumexp``; the gradient's formula).
"""
from __future__ import annotations

import torch

from sandbox.kernels.library import on_triton, op, work_dtype

IGNORE = -100


@op("sandbox::cross_entropy")
def _op(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if on_triton(logits):
        from sandbox.kernels.triton_cross_entropy import cross_entropy_rows_triton   # Triton only where it runs
        return cross_entropy_rows_triton(logits, target, IGNORE)
    x = logits.to(work_dtype(logits.dtype))
    lse = torch.logsumexp(x, -1)
    keep = target != IGNORE
    picked = x.gather(1, torch.where(keep, target, 0)[:, None])[:, 0]
    return torch.where(keep, lse - picked, 0.0), lse


@_op.register_fake
def _op_fake(logits, target):
    n = logits.shape[0]
    dt = work_dtype(logits.dtype)
    return logits.new_empty(n, dtype=dt), logits.new_empty(n, dtype=dt)


@op("sandbox::cross_entropy_grad")
def _grad(logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    if on_triton(logits):
        from sandbox.kernels.triton_cross_entropy import cross_entropy_grad_triton
        return cross_entropy_grad_triton(logits, target, lse, g, IGNORE)
    cols = torch.arange(logits.shape[1], device=logits.device)
    p = torch.exp(logits.to(lse.dtype) - lse[:, None])
    g = torch.where(target != IGNORE, g.to(lse.dtype), 0.0)
    return ((p - (cols[None, :] == target[:, None]).to(p.dtype)) * g[:, None]).to(logits.dtype)


@_grad.register_fake
def _grad_fake(logits, target, lse, g):
    return logits.new_empty(logits.shape)


def _setup(ctx, inputs, output):
    logits, target = inputs
    ctx.save_for_backward(logits, target, output[1])


def _backward(ctx, g, _):
    logits, target, lse = ctx.saved_tensors
    return torch.ops.sandbox.cross_entropy_grad(logits, target, lse, g), None


_op.register_autograd(_backward, setup_context=_setup)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-row negative log-likelihood of ``target`` (int64, ``IGNORE`` rows give 0) under ``logits [..., V]``;
    the shape of ``target``."""
    nll, _ = torch.ops.sandbox.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    return nll.view(target.shape)

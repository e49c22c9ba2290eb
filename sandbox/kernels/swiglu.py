"""SwiGLU's up projection and gate as one op: ``swiglu(x, w) = silu(x w[:H]^T) * (x w[H:]^T)``.

``x [..., D]``, ``w [2H, D]`` (the ``up`` Linear's weight, its first H rows the gate's); the result
``[..., H]`` in x's dtype. Under autocast the caller passes x in the autocast dtype and the weight is cast
to it here, as ``nn.Linear`` would; each product is rounded to that dtype before the gate, as when it was
written to memory.

Why an op of its own: compiled, the up projection wrote its [M, 2H] product to memory, a pointwise kernel
read it back for the gate, and the backward read it again for the gate's gradient. At a stack of 9
Figure 8 runs on the H200 that product is 0.75 GB per layer. Here one Triton kernel
(``triton_swiglu.py``) forms both products tile by tile and writes only the gated [M, H]; the backward
forms them again from x (saved anyway for the weight gradient) and writes the product's gradient, from
which two matrix products give dx and dw, as before.

A torch custom op with its own backward and a vmap rule that folds stacked replicas into its group
dimension, each with its own weight (an ``autograd.Function`` would lose its backward under
``torch.compile`` inside ``vmap``: ``short_conv.py``). Off CUDA, and for float64, the torch form below.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _triton(x: torch.Tensor) -> bool:
    return x.is_cuda and x.dtype != torch.float64


def _products(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [G, M, D], w [G, 2H, D]: a, b [G, M, H] in float32 or wider, each rounded to x's dtype."""
    ab = torch.bmm(x, w.transpose(1, 2))
    return ab.to(torch.promote_types(x.dtype, torch.float32)).chunk(2, -1)


@torch.library.custom_op("sandbox::swiglu", mutates_args=())
def _op(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if _triton(x):
        from sandbox.kernels.triton_swiglu import swiglu_triton   # Triton only where it runs
        return swiglu_triton(x, w)
    a, b = _products(x, w)
    return (F.silu(a) * b).to(x.dtype)


@_op.register_fake
def _op_fake(x, w):
    return x.new_empty(x.shape[0], x.shape[1], w.shape[1] // 2)


@torch.library.custom_op("sandbox::swiglu_grad", mutates_args=())
def _grad_op(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The gradient of the up projection's [G, M, 2H] product, in x's dtype."""
    if _triton(x):
        from sandbox.kernels.triton_swiglu import swiglu_grad_triton
        return swiglu_grad_triton(dy, x, w)
    a, b = _products(x, w)
    s = torch.sigmoid(a)
    d = dy.to(a.dtype)
    return torch.cat([d * b * s * (1 + a * (1 - s)), d * a * s], -1).to(x.dtype)


@_grad_op.register_fake
def _grad_op_fake(dy, x, w):
    return x.new_empty(x.shape[0], x.shape[1], w.shape[1])


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, dy):
    x, w = ctx.saved_tensors
    dh = torch.ops.sandbox.swiglu_grad(dy, x, w)
    return torch.bmm(dh, w), torch.bmm(dh.transpose(1, 2), x)


_op.register_autograd(_backward, setup_context=_setup)


def _batched(info, in_dims, *ts):
    R = info.batch_size
    return [t.movedim(d, 0) if d is not None else t.expand(R, *t.shape) for t, d in zip(ts, in_dims)]


@_op.register_vmap
def _op_vmap(info, in_dims, x, w):
    """Stacked replicas: x [R, G, M, D] and w [R, G, 2H, D] become R * G groups."""
    x, w = _batched(info, in_dims, x, w)
    R, G = x.shape[:2]
    y = torch.ops.sandbox.swiglu(x.reshape(R * G, *x.shape[2:]), w.reshape(R * G, *w.shape[2:]))
    return y.view(R, G, *y.shape[1:]), 0


def swiglu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """silu(x w[:H]^T) * (x w[H:]^T) for x [..., D] and w [2H, D]: [..., H] in x's dtype."""
    lead, D = x.shape[:-1], x.shape[-1]
    y = torch.ops.sandbox.swiglu(x.reshape(1, -1, D), w.to(x.dtype)[None])
    return y.view(*lead, y.shape[-1])

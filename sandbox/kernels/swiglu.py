"""The SwiGLU activation of the MLP as one op: ``swiglu(u) = silu(a) * b`` for ``u = [a | b]`` of width 2H.

Why: uncompiled, ``a, b = u.chunk(2, -1); F.silu(a) * b`` runs a silu and a mul forward, and backward a
silu_backward, two muls and a cat of the two halves' gradients, each a pass over memory: ~0.35 ms of a 5 ms training
step on an H200 (results/throughput/eager_profile.md). On CUDA ``sandbox::swiglu`` is one Triton kernel that reads u
once and writes h, and its gradient (``sandbox::swiglu_grad``) one kernel that reads dh and u once and writes du
whole (``triton_swiglu.py``). Elsewhere both are plain torch in float32 (float64 for float64 u), cast to u's dtype:
the reference the kernels are tested against.

When: ``library.use_fused(u)``, in uncompiled steps on CUDA. A compiled step leaves the activation to Inductor, which
fuses it on its own. Stacked replicas (vmap) run the ops once per replica.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sandbox.kernels.library import on_triton, op, work_dtype


@op("sandbox::swiglu")
def _op(u: torch.Tensor) -> torch.Tensor:
    if on_triton(u):
        from sandbox.kernels.triton_swiglu import swiglu_forward   # Triton only where it runs
        return swiglu_forward(u)
    a, b = u.to(work_dtype(u.dtype)).chunk(2, dim=-1)
    return (F.silu(a) * b).to(u.dtype)


@_op.register_fake
def _op_fake(u):
    return u.new_empty(u.shape[0], u.shape[1] // 2)


@op("sandbox::swiglu_grad")
def _grad(dh: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    if on_triton(u):
        from sandbox.kernels.triton_swiglu import swiglu_backward
        return swiglu_backward(dh, u)
    a, b = u.to(work_dtype(u.dtype)).chunk(2, dim=-1)
    g = dh.to(a.dtype)
    s = torch.sigmoid(a)
    return torch.cat([g * b * s * (1 + a * (1 - s)), g * a * s], dim=-1).to(u.dtype)


@_grad.register_fake
def _grad_fake(dh, u):
    return u.new_empty(u.shape)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, dh):
    (u,) = ctx.saved_tensors
    return torch.ops.sandbox.swiglu_grad(dh, u)


_op.register_autograd(_backward, setup_context=_setup)
_op.vmap_per_replica()
_grad.vmap_per_replica()


def swiglu(u: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` for ``u = [a | b]`` [..., 2H]: h [..., H] in u's dtype."""
    h = torch.ops.sandbox.swiglu(u.reshape(-1, u.shape[-1]))
    return h.view(*u.shape[:-1], h.shape[-1])

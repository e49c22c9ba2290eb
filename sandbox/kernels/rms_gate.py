"""The end of a linear mixer before its output projection (``LinearMixer.finish`` with ``output_norm="rms"``) as
one op: the per-head RMS norm with its weight, then the silu output gate.

``rms_gate(o, weight, og)``: ``o * rsqrt(mean(o^2, -1) + eps) * weight``, flattened over the heads, times
``silu(og)`` where there is a gate; o [B, T, H, V], weight [H, V], og [B, T, H * V].

Why an op of its own: uncompiled, that expression is about 8 kernels forward and 12 backward (the square, the mean,
rsqrt, the products, silu, the sum over B and T for the weight's gradient), about 0.4 ms of a 5 ms GLA training step
on an H200 (results/throughput/eager_profile.md). On CUDA it is one Triton kernel each way (``triton_rms_gate.py``),
everything in float32; elsewhere, and for float64, the torch form below, also in float32 or wider.

When: ``library.use_fused(o)``, the uncompiled step on a GPU. torch.compile fuses the expression itself. Stacked
replicas (vmap) run the op once per replica, each with its own weight.

The output's dtype: without autocast, the expression's (``o * weight`` promotes bf16 o with a float32 weight to
float32). Under autocast, the autocast dtype instead: the expression's float32 result goes only to the output
projection, a Linear that autocast casts to bf16 anyway, so writing bf16 gives that Linear the same values
(rounded once instead of after each bf16 step) and saves the float32 write, the cast and the cast's backward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sandbox.kernels.library import on_triton, op, work_dtype


@op("sandbox::rms_gate")
def _op(o: torch.Tensor, weight: torch.Tensor, og: torch.Tensor | None, eps: float,
        dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    if on_triton(o):
        from sandbox.kernels.triton_rms_gate import rms_gate_triton   # Triton only where it runs
        return rms_gate_triton(o, weight, og, eps, dtype)
    x = o.to(work_dtype(o.dtype))
    rstd = torch.rsqrt(x.pow(2).mean(-1) + eps)
    y = (x * rstd[..., None] * weight.to(x.dtype)).flatten(-2)
    if og is not None:
        y = y * F.silu(og.to(x.dtype))
    return y.to(dtype), rstd


@_op.register_fake
def _op_fake(o, weight, og, eps, dtype):
    y = o.new_empty(*o.shape[:-2], o.shape[-2] * o.shape[-1], dtype=dtype)
    return y, o.new_empty(o.shape[:-1], dtype=work_dtype(o.dtype))


@op("sandbox::rms_gate_grad")
def _grad_op(dy: torch.Tensor, o: torch.Tensor, weight: torch.Tensor, og: torch.Tensor | None,
             rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(d_o, dw, d_og): d_og is empty without a gate (an op returns no optional tensors)."""
    if on_triton(o):
        from sandbox.kernels.triton_rms_gate import rms_gate_grad_triton
        do, dw, dog = rms_gate_grad_triton(dy, o, weight, og, rstd)
    else:
        xhat = o.to(rstd.dtype) * rstd[..., None]
        w = weight.to(rstd.dtype)
        dn = dy.to(rstd.dtype).reshape(o.shape)
        dog = None
        if og is not None:
            g = og.to(rstd.dtype).reshape(o.shape)
            s = torch.sigmoid(g)
            dog = (dn * xhat * w * s * (1 + g * (1 - s))).flatten(-2)
            dn = dn * g * s
        dw = (dn * xhat).reshape(-1, *w.shape).sum(0)
        dnw = dn * w
        do = rstd[..., None] * (dnw - xhat * (dnw * xhat).mean(-1, keepdim=True))
    dog = dog.to(og.dtype) if og is not None else o.new_empty(0)
    return do.to(o.dtype), dw.to(weight.dtype), dog


@_grad_op.register_fake
def _grad_op_fake(dy, o, weight, og, rstd):
    return torch.empty_like(o), torch.empty_like(weight), torch.empty_like(og) if og is not None else o.new_empty(0)


def _setup(ctx, inputs, output):
    o, weight, og, _, _ = inputs
    ctx.save_for_backward(o, weight, og, output[1])


def _backward(ctx, dy, _):
    o, weight, og, rstd = ctx.saved_tensors
    do, dw, dog = torch.ops.sandbox.rms_gate_grad(dy, o, weight, og, rstd)
    return do, dw, dog if og is not None else None, None, None


_op.register_autograd(_backward, setup_context=_setup)
_op.vmap_per_replica()
_grad_op.vmap_per_replica()


def rms_gate(o: torch.Tensor, weight: torch.Tensor, og: torch.Tensor | None = None,
             eps: float = 1e-6) -> torch.Tensor:
    """``(o * rsqrt(mean(o^2, -1) + eps) * weight).flatten(-2) * silu(og)`` (no gate where og is None):
    o [B, T, H, V], weight [H, V], og [B, T, H * V]; [B, T, H * V] in the autocast dtype under autocast, else in
    the dtype the expression gives."""
    dev = o.device.type
    if torch.is_autocast_enabled(dev):
        dtype = torch.get_autocast_dtype(dev)
    else:
        dtype = torch.promote_types(o.dtype, weight.dtype)
        dtype = torch.promote_types(dtype, og.dtype) if og is not None else dtype
    return torch.ops.sandbox.rms_gate(o, weight, og, eps, dtype)[0]

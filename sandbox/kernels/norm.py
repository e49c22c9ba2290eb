"""The model's residual-stream norms (LayerNorm, or RMSNorm) over the last dimension, with the output cast, as one
op.

``norm_cast(x, weight, bias, eps, rms, out_dtype)``: ``y = (x - mean) * rstd * weight + bias`` over the last
dimension D of x [..., D], ``rstd = 1 / sqrt(var + eps)`` (the biased variance, as in ``nn.LayerNorm``); with
``rms``, RMSNorm: nothing subtracted, ``rstd = 1 / sqrt(mean(x^2) + eps)``, and bias usually None. Statistics in
float32 (float64 for float64 x); y comes out in ``out_dtype``, and the gradient of x in x's dtype.

Why an op of its own: in the uncompiled training step with a single replica, torch's layer_norm kernel on 128-wide
float32 rows (about 0.9 TB/s) plus the separate casts to bf16 and back cost about 1 ms of a 5 ms GLA d128 T320 step
on an H200 (results/throughput/eager_profile.md). On CUDA this is one Triton kernel each way (``triton_norm.py``)
that reads the rows once and writes y directly in the dtype the next matmul reads. Elsewhere, and for float64, it is
the same computation in plain torch.

When: ``library.use_fused(x)``, the uncompiled step on a GPU. torch.compile leaves norms to Inductor, which fuses them
with their neighbours. Stacked replicas (vmap) run the op once per replica, each with its own weight.
"""
from __future__ import annotations

import torch

from sandbox.kernels.library import on_triton, op, work_dtype


@op("sandbox::norm")
def _op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool,
        out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [N, D]: (y [N, D] in ``out_dtype``, mean [N], rstd [N]); mean is empty for RMS (an op returns no
    optional tensors)."""
    if on_triton(x):
        from sandbox.kernels.triton_norm import norm_forward   # Triton only where it runs
        y, mean, rstd = norm_forward(x, weight, bias, eps, rms, out_dtype)
        return y, mean if mean is not None else rstd.new_empty(0), rstd
    xc = x.to(work_dtype(x.dtype))
    mean = xc.new_empty(0) if rms else xc.mean(-1)
    if not rms:
        xc = xc - mean[:, None]
    rstd = torch.rsqrt(xc.pow(2).mean(-1) + eps)
    y = xc * rstd[:, None] * weight.to(xc.dtype)
    if bias is not None:
        y = y + bias.to(xc.dtype)
    return y.to(out_dtype), mean, rstd


@_op.register_fake
def _op_fake(x, weight, bias, eps, rms, out_dtype):
    n, dt = x.shape[0], work_dtype(x.dtype)
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty(0 if rms else n, dtype=dt), x.new_empty(n, dtype=dt)


@op("sandbox::norm_grad")
def _grad_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
             rms: bool, has_bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx in x's dtype, dw, db in rstd's dtype); db is empty without a bias."""
    if on_triton(x):
        from sandbox.kernels.triton_norm import norm_backward
        dx, dw, db = norm_backward(dy, x, weight, None if rms else mean, rstd, rms, has_bias)
        return dx, dw, db if db is not None else dw.new_empty(0)
    xhat = x.to(rstd.dtype) if rms else x.to(rstd.dtype) - mean[:, None]
    xhat = xhat * rstd[:, None]
    d = dy.to(rstd.dtype)
    g = d * weight.to(rstd.dtype)
    dx = g - xhat * (g * xhat).mean(-1, keepdim=True)
    if not rms:
        dx = dx - g.mean(-1, keepdim=True)
    db = d.sum(0) if has_bias else rstd.new_empty(0)
    return (rstd[:, None] * dx).to(x.dtype), (d * xhat).sum(0), db


@_grad_op.register_fake
def _grad_op_fake(dy, x, weight, mean, rstd, rms, has_bias):
    D = x.shape[1]
    return x.new_empty(x.shape), rstd.new_empty(D), rstd.new_empty(D if has_bias else 0)


def _setup(ctx, inputs, output):
    x, weight, bias, _, rms, _ = inputs
    ctx.rms, ctx.bias_dtype = rms, bias.dtype if bias is not None else None
    ctx.save_for_backward(x, weight, output[1], output[2])


def _backward(ctx, dy, _mean, _rstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = torch.ops.sandbox.norm_grad(dy, x, weight, mean, rstd, ctx.rms, ctx.bias_dtype is not None)
    return dx, dw.to(weight.dtype), db.to(ctx.bias_dtype) if ctx.bias_dtype is not None else None, None, None, None


_op.register_autograd(_backward, setup_context=_setup)
_op.vmap_per_replica()
_grad_op.vmap_per_replica()


def norm_cast(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool,
              out_dtype: torch.dtype) -> torch.Tensor:
    """LayerNorm (RMSNorm with ``rms``) of x [..., D] over its last dimension, with weight [D] and bias [D] or
    None: y [..., D] in ``out_dtype``."""
    y = torch.ops.sandbox.norm(x.reshape(-1, x.shape[-1]), weight, bias, eps, rms, out_dtype)[0]
    return y.view(x.shape)

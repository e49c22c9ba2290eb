"""The short causal depthwise convolution of the linear mixers (conv on q, k, v), with its silu, as one op.

``short_conv(x, w)``: ``silu(y)``, ``y[..., t, c] = sum_j w[c, j] x[..., t + j - (W - 1), c]`` (x zero before the
sequence starts), summed in float32 (float64 for float64 inputs) and returned in x's dtype.

Why an op of its own: traced by torch.compile, the shifted multiply-adds became a padded float32 copy of x, a
float32 pre-activation saved for the backward, and a backward that recomputed the gradients of the pieces cut
from the output (q, k, v: masked, every piece at every column) at each of the W shifts: with stacked replicas
over a quarter of the step (results/throughput/short_conv.md). Eagerly, cuDNN's depthwise ``conv1d`` was no
better.

So the convolution is a torch custom op: opaque to torch.compile, with its own backward and a vmap rule that
folds stacked replicas into the batch, each with its own weights. An ``autograd.Function`` would not do:
under ``torch.compile`` inside ``vmap``, torch 2.11-2.13 inline its forward and differentiate that, ignoring
its backward (pytorch/pytorch#129845); a custom op keeps its backward there. On CUDA it runs the Triton
kernels of ``triton_short_conv.py`` (which also run on CPU tensors under ``TRITON_INTERPRET=1``, for the
tests); elsewhere, and for float64 inputs or filters over 4 taps, the torch form below.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sandbox.kernels.library import op


def _triton(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the Triton kernels take this call: CUDA, 16/32-bit inputs, filters of at most 4 taps."""
    return x.is_cuda and x.dtype != torch.float64 and w.shape[-1] <= 4


def _work(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _pre_activation(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [N, T, C], w [G, C, W]: the convolution before the silu, in float32 or wider."""
    N, T, _ = x.shape
    G, _, W = w.shape
    xp = F.pad(x.to(_work(x)), (0, 0, W - 1, 0))
    wn = w.to(_work(x)).repeat_interleave(N // G, 0)[:, None]           # [N, 1, C, W]
    return sum(xp[:, j:j + T] * wn[..., j] for j in range(W))


@op("sandbox::short_conv")
def _op(x: torch.Tensor, w: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    if _triton(x, w):
        from sandbox.kernels.triton_short_conv import short_conv_triton   # Triton only where it runs
        return short_conv_triton(x, w, sizes)
    return [y.contiguous() for y in F.silu(_pre_activation(x, w)).to(x.dtype).split(sizes, -1)]


@_op.register_fake
def _op_fake(x, w, sizes):
    return [x.new_empty(*x.shape[:-1], n) for n in sizes]


@op("sandbox::short_conv_grad")
def _grad_op(dys: list[torch.Tensor], x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if _triton(x, w):
        from sandbox.kernels.triton_short_conv import short_conv_grad_triton
        return short_conv_grad_triton(dys, x, w)
    N, T, C = x.shape
    G, _, W = w.shape
    a = _pre_activation(x, w)
    s = torch.sigmoid(a)
    da = torch.cat(dys, -1).to(a.dtype) * s * (1 + a * (1 - s))
    dap = F.pad(da, (0, 0, 0, W - 1))
    wn = w.to(a.dtype).repeat_interleave(N // G, 0)[:, None]
    dx = sum(dap[:, W - 1 - j:W - 1 - j + T] * wn[..., j] for j in range(W))
    xp = F.pad(x.to(a.dtype), (0, 0, W - 1, 0))
    dw = torch.stack([(da * xp[:, j:j + T]).view(G, -1, C).sum(1) for j in range(W)], -1)
    return dx.to(x.dtype), dw                       # dw in float32 (float64 for float64 inputs)


@_grad_op.register_fake
def _grad_op_fake(dys, x, w):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty(w.shape, dtype=_work(x), device=w.device)


def _setup(ctx, inputs, output):
    x, w, sizes = inputs
    ctx.save_for_backward(x, w)
    ctx.sizes = sizes


def _backward(ctx, dys):
    x, w = ctx.saved_tensors
    dys = [d if d is not None else x.new_zeros(*x.shape[:-1], n) for d, n in zip(dys, ctx.sizes)]  # an unused piece
    dx, dw = torch.ops.sandbox.short_conv_grad(dys, x, w)
    return dx, dw.to(w.dtype), None


_op.register_autograd(_backward, setup_context=_setup)


@_op.register_vmap
def _op_vmap(info, in_dims, x, w, sizes):
    """Stacked replicas: inputs [R, N, T, C] and weights [R, G, C, W] become one batch of R * N sequences
    with R * G weight groups (replica r's sequences keep to its own weights)."""
    R = info.batch_size
    xd, wd, _ = in_dims
    x = x.movedim(xd, 0) if xd is not None else x.expand(R, *x.shape)
    w = w.movedim(wd, 0) if wd is not None else w.expand(R, *w.shape)
    N = x.shape[1]
    ys = torch.ops.sandbox.short_conv(x.reshape(R * N, *x.shape[2:]), w.reshape(R * w.shape[1], *w.shape[2:]), sizes)
    return [y.view(R, N, *y.shape[1:]) for y in ys], [0] * len(ys)


def short_conv(x: torch.Tensor, w: torch.Tensor, sizes: list[int] | None = None) -> tuple[torch.Tensor, ...]:
    """silu of the causal depthwise convolution of x [..., T, C] with w [C, W], in x's dtype, as pieces of
    columns of the given widths (one to three; default: the whole): ``y.split(sizes, -1)``, but each piece a
    tensor of its own, written in place by the kernel, and their gradients read where they lie. So the backward
    concatenates nothing (autograd's backward of a split is a concatenation: a copy of the whole gradient)."""
    lead, (T, C) = x.shape[:-2], x.shape[-2:]
    sizes = [C] if sizes is None else list(sizes)
    if sum(sizes) != C or not 1 <= len(sizes) <= 3:
        raise ValueError(f"short_conv: sizes {sizes}: one to three widths that add up to x's {C} columns")
    ys = torch.ops.sandbox.short_conv(x.reshape(-1, T, C), w[None], sizes)
    return tuple(y.view(*lead, T, y.shape[-1]) for y in ys)

"""``linear(x, w, b)``: ``F.linear``, but for stacked replicas a custom op whose weight gradient is summed from S
partial products, one per run of tokens.

A linear layer's weight gradient ``g^T x`` reduces over every token of the batch (81,920 per replica in the Figure 8
slice: batch 256 x 320 tokens) into an [out, in] matrix that is small at the sandbox's widths. For a stack of R
replicas it is a batched product, which cuBLAS tiles over the output only: a small output is few tiles, each walking
all the tokens on one SM, so the GPU sits mostly idle. Cut into S runs of tokens, batched over them and summed in
float32, the same gradient fills the GPU; from [512, 512] on the output alone has tiles enough
(results/throughput/README.md, "Stacked replicas" and "What made it faster").

Why a custom op: written as torch ops (the product batched over runs against the weight broadcast S times, whose
backward is that sum), Inductor copied the activations into the batched layout, forward and backward, which at
d_model 256 cost more than the faster products saved (results/throughput/README.md, "Tried and dropped"). An opaque
op takes x and w as they are, and its backward is a second one. The replicas (``vmap``) fold into the op's groups,
each with its own weight; under ``torch.compile`` the op keeps its backward there (an ``autograd.Function`` would
not: pytorch/pytorch#129845). A single run keeps ``F.linear``, which is faster there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._C._functorch import is_batchedtensor   # traced by torch.compile

from sandbox.kernels.library import op

SPLITS = 8                  # runs of tokens the weight gradient is split into
LARGEST_SPLIT = 1 << 18     # weights of more elements than [512, 512] tile the GPU well as they are
SHORTEST_RUN = 1024         # tokens per run, at least: smaller batches (evaluation slices, tests) stay one product


def splits(tokens: int, out_features: int, in_features: int) -> int:
    """How many runs of tokens the weight gradient of ``tokens`` rows and an [out, in] weight is summed from."""
    if out_features * in_features > LARGEST_SPLIT or tokens % SPLITS or tokens < SPLITS * SHORTEST_RUN:
        return 1
    return SPLITS


@op("sandbox::grouped_linear")
def _op(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [G, M, in], w [G, out, in] -> [G, M, out]: group i's rows times its own weight."""
    return torch.bmm(x, w.transpose(1, 2))


@_op.register_fake
def _op_fake(x, w):
    return x.new_empty(x.shape[0], x.shape[1], w.shape[1])


@op("sandbox::grouped_linear_grad")
def _grad_op(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) of ``grouped_linear`` for its output's gradient g [G, M, out]."""
    G, M, O = g.shape
    dx = torch.bmm(g, w)
    S = splits(M, O, x.shape[-1])
    gt = g.reshape(G * S, M // S, O).transpose(1, 2)
    xs = x.reshape(G * S, M // S, x.shape[-1])
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):
        parts = torch.bmm(gt, xs, out_dtype=torch.float32)      # partial sums kept in float32
    else:
        parts = torch.bmm(gt, xs)
    return dx, parts.view(G, S, O, -1).sum(1).to(w.dtype)


@_grad_op.register_fake
def _grad_op_fake(g, x, w):
    return torch.empty_like(x), torch.empty_like(w)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, g):
    x, w = ctx.saved_tensors
    return torch.ops.sandbox.grouped_linear_grad(g.contiguous(), x, w)


_op.register_autograd(_backward, setup_context=_setup)


@_op.register_vmap
def _op_vmap(info, in_dims, x, w):
    """Stacked replicas: x [R, G, M, in] and w [R, G, out, in] become R * G groups."""
    R = info.batch_size
    xd, wd = in_dims
    x = x.movedim(xd, 0) if xd is not None else x.expand(R, *x.shape)
    w = w.movedim(wd, 0) if wd is not None else w.expand(R, *w.shape)
    G, M = x.shape[1:3]
    y = torch.ops.sandbox.grouped_linear(x.reshape(R * G, M, x.shape[-1]), w.reshape(R * G, *w.shape[2:]))
    return y.view(R, G, M, -1), 0


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)`` (x [..., in], w [out, in]): for stacked replicas (a weight batched by ``vmap``) through
    ``sandbox::grouped_linear`` where its weight gradient is split, elsewhere ``F.linear`` itself."""
    if not is_batchedtensor(w) or splits(x.numel() // x.shape[-1], *w.shape) == 1:
        return F.linear(x, w, b)
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x, w, b = x.to(dtype), w.to(dtype), (None if b is None else b.to(dtype))
    y = torch.ops.sandbox.grouped_linear(x.reshape(1, -1, x.shape[-1]), w[None]).view(*x.shape[:-1], w.shape[0])
    return y if b is None else y + b


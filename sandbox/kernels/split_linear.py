"""``split_linear(x, w, sizes)``: one matrix product whose output is used as several pieces (a linear mixer's
q, k, v and gate inputs), with a backward that concatenates the pieces' gradients as a plain copy.

It equals ``F.linear(x, w).split(sizes, -1)``, forward and backward, to the bit. Autograd's own backward of
that split concatenates the pieces' gradients for the two products (``dx = g W``, ``dW = g^T x``). Under
``torch.compile`` Inductor made that concatenation one pointwise kernel that computed, at every element
of the whole width, the backward arithmetic of every piece (feature maps, gates, norms, the convolution),
masked to the piece its column falls in. Here the concatenation is an opaque op (``sandbox::cat_columns``),
so each piece's gradient is made by its own fused kernel, and the op copies the pieces side by side.
Products per piece instead of a concatenation were slower at GLA (results/throughput/README.md).

Since the compiled step lowers every concatenation as a ConcatKernel (``sandbox/train/step.py``), Inductor's
own concatenation also writes each piece in place; against that, this op is faster at GLA and slower at Gated
DeltaNet by about the same small margin (results/throughput/README.md), so it stays. It reaches
single runs only: under ``vmap`` (stacked replicas), torch.compile inlines an ``autograd.Function``'s forward
and differentiates that, ignoring its backward (pytorch/pytorch#129845); stacks get the ConcatKernel, and the
product of ``linear`` (``linear.py``), whose weight gradient is summed over runs of tokens.
"""
from __future__ import annotations

import torch

from sandbox.kernels.library import op
from sandbox.kernels.linear import linear


@op("sandbox::cat_columns")
def _cat_columns(pieces: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(pieces, -1)


@_cat_columns.register_fake
def _cat_columns_fake(pieces):
    return pieces[0].new_empty(*pieces[0].shape[:-1], sum(p.shape[-1] for p in pieces))


@_cat_columns.register_vmap
def _cat_columns_vmap(info, in_dims, pieces):
    R = info.batch_size
    pieces = [p.movedim(d, 0) if d is not None else p.expand(R, *p.shape) for p, d in zip(pieces, in_dims[0])]
    return torch.ops.sandbox.cat_columns(pieces), 0


class _SplitLinear(torch.autograd.Function):
    generate_vmap_rule = True           # stacked replicas: forward and backward batch as plain torch ops

    @staticmethod
    def forward(x, w, sizes):
        return tuple(linear(x, w).split(sizes, -1))

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, sizes = inputs
        work = output[0].dtype          # the autocast dtype, where autocast cast x and w for the product
        ctx.sizes, ctx.dtypes = sizes, (x.dtype, w.dtype)
        ctx.save_for_backward(x.to(work), w.to(work))

    @staticmethod
    def backward(ctx, *grads):
        x, w = ctx.saved_tensors
        g = torch.ops.sandbox.cat_columns([(gi if gi is not None else x.new_zeros(*x.shape[:-1], n)).to(x.dtype)
                                           for gi, n in zip(grads, ctx.sizes)])   # None: a piece nobody used
        dx = g @ w
        dw = g.flatten(0, -2).T @ x.flatten(0, -2)
        return dx.to(ctx.dtypes[0]), dw.to(ctx.dtypes[1]), None


def split_linear(x: torch.Tensor, w: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    """``F.linear(x, w).split(sizes, -1)`` (no bias; ``sum(sizes) == w.shape[0]``); gradients as autograd's."""
    if sum(sizes) != w.shape[0]:
        raise ValueError(f"split_linear: sizes {list(sizes)} add up to {sum(sizes)}, the weight has {w.shape[0]} rows")
    return _SplitLinear.apply(x, w, list(sizes))

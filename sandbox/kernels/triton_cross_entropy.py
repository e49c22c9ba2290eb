"""The cross-entropy loss over rows of logits (``cross_entropy.py``): its forward and its backward, one Triton
kernel each.

``_rows``: one program per row walks its V logits BV at a time with a running maximum and a running sum of
exponentials (rescaled when the maximum grows), in float32, then writes ``lse = max + log(sum)`` and
``nll = lse - logits[target]`` (0 where the target is the ignore index). The row is read once; nothing of
size V is written.

``_rows_grad``: one program per row writes ``(exp(logits - lse) - onehot(target)) * g`` in the logits' dtype
(0 where the target is ignored): the row read once and its gradient written once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# a whole row of the sandbox's 8192-token vocabulary per load, on 4 warps: the fastest of 4, 8 and 16
# (results/kernels/README.md; benchmarks/loss_speed.py)
BV, WARPS = 8192, 4


@triton.jit
def _rows(logits, target, nll, lse, V, stride, ignore, BV: tl.constexpr):
    row = tl.program_id(0)
    base = logits + row.to(tl.int64) * stride
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], dtype=tl.float32)
    for v0 in range(0, V, BV):
        cols = v0 + tl.arange(0, BV)
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        big = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - big) + tl.sum(tl.exp(x - big), axis=0)
        m = big
    out = m + tl.log(s)
    t = tl.load(target + row)
    keep = t != ignore
    picked = tl.load(base + tl.where(keep, t, 0)).to(tl.float32)
    tl.store(lse + row, out)
    tl.store(nll + row, tl.where(keep, out - picked, 0.0))


@triton.jit
def _rows_grad(logits, target, lse, g, grad, V, stride, ignore, BV: tl.constexpr):
    row = tl.program_id(0)
    base = row.to(tl.int64) * stride
    t = tl.load(target + row)
    scale = tl.where(t != ignore, tl.load(g + row), 0.0)
    top = tl.load(lse + row)
    for v0 in range(0, V, BV):
        cols = v0 + tl.arange(0, BV)
        x = tl.load(logits + base + cols, mask=cols < V, other=0.0).to(tl.float32)
        d = (tl.exp(x - top) - (cols == t).to(tl.float32)) * scale
        tl.store(grad + base + cols, d.to(grad.dtype.element_ty), mask=cols < V)


def cross_entropy_rows_triton(logits: torch.Tensor, target: torch.Tensor, ignore: int,
                              bv: int | None = None, warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, V] (unit column stride), target [N] int64: (nll [N], lse [N]) in float32."""
    N, V = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    nll = torch.empty(N, dtype=torch.float32, device=logits.device)
    lse = torch.empty(N, dtype=torch.float32, device=logits.device)
    bv = bv or min(BV, triton.next_power_of_2(V))
    _rows[(N,)](logits, target, nll, lse, V, logits.stride(0), ignore, BV=bv, num_warps=warps or WARPS)
    return nll, lse


def cross_entropy_grad_triton(logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, g: torch.Tensor,
                              ignore: int, bv: int | None = None, warps: int | None = None) -> torch.Tensor:
    """The gradient of ``sum(nll * g)`` with respect to logits [N, V] (``lse`` [N] from the forward, ``g`` [N]):
    [N, V] in the logits' dtype."""
    N, V = logits.shape
    logits = logits.contiguous()
    grad = torch.empty(N, V, dtype=logits.dtype, device=logits.device)
    bv = bv or min(BV, triton.next_power_of_2(V))
    _rows_grad[(N,)](logits, target, lse, g.float().contiguous(), grad, V, V, ignore, BV=bv,
                     num_warps=warps or WARPS)
    return grad

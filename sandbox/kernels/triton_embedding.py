"""The weight gradient of ``embedding.py``'s lookup as two Triton kernels, with no atomic adds.

Adding tiles' sums into the table with atomics made the result depend on the order the tiles
finished, so the same run trained twice on a GPU gave different bits, and at the edge of learning
different accuracies (results/sse_state_scaling_conv/README.md). Here the order of every sum is
fixed:

1. the ids are sorted (stably), so each token's positions form one run;
2. ``_tile_sums``: each program takes BT sorted positions and BD columns, sums each token's rows
   inside the tile with one small matrix product (``[tok_i == tok_j] @ grad``) and stores the sum at
   the run's first position in the tile;
3. ``_row_sums``: each program takes one table row and BD columns and adds its token's tile sums in
   tile order, BLK tiles at a time (the filler token of MQAR spans most tiles).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BT, BD, BLK = 64, 64, 64


@triton.jit
def _tile_sums(ids, perm, grad, part, N, D, BT: tl.constexpr, BD: tl.constexpr):
    i = tl.arange(0, BT)
    rows = tl.program_id(0) * BT + i
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    mr, mc = rows < N, cols < D
    tok = tl.load(ids + rows, mask=mr, other=-1)
    src = tl.load(perm + rows, mask=mr, other=0).to(tl.int64)
    g = tl.load(grad + src[:, None] * D + cols[None, :], mask=mr[:, None] & mc[None, :], other=0.0).to(tl.float32)
    same = (tok[:, None] == tok[None, :]) & mr[:, None] & mr[None, :]             # [BT, BT]
    summed = tl.dot(same.to(tl.float32), g, input_precision="ieee")             # row i: its token's tile sum
    prev = tl.load(ids + rows - 1, mask=mr & (i > 0), other=-2)
    first = mr & ((i == 0) | (prev != tok))                                       # a run starts here
    tl.store(part + rows.to(tl.int64)[:, None] * D + cols[None, :], summed, mask=first[:, None] & mc[None, :])


@triton.jit
def _row_sums(part, starts, out, D, BT: tl.constexpr, BD: tl.constexpr, BLK: tl.constexpr):
    v = tl.program_id(0)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    mc = cols < D
    s = tl.load(starts + v).to(tl.int64)
    e = tl.load(starts + v + 1).to(tl.int64)
    acc = tl.load(part + s * D + cols, mask=mc & (s + 0 * cols < e), other=0.0)   # the run's first tile
    last = (e - 1) // BT                                                          # later tiles start runs
    for t0 in range(s // BT + 1, last + 1, BLK):
        t = t0 + tl.arange(0, BLK)
        blk = tl.load(part + (t * BT)[:, None] * D + cols[None, :], mask=(t <= last)[:, None] & mc[None, :],
                      other=0.0)
        acc += tl.sum(blk, axis=0)
    tl.store(out + v.to(tl.int64) * D + cols, acc, mask=mc)


def embedding_grad_triton(ids: torch.Tensor, grad: torch.Tensor, num_rows: int) -> torch.Tensor:
    """float32 ``[num_rows, D]``: row t sums the rows of ``grad`` ([N, D]) where ``ids`` ([N]) is t,
    in an order that depends only on the inputs."""
    N, D = grad.shape
    out = torch.empty(num_rows, D, dtype=torch.float32, device=grad.device)
    if not N or not D:
        return out.zero_()
    ids, perm = torch.sort(ids, stable=True)
    starts = torch.searchsorted(ids, torch.arange(num_rows + 1, device=ids.device, dtype=ids.dtype))
    part = torch.empty(N, D, dtype=torch.float32, device=grad.device)
    _tile_sums[(triton.cdiv(N, BT), triton.cdiv(D, BD))](ids, perm, grad.contiguous(), part, N, D, BT=BT, BD=BD)
    _row_sums[(num_rows, triton.cdiv(D, BD))](part, starts, out, D, BT=BT, BD=BD, BLK=BLK)
    return out

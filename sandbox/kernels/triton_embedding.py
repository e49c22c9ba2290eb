"""``embedding.py``'s lookup, and its weight gradient as two Triton kernels with no atomic adds.

``_lookup``: each program copies the table rows of BT ids, BD columns at a time. (torch's gather kernel wrote
the rows well below the GPU's copy bandwidth: results/throughput/README.md.)

Adding tiles' sums into the table with atomics made the result depend on the order the tiles
finished, so the same run trained twice on a GPU gave different bits, and at the edge of learning
different accuracies (a repeated trial of SSE Figure 7, figures/). Here the order of every sum is
fixed:

1. the ids are sorted (stably), so each token's positions form one run. The keys are the narrowest
   integer that holds the table's rows (int16 for MQAR's vocabulary): the radix sort makes one pass
   per byte of key, and int64 ids cost four times the passes of int16;
2. ``_tile_sums``: each program takes BT sorted positions and BD columns, sums each token's rows
   inside the tile with a segmented scan down the rows (a tree of adds of log2(BT) levels; the
   ``[tok_i == tok_j] @ grad`` product it replaces made BT times the adds, in fp32 off the tensor
   cores) and stores the sum at the run's last position
   in the tile. The programs of the first column block also write where each token's run starts
   and ends (one writer per token, so no search over the sorted ids);
3. ``_row_sums``: each program takes one table row and BD columns and adds its token's tile sums in
   tile order, BLK tiles at a time (the filler token of MQAR spans most tiles).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BT, BD, BLK = 64, 64, 64
LOOKUP_BT, LOOKUP_BD, LOOKUP_WARPS = 32, 128, 4


@triton.jit
def _lookup(weight, ids, out, N, D, BT: tl.constexpr, BD: tl.constexpr):
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    m = (rows < N)[:, None] & (cols < D)[None, :]
    tok = tl.load(ids + rows, mask=rows < N, other=0).to(tl.int64)
    v = tl.load(weight + tok[:, None] * D + cols[None, :], mask=m)
    tl.store(out + rows.to(tl.int64)[:, None] * D + cols[None, :], v, mask=m)


def embedding_triton(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``weight[ids]`` for a contiguous table [rows, D]: [*ids.shape, D] in the table's dtype."""
    D = weight.shape[1]
    flat = ids.reshape(-1)
    out = torch.empty(flat.numel(), D, dtype=weight.dtype, device=weight.device)
    grid = (triton.cdiv(flat.numel(), LOOKUP_BT), triton.cdiv(D, LOOKUP_BD))
    _lookup[grid](weight.contiguous(), flat, out, flat.numel(), D, BT=LOOKUP_BT, BD=LOOKUP_BD, num_warps=LOOKUP_WARPS)
    return out.view(*ids.shape, D)


@triton.jit
def _run_add(a, a_new, b, b_new):
    """Combine of a segmented sum: b's partial sum, plus a's unless a run starts in b's span."""
    return tl.where(b_new != 0, b, a + b), a_new | b_new


@triton.jit
def _tile_sums(ids, perm, grad, part, bounds, N, D, R, BT: tl.constexpr, BD: tl.constexpr):
    i = tl.arange(0, BT)
    rows = tl.program_id(0) * BT + i
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    mr, mc = rows < N, cols < D
    tok = tl.load(ids + rows, mask=mr, other=-1)
    src = tl.load(perm + rows, mask=mr, other=0).to(tl.int64)
    g = tl.load(grad + src[:, None] * D + cols[None, :], mask=mr[:, None] & mc[None, :], other=0.0).to(tl.float32)
    prev = tl.load(ids + rows - 1, mask=mr & (rows > 0), other=-2)
    nxt = tl.load(ids + rows + 1, mask=rows + 1 < N, other=-2)
    start = (i == 0) | (prev != tok)                                              # a run starts here (in the tile)
    new = tl.broadcast_to(start.to(tl.int32)[:, None], (BT, BD))
    summed, _ = tl.associative_scan((g, new), 0, _run_add)                        # row i: its run's sum up to i
    last = mr & ((i == BT - 1) | (nxt != tok))                                    # ... complete at its last row
    tl.store(part + rows.to(tl.int64)[:, None] * D + cols[None, :], summed, mask=last[:, None] & mc[None, :])
    if tl.program_id(1) == 0:                                                     # bounds[0]: start, [1]: end
        t = tok.to(tl.int64)
        tl.store(bounds + t, rows, mask=mr & ((rows == 0) | (prev != tok)))
        tl.store(bounds + R + t, rows + 1, mask=mr & (nxt != tok))


@triton.jit
def _row_sums(part, bounds, out, D, R, BT: tl.constexpr, BD: tl.constexpr, BLK: tl.constexpr):
    v = tl.program_id(0)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    mc = cols < D
    s = tl.load(bounds + v).to(tl.int64)
    e = tl.load(bounds + R + v).to(tl.int64)                                      # s = e = 0: no such token
    first = s // BT
    last = tl.where(e > s, tl.maximum(e - 1, 0) // BT, first)                    # the tiles the run spans
    # the first tile on its own: most tokens of a batch occur in one tile only
    acc = tl.load(part + tl.minimum(first * BT + BT - 1, e - 1) * D + cols, mask=mc & (s + 0 * cols < e), other=0.0)
    for t0 in range(first + 1, last + 1, BLK):
        t = t0 + tl.arange(0, BLK)
        end = tl.minimum(t * BT + BT - 1, e - 1)                                  # the run's last row in tile t
        blk = tl.load(part + end[:, None] * D + cols[None, :], mask=(t <= last)[:, None] & mc[None, :], other=0.0)
        acc += tl.sum(blk, axis=0)
    tl.store(out + v.to(tl.int64) * D + cols, acc, mask=mc)


def embedding_grad_triton(ids: torch.Tensor, grad: torch.Tensor, num_rows: int) -> torch.Tensor:
    """float32 ``[num_rows, D]``: row t sums the rows of ``grad`` ([N, D]) where ``ids`` ([N]) is t,
    in an order that depends only on the inputs."""
    N, D = grad.shape
    out = torch.empty(num_rows, D, dtype=torch.float32, device=grad.device)
    if not N or not D:
        return out.zero_()
    key = torch.int16 if num_rows <= torch.iinfo(torch.int16).max else torch.int32
    ids, perm = torch.sort(ids.to(key), stable=True)
    bounds = torch.zeros(2, num_rows, dtype=torch.int32, device=grad.device)
    part = torch.empty(N, D, dtype=torch.float32, device=grad.device)
    # 8 warps: faster than 4 (results/kernels/README.md; benchmarks/embedding_speed.py)
    _tile_sums[(triton.cdiv(N, BT), triton.cdiv(D, BD))](ids, perm, grad.contiguous(), part, bounds, N, D, num_rows,
                                                          BT=BT, BD=BD, num_warps=8)
    _row_sums[(num_rows, triton.cdiv(D, BD))](part, bounds, out, D, num_rows, BT=BT, BD=BD, BLK=BLK)
    return out

"""The k largest entries of each row (``topk_mask.py``) as one Triton kernel.

``_topk_mask``: one program per block of R rows holds their [R, c] entries in registers as 32-bit keys whose
unsigned order is the floats' order (-0.0 taken as +0.0). It finds each row's k-th largest key t bit by bit,
from the top: a bit stays set when at least k keys are at or above the candidate (at most 32 counts per row,
16 for 16-bit floats, whatever c; a row stops once exactly k keys are at or above its candidate). The keys above t are chosen, and of those equal to t the earliest, as many as places are left (a running
count along the row). It reads the rows once and writes one byte per entry.

A first version counted, for each entry, the entries beating it: c^2 comparisons per row, slower than the
selection's at most 32 counts (results/throughput/README.md).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

ENTRIES = 4096      # entries held per program (rows x padded columns)


@triton.jit
def _topk_mask(x, out, n_rows, c, k, inner, s_outer, s_inner, BR: tl.constexpr, BC: tl.constexpr,
               BITS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BC)
    m = (rows < n_rows)[:, None] & (cols < c)[None, :]
    base = rows[:, None] * c + cols[None, :]
    at_x = ((rows // inner) * s_outer + (rows % inner) * s_inner)[:, None] + cols[None, :]
    v = tl.load(x + at_x, mask=m, other=0.0).to(tl.float32)
    v = tl.where(v == 0.0, 0.0, v)                              # -0.0 is +0.0, as comparisons have it
    b = v.to(tl.int32, bitcast=True)
    o = b ^ ((b >> 31) & 0x7FFFFFFF)                            # signed integer order = float order
    u = tl.where(m, (o ^ (-2147483648)).to(tl.uint32, bitcast=True), 0)   # unsigned; padding below all
    t = tl.zeros([BR], dtype=tl.uint32)                          # the k-th largest key, bit by bit
    # a row is done once exactly k keys are at or above its candidate: they are its k largest, whatever the
    # lower bits (random rows get there after about log2(c) + 4 bits, not 32); padding rows are done at once
    done = rows >= n_rows
    i = 0
    while (i < BITS) & (tl.min(done.to(tl.int32), axis=0) == 0):
        cand = t | (tl.full([BR], 1, tl.uint32) << (31 - i).to(tl.uint32))
        count = tl.sum((u >= cand[:, None]).to(tl.int32), axis=1)
        t = tl.where((count >= k) & ~done, cand, t)
        done = done | (count == k)
        i += 1
    if BITS == 16:   # 16-bit floats: a key's low 16 bits are 0 when it is >= 0 (top bit set), else all 1
        t = tl.where(done, t, t | tl.where((t >> 31) == 1, 0, 0xFFFF).to(tl.uint32))
    above = u > t[:, None]
    at = (u == t[:, None]) & m
    room = k - tl.sum(above.to(tl.int32), axis=1)                # places left for entries equal to it
    chosen = above | (at & (tl.cumsum(at.to(tl.int32), axis=1) <= room[:, None]))
    tl.store(out + base, chosen.to(tl.int8), mask=m)


def _row_strides(x: torch.Tensor):
    """(inner, outer stride, inner stride) that address every row of x [..., c] (entries contiguous) as
    outer * (r // inner) + inner_stride * (r % inner), or None. A slice of a fused projection's output
    (``[B, T, H, c]`` columns of ``[B, T, width]``) qualifies, and needs no contiguous copy first."""
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        return None
    dims = [(n, st) for n, st in zip(x.shape[:-1], x.stride()[:-1]) if n != 1]
    merged: list[list[int]] = []
    for n, st in dims:                       # merge a dim into the one before when it continues its stride
        if merged and merged[-1][1] == n * st:
            merged[-1] = [merged[-1][0] * n, st]
        else:
            merged.append([n, st])
    if len(merged) > 2:
        return None
    while len(merged) < 2:
        merged.insert(0, [1, 0])
    return merged[1][0], merged[0][1], merged[1][1]


def topk_mask_triton(x: torch.Tensor, k: int) -> torch.Tensor:
    """x [..., c] in 16/32-bit floats: the mask of each row's k largest entries, torch.bool, x's shape."""
    c = x.shape[-1]
    strides = _row_strides(x)
    if strides is None:
        x = x.contiguous()
        strides = _row_strides(x)
    n = x.numel() // max(c, 1)
    out = torch.empty(n, c, dtype=torch.int8, device=x.device)
    BC = triton.next_power_of_2(c)
    BR = max(1, min(ENTRIES // BC, triton.next_power_of_2(max(n, 1))))
    if n:
        _topk_mask[(triton.cdiv(n, BR),)](x, out, n, c, k, *strides, BR=BR, BC=BC,
                                          BITS=8 * min(x.element_size(), 4), num_warps=4)
    return out.view(torch.bool).view(x.shape)

"""The k largest entries of each row (``topk_mask.py``) as one Triton kernel.

``_topk_mask``: one program per block of R rows holds their [R, c] entries in registers and walks the c
columns; column j beats entry i where it is larger, or equal and earlier (j < i). An entry's count of what
beats it is its rank; the first k ranks are chosen. c^2 comparisons per row, none of them read from memory
twice: the program reads its rows once (column j again from cache) and writes one byte per entry.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

ENTRIES = 4096      # entries held per program (rows x padded columns)


@triton.jit
def _topk_mask(x, out, n_rows, c, k, BR: tl.constexpr, BC: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BC)
    mr = rows < n_rows
    m = mr[:, None] & (cols < c)[None, :]
    base = rows[:, None] * c + cols[None, :]
    xi = tl.load(x + base, mask=m, other=0.0).to(tl.float32)
    rank = tl.zeros([BR, BC], dtype=tl.int32)
    for j in range(c):
        xj = tl.load(x + rows * c + j, mask=mr, other=0.0).to(tl.float32)[:, None]
        beats = (xj > xi) | ((xj == xi) & (cols > j)[None, :])
        rank += beats.to(tl.int32)
    tl.store(out + base, (rank < k).to(tl.int8), mask=m)


def topk_mask_triton(x: torch.Tensor, k: int) -> torch.Tensor:
    """x [..., c] in 16/32-bit floats: the mask of each row's k largest entries, torch.bool, x's shape."""
    c = x.shape[-1]
    x2 = x.reshape(-1, c).contiguous()
    n = x2.shape[0]
    out = torch.empty(n, c, dtype=torch.int8, device=x.device)
    BC = triton.next_power_of_2(c)
    BR = max(1, min(ENTRIES // BC, triton.next_power_of_2(max(n, 1))))
    if n:
        _topk_mask[(triton.cdiv(n, BR),)](x2, out, n, c, k, BR=BR, BC=BC, num_warps=4)
    return out.view(torch.bool).view(x.shape)

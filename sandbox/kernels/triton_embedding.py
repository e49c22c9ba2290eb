"""The tile-summed scatter-add of ``embedding.py``'s backward, as one Triton kernel."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BT, BD = 64, 64


@triton.jit
def _embedding_grad(ids, grad, out, N, D, BT: tl.constexpr, BD: tl.constexpr):
    i = tl.arange(0, BT)
    rows = tl.program_id(0) * BT + i
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    mr, mc = rows < N, cols < D
    tok = tl.load(ids + rows, mask=mr, other=-1).to(tl.int64)
    g = tl.load(grad + rows.to(tl.int64)[:, None] * D + cols[None, :], mask=mr[:, None] & mc[None, :],
                other=0.0).to(tl.float32)
    same = (tok[:, None] == tok[None, :]) & mr[:, None] & mr[None, :]              # [BT, BT]
    summed = tl.dot(same.to(tl.float32), g, input_precision="ieee")              # row i: its token's sum
    earlier = tl.sum((same & (i[None, :] < i[:, None])).to(tl.int32), axis=1)    # equal tokens before i
    first = mr & (earlier == 0)
    tl.atomic_add(out + tok[:, None] * D + cols[None, :], summed, mask=first[:, None] & mc[None, :])


def embedding_grad_triton(ids: torch.Tensor, grad: torch.Tensor, num_rows: int) -> torch.Tensor:
    """float32 ``[num_rows, D]``: row t sums the rows of ``grad`` ([N, D]) where ``ids`` ([N]) is t."""
    N, D = grad.shape
    out = torch.zeros(num_rows, D, dtype=torch.float32, device=grad.device)
    if N and D:
        _embedding_grad[(triton.cdiv(N, BT), triton.cdiv(D, BD))](ids.contiguous(), grad.contiguous(), out,
                                                                  N, D, BT=BT, BD=BD)
    return out

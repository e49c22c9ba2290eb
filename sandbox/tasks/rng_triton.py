"""The table of uniforms of ``rng.uniform`` as one Triton kernel: the same 32-bit mixing in int64, so
the same bits as the torch form, in one pass over memory instead of some thirty."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _mix(x):
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & 0xFFFFFFFF
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _uniform(row_a, row_b, pos, out, B, n, BR: tl.constexpr, BN: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    mr, mc = r < B, c < n
    ka = tl.load(row_a + r, mask=mr, other=0).to(tl.int64)[:, None]
    kb = tl.load(row_b + r, mask=mr, other=0).to(tl.int64)[:, None]
    h = _mix((tl.load(pos + c, mask=mc, other=0).to(tl.int64) + 0x9E3779B9) & 0xFFFFFFFF)[None, :]
    a = _mix(ka ^ h) >> 6                 # 26 bits each
    b = _mix(kb ^ h) >> 6
    u = ((a << 26 | b).to(tl.float64) + 0.5) / 4503599627370496.0      # 2 ** 52
    tl.store(out + r.to(tl.int64)[:, None] * n + c[None, :], u, mask=mr[:, None] & mc[None, :])


def uniform_triton(row_a: torch.Tensor, row_b: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """float64 ``[B, n]`` from row keys ``[B, 1]`` and positions ``[n]`` (int64)."""
    B, n = row_a.shape[0], pos.numel()
    out = torch.empty(B, n, dtype=torch.float64, device=row_a.device)
    if B and n:
        _uniform[(triton.cdiv(B, 16), triton.cdiv(n, 256))](row_a.reshape(-1).contiguous(),
                                                             row_b.reshape(-1).contiguous(), pos.contiguous(),
                                                             out, B, n, BR=16, BN=256)
    return out

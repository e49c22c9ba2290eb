"""The table of uniforms of ``rng.uniform`` as one Triton kernel: the same 32-bit mixing, so the same
bits as the torch form, in one pass over memory instead of some thirty. The torch form holds its 32-bit
values in int64 and masks after each product; here they are uint32, whose products wrap at 2**32 by
themselves: a GPU multiplies 32-bit integers in one instruction and 64-bit ones in several."""
from __future__ import annotations

import math
from fractions import Fraction

import torch
import triton
import triton.language as tl


@triton.jit
def _mix(x):
    """``rng._mix`` on uint32."""
    x = x ^ (x >> 16)
    x = x * 0x45D9F3B
    x = x ^ (x >> 16)
    x = x * 0x45D9F3B
    return x ^ (x >> 16)


@triton.jit
def _bits52(ka, kb, pos):
    """The 52-bit integer m of the uniform (m + 0.5) / 2**52 at positions ``pos`` (int64) of a row with
    keys ``ka``, ``kb`` (uint32), as int64."""
    h = _mix((pos + 0x9E3779B9).to(tl.uint32))
    a = (_mix(ka ^ h) >> 6).to(tl.int64)              # 26 bits each
    b = (_mix(kb ^ h) >> 6).to(tl.int64)
    return a << 26 | b


@triton.jit
def _uniform(row_a, row_b, pos, out, B, n, BR: tl.constexpr, BN: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    mr, mc = r < B, c < n
    ka = tl.load(row_a + r, mask=mr, other=0).to(tl.uint32)[:, None]
    kb = tl.load(row_b + r, mask=mr, other=0).to(tl.uint32)[:, None]
    m = _bits52(ka, kb, tl.load(pos + c, mask=mc, other=0).to(tl.int64)[None, :])
    u = (m.to(tl.float64) + 0.5) / 4503599627370496.0      # 2 ** 52
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


@triton.jit
def _below(row_a, row_b, limit, cand_m, cand_i, count, n, M, BN: tl.constexpr):
    """One row: every position whose 52-bit integer is below ``limit`` (its uniform below the threshold),
    compacted in position order into ``cand_m`` / ``cand_i`` (the first M of them), and how many there were."""
    r = tl.program_id(0).to(tl.int64)
    ka = tl.load(row_a + r).to(tl.uint32)
    kb = tl.load(row_b + r).to(tl.uint32)
    c = 0
    for start in range(0, n, BN):
        pos = start + tl.arange(0, BN)
        m = _bits52(ka, kb, pos.to(tl.int64))
        keep = (m < limit) & (pos < n)
        slot = c + tl.cumsum(keep.to(tl.int32), axis=0) - 1
        ok = keep & (slot < M)
        tl.store(cand_m + r * M + slot, m, mask=ok)
        tl.store(cand_i + r * M + slot, pos.to(tl.int64), mask=ok)
        c += tl.sum(keep.to(tl.int32), axis=0)
    tl.store(count + r, c)


def smallest_triton(row_a: torch.Tensor, row_b: torch.Tensor, n: int, k: int, mean: float | None = None
                    ) -> torch.Tensor:
    """Positions ``[B, k]`` of the k smallest of the n uniforms of each row, smallest first: the same as
    ``torch.topk(uniform_torch(row_a, row_b, arange(n)), k, largest=False).indices``, without the
    ``[B, n]`` table. The uniforms are drawn on the fly and only those below a threshold, which about
    k + 6 sqrt(k) + 16 of them pass, are kept; a row where fewer than k pass, or more than the buffer
    holds (each about as likely as a Poisson variable 6 standard deviations from its mean), is redone
    with the whole table. ``mean``: the expected number kept (default as above)."""
    B = row_a.shape[0]
    mean = min(float(n), k + 6 * k ** 0.5 + 16) if mean is None else mean
    # u = (m + 0.5) / 2**52 < t  <=>  m < ceil(t * 2**52 - 1/2) for the integer m (exact, in Fractions)
    limit = math.ceil(Fraction(mean / n) * 2 ** 52 - Fraction(1, 2))
    M = triton.next_power_of_2(int(2 * mean + 64))
    dev = row_a.device
    cand_m = torch.full((B, M), 2 ** 62, dtype=torch.int64, device=dev)     # above every 52-bit m
    cand_i = torch.zeros(B, M, dtype=torch.int64, device=dev)
    count = torch.empty(B, dtype=torch.int32, device=dev)
    if B:
        _below[(B,)](row_a.reshape(-1).contiguous(), row_b.reshape(-1).contiguous(), limit, cand_m, cand_i, count,
                     n, M, BN=1024)
    out = cand_i.gather(1, torch.topk(cand_m, k, dim=1, largest=False).indices)   # m orders as u does
    bad = ((count < k) | (count > M)).nonzero()[:, 0]          # a host sync: drawing a pool, not in a step
    if bad.numel():
        full = uniform_triton(row_a[bad], row_b[bad], torch.arange(n, device=dev))
        out[bad] = torch.topk(full, k, dim=1, largest=False).indices
    return out

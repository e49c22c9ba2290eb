"""A counter-based random generator built from integer tensor ops.

torch's own generators give different streams on CPU and CUDA. Tasks must give the same
bits for the same (seed, split, index) on any device, so every random number here is a
hash of its coordinates, computed with 32-bit mixing inside int64 arithmetic that is
exact everywhere.

Cost matters: the tasks draw thousands of uniforms per example (the smallest of them pick the
keys), and in torch each int64 op is a kernel launch plus a pass over memory. So scalar
coordinates (seed, split, stream) are hashed in Python, the example id once per row
(``row_key``, shape ``[B, 1]``), the position once per column, and on a GPU the table of
uniforms is one Triton kernel (``rng_triton.py``: the same integer arithmetic, so the same
bits) instead of some thirty passes; where only the k smallest of a row's uniforms matter
(``smallest``), the kernel keeps just those below a threshold instead of writing the table.
"""
from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_MUL = 0x45D9F3B          # < 2**31, so a 32-bit value times it stays inside int64
_GOLDEN = 0x9E3779B9


def _mix(x):
    """Bijective avalanche mix of 32-bit values held in int64 (works on Python ints too)."""
    x = x ^ (x >> 16)
    x = (x * _MUL) & _M32
    x = x ^ (x >> 16)
    x = (x * _MUL) & _M32
    return x ^ (x >> 16)


def scalar_key(*ints: int) -> int:
    """Hash of Python integers (seed, split, stream ...) into [0, 2**32)."""
    h = 0x2545F491
    for v in ints:
        h = _mix(h ^ _mix((v + _GOLDEN) & _M32) ^ _mix(((v >> 32) + 0x7F4A7C15) & _M32))
    return h


def row_key(ids: torch.Tensor, *scalars: int) -> torch.Tensor:
    """Per-row key ``[B, 1]`` from int64 example ids ``[B]`` and scalar coordinates."""
    k = scalar_key(*scalars)
    h = _mix((ids & _M32) ^ k)
    return _mix(h ^ ((ids >> 32) + _GOLDEN & _M32))[:, None]


def derive(row: torch.Tensor, *scalars: int) -> torch.Tensor:
    """Another independent row key from a row key (one mix on ``[B, 1]``)."""
    return _mix(row ^ scalar_key(*scalars))


def bits32(row: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """32 random bits per (row, position): ``row`` [B, 1] from ``row_key``, ``pos`` int64 [n]."""
    return _mix(row ^ _mix((pos + _GOLDEN) & _M32))


def uniform(row_a: torch.Tensor, row_b: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """float64 uniforms in (0, 1) with 52 random bits from two independent row keys: ``[B, n]`` for
    row keys ``[B, 1]`` and positions ``[n]``."""
    if row_a.is_cuda:
        from sandbox.tasks.rng_triton import uniform_triton
        return uniform_triton(row_a, row_b, pos)
    return uniform_torch(row_a, row_b, pos)


def smallest(row_a: torch.Tensor, row_b: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Positions ``[B, k]`` of the k smallest of each row's uniforms over positions ``0 .. n-1``, smallest
    first: a uniform random k-subset of ``range(n)`` in random order."""
    if row_a.is_cuda:
        from sandbox.tasks.rng_triton import smallest_triton
        return smallest_triton(row_a, row_b, n, k)
    return torch.topk(uniform_torch(row_a, row_b, torch.arange(n, device=row_a.device)), k, dim=1,
                      largest=False).indices


def uniform_torch(row_a, row_b, pos):
    a = bits32(row_a, pos) >> 6          # 26 bits
    b = bits32(row_b, pos) >> 6          # 26 bits
    return ((a << 26 | b).to(torch.float64) + 0.5) / float(2 ** 52)


def row_fingerprint(x: torch.Tensor) -> torch.Tensor:
    """A 62-bit order-sensitive fingerprint per row of an int64 [B, T] token tensor."""
    pos = torch.arange(x.shape[1], device=x.device)
    h1 = _mix((x * 0x9E3779B1 + pos * 0x7FEB352D) & _M32).sum(1) & 0x7FFFFFFF
    h2 = _mix((x * 0x846CA68B + pos * 0x68E31DA4 + 1) & _M32).sum(1) & 0x7FFFFFFF
    return h1 << 31 | h2

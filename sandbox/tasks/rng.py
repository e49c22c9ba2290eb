"""A counter-based random generator built from integer tensor ops.

torch's own generators give different streams on CPU and CUDA. Tasks must give
the same bits for the same (seed, split, index) on any device, so every random
number here is a hash of its coordinates (seed, stream, example id, position),
computed with 32-bit mixing inside int64 arithmetic that is exact everywhere.
"""
from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_MUL = 0x45D9F3B          # < 2**31, so a 32-bit value times it stays inside int64
_GOLDEN = 0x9E3779B9


def _mix(x: torch.Tensor) -> torch.Tensor:
    """Bijective avalanche mix of 32-bit values held in int64."""
    x = x ^ (x >> 16)
    x = (x * _MUL) & _M32
    x = x ^ (x >> 16)
    x = (x * _MUL) & _M32
    return x ^ (x >> 16)


def hash32(*coords) -> torch.Tensor:
    """Hash of broadcastable integer coordinates (ints or int64 tensors) into [0, 2**32)."""
    h = None
    for c in coords:
        c = torch.as_tensor(c, dtype=torch.int64) if not torch.is_tensor(c) else c.to(torch.int64)
        v = _mix(((c & _M32) + _GOLDEN) & _M32)
        h = v if h is None else _mix((h ^ v) + _GOLDEN & _M32)
        # second round decorrelates the high part of long coordinates (example ids beyond 2**32)
        hi = (c >> 32) & _M32
        h = _mix(h ^ _mix(hi + 0x7F4A7C15))
    return h


def uniform(*coords) -> torch.Tensor:
    """float64 uniforms in (0, 1) with 52 random bits (two hashes), same bits on any device."""
    a = hash32(*coords, 0x51) >> 6          # 26 bits
    b = hash32(*coords, 0xA7) >> 6          # 26 bits
    return ((a << 26 | b).to(torch.float64) + 0.5) / float(2 ** 52)


def randint(low: int, high: int, *coords) -> torch.Tensor:
    """Integers in [low, high); the modulo bias is below (high - low) / 2**32."""
    return low + hash32(*coords) % (high - low)

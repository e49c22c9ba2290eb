"""Kernels of the linear recurrence: pure functions on tensors behind one dispatch.

``linear_recurrence(q, k, v, g=None, beta=None, *, scale=1.0, initial_state=None,
output_final_state=False, cu_seqlens=None, impl="auto")`` returns ``(o, final_state)``;
see ``sandbox/kernels/reference.py`` for the recurrence and the tensor shapes.

impl: "naive" = per-step reference loop (ground truth), "torch" = chunked torch form,
"triton" = Triton kernels, "auto" = Triton on CUDA when it covers the case, else torch.
"""
from __future__ import annotations

from sandbox.kernels.chunked import chunk_reference
from sandbox.kernels.reference import recurrent_reference

IMPLS = ("auto", "torch", "naive", "triton")


def linear_recurrence(q, k, v, g=None, beta=None, *, scale=1.0, initial_state=None,
                      output_final_state=False, cu_seqlens=None, impl="auto"):
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    kwargs = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                  cu_seqlens=cu_seqlens)
    if impl == "auto":
        impl = "triton" if _triton_covers(q, v, g, beta) else "torch"
    if impl == "naive":
        return recurrent_reference(q, k, v, g, beta, **kwargs)
    if impl == "torch":
        return chunk_reference(q, k, v, g, beta, **kwargs)
    return _triton(q, k, v, g, beta, **kwargs)


def _triton_covers(q, v, g, beta) -> bool:
    """Whether the Triton kernels handle this case: CUDA, 16/32-bit floats, head dims of at least
    16 (GSA's first pass has 1-wide values: it crashed on the H200), delta rule only with a
    scalar gate and K <= 256."""
    import torch

    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if min(q.shape[-1], v.shape[-1]) < 16:
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return beta is None or ((g is None or g.dim() == 3) and q.shape[-1] <= 256)


def _common_dtype(*xs):
    """The narrowest float dtype among the inputs (under autocast some projections stay fp32)."""
    import torch

    for dt in (torch.bfloat16, torch.float16):
        if any(x.dtype == dt for x in xs):
            return dt
    return xs[0].dtype


def _triton(q, k, v, g, beta, **kwargs):
    # tl.dot needs both operands in one dtype: cast once here, autograd casts the gradients back
    dt = _common_dtype(q, k, v)
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    if beta is None:
        from sandbox.kernels.triton_chunk import chunk_gla
        return chunk_gla(q, k, v, g, **kwargs)
    from sandbox.kernels.triton_delta import chunk_delta_rule
    return chunk_delta_rule(q, k, v, beta, g, **kwargs)


__all__ = ["linear_recurrence", "recurrent_reference", "chunk_reference", "IMPLS"]

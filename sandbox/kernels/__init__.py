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
        impl = "torch"  # the Triton branch is added with the Triton kernels
    if impl == "naive":
        return recurrent_reference(q, k, v, g, beta, **kwargs)
    if impl == "torch":
        return chunk_reference(q, k, v, g, beta, **kwargs)
    raise NotImplementedError("impl='triton': the Triton kernels are not available yet; use impl='torch' or 'auto'")


__all__ = ["linear_recurrence", "recurrent_reference", "chunk_reference", "IMPLS"]

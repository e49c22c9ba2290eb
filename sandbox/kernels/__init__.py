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
        gap = _triton_gap(q, v, g, beta)
        impl = "torch" if gap else "triton"
        if gap and q.is_cuda:
            _warn_once(f"linear_recurrence: the Triton kernels do not cover {gap}; the chunked torch form runs "
                       "instead, several times slower")
    if impl == "naive":
        return recurrent_reference(q, k, v, g, beta, **kwargs)
    if impl == "torch":
        return chunk_reference(q, k, v, g, beta, **kwargs)
    return _triton(q, k, v, g, beta, **kwargs)


def _triton_gap(q, v, g, beta) -> str | None:
    """What keeps the Triton kernels from this case, or None where they cover it: CUDA, 16/32-bit floats,
    delta rule only with a scalar gate and K <= 256 (head dims under 16 are padded to 16 by ``_triton``)."""
    import torch

    if not q.is_cuda:
        return "CPU tensors"
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"{q.dtype}"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "this machine (triton is not installed)"
    if beta is not None and g is not None and g.dim() != 3:
        return "the delta rule with a per-row gate"
    if beta is not None and q.shape[-1] > 256:
        return f"the delta rule with {q.shape[-1]} key rows per head (at most 256)"
    return None


_warned: set = set()


def _warn_once(msg: str) -> None:
    """A slow path taken on the GPU is said once per process and case (a sweep's worker log shows it)."""
    if msg not in _warned:
        _warned.add(msg)
        import warnings

        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _common_dtype(*xs):
    """The narrowest float dtype among the inputs (under autocast some projections stay fp32)."""
    import torch

    for dt in (torch.bfloat16, torch.float16):
        if any(x.dtype == dt for x in xs):
            return dt
    return xs[0].dtype


MIN_HEAD_DIM = 16  # tl.dot's smallest operand side


def _triton(q, k, v, g, beta, **kwargs):
    """The Triton kernels, with head dims under 16 zero-padded to 16 and the outputs cut back: a key row
    with q = k = 0 (and log-decay 0) keeps a zero state row and adds nothing to o, a zero value column
    gives a zero output column, so the result is exact.  (Tiles narrower than 16 crashed, on a 1-wide value
    pass; GLA with 16 heads at d_model 256 has 8 key rows, which used to fall back to the far slower chunked
    torch form: results/throughput/README.md.)"""
    import torch.nn.functional as F

    # tl.dot needs both operands in one dtype: cast once here, autograd casts the gradients back
    dt = _common_dtype(q, k, v)
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    K, V = q.shape[-1], v.shape[-1]
    Kp, Vp = max(K, MIN_HEAD_DIM), max(V, MIN_HEAD_DIM)
    if Kp > K:
        q, k = F.pad(q, (0, Kp - K)), F.pad(k, (0, Kp - K))
        g = F.pad(g, (0, Kp - K)) if g is not None and g.dim() == 4 else g
    if Vp > V:
        v = F.pad(v, (0, Vp - V))
    if (K, V) != (Kp, Vp) and kwargs["initial_state"] is not None:
        kwargs["initial_state"] = F.pad(kwargs["initial_state"], (0, Vp - V, 0, Kp - K))   # [N, H, K, V]
    if beta is None:
        from sandbox.kernels.triton_chunk import chunk_gla
        o, ht = chunk_gla(q, k, v, g, **kwargs)
    else:
        from sandbox.kernels.triton_delta import chunk_delta_rule
        o, ht = chunk_delta_rule(q, k, v, beta, g, **kwargs)
    if (K, V) != (Kp, Vp):
        o = o[..., :V]
        ht = None if ht is None else ht[..., :K, :V]
    return o, ht


__all__ = ["linear_recurrence", "recurrent_reference", "chunk_reference", "IMPLS"]

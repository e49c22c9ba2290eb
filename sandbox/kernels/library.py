"""How the ``sandbox::`` operators are defined: ``op``, through torch.library's ``define`` and ``impl``.

``torch.library.custom_op`` would register the same dispatcher entries, but it wraps every kernel to keep Dynamo
out of it, and that wrapper imports ``torch._dynamo`` at a kernel's first call: 0.9 s on the CI's CPU, in every
process, the uncompiled ones included (results/throughput/README.md). ``torch.library.impl`` registers a kernel
without the wrapper; to torch.compile the operators are opaque either way, traced through their fake kernels.
"""
from __future__ import annotations

import torch

LIB = torch.library.Library("sandbox", "DEF")


class Op:
    """A defined operator, with ``torch.library.custom_op``'s registration methods; calling it calls the op."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args, **kwargs):
        return getattr(torch.ops.sandbox, self.name.removeprefix("sandbox::"))(*args, **kwargs)

    def register_fake(self, fn):
        torch.library.register_fake(self.name, fn, lib=LIB)
        return fn

    def register_autograd(self, backward, setup_context=None) -> None:
        torch.library.register_autograd(self.name, backward, setup_context=setup_context, lib=LIB)

    def register_vmap(self, fn):
        torch.library.register_vmap(self.name, fn, lib=LIB)
        return fn

    def vmap_per_replica(self) -> None:
        """Under vmap (stacked replicas), run the op once per slice of the vmapped dimension and stack its
        outputs: each replica has weights of its own, which a kernel over rows cannot take. ``unbind`` and
        ``stack`` are views and one copy each way in autograd (selecting each slice would give every input's
        gradient R full-size pieces to sum)."""
        def rule(info, in_dims, *args):
            cols = [a.movedim(d, 0).unbind(0) if d is not None else (a,) * info.batch_size
                    for a, d in zip(args, in_dims)]
            outs = [self(*one) for one in zip(*cols)]
            if isinstance(outs[0], torch.Tensor):
                return torch.stack(outs), 0
            stacked = tuple(torch.stack(o) for o in zip(*outs))
            return stacked, (0,) * len(stacked)
        self.register_vmap(rule)


def op(name: str, schema: str | None = None, tags: tuple = ()):
    """Decorator: define ``name`` (``sandbox::NAME``) with ``schema`` (else read from the function's annotations, as
    custom_op reads it) and the function as its kernel on every device."""
    def define(fn) -> Op:
        short = name.removeprefix("sandbox::")
        LIB.define(short + (schema or torch.library.infer_schema(fn, mutates_args=())),
                   tags=(torch.Tag.pt2_compliant_tag, *tags))
        LIB.impl(short, fn, "CompositeExplicitAutograd")
        return Op(name)
    return define


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an elementwise op computes in: float32, or float64 for float64 inputs (the torch form, which the
    kernels are tested against in float64)."""
    return torch.promote_types(dtype, torch.float32)


def on_triton(x: torch.Tensor) -> bool:
    """Whether an op's Triton kernel takes ``x``: on CUDA, in a 16- or 32-bit float (they compute in float32;
    float64 keeps the torch form)."""
    return x.is_cuda and x.dtype != torch.float64


def use_fused(x: torch.Tensor) -> bool:
    """Whether a model's elementwise chains (its norms, SwiGLU, a linear mixer's output norm and gate) run as the
    ``sandbox::`` ops of one Triton kernel each way rather than as torch's chain of kernels: on CUDA, in the
    uncompiled step (torch.compile fuses the chains itself, with their neighbours), stacked replicas included
    (under vmap each op runs once per replica)."""
    return x.is_cuda and not torch.compiler.is_compiling()

"""A training step's forward and backward captured once as a CUDA graph and replayed.

The sandbox's models are small: a step launches a few hundred kernels of a few microseconds
each, so the host (Python, autograd, the launches) sets the pace, not the GPU. Replaying a
captured graph removes that cost. Only the forward, the loss and the backward are captured;
gradient clipping, the (fused) AdamW step and the learning-rate schedule stay eager, so the
optimizer, its checkpoint and the schedule are the same objects as without a graph.

Requirements, checked by ``graph_safe(model)``: every mixer declares that its forward and
backward keep static shapes and never wait on the host (``Mixer.graph_safe``). Anything that
breaks them (a ``.item()``, a data-dependent shape) would fail the capture.

How the step stays correct: the gradients are set to ``None`` before the capture, so the
captured backward *writes* them (into memory the graph owns) rather than adding to them;
every replay overwrites them in place and the eager optimizer reads them there. Nothing else
may reset them to ``None`` afterwards.
"""
from __future__ import annotations

from typing import Callable

import torch


def graph_safe(model) -> bool:
    return all(m.graph_safe() for m in model.mixers)


class GraphedStep:
    """``step(x, y)``: the forward and backward of one training step, eager or from a CUDA graph.

    ``loss_fn(x, y)`` returns ``(total, loss)``: the tensor to differentiate and the plain loss,
    which is added to ``loss_sum`` on the device (read it when logging). Each call leaves fresh
    gradients in ``.grad`` (never accumulated); the caller clips and steps the optimizer.
    With ``capture_after=n`` the first n calls run eagerly (compiling and tuning the kernels),
    then one capture, then every call is a replay; ``None`` stays eager.
    """

    def __init__(self, loss_fn: Callable, params: list[torch.nn.Parameter], loss_sum: torch.Tensor,
                 capture_after: int | None = 2):
        self.loss_fn, self.params, self.loss_sum = loss_fn, params, loss_sum
        self.capture_after = capture_after
        self.graph: torch.cuda.CUDAGraph | None = None
        self.calls = 0
        self.stream = torch.cuda.Stream() if capture_after is not None else None

    def _eager(self, x, y) -> None:
        for p in self.params:
            p.grad = None
        total, loss = self.loss_fn(x, y)
        total.backward()
        self.loss_sum += loss.detach()

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.calls += 1
        if self.capture_after is None:
            return self._eager(x, y)
        if self.graph is None and self.calls <= self.capture_after:
            # warm up on the stream the capture will use (lazy cuBLAS/Triton state lives there)
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                self._eager(x, y)
            torch.cuda.current_stream().wait_stream(self.stream)
            return None
        if self.graph is None:
            self._capture(x, y)
        self.x.copy_(x)
        self.y.copy_(y)
        self.graph.replay()
        return None

    def _capture(self, x, y) -> None:
        self.x, self.y = x.clone(), y.clone()
        for p in self.params:
            p.grad = None
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph, stream=self.stream):
                total, loss = self.loss_fn(self.x, self.y)
                total.backward()
                self.loss_sum += loss.detach()
        except Exception as e:   # a host sync in some mixer: name the way out
            raise RuntimeError(f"CUDA graph capture failed ({type(e).__name__}: {str(e).splitlines()[0]}); "
                               f"a mixer is not graph-safe: set train.cuda_graph: false") from e
        unused = sum(p.grad is None for p in self.params)
        if unused:
            raise RuntimeError(f"CUDA graph: {unused} parameters got no gradient in the captured step "
                               f"(they would never be trained); set train.cuda_graph: false")

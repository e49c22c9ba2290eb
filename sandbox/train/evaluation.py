"""Test accuracy and loss on a task's test split: of one model (``evaluate``), or of every replica of a stack at
once (``evaluate_stack``), the replicas run as one stacked forward per test batch as in the step, so an evaluation
costs one replica's launches, not R of them.

Both count the same way: the logits at the scored positions, the argmax against the target, and the summed loss
(the training loss op, ``cross_entropy``) over the scored targets.

A stack whose step is compiled (``train.compile``, on a GPU) evaluates through ``torch.compile`` too, with the
step's options: the forward and the counting fused as in the step, where eagerly each norm, gate and residual add
is a kernel of its own over a test batch 2-4x the size of a training batch. A Figure 8 run evaluates 12 times; eager,
its evaluations were about a minute of the grid's 30 GPU-minutes on the H200 (results/throughput/). The compiled
forward rounds as the step does, not as the eager one: its counts may differ from an eager evaluation's in the
last scored position, never between two runs of the same code.
"""
from __future__ import annotations

import contextlib
import json

import torch

from sandbox.kernels.cross_entropy import IGNORE, cross_entropy
from sandbox.train.step import concat_kernels, scored_positions

# The most logits a stacked evaluation holds at once, all replicas together (bf16: 2 GB)
EVAL_LOGITS = 1 << 30


def _count(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The counts ([R, 3]: correct, scored, summed loss) of ``logits`` [R, rows, P, V] against ``y`` [R, rows, P]."""
    R = logits.shape[0]
    mask = y != IGNORE
    nll = cross_entropy(logits.flatten(0, -2), y.flatten())
    return torch.stack([((logits.argmax(-1) == y) & mask).flatten(1).sum(1).double(),
                        mask.flatten(1).sum(1).double(), nll.view(R, -1).sum(1).double()], 1)


def _slice_counts(base, params, buffers, dim, x, pos, y) -> torch.Tensor:
    """The counts ([R, 3]) of one slice of a test batch: ``x`` and ``pos`` [rows, ...] shared by the replicas
    (``dim`` None) or [R, rows, ...] (``dim`` 0); ``params`` None for one replica (its own weights, no vmap, as in
    the step), else the stack's [R, ...] weights and buffers."""
    if params is None:
        logits = base(x, pos)[None]
    else:
        def logits_of(p, b, x, pos):
            return torch.func.functional_call(base, (p, b), (x, pos))
        logits = torch.func.vmap(logits_of, in_dims=(0, 0, dim, None if pos is None else dim))(params, buffers, x,
                                                                                              pos)
    return _count(logits, y.expand(logits.shape[:-1]))


_compiled: dict = {}        # ``_slice_counts`` compiled with a step's options, by those options


def _compiled_counts(replicas: int):
    from sandbox.train.step import compile_options
    options = compile_options(replicas)
    key = json.dumps(options, sort_keys=True)
    if key not in _compiled:
        _compiled[key] = torch.compile(_slice_counts, dynamic=False, options=options)
    return _compiled[key]


def _metrics(counts: torch.Tensor) -> list[dict]:
    correct, scored, loss = counts.unbind(1)
    return [{"test/accuracy": c / max(n, 1.0), "test/loss": s / max(n, 1.0)}
            for c, n, s in zip(correct.tolist(), scored.tolist(), loss.tolist())]


@torch.no_grad()
def evaluate(model, task, batch_size: int, autocast) -> dict:
    """One model's test accuracy and loss (``autocast``: the context to run its forward in)."""
    model.eval()
    counts = torch.zeros(1, 3, dtype=torch.float64, device=task.device)
    try:
        for x, y in task.test_batches(batch_size):
            pos, y = scored_positions(y, getattr(task, "max_targets", None))
            with autocast():
                logits = model(x, pos)
            counts += _count(logits[None], y[None])
    finally:
        model.train()
    return _metrics(counts)[0]


@torch.no_grad()
def evaluate_stack(step, tasks: list, batch_size: int, compiled: bool | None = None) -> list[dict]:
    """Test accuracy and loss of every replica of ``step`` (a ``Step``) on its task's test split (``tasks[r]``).
    Replicas of one seed share its test batches ([B, T]); of several, each reads its own ([R, B, T]). A batch goes
    through in slices of rows whose logits of all replicas stay within ``EVAL_LOGITS`` elements. ``compiled``
    (default: whether the step is) runs each slice through ``torch.compile``."""
    base, R = step.models[0], step.R
    params = buffers = None
    if R > 1:
        params = {n: p.detach() for n, p in step.optimizer.weights().items()}
        buffers = {n: torch.stack(bs) for n, bs in zip(step.buffer_names, zip(*(m.buffers() for m in step.models)))}
    shared = len({t.seed for t in tasks}) == 1          # a stack's tasks differ in nothing but the seed
    dim = None if shared else 0
    compiled = step.compiled if compiled is None else compiled
    counts_of = _compiled_counts(R) if compiled else _slice_counts
    fused = concat_kernels() if compiled else contextlib.nullcontext()

    counts = torch.zeros(R, 3, dtype=torch.float64, device=step.device)
    base.eval()
    try:
        with fused, step.attention_backends(), step.autocast():
            for got in zip(*[t.test_batches(batch_size) for t in (tasks[:1] if shared else tasks)]):
                x, y = (torch.stack(ts) for ts in zip(*got))      # [1 or R, B, T]
                pos, y = scored_positions(y.flatten(0, 1), step.per_row)
                y = y.view(x.shape[0], x.shape[1], -1)
                pos = None if pos is None else pos.view_as(y)
                if shared:
                    x, pos = x[0], None if pos is None else pos[0]
                rows = max(1, EVAL_LOGITS // (R * y.shape[-1] * base.embed.num_embeddings))
                for i in range(0, y.shape[1], rows):
                    cut = slice(i, i + rows)
                    xi, pi = (x[cut], None if pos is None else pos[cut]) if shared else \
                        (x[:, cut], None if pos is None else pos[:, cut])
                    counts += counts_of(base, params, buffers, dim, xi, pi, y[:, cut])
    finally:
        base.train()
    return _metrics(counts)

"""Synthetic tasks. ``make_task(name, seed=..., device=..., **params)`` or ``make_task(TaskConfig)``.

A task yields ``(inputs, targets)`` int64 tensors ``[batch, seq_len]`` on its device
with ``targets == -100`` wherever nothing is scored; the same (seed, split, index)
gives the same bits on any device.
"""
from __future__ import annotations

import dataclasses

import torch

from sandbox.tasks.mqar import MQAR, MQARConfig

TASKS = {"mqar": (MQAR, MQARConfig)}


class TrainBatches:
    """The training batch of each step, drawn ahead into a pool on the task's device.

    ``batches[step]`` equals ``task.sample(batch_size, "train", step)`` bit for bit. The pool holds
    the batches of consecutive steps (as int32): every step of the run when they fit in
    ``max_bytes``, else spans of that size, each drawn when the run reaches it, in generator calls
    of ``task.rows_per_call`` rows. A step then only slices the pool: on a GPU the generator's
    launches and passes are paid once per span, not per step.
    """

    def __init__(self, task, batch_size: int, steps: int | None = None, max_bytes: int = 1 << 30):
        self.task, self.batch_size = task, batch_size
        per_step = 2 * 4 * batch_size * task.seq_len
        self.span = max(1, max_bytes // per_step)
        self.steps = steps
        if steps is not None:
            self.span = min(self.span, steps)
        self.first = None
        self.x = self.y = None

    def __getitem__(self, step: int):
        if self.first is None or not self.first <= step < self.first + self.span:
            self._draw(step)
        B = self.batch_size
        i = (step - self.first) * B
        return self.x[i:i + B].long(), self.y[i:i + B].long()

    def _draw(self, first: int) -> None:
        B, T = self.batch_size, self.task.seq_len
        if self.x is None:
            self.x = torch.empty(self.span * B, T, dtype=torch.int32, device=self.task.device)
            self.y = torch.empty_like(self.x)
        per_call = max(1, getattr(self.task, "rows_per_call", B) // B)       # steps per generator call
        span = self.span if self.steps is None else max(1, min(self.span, self.steps - first))  # a resumed run
        for s in range(0, span, per_call):
            n = min(per_call, span - s)
            x, y = self.task.sample(B, "train", first + s, count=n)
            self.x[s * B:(s + n) * B] = x
            self.y[s * B:(s + n) * B] = y
        self.first = first


def task_config_class(name: str):
    return TASKS[name][1]


def make_task(name_or_cfg, *, seed: int = 0, device="cpu", **params):
    """Build a task from a name and parameters, or from a config dataclass of a known task."""
    if dataclasses.is_dataclass(name_or_cfg):
        cfg = name_or_cfg
        name = next(n for n, (_, c) in TASKS.items() if isinstance(cfg, c))
    else:
        name = name_or_cfg
        if name not in TASKS:
            raise ValueError(f"task: unknown task {name!r}; known: {', '.join(sorted(TASKS))}")
        fields = {f.name for f in dataclasses.fields(TASKS[name][1])}
        unknown = sorted(set(params) - fields)
        if unknown:
            raise ValueError(f"task.{unknown[0]}: not a parameter of {name!r}; known: {', '.join(sorted(fields))}")
        cfg = TASKS[name][1](**params)
    return TASKS[name][0](cfg, seed=seed, device=device)

"""Synthetic tasks. ``make_task(name, seed=..., device=..., **params)`` or ``make_task(TaskConfig)``.

A task yields ``(inputs, targets)`` int64 tensors ``[batch, seq_len]`` on its device
with ``targets == -100`` wherever nothing is scored; the same (seed, split, index)
gives the same bits on any device.
"""
from __future__ import annotations

import dataclasses

from sandbox.tasks.mqar import MQAR, MQARConfig

TASKS = {"mqar": (MQAR, MQARConfig)}


class TrainBatches:
    """Training batch of each step, generated several steps at a time.

    ``batches[step]`` equals ``task.sample(batch_size, "train", step)`` bit for bit; a block
    of up to 16 steps comes from one ``sample(..., count=n)`` call, so a GPU run pays the
    generator's ~300 kernel launches once per block instead of once per step.
    """

    def __init__(self, task, batch_size: int, max_ahead: int = 16):
        self.task, self.batch_size = task, batch_size
        self.ahead = max(1, min(max_ahead, getattr(task, "rows_per_call", batch_size) // batch_size))
        self.first, self.block = None, None

    def __getitem__(self, step: int):
        B = self.batch_size
        if self.first is None or not self.first <= step < self.first + self.ahead:
            self.first, self.block = step, self.task.sample(B, "train", step, count=self.ahead)
        i = (step - self.first) * B
        return tuple(t[i:i + B] for t in self.block)


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

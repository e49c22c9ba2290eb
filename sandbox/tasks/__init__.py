"""Synthetic tasks. ``make_task(name, seed=..., device=..., **params)`` or ``make_task(TaskConfig)``.

A task yields ``(inputs, targets)`` int64 tensors ``[batch, seq_len]`` on its device
with ``targets == -100`` wherever nothing is scored; the same (seed, split, index)
gives the same bits on any device.
"""
from __future__ import annotations

import dataclasses

from sandbox.tasks.mqar import MQAR, MQARConfig

TASKS = {"mqar": (MQAR, MQARConfig)}


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

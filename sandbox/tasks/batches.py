"""The training batches of a run, drawn ahead on the task's device."""
from __future__ import annotations

import torch


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
        per_call = max(1, self.task.rows_per_call // B)       # steps per generator call
        span = self.span if self.steps is None else max(1, min(self.span, self.steps - first))  # a resumed run
        for s in range(0, span, per_call):
            n = min(per_call, span - s)
            x, y = self.task.sample(B, "train", first + s, count=n)
            self.x[s * B:(s + n) * B] = x
            self.y[s * B:(s + n) * B] = y
        self.first = first

"""Synthetic tasks behind one contract (``base.Task``), registered by name. Importing this
package registers every task.

``make_task(name, seed=..., device=..., **params)`` or ``make_task(TaskConfig)`` builds one; it
yields ``(inputs, targets)`` int64 tensors ``[batch, seq_len]`` on its device with
``targets == -100`` wherever nothing is scored, from a train, a val and a test split kept apart;
the same (seed, split, index) gives the same bits on any device.
"""
from sandbox.tasks.base import SPLIT_IDS, Task, make_task, register_task, task_config_class, task_names
from sandbox.tasks.batches import TrainBatches

# Each import registers its tasks.
from sandbox.tasks import mqar  # noqa: E402,F401

__all__ = ["SPLIT_IDS", "Task", "TrainBatches", "make_task", "register_task", "task_config_class", "task_names"]

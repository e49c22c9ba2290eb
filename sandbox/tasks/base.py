"""The task contract and the name -> class registry.

A task is a generator of examples behind three splits:

* ``train``: unbounded; batch ``index`` of ``batch_size`` rows holds examples
  ``index * batch_size ...``, taken modulo ``train_examples`` when the task has a fixed
  training set (a recipe that trains for epochs over one, as Zoology's does);
* ``val``: a fixed set of ``split_sizes["val"]`` examples, where a learning rate and an
  early-stop step are chosen;
* ``test``: a fixed set of ``split_sizes["test"]`` examples, where verdicts are read.

An example is an ``(inputs, targets)`` pair of int64 rows of ``seq_len`` tokens, with
``targets == -100`` wherever nothing is scored. Each split draws from its own stream (its
split id below is hashed with the seed and the example id), so the same (seed, split, index)
gives the same bits on any device. The splits are kept apart by scoring, not by rejection,
so an example's bits never depend on the other splits: a train row equal to a val or test
example, or a val row equal to a test example, keeps its tokens and loses its targets.

A task subclasses ``Task``, sets the members below in ``__init__`` and writes ``examples``;
the base class draws batches from it and keeps the splits apart. Each registered task names
a config dataclass; the YAML section ``task`` is parsed into it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

import torch

from sandbox.tasks.rng import row_fingerprint

SPLIT_IDS = {"train": 1, "test": 2, "val": 3}         # hashed into every random number: never renumber
# the held-out splits whose examples a scored row of each split must not equal
HELD_OUT_FROM = {"train": ("val", "test"), "val": ("test",), "test": ()}

IGNORE = -100


class Task:
    """Base class of every task: the members a trainer, an evaluation and a verdict may read.

    Set by the subclass:
      * ``seq_len``: tokens per row;
      * ``vocab_size``: tokens the model must embed (every input is below it);
      * ``chance``: the accuracy of a model that has not learned the task's skill (what "at
        chance" means is the subclass's to state);
      * ``split_sizes``: examples in each held-out split, ``{"val": n, "test": n}``.

    With defaults here:
      * ``max_targets``: scored positions per row at most (lets a head read those positions
        only); None when any position may be scored;
      * ``rows_per_call``: the most rows one call of ``examples`` should make (bounds its
        temporaries; ``TrainBatches`` draws this many at once);
      * ``train_examples``: the size of a fixed training set (None: every batch is new).
    """

    seq_len: int
    vocab_size: int
    chance: float
    split_sizes: dict[str, int]
    max_targets: int | None = None
    rows_per_call: int = 4096
    train_examples: int | None = None
    name: str                                           # set by ``register_task``

    def __init__(self, seed: int = 0, device="cpu"):
        self.seed, self.device = seed, torch.device(device)
        self._held_out: dict[str, torch.Tensor] = {}

    # ---- what a task writes ----------------------------------------------------------------
    def examples(self, ids: torch.Tensor, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The examples of global ids (int64 ``[B]``, on the task's device) of ``split``, before the
        splits are kept apart: ``(inputs, targets)`` int64 ``[B, seq_len]``. Each row must depend on
        (seed, split, id) alone (``rng.row_key(ids, seed, SPLIT_IDS[split])``)."""
        raise NotImplementedError

    # ---- what the contract gives ------------------------------------------------------------
    def sample(self, batch_size: int, split: str = "train", index: int = 0, count: int = 1):
        """Batch ``index`` of a split: examples ``index*batch_size ... (index+1)*batch_size - 1``.
        With ``count``, batches ``index ... index+count-1`` stacked along the rows, with the same
        bits as sampling them one by one (one call instead of ``count``: on a GPU the generator is
        bound by kernel launches, not by the size of the batch).

        A row equal to an example of a split held out from this one (``HELD_OUT_FROM``) is not
        scored (targets -100), so no two splits share a scored example."""
        self._check_split(split)
        first, stop = index * batch_size, (index + count) * batch_size
        if split != "train" and stop > self.split_sizes[split]:
            raise IndexError(f"{split} split has {self.split_sizes[split]} examples; batch {index} of "
                             f"{batch_size} runs past it")
        ids = torch.arange(first, stop, device=self.device, dtype=torch.int64)
        if split == "train" and self.train_examples is not None:
            ids = ids % self.train_examples
        return self._draw(ids, split)

    def eval_batches(self, split: str, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The whole of a held-out split (``val`` or ``test``) in batches; the last one may be smaller."""
        self._check_split(split)
        if split == "train":
            raise ValueError("split: 'train' is unbounded; eval_batches reads 'val' or 'test'")
        n = self.split_sizes[split]
        for start in range(0, n, batch_size):
            yield self._draw(torch.arange(start, min(start + batch_size, n), device=self.device,
                                          dtype=torch.int64), split)

    def test_batches(self, batch_size: int):
        """``eval_batches("test", batch_size)``."""
        return self.eval_batches("test", batch_size)

    def held_out_fingerprints(self, split: str) -> torch.Tensor:
        """Sorted fingerprints (``rng.row_fingerprint``) of the inputs of every example that a scored
        row of ``split`` must not equal; computed once, on the first call."""
        if split not in self._held_out:
            parts = [torch.zeros(0, dtype=torch.int64, device=self.device)]
            for other in HELD_OUT_FROM[split]:
                n, step = self.split_sizes[other], max(1, self.rows_per_call)
                parts += [row_fingerprint(self.examples(torch.arange(s, min(s + step, n), device=self.device,
                                                                     dtype=torch.int64), other)[0])
                          for s in range(0, n, step)]
            self._held_out[split] = torch.cat(parts).sort().values
        return self._held_out[split]

    # ---- steps -------------------------------------------------------------------------------
    def _check_split(self, split: str) -> None:
        if split not in SPLIT_IDS:
            raise ValueError(f"split: must be one of {', '.join(map(repr, SPLIT_IDS))}, got {split!r}")

    def _draw(self, ids: torch.Tensor, split: str):
        x, y = self.examples(ids, split)
        held = self.held_out_fingerprints(split)
        if held.numel():
            fp = row_fingerprint(x)           # held is sorted: a binary search, not isin's sort
            clash = held[torch.searchsorted(held, fp).clamp_max(held.numel() - 1)] == fp
            y = torch.where(clash[:, None], torch.full_like(y, IGNORE), y)
        return x, y


_REGISTRY: dict[str, tuple[type[Task], type]] = {}


def register_task(name: str, config_cls: type) -> Callable[[type[Task]], type[Task]]:
    """Class decorator: ``@register_task("mqar", MQARConfig)``."""
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"config class for task {name!r} must be a dataclass")

    def deco(cls: type[Task]) -> type[Task]:
        if name in _REGISTRY:
            raise ValueError(f"task {name!r} registered twice")
        _REGISTRY[name] = (cls, config_cls)
        cls.name = name
        return cls

    return deco


def task_names() -> list[str]:
    return sorted(_REGISTRY)


def task_config_class(name: str) -> type:
    return _REGISTRY[name][1]


def make_task(name_or_cfg, *, seed: int = 0, device="cpu", **params) -> Task:
    """Build a task from a name and parameters, or from a config dataclass of a known task."""
    if dataclasses.is_dataclass(name_or_cfg):
        cfg = name_or_cfg
        name = next((n for n, (_, c) in _REGISTRY.items() if isinstance(cfg, c)), None)
        if name is None:
            raise TypeError(f"task: {type(cfg).__name__} is the config of no registered task")
    else:
        name = name_or_cfg
        if name not in _REGISTRY:
            raise ValueError(f"task: unknown task {name!r}; known: {', '.join(task_names())}")
        fields = {f.name for f in dataclasses.fields(_REGISTRY[name][1])}
        unknown = sorted(set(params) - fields)
        if unknown:
            raise ValueError(f"task.{unknown[0]}: not a parameter of {name!r}; known: {', '.join(sorted(fields))}")
        cfg = _REGISTRY[name][1](**params)
    return _REGISTRY[name][0](cfg, seed=seed, device=device)

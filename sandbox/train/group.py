"""What a stack of runs trains with, and the rules that shape it.

``Group(cfgs)``: the device, tasks, models, the ``Step`` and the batch pools (one per seed) of runs that differ only
in learning rate and seed (``stack_key``). ``use_cuda_graph`` reads ``train.cuda_graph``, ``compile.decide``
``train.compile``; ``worth_regrouping`` is the run loop's decision from measured times to rebuild a stack whose
replicas mostly stopped.
"""
from __future__ import annotations

import json

import torch

from sandbox.config import RunConfig, to_dict
from sandbox.kernels import triton_key
from sandbox.model import LanguageModel
from sandbox.tasks import TrainBatches, make_task
import sandbox.train.compile as compiling
from sandbox.train.step import Step, graph_safe


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"train.device: {name} requested but CUDA is not available")
    return torch.device(name)


def build(cfg: RunConfig, device: torch.device):
    """The task and a freshly initialised model (initialised on the CPU so the seed gives
    the same weights on any device)."""
    task = make_task(cfg.task.params, seed=cfg.seed, device=device)
    torch.manual_seed(cfg.seed)
    model = LanguageModel(cfg.model, task.vocab_size, task.seq_len)
    return task, model.to(device)


def use_cuda_graph(setting, device: torch.device, model) -> bool:
    """``train.cuda_graph``: auto = on CUDA when every mixer is graph-safe; true insists."""
    if setting == "auto":
        return device.type == "cuda" and graph_safe(model)
    if setting and device.type != "cuda":
        raise ValueError(f"train.cuda_graph: true needs a CUDA device, got {device}")
    if setting and not graph_safe(model):
        raise ValueError(f"train.cuda_graph: true, but {eager_mixers(model)}")
    return bool(setting)


def eager_mixers(model) -> str:
    """Which mixers of ``model`` are not graph-safe, and why (each mixer's ``eager_reason``)."""
    return "; ".join(sorted({f"mixer {m.mixer_name} is not graph-safe: {m.eager_reason()}"
                             for m in model.mixers if not m.graph_safe()}))


def stack_key(cfg: RunConfig) -> str:
    """Runs with equal keys may train as replicas of one stacked model (they differ in lr, seed, name)."""
    d = to_dict(cfg)
    d.pop("seed", None)
    d.pop("name", None)
    d["train"] = {k: v for k, v in d["train"].items() if k != "lr"}
    return json.dumps(d, sort_keys=True, default=str)


class Unstackable(ValueError):
    """Runs that must train one at a time: a mixer of theirs is not graph-safe (its shapes change, or it waits on
    the host), so it cannot run under vmap."""


# A group whose replicas stopped keeps computing them (frozen, at full cost): it is rebuilt with the
# running ones when the time that saves exceeds REGROUP_FACTOR times what the group took to start.
REGROUP_FACTOR = 2.0


def worth_regrouping(active: int, replicas: int, steps_left: int, step_s: float, setup_s: float) -> bool:
    """Whether ``active`` of ``replicas`` stacked runs should go on as a group of their own: the step's cost
    is taken as proportional to the replicas (at batch 256 one already fills a GPU, results/throughput/)."""
    if not 0 < active < replicas:
        return False
    return steps_left * step_s * (1 - active / replicas) > REGROUP_FACTOR * setup_s


class Group:
    """What a run of R stacked replicas trains with: the tasks, the models, the step, the batches.

    ``stack``: the number of runs the rule for ``train.compile: auto`` weighs (default: these), so that a group
    rebuilt from a stack's running replicas keeps the stack's decision."""

    def __init__(self, cfgs: list[RunConfig], stack: int | None = None):
        tc = cfgs[0].train
        self.device = device = resolve_device(tc.device)
        if device.type == "cuda":
            torch.backends.cudnn.deterministic = True   # cuDNN's conv1d weight gradient in a fixed order: runs repeat
            triton_key.compute_soon()                   # overlaps building the models (see triton_key.py)
        built = [build(c, device) for c in cfgs]
        self.tasks, self.models = [b[0] for b in built], [b[1] for b in built]
        if tc.precision == "fp64":
            self.models = [m.double() for m in self.models]
        safe = graph_safe(self.models[0])
        if len(cfgs) > 1 and not safe:
            raise Unstackable(f"train_replicas: cannot train stacked: {eager_mixers(self.models[0])}")
        self.bf16 = tc.precision == "bf16" or (tc.precision == "auto" and device.type == "cuda")
        self.graph = use_cuda_graph(tc.cuda_graph, device, self.models[0])
        self.compile = compiling.decide(tc.compile, cfgs[0], stack or len(cfgs), device, safe)
        # a seed's task gives its replicas the same batches: one pool per seed
        self.seeds = [c.seed for c in cfgs]
        self.step = Step(self.models, [c.train for c in cfgs], per_row=getattr(self.tasks[0], "max_targets", None),
                         autocast_dtype=torch.bfloat16 if self.bf16 else None,
                         capture_after=2 if self.graph else None, compile=self.compile)
        self.pools = {seed: TrainBatches(self.tasks[self.seeds.index(seed)], tc.batch_size, tc.steps)
                      for seed in dict.fromkeys(self.seeds)}

    def batch(self, s: int):
        """One batch for every replica ([B, T]) when they share a seed, else one each ([R, B, T])."""
        got = {seed: pool[s] for seed, pool in self.pools.items()}
        if len(got) == 1:
            return got[self.seeds[0]]
        xs, ys = zip(*(got[seed] for seed in self.seeds))
        return torch.stack(xs), torch.stack(ys)

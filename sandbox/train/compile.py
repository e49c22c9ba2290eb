"""Compiling the training step: whether a run compiles (``train.compile``), with which Inductor settings, and what
torch's caches gave it.

**Whether.** ``decide``: ``true`` and ``false`` force; ``auto`` compiles on a GPU when the seconds the compiled step
would save over the run exceed what compiling costs at its start (``estimate``). Both come from reference
configurations measured on a GPU (``RULE_FILE``, written by ``benchmarks/time_to_result.py``, which says the command,
the GPU, the commit and the date): the nearest reference's eager and compiled step (for a mixer none has, the one
that gains most), scaled to this configuration's work, and its compile seconds from empty caches: so a compiled
run is never slower than the same run uncompiled, on a fresh machine too, and the runs after it, with torch's
caches warm, gain more. The decision is a function of
the configuration alone, never of timings or of what the caches hold, because a compiled and an eager step round
differently: a configuration takes the same path in every rerun. The eager path keeps its CUDA graph where the
mixers allow it (``group.use_cuda_graph``).

**Caches.** torch keeps what it compiles: Inductor's FX graph cache and AOTAutograd's cache hold a compiled
forward and backward on disk (``TORCHINDUCTOR_CACHE_DIR``), Triton the kernels (``TRITON_CACHE_DIR``), so a later
process compiling a step of the same shapes and settings loads them and only traces. ``SANDBOX_COMPILE_CACHE=DIR``
points both at one directory (kept across reboots, shared, or removed for a cold start); torch's own variables, where
set, win. Within a process Dynamo keeps each compilation, and a later stack of the same shapes reuses it.
``cache_outcome`` reads torch's counters to say which of these a compilation got.
"""
from __future__ import annotations

import contextlib
import copyreg
import dataclasses
import functools
import json
import math
import os
from pathlib import Path

import torch

RULE_FILE = Path(__file__).resolve().parents[2] / "results" / "throughput" / "compile_rule.json"


# -- whether to compile ----------------------------------------------------------------------------------------
def work(cfg) -> float:
    """What a step's cost scales with, per replica: tokens per step x width x layers (the steps of this project's
    models are bound by the bytes they move, which grow with these; results/throughput/)."""
    seq_len = getattr(cfg.task.params, "seq_len", None)
    if seq_len is None:
        raise ValueError(f"train.compile: auto: task {cfg.task.name} has no seq_len to size its step by; "
                         f"set train.compile to true or false")
    return float(cfg.train.batch_size * seq_len * cfg.model.d_model * cfg.model.n_layers)


def features(cfg) -> tuple[str, ...]:
    """The mixers of a configuration and the options that add work to their step (top-k, short convolution)."""
    names = sorted(set(cfg.model.layer_mixers()))
    opts = [f"{n}.{k}" for n in names for k in ("topk", "conv_size") if getattr(cfg.model.options(n), k, None)]
    return tuple(names + opts)


@dataclasses.dataclass(frozen=True)
class Reference:
    name: str
    features: tuple[str, ...]
    work: float
    eager_ms: float             # a step uncompiled (CUDA graph), one run
    compiled_ms: float          # the step compiled
    compile_s: float            # seconds compiling adds to a run's start


@dataclasses.dataclass(frozen=True)
class Estimate:
    reference: str
    saved_s: float              # what the compiled step would save over the run
    cost_s: float               # what compiling costs at its start

    @property
    def pays(self) -> bool:
        return self.saved_s > self.cost_s

    def __str__(self) -> str:
        return f"saves about {self.saved_s:.0f} s, costs about {self.cost_s:.0f} s (as {self.reference})"


@functools.cache
def references(path: Path = RULE_FILE) -> tuple[Reference, ...]:
    from sandbox.config import ConfigError, config_from_dict
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: train.compile: auto reads its constants here: {e}; "
                         f"set train.compile to true or false") from e
    refs = []
    for row in data["references"]:
        try:
            cfg = config_from_dict(row["config"], f"{path}: {row['name']}")
        except ConfigError as e:
            raise ValueError(str(e)) from e
        refs.append(Reference(row["name"], features(cfg), work(cfg), 1e3 / row["eager_steps_per_s"],
                              1e3 / row["compiled_steps_per_s"], row["compile_s"]))
    return tuple(refs)


def estimate(cfg, replicas: int = 1, refs: tuple[Reference, ...] | None = None) -> Estimate:
    """What compiling a stack of ``replicas`` runs of ``cfg`` would save over its ``train.steps`` and what it costs,
    from the reference with the same mixers whose options and then whose work are nearest; the time saved per step
    grows with the work (a stack's replicas add theirs).

    Mixers no reference has take the reference whose compiled step saves most for its work: how much Inductor
    gains on a mixer's step depends on the chains only that mixer's uncompiled step runs, which nothing measured,
    and a compiled run is slower than an uncompiled one by its compilation at most, where the uncompiled step of
    a wrong guess can take twice as long over the whole run."""
    refs = refs or references()
    mine, w = features(cfg), work(cfg) * replicas
    mixers = {f for f in mine if "." not in f}
    same = [r for r in refs if {f for f in r.features if "." not in f} == mixers]
    if same:
        ref = min(same, key=lambda r: (len(set(r.features) ^ set(mine)), abs(math.log(w / r.work))))
    else:
        ref = max(refs, key=lambda r: (r.eager_ms - r.compiled_ms) / r.work)
    saved = cfg.train.steps * (ref.eager_ms - ref.compiled_ms) / 1e3 * w / ref.work
    return Estimate(ref.name, saved, ref.compile_s)


@dataclasses.dataclass(frozen=True)
class Decision:
    compile: bool
    reason: str

    def __bool__(self) -> bool:
        return self.compile


def decide(setting, cfg, replicas: int, device: torch.device, graph_safe: bool) -> Decision:
    """``train.compile`` for a stack of ``replicas`` runs of ``cfg``: true or false as set; auto compiles on CUDA a
    model whose mixers are all graph-safe (static shapes: one compilation) when ``estimate`` says it pays."""
    if setting != "auto":
        return Decision(bool(setting), f"train.compile: {str(bool(setting)).lower()}")
    if device.type != "cuda":
        return Decision(False, "not on a GPU")
    if not graph_safe:
        return Decision(False, "a mixer is not graph-safe")
    est = estimate(cfg, replicas)
    runs = f" x {replicas} runs" if replicas > 1 else ""
    return Decision(est.pays, f"over {cfg.train.steps} steps{runs} compiling {est}")


# -- how to compile ----------------------------------------------------------------------------------------------
# Inductor lowers a concatenation of up to 8 pointwise results as one kernel that evaluates, at every element of
# the output, the producer of each piece, masked to the piece its column falls in. The backward of every fused
# projection is such a concatenation (the gradients of a feature map, a gate, a short convolution and a silu side
# by side). As a ``ConcatKernel`` each piece's producer is a kernel of its own, tiled for its own layout, writing
# straight into its slice (results/throughput/bench_concat.json). torch >= 2.12 has settings for it; in 2.11 the
# limit is a constant, and ``concat_kernels`` swaps the lowering while a step compiles.
CONCAT_OPTIONS = {"max_pointwise_cat_inputs": 0, "max_complex_pointwise_cat_inputs": 0}

# Inductor times a reduction's candidate configs on the GPU the first time it runs and keeps the fastest; those add
# in different orders, so two processes compiling the same step from empty caches could train different bits.
# Deterministic mode picks them by a fixed rule and times only what does not change the sums.
DETERMINISM = {"deterministic": True}

# Inductor's mixed-order reduction finishes a LayerNorm backward's column sums (weight and bias) with an eager
# ``sum`` over a workspace, a launch each; off, they are reductions Inductor fuses with their neighbours.
REDUCTIONS = {"triton.mix_order_reduction": False}

# Not set: programmatic dependent launch (``triton.enable_pdl``). It made a single run's GLA step 1.046x faster,
# but Inductor's own launcher cannot launch such a kernel, and Triton then builds a C launcher with the host
# compiler for each kernel signature: 5-7 s more on every cold start, which a GLA step repays only after about
# 50,000 steps, attention's and Gated DeltaNet's never (results/throughput/README.md, "Start-up").


def options() -> dict:
    """Inductor options of the step (those this torch knows)."""
    from torch._inductor import config
    known = config.get_config_copy()            # every setting of this torch, nested ones by dotted name
    return {k: v for k, v in {**CONCAT_OPTIONS, **DETERMINISM, **REDUCTIONS}.items() if k in known}


@contextlib.contextmanager
def concat_kernels():
    """While a step compiles under torch 2.11: every concatenation Inductor would lower pointwise becomes a
    ConcatKernel (a no-op where ``options`` has the setting)."""
    from torch._inductor import config, ir, lowering
    if hasattr(config, "max_complex_pointwise_cat_inputs"):
        yield
        return
    pointwise = lowering.pointwise_cat
    lowering.pointwise_cat = lambda inputs, dim=0: ir.TensorBox(ir.ConcatKernel.create(inputs, dim))
    try:
        yield
    finally:
        lowering.pointwise_cat = pointwise


# A sweep worker compiles one stack after another; each new shape adds an entry to Dynamo's cache of the step's
# function, and past its recompile limit Dynamo silently runs eager. So the limit is raised, and this process's
# compilations are dropped (torch.compiler.reset) once that many steps have compiled.
RECOMPILE_LIMIT = 64
_compiled_steps = 0


def compiled(fn):
    """``fn`` through ``torch.compile`` with the step's options (static shapes)."""
    global _compiled_steps
    if _compiled_steps >= RECOMPILE_LIMIT:
        torch.compiler.reset()
        _compiled_steps = 0
    dynamo = torch._dynamo.config
    # AOTAutograd's cache passes over a graph that holds an autograd.Function (``split_linear``'s backward) unless
    # told otherwise, and then every process traces the joint graph and partitions it again (1.7 s of the 5.1 s a
    # cached GLA step took to compile on the CPU). Its key covers the Function's traced forward and backward,
    # so a changed Function misses the cache rather than reusing a stale graph.
    from torch._functorch import config as functorch
    functorch.autograd_cache_allow_custom_autograd_functions = True
    dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)
    _compiled_steps += 1
    return torch.compile(fn, dynamic=False, options=options())


# -- what torch's caches gave ------------------------------------------------------------------------------------
def _memory_format(name: str) -> torch.memory_format:
    return getattr(torch, name)


# The on-disk caches key a compilation by a pickle of its graph and inputs, and pickle names a torch.memory_format
# (it has no __module__) after the first module in sys.modules through which "torch.contiguous_format" resolves:
# torch._utils where torch was imported first, optuna's lazy ``torch`` where optuna was. Processes that imported
# them in another order (`sandbox train` and a sweep worker) then key the same step apart. Pickled by name, every
# process keys it alike.
copyreg.pickle(torch.memory_format, lambda f: (_memory_format, (str(f).removeprefix("torch."),)))


def cache_counts() -> dict:
    """torch's counters of compiled graphs and of its on-disk caches' hits and misses, now (a graph the
    AOTAutograd cache passed over counts as a miss: it was traced and partitioned again)."""
    from torch._dynamo.utils import counters
    aot, ind = counters["aot_autograd"], counters["inductor"]
    return {"graphs": counters["stats"]["unique_graphs"],
            "hits": aot["autograd_cache_hit"] + ind["fxgraph_cache_hit"],
            "misses": aot["autograd_cache_miss"] + aot["autograd_cache_bypass"] + ind["fxgraph_cache_miss"]}


def cache_outcome(before: dict) -> str:
    """What the compilations since ``before`` (``cache_counts()``) got: "reused" (this process's own), "cached"
    (loaded from torch's on-disk caches), "cold" (compiled from nothing) or "partly cached"."""
    now = cache_counts()
    hits, misses = now["hits"] - before["hits"], now["misses"] - before["misses"]
    if now["graphs"] == before["graphs"] and not hits and not misses:
        return "reused"
    if hits and misses:
        return "partly cached"
    return "cached" if hits else "cold"


def use_cache_dir() -> None:
    """``SANDBOX_COMPILE_CACHE=DIR``: torch's compile caches (Inductor's, AOTAutograd's, Triton's) under DIR."""
    root = os.environ.get("SANDBOX_COMPILE_CACHE")
    if root:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(root) / "inductor"))
        os.environ.setdefault("TRITON_CACHE_DIR", str(Path(root) / "triton"))


use_cache_dir()

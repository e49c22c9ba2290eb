"""One training step of R replicas of a model, eager or replayed from one CUDA graph.

A replica is a whole ``LanguageModel``; replicas share the architecture and differ in weights
(seed) and learning rate. Their weights live in one [R, P] tensor (``StackedAdamW``, adamw.py), of
which each model's parameters are views. With R > 1, ``torch.func.vmap`` runs the model once over
all replicas, each weight an [R, ...] piece of that tensor: every matrix product becomes a batched
one and the recurrence kernels see one batch of R * B sequences (their custom ops fold the
replicas in). The backward of the summed losses is one [R, P] gradient; each replica's row is
clipped to its own norm and AdamW steps all rows at once, with the learning rates as a device
tensor.

So a whole step - forward, backward, clipping, optimizer, schedule and the running loss - is
device work with no host read (the learning rates are a table indexed by a step counter on the
device), and on CUDA it is captured once as a graph and replayed:
the host only copies the batch in and launches the graph. The sandbox's models are small, so
this removes what used to set the pace (Python, autograd and a few hundred kernel launches).

Requirements for a graph and for stacking, checked by ``graph_safe(model)``: every mixer keeps
static shapes and never waits on the host (``Mixer.graph_safe``). A replica that stops (early
stop, pruning, a non-finite loss) is frozen by a zero learning rate; the others go on.

With ``compile`` (``compile_now()``) the forward and backward go through ``torch.compile`` (the kernels
are custom ops it treats as opaque), which fuses the norms, the residual adds, SwiGLU and the gate
arithmetic. A process keeps what it compiled: Dynamo's guards check a step's shapes and settings, not
which models it holds, so a later ``Step`` of a kind compiled before (``kind``: what its code depends on
besides tensor shapes) runs that compilation at no cost (``compiled_before``).
"""
from __future__ import annotations

import contextlib
import copyreg
import gc
import hashlib
import json
import math
from pathlib import Path
from typing import Callable

import torch

from sandbox.kernels.cross_entropy import IGNORE, cross_entropy
from sandbox.train.adamw import StackedAdamW


def _memory_format(name: str) -> torch.memory_format:
    return getattr(torch, name)


# Inductor's and AOTAutograd's on-disk caches key a compilation by a pickle of its graph and inputs, and pickle
# names a torch.memory_format (it has no __module__) after the first module in sys.modules through which
# "torch.contiguous_format" resolves: torch._utils where torch was imported first, optuna.samplers._gp.sampler (a
# lazy ``torch``) where optuna was. Two processes that imported them in another order (a sweep worker or a test
# process, and a helper of precompile.py) then key the same step apart, and neither finds the other's compilation.
# Pickled by name, every process keys it alike.
copyreg.pickle(torch.memory_format, lambda f: (_memory_format, (str(f).removeprefix("torch."),)))


# The kinds of step this process compiled since Dynamo's cache was last dropped. A sweep worker trains one
# stack after another; one of a kind compiled before reuses that compilation (0.1 s on the CPU, against 11 s
# that only traces with the on-disk caches warm, 20-27 s on the H200 from a cold start). Each new kind adds an
# entry to Dynamo's cache of ``Step._losses``, and past its recompile limit Dynamo silently runs eager, so the
# limit is raised to RECOMPILE_LIMIT and the cache dropped when that many kinds have compiled.
RECOMPILE_LIMIT = 64
_compiled_kinds: set = set()


def compiled_before(kind) -> bool:
    """Whether this process compiled a step of ``kind`` that a new one reuses without compiling."""
    return kind is not None and kind in _compiled_kinds


# A step compiled once (by a helper process, precompile.py, or by a stack) leaves its forward and backward in the
# on-disk caches; a marker beside them says so, and a later stack of that kind in any process compiles from its
# first step, since compiling then only traces (4 s on the H200, against 18-27 s from a cold start).
def warm_marker(kind) -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    digest = hashlib.sha1(json.dumps(list(kind), default=str).encode()).hexdigest()[:24]
    return Path(cache_dir()) / "sandbox-steps" / digest


def cache_warm(kind) -> bool:
    """Whether a step of ``kind`` was compiled into the on-disk caches (by any process) since they were made."""
    return kind is not None and warm_marker(kind).exists()


def mark_cache_warm(kind, seconds: float) -> None:
    """Leave ``kind``'s marker, holding the seconds its first compilation from cold caches took (a marker already
    there keeps its own: a later, warm compilation is not what a cold start costs)."""
    if kind is not None and not warm_marker(kind).exists():
        path = warm_marker(kind)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{seconds:.3f}")


def compile_seconds(kind) -> float | None:
    """The seconds ``kind``'s first compilation took, as its marker holds them (None: no marker, or one from before
    markers kept them)."""
    try:
        return float(warm_marker(kind).read_text())
    except (OSError, ValueError):
        return None


def forget_compilations() -> None:
    """Drop every compilation this process holds (the on-disk caches stay)."""
    torch.compiler.reset()
    _compiled_kinds.clear()


# Inductor lowers a concatenation of up to 8 pointwise results as one kernel that evaluates, at every element of
# the output, the producer of each piece, masked to the piece its column falls in, reading each input in the
# output's order. The backward of every fused product is such a concatenation (a mixer's q, k, v, gate and
# output-gate projections, SwiGLU's up projection): the gradients of a feature map, a gate, a short convolution
# and a silu side by side. Lowered as a ``ConcatKernel`` instead, each piece's producer is a kernel of its own,
# tiled for its own layout, that writes straight into its slice of the concatenation (no copy). On the H200
# (torch 2.11, results/throughput/bench_concat.json): a stack of 9 Figure 8 GLA runs (conv 4, T320) 26.29 ->
# 24.43 ms per step, the single Figure 8 GLA 2.004 -> 1.949 ms. torch >= 2.12 has settings for it; in 2.11 the
# limit is a constant, and there the pointwise lowering is swapped for the ConcatKernel one while a step compiles.
CONCAT_OPTIONS = {"max_pointwise_cat_inputs": 0, "max_complex_pointwise_cat_inputs": 0}


# Inductor times a reduction kernel's candidate configs (its block size along the reduced dimension, its warps)
# on the GPU the first time the kernel runs and keeps the fastest; those differ in the order they add, so two
# processes that compile the same step from empty caches could pick differently and train different bits (on
# the H200, three such processes ended a GLA d128 run's 400 steps at test losses 8.3372 to 8.3403; all three
# 8.339338 with this; results/throughput/). Inductor's deterministic mode (in torch 2.11 and 2.13) picks those by
# a fixed rule instead and times only what does not change the sums.
DETERMINISM = {"deterministic": True}

# A LayerNorm's backward reduces along rows (the input's gradient) and along columns (the weight's and bias's).
# Inductor's mixed-order reduction does both in one kernel that writes per-block column sums to a workspace,
# then sums that workspace with an eager ``sum`` per parameter: 8 reduce launches of about 7 us each in the
# Figure 8 step (0.063 ms of 1.72), each adding up a 1536 x 128 float32 block. Off, the column sums are kernels
# Inductor fuses with their neighbours.
REDUCTIONS = {"triton.mix_order_reduction": False}

# Programmatic dependent launch (Hopper and later; Inductor generates none elsewhere): each Inductor kernel of
# the step and of the optimizer's update is launched while the kernel before it still runs, and waits
# (``griddepcontrol.wait``) only before it touches what that one wrote, so its start overlaps the other's tail.
# It pays where kernels are short and launches dominate: on the H200 the Figure 8 step went from 1.490 to 1.424
# ms (1.05x), attention d64 1.02x, Gated DeltaNet 0.99x, the same bits in all three. A stack's kernels are long,
# and there the early programs only sit on SMs the running kernel could use: stacks of 9 GLA top-8 0.972x and
# GSA top-16 0.982x, stacks of 3 GLA d64 1.007x and GSA d64 0.992x (results/throughput/bench_pdl.json). So a
# single run's step launches early and a stack's does not. A CUDA graph keeps the attribute as a programmatic edge.
LAUNCH = {"triton.enable_pdl": True}


def compile_options(replicas: int = 1) -> dict:
    """``torch.compile`` options of the step of ``replicas`` stacked runs: the concatenations as ConcatKernels,
    where torch has the setting (``max_pointwise_cat_inputs`` alone, in 2.11, only keys the on-disk caches apart
    from the code before), reductions compiled the same way in every process, a LayerNorm's column sums without
    an eager finish, and, for a single run, each kernel launched before the one ahead of it ends."""
    from torch._inductor import config
    known = config.get_config_copy()            # every setting of this torch, nested ones by dotted name
    launch = LAUNCH if replicas == 1 else {}
    return {k: v for k, v in {**CONCAT_OPTIONS, **DETERMINISM, **REDUCTIONS, **launch}.items() if k in known}


@contextlib.contextmanager
def concat_kernels():
    """While a step compiles under torch 2.11: every concatenation Inductor would lower pointwise becomes a
    ConcatKernel (a no-op where ``compile_options`` has the setting)."""
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


def graph_safe(model) -> bool:
    return all(m.graph_safe() for m in model.mixers)


def lr_lambda(steps: int, warmup_frac: float) -> Callable[[int], float]:
    """The learning-rate factor of step ``step`` (0-based): linear warm-up, then cosine to 0."""
    warmup = int(warmup_frac * steps)

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return f


def lr_factor(step: torch.Tensor, steps: int, warmup_frac: float) -> torch.Tensor:
    """``lr_lambda`` over a tensor of steps (float64)."""
    warmup = int(warmup_frac * steps)
    cosine = 0.5 * (1 + torch.cos(math.pi * ((step - warmup) / max(1, steps - warmup)).clamp(max=1.0)))
    if warmup == 0:
        return cosine
    return torch.where(step < warmup, (step + 1) / warmup, cosine)


def scored_positions(targets: torch.Tensor, per_row: int | None):
    """``(positions [B, P], targets [B, P])`` covering every scored target when a row has at most
    ``per_row`` of them (``None``: all positions). Fixed shapes, so no host sync."""
    if per_row is None or per_row >= targets.shape[1]:
        return None, targets
    pos = torch.topk((targets != IGNORE).to(torch.float16), per_row, dim=1, sorted=False).indices
    return pos, targets.gather(1, pos)


class Step:
    """``step(x, y)``: one training step of every replica.

    ``x, y``: int64 ``[B, T]`` (one batch for all replicas) or ``[R, B, T]`` (a batch each).
    ``models`` and ``train_cfgs`` are per replica; the train configs may differ in ``lr`` only
    (and in whatever does not enter the step). ``capture_after=n`` runs n eager steps (compiling
    and tuning the kernels, creating the optimizer state), then captures one and replays it;
    ``None`` stays eager. Read the running loss of each replica from ``loss_sum`` ([R]).
    """

    def __init__(self, models: list, train_cfgs: list, *, per_row: int | None, autocast_dtype=None,
                 capture_after: int | None = None, compile: bool = False, kind=None):
        self.models, self.R, self.kind = models, len(models), kind
        tc = train_cfgs[0]
        self.steps, self.warmup_frac = tc.steps, tc.warmup_frac
        self.per_row, self.autocast_dtype = per_row, autocast_dtype
        p0 = next(models[0].parameters())
        self.device = p0.device
        # the learning rate of every replica at every step, looked up on the device by the step counter
        factor = lr_factor(torch.arange(self.steps + 1, dtype=torch.float64), self.steps, self.warmup_frac)
        self.lr_table = (torch.tensor([c.lr for c in train_cfgs], dtype=torch.float64)[:, None] * factor[None, :]
                         ).float().to(self.device)                           # [R, steps + 1]
        self.counter = torch.zeros(1, dtype=torch.int64, device=self.device)   # the step being taken
        self.lr = torch.zeros(self.R, dtype=torch.float32, device=self.device)
        # every replica's weights in one [R, P] tensor (the models' parameters become views of its rows)
        self.optimizer = StackedAdamW(models, train_cfgs, self.lr)
        self.loss_sum = torch.zeros(self.R, device=self.device)
        self.buffer_names = [n for n, _ in models[0].named_buffers()]
        self.model_buffers = [list(m.buffers()) for m in models]   # read here: traced after a forward, a graph break
        self.forward, self.compiled = self._losses, False
        self.capture_after = capture_after
        self.graph = None
        self.calls = 0
        self.stream = torch.cuda.Stream() if capture_after is not None else None
        if compile:
            self.compile_now()

    def compile_now(self) -> None:
        """Go on with the forward and backward compiled: the next steps compile it (or reuse the compilation
        of a step of the same kind) and capture anew."""
        if not compiled_before(self.kind):
            if len(_compiled_kinds) >= RECOMPILE_LIMIT or self.kind is None:
                forget_compilations()       # a step of no kind: nothing to reuse, and no count of the entries
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
            torch._dynamo.config.accumulated_recompile_limit = max(
                torch._dynamo.config.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)
            if self.kind is not None:
                _compiled_kinds.add(self.kind)
        options = compile_options(self.R)
        self.forward, self.compiled = torch.compile(self._losses, dynamic=False, options=options), True
        self.optimizer.compile(options)
        self.graph, self.calls = None, 0

    # -- state that lives outside the graph ------------------------------------------------------
    def start_at(self, step: int) -> None:
        """Continue a run at ``step`` (after loading the replicas' checkpoints)."""
        self.counter.fill_(min(step, self.steps))

    def optimizer_state(self, r: int, device=None) -> dict:
        """Replica r's AdamW state (a torch AdamW ``state_dict``, for its checkpoint), its tensors copied to
        ``device`` (default: where the weights are)."""
        return self.optimizer.state_dict(r, int(self.counter), device)

    def load_optimizer_state(self, r: int, state: dict) -> None:
        self.optimizer.load_state_dict(r, state)

    def freeze(self, r: int) -> None:
        """Replica r trains no further (its learning rate is zero from the next step)."""
        self.lr_table[r] = 0.0

    # -- the step --------------------------------------------------------------------------------
    def _losses(self, x, y):
        """(sum of the replicas' total losses, per-replica losses [R])."""
        params = self.optimizer.weights()       # [R, ...] pieces of the flat weights
        if self.R == 1:
            m = self.models[0]
            pos, y = scored_positions(y, self.per_row)
            logits = torch.func.functional_call(m, {n: p[0] for n, p in params.items()}, (x, pos))
            aux = m.aux_loss()
            loss = cross_entropy(logits, y).sum() / (y != IGNORE).sum()
            return (loss + aux if aux is not None else loss), loss[None]
        buffers = {n: torch.stack(bs) for n, bs in zip(self.buffer_names, zip(*(m.buffers() for m in self.models)))}
        base = self.models[0]

        def one(p, b, x, y):
            pos, y = scored_positions(y, self.per_row)
            logits = torch.func.functional_call(base, (p, b), (x, pos))
            aux = base.aux_loss()
            return logits, y, (aux if aux is not None else logits.new_zeros((), dtype=torch.float32))

        dim = 0 if x.dim() == 3 else None
        # randomness: each replica draws its own random numbers (LTE's dropout), as a run of its own would
        logits, y, aux = torch.func.vmap(one, in_dims=(0, 0, dim, dim), randomness="different")(params, buffers, x, y)
        # a mixer's running state updated in the forward (LTE's lambda) went to the stacked copies: back to the models
        for stacked, bs in zip(buffers.values(), zip(*self.model_buffers)):
            for r, b in enumerate(bs):
                b.copy_(stacked[r])
        # The loss over all replicas at once, outside vmap (one op over all rows; under vmap, torch's loss had
        # picked each target's logit in its backward by a scatter into a zero tensor the size of the logits).
        nll = cross_entropy(logits, y)
        loss = nll.view(self.R, -1).sum(1) / (y != IGNORE).view(self.R, -1).sum(1)
        return (loss + aux).sum(), loss

    # The forward's settings (mixed precision; for stacked replicas, the attention kernels) are entered around
    # the compiled function, not inside it: traced there, either keeps the compilation out of AOTAutograd's
    # cache, and then every stack of a sweep compiles from scratch even where one of the same shapes has
    # compiled before (measured on the CPU: 17 s on a warm cache with them inside).
    def autocast(self):
        """Mixed precision for the step, and for evaluations (which stay eager: with a graph, casts are not
        cached, since a replay would reuse them)."""
        return torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.bfloat16,
                              enabled=self.autocast_dtype is not None, cache_enabled=self.capture_after is None)

    def attention_backends(self):
        """vmap has no batching rule for the fused attention kernels: it runs them once per replica, which
        cuDNN's kernel does not support (optional outputs); flash and memory-efficient do."""
        if self.R == 1:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def _step(self, x, y) -> None:
        with concat_kernels() if self.compiled else contextlib.nullcontext():  # compiles forward, then backward
            with self.attention_backends(), self.autocast():
                total, loss = self.forward(x, y)
            # the whole gradient as one [R, P] tensor (the backward of the split in ``weights()``)
            grad, = torch.autograd.grad(total, [self.optimizer.flat])
        self.loss_sum += loss.detach()
        self.lr.copy_(self.lr_table.index_select(1, self.counter)[:, 0])
        self.counter.add_(1).clamp_(max=self.steps)
        self.optimizer.step(grad, self.counter[0])

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.calls += 1
        if self.capture_after is None:
            return self._step(x, y)
        if self.graph is None and self.calls <= self.capture_after:
            # warm up on the stream the capture will use (lazy cuBLAS/Triton state lives there)
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                self._step(x, y)
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
        # An earlier run's step holds its graph in a reference cycle (``self.forward``), so Python's collector
        # may destroy that graph at any allocation, and destroying a graph while another is captured
        # invalidates the capture (pytorch/pytorch#161037; torch >= 2.9 no longer collects before capturing).
        # Collect now, and keep the collector off while this graph is captured.
        gc.collect()
        torch.cuda.synchronize()
        # the graph allocates from a pool of its own: hand back what the eager warm-up steps (and an earlier
        # graph, before a compile) left cached, or the process holds the step's activations two or three
        # times over (sweep workers on the H200 held 30-70 GB each, and a fourth ran out of memory)
        torch.cuda.empty_cache()
        self.graph = torch.cuda.CUDAGraph()
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(self.graph, stream=self.stream):
                self._step(self.x, self.y)
        except Exception as e:   # a host sync in some mixer: name the way out
            raise RuntimeError(f"CUDA graph capture failed ({type(e).__name__}: {str(e).splitlines()[0]}); "
                               f"a mixer is not graph-safe: set train.cuda_graph: false") from e
        finally:
            if collecting:
                gc.enable()

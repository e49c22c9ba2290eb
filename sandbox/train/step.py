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

With ``compile`` (``compile_now()``) the forward and backward go through ``torch.compile`` (compile.py; the kernels
are custom ops it treats as opaque), which fuses the norms, the residual adds, SwiGLU and the gate arithmetic.
Dynamo's guards check a step's shapes and settings, not which models it holds, so a later ``Step`` of the same
shapes in this process reuses the compilation, and one in another process loads it from torch's on-disk caches.
"""
from __future__ import annotations

import contextlib
import gc
import math
from typing import Callable

import torch

from sandbox.kernels.cross_entropy import IGNORE, cross_entropy
import sandbox.train.compile as compiling
from sandbox.train.adamw import StackedAdamW


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
                 capture_after: int | None = None, compile: bool = False):
        self.models, self.R = models, len(models)
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
        """Go on with the forward and backward compiled: the next step compiles them (or reuses a compilation of
        the same shapes) and a graph is captured anew."""
        self.forward, self.compiled = compiling.compiled(self._losses), True
        self.optimizer.compile(compiling.options())
        self.graph, self.calls = None, 0

    @property
    def ready(self) -> bool:
        """Whether the next call is a steady step: replayed from the graph, or eager after the first."""
        return self.graph is not None if self.capture_after is not None else self.calls > 0

    @property
    def next_phase(self) -> str:
        """What the next call does before it is ready: "compile" (the first steps: compiling the step, or the
        kernels' first launches, and the warm-up before a capture) or "capture" (the CUDA graph)."""
        return "capture" if self.capture_after is not None and self.calls >= self.capture_after else "compile"

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
    # cache, and then every process compiles the step from scratch even where one of the same shapes has
    # compiled before.
    def autocast(self):
        """Mixed precision for the step, and for evaluations (which stay eager: with a graph, casts are not
        cached, since a replay would reuse them)."""
        return torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.bfloat16,
                              enabled=self.autocast_dtype is not None, cache_enabled=self.capture_after is None)

    def attention_backends(self):
        """SDPA's flash and memory-efficient kernels, not cuDNN's, which torch prefers on Hopper: cuDNN's compiles
        its kernel at run time at the first call of a shape (1.4 s of a cold start of Zoology's attention run on
        an H200, cProfile, 2026-11-29), and under vmap, which runs a fused kernel once per replica, it fails
        (optional outputs)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def _step(self, x, y) -> None:
        with compiling.concat_kernels() if self.compiled else contextlib.nullcontext():  # compiles fwd, then bwd
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
        # times over, and sweep workers sharing a GPU run out of memory
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

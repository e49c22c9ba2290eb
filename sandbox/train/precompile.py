"""Compile the steps of the stacks a sweep worker takes next in a helper process, while the GPU trains this one.

A stack compiles its step before its first step (``train.compile: auto`` on CUDA, group.py), and in its own
process that leaves the GPU idle for the whole compilation (18-39 s on the H200 from cold caches; up to a third of
a short Figure 8 stack). So once a stack's step is captured, and where the GPU has room (``room``), a helper builds
groups of the kinds of the stacks the worker takes next (``train_replicas(prefetch=...)``), compiles their steps and
runs each once: that fills the on-disk caches (Inductor's FX graph cache and AOTAutograd's cache, under
``TORCHINDUCTOR_CACHE_DIR``) and leaves a marker there (``step.cache_warm``). Those stacks then pay the tracing only
(Dynamo); one that starts while a helper is still compiling its kind waits for it (``wait``).

Each helper writes a line to its parent's stderr (a sweep worker's log) when a kind is compiled, with how long it
took and how long after the helper started. Stacks of a kind that
is warm already, or queued in another live helper, are left out. A process runs up to
``HELPERS`` helpers at once, the stacks dealt to them in turn; each works through its list in order and exits
when its parent does. One helper could not keep up with short stacks: a cold compilation takes 24-37 s on the
H200, as long as a stack of 3 d64-d128 Figure 8 runs trains (14-19 s), so in part 2 of Figure 8 about half the
stacks started before theirs was ready (simulated from each kind's measured times:
19.9 GPU-minutes with one helper, 18.9 with two, 18.4 if every stack started warm). Measured with the real
runner over part 2's first 180 s from empty caches: two helpers 1.08x the trial-steps of one
(results/sweep_packing/).

A stack that compiles its own step from cold caches (a worker's first stacks, before any helper has run) spends
about half of its first step's 30-35 s compiling the project's Triton kernels, one after another as the step first
launches them, after Dynamo and Inductor are done (GSA and GLA stacks of 9 on the H200, benchmarks/compile_time.py).
``warm_kernels`` has a helper run one eager step of that stack at a small batch meanwhile: the same kernels, with the
same specialisations, compile there into Triton's on-disk cache while this process traces and compiles.

A separate process, not a thread: compiling traces through functorch's vmap, whose state is shared by
the threads of a process, and a thread compiling beside the stack's own vmapped steps breaks both.

    python -c "from sandbox.train.precompile import main; main()" < stacks.json   # a JSON list of stacks, each a
                                                                                  # list of run configs
"""
from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

from sandbox.train.group import group_kind
from sandbox.train.signals import process_alive
from sandbox.train.step import cache_warm, warm_marker

STEPS = 3           # the helper's runs are this long: its batch pool holds no more than it uses
HELPERS = 2         # helper processes at once (two compilations side by side: 1.08x one, above)
KERNEL_BATCH = 32   # a kernel warm-up's batch per replica: a multiple of 16 like the runs', so that the kernels' integer
                    # arguments specialise alike, at an eighth of a 256-batch step's memory
_helpers: list[subprocess.Popen] = []       # the helpers this process started
# a helper's command: ``-m sandbox.train.precompile`` would run this module a second time after the package had
# imported it (runpy's RuntimeWarning in every worker log); the module's name stays in the command line, where
# ``queued`` looks for it
_ENTRY = "import sys; from sandbox.train.precompile import main; sys.exit(main())"
_ENTRY_KERNELS = "import sys; from sandbox.train.precompile import main; sys.exit(main(kernels_only=True))"


def room(device) -> int:
    """How many helpers (at most ``HELPERS``) fit beside the stack: each holds about what this process holds at
    its peak, and as much again stays free (other workers may share the GPU)."""
    import torch
    if device.type != "cuda":
        return 0
    free, _ = torch.cuda.mem_get_info(device)
    return max(0, min(HELPERS, int(free // max(torch.cuda.max_memory_reserved(device), 1)) - 1))


def _queue_file(kind) -> Path:
    return warm_marker(kind).with_suffix(".queued")


def queued(kind) -> bool:
    """Whether a live helper (of any process) has a step of ``kind`` in its list and has not compiled it yet."""
    try:
        pid = int(_queue_file(kind).read_text())
    except (OSError, ValueError):
        return False
    return process_alive(pid, "sandbox.train.precompile") and not cache_warm(kind)


def wait(kind, poll_s: float = 0.5) -> None:
    """Until no live helper has ``kind`` still to compile: a stack that starts while one compiles its step then
    finds it in the caches, instead of compiling it a second time beside the helper."""
    while queued(kind):
        time.sleep(poll_s)


def running() -> bool:
    """Whether a helper this process started is still at work."""
    return any(p.poll() is None for p in _helpers)


def start(stacks, processes: int = 1) -> list[subprocess.Popen]:
    """Start compiling the steps of ``stacks`` (each a list of run configs) in up to ``processes`` helper
    processes, the stacks dealt to them in turn, each helper's one after another. Stacks of a kind that is warm
    or queued already are left out; no helper when none is left."""
    todo = [cfgs for cfgs in stacks if not (cache_warm(group_kind(cfgs)) or queued(group_kind(cfgs)))]
    n = max(0, min(processes, len(todo)))
    return [_spawn(_ENTRY, share, queue=True) for share in (todo[i::n] for i in range(n))]


def warm_kernels(cfgs) -> subprocess.Popen | None:
    """A helper that JIT-compiles the project's Triton kernels of the stack ``cfgs`` (one eager step at a batch of
    ``KERNEL_BATCH``) while this process compiles the stack's step; None where this process would not compile it
    from cold caches (not on a GPU, ``train.compile: false``, a kind compiled before or queued in a helper)."""
    from sandbox.train.group import resolve_device
    from sandbox.train.step import compiled_before
    tc = cfgs[0].train
    kind = group_kind(cfgs)
    if tc.compile is False or resolve_device(tc.device).type != "cuda" or compiled_before(kind) \
            or cache_warm(kind) or queued(kind):
        return None
    return _spawn(_ENTRY_KERNELS, [cfgs])


def _spawn(entry: str, stacks, queue: bool = False) -> subprocess.Popen:
    """A helper process running ``entry`` on ``stacks``; with ``queue``, registered as compiling their kinds. Its
    lines go to this process's stderr where that is a log (a sweep worker's), not a terminal."""
    from sandbox.config import to_dict
    p = subprocess.Popen([sys.executable, "-c", entry], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL if sys.stderr.isatty() else None, env=os.environ.copy())
    for cfgs in stacks if queue else []:
        path = _queue_file(group_kind(cfgs))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(str(p.pid))
    p.stdin.write(json.dumps([[to_dict(c) for c in cfgs] for cfgs in stacks]).encode())
    p.stdin.close()
    if not _helpers:
        atexit.register(stop_all)
    _helpers.append(p)
    return p


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
        p.wait()


def stop_all() -> None:
    for p in _helpers:
        stop(p)


def main(kernels_only: bool = False) -> int:
    """Compile the steps of the stacks read from stdin (with ``kernels_only``: run one eager step of each, which
    compiles the project's Triton kernels only, and leaves the kind's marker and queue file alone)."""
    import gc

    import torch

    from sandbox.config import config_from_dict
    from sandbox.train.group import Group
    from sandbox.train.step import forget_compilations, mark_cache_warm
    warnings.simplefilter("ignore")     # the stack's own compilation says the same; the log keeps this helper's lines
    parent = os.getppid()
    failed = 0
    t_start = time.perf_counter()
    for datas in json.loads(sys.stdin.read()):
        if os.getppid() != parent:          # the worker is gone: so is the use of what is left
            break
        cfgs = [config_from_dict(d, "<precompile>") for d in datas]
        kind = group_kind(cfgs)             # of the stack as it will train (the helper's runs are shorter)
        if cache_warm(kind):
            continue
        group, t_kind = None, time.perf_counter()
        try:
            for c in cfgs:
                c.train.steps = STEPS
                if kernels_only:
                    c.train.compile, c.train.cuda_graph = False, False
                    c.train.batch_size = min(c.train.batch_size, KERNEL_BATCH)
            group = Group(cfgs)
            if not kernels_only:
                group.step.compile_now()
            group.step(*group.batch(0))     # an eager (not yet captured) step: forward and backward
            if group.device.type == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()   # when each kind got ready: what a stack that started before it waited for
            if not kernels_only:
                mark_cache_warm(kind, now - t_kind)
            what = "kernels compiled (eager step)" if kernels_only else "compiled"
            print(f"precompile (helper {os.getpid()}): {_label(cfgs)} {what} in {now - t_kind:.1f} s, "
                  f"{now - t_start:.0f} s after the helper started", file=sys.stderr, flush=True)
        except Exception as e:              # e.g. out of memory beside the stack: that stack compiles itself
            failed += 1
            print(f"precompile: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            if not kernels_only:            # the queue file is a compiling helper's
                _queue_file(kind).unlink(missing_ok=True)
            del group
            forget_compilations()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return 1 if failed else 0


def _label(cfgs) -> str:
    m = cfgs[0].model
    topk = getattr(getattr(m, m.mixer, None), "topk", None)
    return f"{m.mixer} d{m.d_model}" + (f" top-{topk}" if topk else "") + f" x{len(cfgs)}"


if __name__ == "__main__":
    sys.exit(main())

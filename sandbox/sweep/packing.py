"""How a sweep fills its GPUs: stacked replicas in a process, and how many processes per GPU.

At batch 256 one training process keeps the GPU busy for every reference configuration from attention
d64 T64 upwards, and several plain processes on one GPU only time-slice it (results/throughput/README.md,
results/sweep_packing/README.md). So:

* the trials that differ only in learning rate and seed (a grid point's tuned values, and the same
  point's other seeds) train in one process as stacked replicas (``sandbox.train.train_replicas``):
  one start-up, one compilation, one data pool per seed;
* under CUDA MPS, which lets processes share the GPU's units instead of taking turns, a GPU starts
  with two worker processes: a worker's start-up for each group (the data pool, compilation and
  graph capture, mostly host work) leaves the GPU idle, so a second worker trains while the first
  starts. The launcher adds one more while the GPU's measured utilisation stays low with every worker
  on it training: a GPU left idle by set-ups (a cold stack's compilation) is not underfilled, and a
  third worker added then slowed the stacks beside it once they trained (results/sweep_packing/README.md).
  Without MPS it never packs processes.

With a time limit (``sandbox sweep --time-limit``) a worker sizes what it takes to what finishes before
the limit (``fits``): a start-up, shorter for a kind the worker process trained before, then training at
the pace measured for that kind of stack (``pace_for``, ``training_pace``): in this launch, or from the
trials the sweep finished before (their groups' wall time less their start-up), so that a fresh machine
does not start blind. A pace is measured on a group of some number of replicas: a larger group is taken to
train as many trial-steps per second, a smaller one as many steps per second (``fits``). Near the end it stacks
fewer trials where that finishes sooner; once nothing finishes in time, the worker trains what waits anyway and
the limit stops it with checkpoints for the next launch (worker.py). Under a limit the launcher runs one worker
per GPU unless told otherwise: another one sharing the GPU would slow the stacks each sized to the limit, so that
none finishes in time (results/sweep_packing/README.md).

The runner starts a private MPS control daemon (``sandbox.train.mps``, its pipe and log directories inside the
sweep directory) and stops it when the sweep ends.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from sandbox.train.files import write_json

START_WORKERS_PER_GPU = 2     # under MPS
MAX_WORKERS_PER_GPU = 4
IDLE_BELOW = 60.0             # % utilisation (nvidia-smi) under which a GPU counts as underfilled
WINDOW_S = 30.0               # seconds of samples a decision looks at
# sizing work to a time limit, from Figure 8's MetaLA stacks on H200s (results/sweep_packing/README.md): a
# group's start-up is charged apart from its training, which is paced without any start-up
STARTUP_S = 40.0              # a kind's first group in a worker process: 35-37 s measured (compiling cold)
WARM_STARTUP_S = 20.0         # a later group of a kind the process trained: 0.3-17 s measured (new replica count)
SAFETY = 1.2                  # a group may train this much slower than the pace measured before it
UNKNOWN_SLOWER = 2.0          # a kind of stack never measured is taken as this much slower than the slowest
EXIT_TIME_LIMIT = 76          # a worker's exit code: trials are waiting, but none finishes before the limit
EXIT_MEMORY = 77              # a worker's exit code: out of GPU memory that other workers held; run one fewer
HEADROOM = 1.5                # another worker starts only where this many workers' average memory is free


def underfilled(samples: list[dict], times: list[float], gpu: int, now: float, window_s: float = WINDOW_S,
                below: float = IDLE_BELOW, since: float = float("-inf")) -> bool | None:
    """Whether GPU ``gpu`` was underfilled over the last ``window_s`` seconds of ``samples``
    (``[{gpu index: (utilisation %, memory MiB)}, ...]`` taken at ``times``), counting only those taken
    from ``since`` on (when its workers were all training): its mean utilisation below ``below``. None
    while the window holds too few samples to tell."""
    recent = [s[gpu][0] for s, t in zip(samples, times) if now - t <= window_s and t >= since and gpu in s]
    if len(recent) < 5:
        return None
    return sum(recent) / len(recent) < below


def mark_training(sweep_dir: Path, training: bool) -> None:
    """Say whether this worker process trains a group now (from its first evaluation to the group's end),
    for the launcher's fill rule (``training_since``)."""
    marker = Path(sweep_dir) / "logs" / f"training-{os.getpid()}"
    if not training:
        marker.unlink(missing_ok=True)
    elif not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{time.time():.3f}")


def training_since(sweep_dir: Path, pids: list[int]) -> float | None:
    """Since when the workers ``pids`` all train (the latest of their markers' times); None while one of
    them sets a group up or has none."""
    since = float("-inf")
    for pid in pids:
        try:
            since = max(since, float((Path(sweep_dir) / "logs" / f"training-{pid}").read_text()))
        except (OSError, ValueError):
            return None
    return since if pids else None


def group_size(spec, cap: int = 12) -> int:
    """Trials stacked in one process: as many as share every shape (a grid point's tuned values, and the
    grid points that differ only in seed), at most ``cap``."""
    from collections import Counter

    from sandbox.sweep.spec import build_config
    from sandbox.train import stack_key
    keys = Counter()
    for p in spec.points():
        try:
            keys[stack_key(build_config(spec.base, {**p.grid, **p.tune}))] += 1
        except Exception:            # an invalid point fails as its own trial, with its own message
            keys[p.point_id] += 1
    return max(1, min(cap, max(keys.values(), default=1)))


def room_for_one_more(used_mib: float, total_mib: float, workers: int) -> bool:
    """Whether a GPU with ``used_mib`` of ``total_mib`` taken by ``workers`` workers has the memory of another:
    ``HEADROOM`` times their average free: utilisation alone packed more stacks than the memory held, and
    their trials failed out of memory (results/sweep_packing/README.md)."""
    return workers == 0 or total_mib - used_mib >= HEADROOM * used_mib / workers


def gpu_shared(share: float = 0.25) -> bool:
    """Whether other processes hold more than ``share`` of this process's GPU's memory."""
    import torch
    if not torch.cuda.is_available():
        return False
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved() > share * total


def release_gpu_memory() -> None:
    """Hand what the caching allocator holds back to the GPU (a finished group's graphs and activations), so
    that the other workers on it can use the memory."""
    import gc

    import torch
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def fits(trial_steps: int, trials: int, pace: tuple[float, int] | None, seconds_left: float,
         startup_s: float = STARTUP_S) -> bool:
    """Whether a group of ``trials`` and ``trial_steps`` (summed over them) starts in ``startup_s`` and then
    trains in the rest of ``seconds_left`` at ``pace``, (trial-steps/s of training, replicas of the group it was
    measured on); None: nothing measured yet, so only the start-up is checked. A stack never trains fewer
    trial-steps per second than a smaller one of its kind, nor steps more slowly than a larger one: so a group
    larger than the measured one takes at most its pace, and a smaller one at most its steps per second. A small
    model's stack of 9 trains at nearly the steps per second of one trial (results/sweep_packing/README.md): a
    stack's pace taken as one trial's had a lone trial look nine times faster than it is."""
    if seconds_left < startup_s:
        return False
    if pace is None:
        return True
    rate, replicas = pace
    return startup_s + SAFETY * trial_steps / (rate * min(1.0, trials / replicas)) <= seconds_left


def training_pace(trial_steps: float, wall_s: float, setup_s: float | None) -> float | None:
    """Trial-steps per second of a group's training: its wall time without its start-up (``setup_s``, building,
    compiling and capturing), which ``fits`` charges apart. A pace with the start-up in it sized a stack of 12
    at 138 s where it trained in 69-74 s (results/sweep_packing/README.md). None where nothing was trained."""
    seconds = wall_s - (setup_s or 0.0)
    if trial_steps <= 0 or seconds <= 0:
        return None
    return trial_steps / seconds


def pace_for(key: str, family: str, paces: dict[str, tuple[str, float, int]]) -> tuple[float, int] | None:
    """The pace to size a group of stack ``key`` by, (trial-steps/s, replicas it was measured on), from
    ``paces`` (stack key -> (family, trial-steps/s, replicas)) measured so far: its own; else the slowest of
    its family (same mixer, width and length: mixers of one width train at very different paces, and sizing
    GSA by GLA's started stacks the limit then cut off); else the slowest of the same mixer and length at
    another width, slowed by the ratio of widths where this one is wider; else the same at the longest
    shorter length measured for that mixer, slowed by the ratio of lengths too; else the slowest of all over
    ``UNKNOWN_SLOWER``; None where nothing is known. The slowest of all alone was so far below most kinds'
    own paces that whole columns of a grid fit no trial (results/sweep_packing/README.md)."""
    if key in paces:
        return paces[key][1:]
    kin = [(r, n) for f, r, n in paces.values() if f == family]
    if kin:
        return min(kin)
    mixer, width, length = _family_parts(family)
    same = [(w, n, r, k) for f, r, k in paces.values() for m, w, n in [_family_parts(f)] if m == mixer and w and width]
    shorter = [n for _, n, _, _ in same if n is not None and length is not None and n < length]
    at = length if any(n == length for _, n, _, _ in same) else max(shorter, default=None)
    rates = [(r * min(1.0, w / width) * (n / length if n != length else 1.0), k) for w, n, r, k in same if n == at]
    if rates:
        return min(rates)
    if not paces:
        return None
    rate, replicas = min((r, n) for _, r, n in paces.values())
    return rate / UNKNOWN_SLOWER, replicas


def _family_parts(family: str) -> tuple[str, int | None, int | None]:
    """(mixer, width or None, length or None) of a family ``mixer|d_model|seq_len``."""
    mixer, width, length = (family.split("|") + ["", ""])[:3]
    return mixer, int(width) if width.isdigit() else None, int(length) if length.isdigit() else None


def record_pace(sweep_dir: Path, paces: dict[str, tuple[str, float, float, int]]) -> None:
    """A worker's measured paces (stack key -> (family, trial-steps/s, trial-steps it was measured over,
    replicas of that group)), for workers that start later."""
    d = Path(sweep_dir) / "logs"
    d.mkdir(parents=True, exist_ok=True)
    write_json(d / f"pace-{os.getpid()}.json", paces)


def known_paces(sweep_dir: Path) -> dict[str, tuple[str, float, float, int]]:
    """The slowest pace of each stack key that this launch's workers recorded (the launcher clears them), in
    steps per second of its group: trial-steps/s over replicas."""
    out: dict[str, tuple[str, float, float, int]] = {}
    for f in (Path(sweep_dir) / "logs").glob("pace-*.json"):
        try:
            recs = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        for key, (family, rate, trained, replicas) in recs.items():
            if key not in out or rate / replicas < out[key][1] / out[key][3]:
                out[key] = (family, float(rate), float(trained), int(replicas))
    return out


def clear_pace(sweep_dir: Path) -> None:
    """Forget what the workers of an earlier launch left: their paces and training markers."""
    for pattern in ("pace-*", "training-*"):
        for f in (Path(sweep_dir) / "logs").glob(pattern):
            f.unlink(missing_ok=True)

"""One configuration of ``sandbox bench train``, measured in a process of its own.

Run as a script with ``PYTHONPATH`` set to the code under test (this checkout, or another commit's
worktree), so the same measurement runs on both:

    PYTHONPATH=CODE python sandbox/bench/step_worker.py CONFIG.json OUT_DIR [--replicas R] [--roofline]

It trains the configuration through that code's own ``sandbox.train.train`` (or, with
``--replicas``, ``train_replicas`` over R learning rates) and reads back what the run logged:
steady-state steps/s (the median of TensorBoard's ``perf/steps_per_sec`` after the first 100
steps, which hold compilation and graph capture) and the training loss every 25 steps. It also
times the task generator alone over the same steps, the peak GPU memory, and with
``--roofline`` the step's FLOPs and the bytes it must move (this checkout's code only).
Prints one JSON object.
"""
from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402


def _scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def generator_ms(cfg, steps: int) -> float:
    """ms per step that drawing the training batches costs on their own (whatever TrainBatches does)."""
    from sandbox.tasks import TrainBatches, make_task
    task = make_task(cfg.task.params, seed=cfg.seed, device="cuda" if torch.cuda.is_available() else "cpu")
    task.held_out_fingerprints("train")    # once per run, not per step
    _sync()
    t = time.perf_counter()
    try:
        batches = TrainBatches(task, cfg.train.batch_size, steps)
    except TypeError:                       # older code: no pool
        batches = TrainBatches(task, cfg.train.batch_size)
    for s in range(steps):
        batches[s]
    _sync()
    return 1e3 * (time.perf_counter() - t) / steps


def peaks() -> dict:
    """Measured ceilings of this GPU: bf16 matrix products and device-to-device copies."""
    import triton.testing
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: a @ a, warmup=10, rep=50, return_mode="median")
    flops = 2 * 8192 ** 3 / (ms * 1e-3)
    x = torch.empty(1 << 29, device="cuda", dtype=torch.float32)       # 2 GiB
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=5, rep=30, return_mode="median")
    return {"bf16_flops": flops, "copy_bytes_per_s": 2 * x.numel() * 4 / (ms * 1e-3)}


def roofline(cfg) -> dict:
    """FLOPs of one eager forward+backward (torch's FLOP counter, with the kernels' own formulas) and the
    bytes a step must move: every tensor autograd saves, written once and read once, plus AdamW
    (read parameter, gradient and two moments, write three: 28 bytes per fp32 parameter)."""
    from torch.utils.flop_counter import FlopCounterMode

    from sandbox.tasks import TrainBatches
    from sandbox.train import build, scored_positions
    import torch.nn.functional as F

    task, model = build(cfg, torch.device("cuda"))
    x, y = TrainBatches(task, cfg.train.batch_size, 1)[0]
    saved = {}

    def pack(t):
        saved[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
        return t

    with FlopCounterMode(display=False) as fc, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        pos, yy = scored_positions(y, task.max_targets)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x, pos)
            loss = F.cross_entropy(logits.float().flatten(0, 1), yy.flatten(), ignore_index=-100)
        loss.backward()
    n_params = sum(p.numel() for p in model.parameters())
    return {"flops": fc.get_total_flops(), "bytes": 2 * sum(saved.values()) + 28 * n_params, "params": n_params}


def _profiled_steps(datas: list[dict], steps: int, **kw):
    """A group of the configurations ``datas`` (one per replica), 10 steps of warm-up, then the profile of
    ``steps`` more (torch profiler keyword arguments ``kw``): (group, profile)."""
    from torch.profiler import profile as torch_profile

    from sandbox.config import load_config
    from sandbox.train import Group

    group = Group([load_config(data=d) for d in datas])
    for s in range(10):
        group.step(*group.batch(s))
    _sync()
    with torch_profile(**kw) as prof:
        for s in range(10, 10 + steps):
            group.step(*group.batch(s))
        _sync()
    return group, prof


def profile(cfg, replicas: int, steps: int = 20) -> list[dict]:
    """GPU time per kernel over ``steps`` replayed steps (after warm-up), largest first, after the total."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from sandbox.config import to_dict

    group, prof = _profiled_steps([to_dict(cfg)] * replicas, steps, activities=[ProfilerActivity.CUDA])
    rows = _top(prof, steps)
    # and the generator: drawing the batches of 64 steps
    task, B = group.tasks[0], cfg.train.batch_size
    task.sample(B, "train", 0, count=64)
    _sync()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        task.sample(B, "train", 0, count=64)
        _sync()
    return rows + [{"kernel": "GENERATOR (per step, drawn 64 steps at a time)", "ms_per_step": 0, "calls": 0}] \
        + _top(prof, 64)[:8]


def by_op(cfg, steps: int = 10) -> list[dict]:
    """GPU time per step by the operator that launched it, with the frames of this package that called
    it: the step run eagerly (no CUDA graph, whose replay hides who launched a kernel), compiled as in
    the run. The 25 largest operators by their own kernels' time."""
    from torch.profiler import ProfilerActivity

    from sandbox.config import to_dict

    data = to_dict(cfg)
    data["train"]["cuda_graph"] = False
    _, prof = _profiled_steps([data], steps, activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                              with_stack=True)
    totals: dict[tuple[str, str], list[float]] = {}
    for e in prof.events():
        # a kernel counts for the innermost host event that launched it; the kernels' own events and the GPU
        # spans of annotations (an optimizer step's span includes its idle gaps) are left out
        if (e.self_device_time_total <= 0 or e.device_type != torch.autograd.DeviceType.CPU
                or getattr(e, "is_user_annotation", False)):
            continue
        key = (e.name[:60], _caller(e))
        t = totals.setdefault(key, [0.0, 0])
        t[0] += e.self_device_time_total
        t[1] += 1
    rows = [{"op": op, "where": where, "ms_per_step": us / 1e3 / steps, "calls": n / steps}
            for (op, where), (us, n) in totals.items()]
    rows.sort(key=lambda r: -r["ms_per_step"])
    return rows[:25]


def _caller(e) -> str:
    """Who launched a profiled operator: the nearest enclosing event that is neither an aten operator nor a
    Python frame (``autograd::engine::evaluate_function: MmBackward0``, ``Optimizer.step#AdamW.step``, a
    compiled region), then the innermost frames of this package above it."""
    frames, other, p = [], None, e.cpu_parent
    while p is not None:
        if p.name.startswith("sandbox/"):
            frames.append(p.name)
        elif other is None and not p.name.startswith(("aten::", "torch/", "<")):
            other = p.name[:70]
        p = p.cpu_parent
    return " < ".join(([other] if other else []) + frames[:2])


def _top(prof, steps: int) -> list[dict]:
    rows = [{"kernel": e.key[:90], "ms_per_step": e.device_time_total / 1e3 / steps, "calls": e.count / steps}
            for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r["ms_per_step"])
    total = sum(r["ms_per_step"] for r in rows)
    return [{"kernel": "TOTAL", "ms_per_step": total, "calls": sum(r["calls"] for r in rows)}] + rows


def stack_configs(data: dict, replicas: int) -> list:
    """The runs a timing of ``data`` trains: ``replicas`` stacked copies at learning rates a factor 2 apart."""
    from sandbox.config import load_config
    cfgs = [load_config(data=data) for _ in range(replicas)]
    for i, c in enumerate(cfgs):
        c.train.lr *= 2.0 ** (i - replicas // 2)
    return cfgs


def _train(data: dict, replicas: int, out: Path) -> Path:
    """Train the configuration ``data`` (or ``replicas`` stacked copies of it, ``stack_configs``) into ``out``;
    the directory of the run whose log to read."""
    if replicas > 1:
        from sandbox.train import train_replicas
        train_replicas(stack_configs(data, replicas), [out / str(i) for i in range(replicas)], progress=False)
        return out / str(replicas // 2)
    from sandbox.config import load_config
    from sandbox.train import train
    train(load_config(data=data), out, progress=False)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("out")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--roofline", action="store_true")
    p.add_argument("--profile", action="store_true", help="GPU time per kernel of the step (this checkout only)")
    p.add_argument("--warm", action="store_true",
                   help="then the set-up of a second group of the same kind in this process, its compilations "
                        "dropped and torch's on-disk caches warm (a later stack of a sweep's kind)")
    a = p.parse_args(argv)
    from sandbox.config import load_config
    data = json.loads(Path(a.config).read_text())
    out = Path(a.out)
    cfg = load_config(data=data)
    steps = cfg.train.steps
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    import sandbox.train  # noqa: F401
    import_s = time.perf_counter() - T_START
    t0 = time.perf_counter()
    run_dir = _train(data, a.replicas, out)
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else None
    sps = [v for s, v in _scalars(run_dir, "perf/steps_per_sec") if s > 100]
    # where the wall time outside the steady steps went (code that records it): the group's start-up (build,
    # data pool, compilation, graph capture) and the evaluations (every replica's, one after another)
    dirs = [out / str(i) for i in range(a.replicas)] if a.replicas > 1 else [out]
    done = [json.loads((d / "result.json").read_text()) for d in dirs if (d / "result.json").exists()]
    parts = {"setup_s": done[0]["setup_s"], "eval_s": sum(r["eval_s"] for r in done),
             "first_eval_s": sum(r.get("first_eval_s") or 0.0 for r in done)} if done and "setup_s" in done[0] else {}
    res = {**parts, "steps_per_sec": statistics.median(sps) if sps else None, "wall_s": wall, "peak_gib": peak,
           "loss": _scalars(run_dir, "train/loss"), "replicas": a.replicas, "import_s": import_s,
           "generator_ms": generator_ms(cfg, min(steps, 200))}
    if a.warm:
        torch.compiler.reset()
        short = json.loads(json.dumps(data))
        short["train"].update(steps=20, eval_every=20)
        warm_dir = _train(short, a.replicas, out / "warm")
        res["warm_setup_s"] = json.loads((warm_dir / "result.json").read_text())["setup_s"]
    if a.roofline and cuda:
        res.update(roofline(cfg), peaks=peaks())
    if a.profile and cuda:
        res["profile"] = profile(cfg, a.replicas)
        res["by_op"] = by_op(cfg)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

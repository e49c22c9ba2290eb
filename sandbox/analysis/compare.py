"""``sandbox compare A B --seeds 5``: the quick hypothesis test before a sweep.

A variant is either a run YAML file or a mixer written ``NAME[+KEY=VALUE...]`` on a base run
(``--task``: a preset below or a YAML file); ``gla+topk=8+balance_alpha=0.01`` sets
``model.mixer: gla`` and ``model.gla.topk: 8``, ``model.gla.balance_alpha: 0.01``. ``--set``
applies to both variants, ``--set-a``/``--set-b`` to one. Both variants train on the same
seeds (base seed, +1, ...); the report gives each variant's mean and 95% t interval, the
difference B - A with its interval, and Welch's t-test.
"""
from __future__ import annotations

import copy
import json
import math
import multiprocessing as mp
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from sandbox.analysis.stats import mean_ci, welch_test
from sandbox.config import config_from_dict, parse_override, read_yaml, set_dotted, to_dict

_TRAIN = {"steps": 800, "batch_size": 64, "lr": 3e-3, "eval_every": 100, "eval_batch_size": 256}
# Small MQAR settings that separate mixers in seconds to minutes (CPU: minutes).
PRESETS = {
    "mqar": {"task": {"name": "mqar", "seq_len": 64, "num_kv_pairs": 8, "vocab_size": 128, "test_examples": 512},
             "model": {"d_model": 32, "n_layers": 2, "n_heads": 1}, "train": _TRAIN},
    "mqar_gap": {"task": {"name": "mqar", "seq_len": 128, "num_kv_pairs": 8, "vocab_size": 128, "gap": 64,
                          "test_examples": 512},
                 "model": {"d_model": 32, "n_layers": 2, "n_heads": 1}, "train": _TRAIN},
    "mqar_noise": {"task": {"name": "mqar", "seq_len": 128, "num_kv_pairs": 8, "vocab_size": 128, "noise": 64,
                            "test_examples": 512},
                   "model": {"d_model": 32, "n_layers": 2, "n_heads": 1}, "train": _TRAIN},
}
DONE = ("completed", "early_stopped")


def _is_yaml(spec: str) -> bool:
    return spec.endswith((".yaml", ".yml")) or Path(spec).is_file()


def variant_config(spec: str, task: str, sets=(), own=()) -> tuple[str, dict]:
    """(label, raw config dict) of one variant, before seeds."""
    if _is_yaml(spec):
        data, label = read_yaml(spec), Path(spec).stem
        if not isinstance(data, dict):
            raise ValueError(f"{spec}: the top level must be a mapping")
    else:
        if _is_yaml(task):
            data = read_yaml(task)
        elif task in PRESETS:
            data = copy.deepcopy(PRESETS[task])
        else:
            raise ValueError(f"task: {task!r} is neither a YAML file nor a preset ({', '.join(PRESETS)})")
        name, *opts = spec.split("+")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"variant: {spec!r} is not NAME[+KEY=VALUE...] nor a YAML file")
        set_dotted(data, "model.mixer", name)
        for opt in opts:
            key, value = parse_override(opt)
            set_dotted(data, f"model.{name}.{key}", value, src=spec)
        label = spec
    for item in (*sets, *own):
        key, value = parse_override(item)
        set_dotted(data, key, value)
    return label, data


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9=._-]+", "_", s)[:60]


def _worker_init(gpus) -> None:
    if gpus is not None:                      # pin each worker process to one GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpus.get())


def _run_one(config: dict, out_dir: str, progress: bool) -> dict:
    from sandbox.train import TrainingDiverged, train

    cfg = config_from_dict(config, out_dir)
    res_path = Path(out_dir) / "result.json"
    if res_path.is_file():                    # finished before: reuse, never train past an early stop
        old = json.loads(res_path.read_text())
        if old.get("status") in DONE and old.get("config") == to_dict(cfg):
            return old
    try:
        return train(cfg, out_dir, progress=progress)
    except TrainingDiverged:
        return json.loads(res_path.read_text())


def compare(a: str, b: str, seeds: int = 5, task: str = "mqar", sets=(), set_a=(), set_b=(),
            metric: str = "best_accuracy", out=None, jobs: int = 1, progress: bool = False, log=print) -> dict:
    if seeds < 1:
        raise ValueError(f"seeds: must be >= 1, got {seeds}")
    if jobs < 1:
        raise ValueError(f"jobs: must be >= 1, got {jobs}")
    if metric not in ("best_accuracy", "final_accuracy"):
        raise ValueError(f"metric: must be best_accuracy or final_accuracy, got {metric!r}")
    variants = [variant_config(a, task, sets, set_a), variant_config(b, task, sets, set_b)]
    if variants[0][0] == variants[1][0]:
        variants = [(f"A:{variants[0][0]}", variants[0][1]), (f"B:{variants[1][0]}", variants[1][1])]
    root = Path(out) if out else Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    runs = []                                  # (variant index, seed, config dict, out dir)
    for vi, (label, data) in enumerate(variants):
        base_seed = data.get("seed", 0)
        for s in range(seeds):
            d = copy.deepcopy(data)
            d["seed"] = base_seed + s if isinstance(base_seed, int) else base_seed
            d.setdefault("name", f"{label} s{d['seed']}")
            cfg = config_from_dict(d, label)   # validate everything before training anything
            runs.append((vi, d["seed"], to_dict(cfg), str(root / f"{'AB'[vi]}-{_slug(label)}" / f"seed{d['seed']}")))
    log(f"compare: {variants[0][0]}  vs  {variants[1][0]}  ({seeds} seeds each, {len(runs)} runs, "
        f"{jobs} at a time) -> {root}")
    t0 = time.perf_counter()
    # interleave A and B so that a partial run (interrupted) still has both variants
    order = sorted(range(len(runs)), key=lambda i: (runs[i][1], runs[i][0]))
    results: dict[int, dict] = {}
    if jobs == 1:
        for i in order:
            vi, seed, cfg, d = runs[i]
            results[i] = _run_one(cfg, d, progress)
            log(f"  {variants[vi][0]} seed {seed}: {metric} {results[i].get(metric) or 0:.4f} "
                f"({results[i]['status']}, {results[i].get('wall_time_s') or 0:.1f} s)")
    else:
        gpus = None
        ctx = mp.get_context("spawn")
        try:
            import torch
            n_gpu = torch.cuda.device_count()
        except Exception:                      # noqa: BLE001 - no CUDA at all
            n_gpu = 0
        if n_gpu > 0:
            gpus = ctx.Manager().Queue()
            for w in range(jobs):
                gpus.put(w % n_gpu)
        with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_worker_init, initargs=(gpus,)) as pool:
            futures = {i: pool.submit(_run_one, runs[i][2], runs[i][3], False) for i in order}
            for i in order:
                results[i] = futures[i].result()
                vi, seed = runs[i][0], runs[i][1]
                log(f"  {variants[vi][0]} seed {seed}: {metric} {results[i].get(metric) or 0:.4f} "
                    f"({results[i]['status']}, {results[i].get('wall_time_s') or 0:.1f} s)")
    wall = time.perf_counter() - t0
    summary = {"variants": [], "metric": metric, "seeds": seeds, "wall_time_s": round(wall, 2), "out": str(root)}
    values = []
    for vi, (label, _) in enumerate(variants):
        mine = [results[i] for i in range(len(runs)) if runs[i][0] == vi]
        vals = [float(r.get(metric) or 0.0) for r in mine]
        values.append(vals)
        m, lo, hi = mean_ci(vals)
        train_s = sum(float(r.get("train_time_s") or 0) for r in mine)
        summary["variants"].append({"label": label, "values": vals, "mean": m, "ci95": [lo, hi],
                                    "statuses": [r["status"] for r in mine], "train_time_s": round(train_s, 2),
                                    "params": mine[0].get("params"), "state_size": mine[0].get("state_size")})
    width = max(len(v["label"]) for v in summary["variants"])
    log("")
    for tag, v in zip("AB", summary["variants"]):
        ci = "n/a (one seed)" if math.isnan(v["ci95"][0]) else f"[{v['ci95'][0]:.4f}, {v['ci95'][1]:.4f}]"
        bad = [s for s in v["statuses"] if s not in DONE]
        log(f"{tag}  {v['label']:<{width}}  {metric} mean {v['mean']:.4f}  95% CI {ci}  "
            f"seeds: {' '.join(f'{x:.3f}' for x in v['values'])}  state {v['state_size'] or 0:,}  "
            f"train {v['train_time_s'] / len(v['values']):.1f} s/run" + (f"  ({len(bad)} {'/'.join(set(bad))})" if bad else ""))
    if seeds >= 2:
        w = welch_test(values[1], values[0])
        summary["welch"] = {"diff_b_minus_a": w.diff, "ci95": [w.low, w.high], "t": w.t, "df": w.df, "p": w.p}
        verdict = "significant at the 5% level" if w.p < 0.05 else "not significant at the 5% level"
        log(f"B - A: {w.diff:+.4f}  95% CI [{w.low:+.4f}, {w.high:+.4f}]  Welch t = {w.t:.3f}, df = {w.df:.1f}, "
            f"p = {w.p:.4g}  ({verdict})")
    else:
        log("B - A: one seed per variant; use --seeds 2 or more for an interval and a test")
    log(f"wall time {wall:.1f} s for {len(runs)} runs")
    (root / "compare.json").parent.mkdir(parents=True, exist_ok=True)
    (root / "compare.json").write_text(json.dumps(summary, indent=2))
    return summary

"""``sandbox compare A B --seeds 5``: the quick hypothesis test before a sweep.

A variant is either a run YAML file or a mixer written ``NAME[+KEY=VALUE...]`` on a base run
(``--task``: a preset below or a YAML file); ``gla+topk=8+balance_alpha=0.01`` sets
``model.mixer: gla`` and ``model.gla.topk: 8``, ``model.gla.balance_alpha: 0.01``. ``--set``
applies to both variants, ``--set-a``/``--set-b`` to one. Both variants train on the same
seeds (base seed, +1, ...); the report gives each variant's mean and 95% t interval, the
difference B - A with its interval, and Welch's t-test.

A variant's seeds differ only in seed, so they train as one stack (``train_replicas``: one start-up, one
compilation; one after another where a mixer cannot stack). On a GPU the two variants train side by side, B in a
process of its own (``jobs``: 1 for one after the other); each variant's line says where its time went: start-up,
compilation, training and evaluation.
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


def _use_gpu(index: int) -> None:
    """A variant's process: its GPU (the second variant takes the second GPU where there is one)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)


def _train_variant(configs: list[dict], dirs: list[str], progress: bool) -> tuple[list[dict], float]:
    """Train one variant's seeds (finished directories return their results): as one stack where its mixers allow,
    else one after another. Returns the results and the seconds it took."""
    from sandbox.train import Unstackable, train_replicas

    t0 = time.perf_counter()
    cfgs = [config_from_dict(c, d) for c, d in zip(configs, dirs)]
    try:
        results = train_replicas(cfgs, dirs, progress=progress)
    except Unstackable:
        results = [train_replicas([c], [d], progress=progress)[0] for c, d in zip(cfgs, dirs)]
    return results, time.perf_counter() - t0


def _phases(results: list[dict]) -> dict:
    """Where a variant's time went: a stack's start-up, compilation and training once (its runs share them), every
    run's evaluations; runs trained one after another, each run's."""
    keys = ("startup", "compile", "capture", "train", "eval")
    got = [r.get("phases") or dict.fromkeys(keys, 0.0) for r in results]
    stacked = all((r.get("replicas") or 1) > 1 for r in results)
    return {k: sum(p[k] for p in got) if k == "eval" or not stacked else max(p[k] for p in got) for k in keys}


def _train_variants(runs: list[list[tuple]], jobs: int, progress: bool) -> list[tuple[list[dict], float]]:
    """Each variant's ``(results, seconds)``; with ``jobs`` 2, B in a process of its own while A trains here."""
    def args(variant):
        return [cfg for _, cfg, _ in variant], [d for _, _, d in variant]

    if jobs == 1:
        return [_train_variant(*args(v), progress) for v in runs]
    import torch
    gpu = 1 if torch.cuda.device_count() > 1 else 0
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=_use_gpu, initargs=(gpu,)) as pool:
        b = pool.submit(_train_variant, *args(runs[1]), False)
        a = _train_variant(*args(runs[0]), progress)
        return [a, b.result()]


def compare(a: str, b: str, seeds: int = 5, task: str = "mqar", sets=(), set_a=(), set_b=(),
            metric: str = "best_accuracy", out=None, jobs: int | None = None, progress: bool = False,
            log=print) -> dict:
    if seeds < 1:
        raise ValueError(f"seeds: must be >= 1, got {seeds}")
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs: must be >= 1, got {jobs}")
    if metric not in ("best_accuracy", "final_accuracy"):
        raise ValueError(f"metric: must be best_accuracy or final_accuracy, got {metric!r}")
    variants = [variant_config(a, task, sets, set_a), variant_config(b, task, sets, set_b)]
    if variants[0][0] == variants[1][0]:
        variants = [(f"A:{variants[0][0]}", variants[0][1]), (f"B:{variants[1][0]}", variants[1][1])]
    root = Path(out) if out else Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    runs: list[list[tuple]] = [[], []]            # per variant: (seed, config dict, out dir)
    for vi, (label, data) in enumerate(variants):
        base_seed = data.get("seed", 0)
        for s in range(seeds):
            d = copy.deepcopy(data)
            d["seed"] = base_seed + s if isinstance(base_seed, int) else base_seed
            d.setdefault("name", f"{label} s{d['seed']}")
            cfg = config_from_dict(d, label)   # validate everything before training anything
            runs[vi].append((d["seed"], to_dict(cfg), str(root / f"{'AB'[vi]}-{_slug(label)}" / f"seed{d['seed']}")))
    if jobs is None:
        import torch
        jobs = 2 if torch.cuda.is_available() else 1
    together = "side by side" if jobs > 1 else "one after the other"
    log(f"compare: {variants[0][0]}  vs  {variants[1][0]}  ({seeds} seeds each, each variant's seeds as one stack, "
        f"the variants {together}) -> {root}")
    t0 = time.perf_counter()
    trained = _train_variants(runs, min(jobs, 2), progress)
    for (label, _), variant, (results, seconds) in zip(variants, runs, trained):
        p = _phases(results)
        log(f"  {label}: {seconds:.1f} s: start-up {p['startup']:.1f} s, compilation (the first steps) "
            f"{p['compile'] + p['capture']:.1f} s ({results[0].get('compile_cache') or 'step not compiled'}), "
            f"training {p['train']:.1f} s, evaluation {p['eval']:.1f} s")
        for (seed, _, _), res in zip(variant, results):
            log(f"    seed {seed}: {metric} {res.get(metric) or 0:.4f} ({res['status']})")
    wall = time.perf_counter() - t0
    summary = {"variants": [], "metric": metric, "seeds": seeds, "wall_time_s": round(wall, 2), "out": str(root)}
    values = []
    for (label, _), (mine, seconds) in zip(variants, trained):
        vals = [float(r.get(metric) or 0.0) for r in mine]
        values.append(vals)
        m, lo, hi = mean_ci(vals)
        phases = {k: round(v, 2) for k, v in _phases(mine).items()}
        summary["variants"].append({"label": label, "values": vals, "mean": m, "ci95": [lo, hi],
                                    "statuses": [r["status"] for r in mine], "train_time_s": phases["train"],
                                    "wall_time_s": round(seconds, 2), "phases": phases,
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
    log(f"wall time {wall:.1f} s for {2 * seeds} runs")
    (root / "compare.json").parent.mkdir(parents=True, exist_ok=True)
    (root / "compare.json").write_text(json.dumps(summary, indent=2))
    return summary

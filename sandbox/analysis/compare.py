"""``sandbox compare A B --seeds 5``: the quick hypothesis test before a sweep.

A variant is either a run YAML file or a mixer written ``NAME[+KEY=VALUE...]`` on a base run
(``--task``: a preset below or a YAML file); ``gla+topk=8+balance_alpha=0.01`` sets
``model.mixer: gla`` and ``model.gla.topk: 8``, ``model.gla.balance_alpha: 0.01``. ``--set``
applies to both variants, ``--set-a``/``--set-b`` to one. Both variants train on the same
seeds (base seed, +1, ...).

The report says what was run before what came out: the task with its chance level, the model, and the training
(steps, batch, learning rate, recipe, seeds). Each variant's seeds give a mean with a 95% t interval clipped to
[0, 1]; the comparison is worded as ``sandbox verdict`` words one (``sandbox.analysis.stats``): the effect
mean(B) - mean(A) with its Welch interval, n, and a verdict against ``margin``, the smallest effect worth reporting
(B better / A better / no difference / inconclusive with the seeds that would decide it). A variant whose mean
lies within the margin of chance learned nothing at this budget, and the report says so: two such variants cannot
be told apart. ``report`` is that part alone, a pure function of the values.

A variant's seeds differ only in seed, so they train as one stack (``train_replicas``: one start-up, one
compilation; one after another where a mixer cannot stack). On a GPU the two variants train side by side, each in
a process of its own, on one GPU under CUDA MPS (``jobs``: 1 for one after the other); each variant's line says
where its time went: start-up, compilation, training and evaluation.
"""
from __future__ import annotations

import copy
import json
import multiprocessing as mp
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from sandbox.analysis import stats
from sandbox.analysis.verdicts.checks import still_improving
from sandbox.config import config_from_dict, parse_override, read_yaml, set_dotted, to_dict
from sandbox.train.mps import MPS

# A preset is a base run on which a control learns within the preset's own budget, so that a variant at chance
# says something about that variant, not about the budget.
PRESETS = {
    # CPU-sized: attention (the control: learned positions, 2 layers) reaches 0.99 within a few hundred steps.
    # Recurrent mixers learn it with a short convolution (gla+conv_size=4), more slowly on a CPU.
    "tiny": {"task": {"name": "mqar", "seq_len": 32, "num_kv_pairs": 4, "vocab_size": 64, "val_examples": 256,
                      "test_examples": 512},
             "model": {"d_model": 64, "n_layers": 2, "n_heads": 1, "positions": "learned", "channel_mixer": "swiglu"},
             "train": {"steps": 1000, "batch_size": 128, "lr": 3e-3, "eval_every": 100, "eval_batch_size": 256,
                       "early_stop": 0.99}},
    # GPU-sized: the task, model and recipe of SSE's Figure 8 as this project runs it (zero tokens; --set task.gap=0
    # --set task.noise=192 for its noise tokens; tests/test_compare.py keeps the two alike), at the learning rate its
    # control chose at both settings. The control is attention with learned positions: `sandbox compare attention
    # gla --task fig8 --set-a model.positions=learned`. tests/test_compare.py checks on a GPU that the control reaches
    # 0.99 within the preset (3000 steps of batch 256 at length 320; not run yet).
    "fig8": {"task": {"name": "mqar", "seq_len": 320, "num_kv_pairs": 16, "vocab_size": 8192, "gap": 192,
                      "val_examples": 1024, "test_examples": 1024},
             "model": {"d_model": 128, "n_layers": 2, "n_heads": 2, "channel_mixer": "swiglu",
                       "gla": {"conv_size": 4}, "metala": {"conv_size": 4}},
             "train": {"steps": 3000, "batch_size": 256, "lr": 2e-3, "eval_every": 250, "eval_batch_size": 512,
                       "early_stop": 0.99}},
}
DONE = ("completed", "early_stopped")
# What each run contributes (--metric), in words for the report's footnote.
METRICS = {
    "test_at_best_val": "each seed's test accuracy at the step chosen on val (its evaluation with the best val "
                        "accuracy; one learning rate, not tuned)",
    "best_accuracy": "each seed's best test accuracy over its evaluations (the step chosen on test: optimistic)",
    "final_accuracy": "each seed's test accuracy at its last step",
}


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
    run's evaluations; runs trained one after another, each run's. A run of a stack that went on in a smaller group
    once others stopped (down to a group of one) counts the stack's time and its group's, so the longest is the
    stack's whole."""
    keys = ("startup", "compile", "capture", "train", "eval")
    got = [r.get("phases") or dict.fromkeys(keys, 0.0) for r in results]
    stacked = any((r.get("replicas") or 1) > 1 for r in results)
    return {k: sum(p[k] for p in got) if k == "eval" or not stacked else max(p[k] for p in got) for k in keys}


def _train_variants(runs: list[list[tuple]], jobs: int, progress: bool, root: Path,
                    log=print) -> list[tuple[list[dict], float]]:
    """Each variant's ``(results, seconds)``; with ``jobs`` 2, each in a process of its own, side by side: on two
    GPUs where there are two, else both on one under a private CUDA MPS daemon (in ``root``), which lets the two
    share the GPU's units rather than take turns. This process never uses CUDA then, so that it is no client of
    the daemon it stops at the end."""
    def args(variant):
        return [cfg for _, cfg, _ in variant], [d for _, _, d in variant]

    if jobs == 1:
        return [_train_variant(*args(v), progress) for v in runs]
    import torch
    n = torch.cuda.device_count()              # counted through NVML: CUDA stays untouched here
    gpus = (0, 1) if n > 1 else (0, 0)
    mps = MPS(root) if n == 1 else None
    if mps is not None and not mps.start():
        log(f"  (CUDA MPS is unavailable: {mps.reason}; the two variants take turns on the GPU)")
        mps = None
    saved = {k: os.environ.get(k) for k in (mps.env if mps else {})}
    os.environ.update(mps.env if mps else {})         # the spawned processes' environment: MPS clients
    try:
        pools = [ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=_use_gpu, initargs=(g,))
                 for g in gpus]
        with pools[0], pools[1]:
            futures = [pool.submit(_train_variant, *args(v), progress and i == 0)
                       for i, (pool, v) in enumerate(zip(pools, runs))]
            return [f.result() for f in futures]
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
        if mps is not None:
            mps.stop()


def chance_of(task: dict) -> float:
    """The chance level of a resolved config's ``task`` section (the task contract's ``chance``)."""
    from sandbox.analysis.verdicts.claims import chance_level
    return chance_level(task)


# task parameters named in the report whenever the task has them; any other is named where it differs from its
# default
_TASK_KEYS = ("seq_len", "num_kv_pairs", "vocab_size", "gap", "noise")


def describe(cfg: dict, seeds: list[int]) -> dict[str, str]:
    """What a variant ran, from its resolved config (``to_dict``): lines ``task``, ``model`` and ``training``."""
    from sandbox.tasks import task_config_class
    task = {k: v for k, v in cfg["task"].items() if k != "name"}
    default = vars(task_config_class(cfg["task"]["name"])())
    shown = [k for k in task if k in _TASK_KEYS or task[k] != default.get(k)]
    m, t = cfg["model"], cfg["train"]
    recipe = t["recipe"] or (f"none: AdamW betas ({t['betas'][0]}, {t['betas'][1]}), weight decay "
                             f"{t['weight_decay']:g}, {t['warmup_frac']:.0%} warm-up then cosine")
    stop = f", early stop at val accuracy {t['early_stop']:g}" if t["early_stop"] is not None else ""
    return {
        "task": f"{cfg['task']['name']} (" + ", ".join(f"{k} {task[k]}" for k in shown) + ")",
        "model": f"d_model {m['d_model']}, {_count(m['n_layers'], 'layer')}, {_count(m['n_heads'], 'head')}, "
                 f"positions {m['positions']}, channel mixer {m['channel_mixer']}",
        "training": f"{t['steps']} steps{stop}, batch {t['batch_size']}, lr {t['lr']:g}, recipe {recipe}, precision "
                    f"{t['precision']}; seeds {', '.join(map(str, seeds))}",
    }


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def chance_warning(stuck: list[tuple[str, dict]], margin: float) -> str:
    """The warning for variants (``(tag, variant)``) whose mean lies within ``margin`` of their chance level."""
    fix = "Train longer (--set train.steps=N) or on an easier task (fewer pairs, a shorter sequence)."
    if len(stuck) == 2:
        (_, a), (_, b) = stuck
        return (f"warning: A {a['label']} and B {b['label']} sit at chance (means {a['mean']:.3f} and {b['mean']:.3f}, "
                f"chance {a['chance']:.3f}, margin {margin:g}): neither learned at this budget, so the comparison "
                f"cannot tell the mixers apart. {fix}")
    (tag, v), = stuck
    other = "B" if tag == "A" else "A"
    return (f"warning: {tag} {v['label']} sits at chance (mean {v['mean']:.3f} < chance {v['chance']:.3f} + margin "
            f"{margin:g}): it learned nothing at this budget, so the effect measures whether {other} learns, not "
            f"how two mixers that learn differ. {fix}")


def budget_note(learned: list[tuple[str, dict]], margin: float) -> str | None:
    """A note where most seeds that learned something (``value`` at least ``margin`` above chance) were still improving
    at their last step (``improving``): the effect is then one at this budget, and may change with more steps."""
    parts = []
    for tag, v in learned:
        seeds = [i for i, x in enumerate(v["values"]) if x - v["chance"] >= margin and i < len(v.get("improving", []))]
        still = sum(bool(v["improving"][i]) for i in seeds)
        if seeds and 2 * still >= len(seeds):
            parts.append(f"{tag}: {still} of {len(seeds)} seeds that learned")
    if not parts:
        return None
    return (f"note: still improving at the last step ({'; '.join(parts)}): the effect is the one after this many "
            f"steps and may change with more (--set train.steps=N).")


def report(variants: list[dict], margin: float = 0.05, metric: str = "test_at_best_val") -> tuple[list[str], dict]:
    """The comparison of two variants' values, as lines to print and a summary to store.

    ``variants``: A and B, each a dict with ``label``, ``values`` (one per seed, in [0, 1]) and ``chance`` (the
    task's chance level), and optionally ``statuses``, ``state_size``, ``train_s`` (training seconds per run) and
    ``improving`` (per seed: whether its chosen step was its last one, short of the early stop).
    The effect is mean(B) - mean(A); the verdict reads its 95% interval against ``stats.sides(margin)``."""
    if margin <= 0:
        raise ValueError(f"margin: must be > 0 (the smallest effect worth reporting), got {margin}")
    if len(variants) != 2 or any(not v["values"] for v in variants):
        raise ValueError("variants: need A and B, each with at least one value")
    lines, out = [], {"variants": [], "metric": metric, "margin": margin}
    width = max(len(v["label"]) for v in variants)
    for tag, v in zip("AB", variants):
        mean, lo, hi = stats.mean_ci(v["values"], bounds=(0.0, 1.0))
        at_chance = mean - v["chance"] < margin
        out["variants"].append({**v, "mean": mean, "ci95": [lo, hi], "at_chance": at_chance})
        ci = f"[{lo:.3f}, {hi:.3f}]" if lo == lo else "[one seed]"
        bad = [s for s in v.get("statuses", []) if s not in DONE]
        extra = "".join([f"  state {v['state_size']:,}" if v.get("state_size") else "",
                         f"  train {v['train_s']:.1f} s/run" if v.get("train_s") is not None else "",
                         f"  ({len(bad)} {'/'.join(sorted(set(bad)))})" if bad else ""])
        lines.append(f"{tag}  {v['label']:<{width}}  {mean:.3f} {ci}  seeds {' '.join(f'{x:.3f}' for x in v['values'])}"
                     + extra)
    a, b = out["variants"]
    stuck = [(tag, v) for tag, v in zip("AB", (a, b)) if v["at_chance"]]
    if stuck:
        lines.append(chance_warning(stuck, margin))
    note = budget_note([(tag, v) for tag, v in zip("AB", (a, b)) if not v["at_chance"]], margin)
    if note:
        lines.append(note)
    e = stats.difference(b["values"], a["values"])
    rules = dict(zip(("B better", "A better", "no difference"), stats.sides(margin)))
    held = [name for name, rule in rules.items() if stats.decide(e, rule) == stats.HOLDS]
    if len(stuck) == 2:
        verdict = "not compared: both variants sit at chance"
    elif held:
        verdict = f"{held[0]} ({rules[held[0]].text()} holds)"
    else:
        verdict = f"{stats.OPEN}: {stats.seeds_text(e, rules['no difference'])}"
    lo, hi = e.interval()
    out["effect"] = {"b_minus_a": e.estimate, "ci95": [max(lo, -1.0), min(hi, 1.0)], "n": list(e.n),
                     "p_superior": e.p_superior, "verdict": verdict,
                     "seeds_to_decide": None if held else stats.seeds_to_decide(e, rules["no difference"])}
    lines += [f"B - A: effect {stats.effect_text(e, (-1.0, 1.0))}  n {stats.n_text(e)}  P(B > A) "
              f"{e.p_superior:.2f}  verdict: {verdict}",
              f"Rule (--margin {margin:g}): B better when the whole 95% interval of the effect lies above {margin:+g}, "
              f"A better when below {-margin:+g}, no difference when inside ±{margin:g}; else inconclusive.",
              f"Values: {METRICS[metric]}; means with their 95% t interval clipped to [0, 1].",
              f"Effect: mean(B) - mean(A) with Welch's 95% interval (seeds' spreads taken as at least "
              f"{stats.SD_FLOOR}), clipped to [-1, 1]; P(B > A): the share of seed pairs where B's seed is higher."]
    return lines, out


def compare(a: str, b: str, seeds: int = 5, task: str = "tiny", sets=(), set_a=(), set_b=(),
            metric: str = "test_at_best_val", margin: float = 0.05, out=None, jobs: int | None = None,
            progress: bool = False, log=print) -> dict:
    if seeds < 1:
        raise ValueError(f"seeds: must be >= 1, got {seeds}")
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs: must be >= 1, got {jobs}")
    if metric not in METRICS:
        raise ValueError(f"metric: must be one of {', '.join(METRICS)}, got {metric!r}")
    if margin <= 0:
        raise ValueError(f"margin: must be > 0 (the smallest effect worth reporting), got {margin}")
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
        jobs = 2 if torch.cuda.device_count() else 1     # NVML's count: no CUDA context in this process
    together = "side by side" if jobs > 1 else "one after the other"
    log(f"compare: {variants[0][0]}  vs  {variants[1][0]}  ({seeds} seeds each, each variant's seeds as one stack, "
        f"the variants {together}) -> {root}")
    chances = [chance_of(v[0][1]["task"]) for v in runs]
    what = [describe(v[0][1], [s for s, _, _ in v]) for v in runs]
    for key in ("task", "model", "training"):
        if what[0][key] == what[1][key]:
            log(f"  {key}: {what[0][key]}" + (f"; chance {chances[0]:.3f}" if key == "task" else ""))
        else:
            for tag, w, c in zip("AB", what, chances):
                log(f"  {key} of {tag}: {w[key]}" + (f"; chance {c:.3f}" if key == "task" else ""))
    t0 = time.perf_counter()
    trained = _train_variants(runs, min(jobs, 2), progress, root, log)
    for (label, _), variant, (results, seconds) in zip(variants, runs, trained):
        p = _phases(results)
        log(f"  {label}: {seconds:.1f} s: start-up {p['startup']:.1f} s, compilation (the first steps) "
            f"{p['compile'] + p['capture']:.1f} s ({results[0].get('compile_cache') or 'step not compiled'}), "
            f"training {p['train']:.1f} s, evaluation {p['eval']:.1f} s")
        for (seed, _, _), res in zip(variant, results):
            log(f"    seed {seed}: {metric} {_value(res, metric, seed):.4f} ({res['status']})")
    wall = time.perf_counter() - t0
    values = []
    for (label, _), variant, (mine, seconds), chance in zip(variants, runs, trained, chances):
        phases = {k: round(v, 2) for k, v in _phases(mine).items()}
        values.append({"label": label, "values": [_value(r, metric, s) for (s, _, _), r in zip(variant, mine)],
                       "chance": chance,
                       "statuses": [r["status"] for r in mine], "state_size": mine[0].get("state_size"),
                       "improving": [still_improving(r, _early_stop(r)) for r in mine],
                       "train_s": phases["train"] / len(mine), "params": mine[0].get("params"),
                       "wall_time_s": round(seconds, 2), "phases": phases})
    lines, summary = report(values, margin, metric)
    log("")
    for line in lines:
        log(line)
    log(f"wall time {wall:.1f} s for {2 * seeds} runs")
    summary.update({"seeds": seeds, "wall_time_s": round(wall, 2), "out": str(root),
                    "setup": {tag: {**w, "chance": c} for tag, w, c in zip("AB", what, chances)}})
    (root / "compare.json").parent.mkdir(parents=True, exist_ok=True)
    (root / "compare.json").write_text(json.dumps(summary, indent=2))
    return summary


def _early_stop(result: dict) -> float:
    """The validation accuracy at which the run would have stopped early (1.0: none)."""
    return (result.get("config") or {}).get("train", {}).get("early_stop") or 1.0


def _value(result: dict, metric: str, seed) -> float:
    v = result.get(metric)
    if v is None:
        if result["status"] in DONE:
            raise ValueError(f"seed {seed}: its result has no {metric} (a run from before the val split?); "
                             "use --metric best_accuracy")
        return 0.0              # a run that diverged or failed before its first evaluation learned nothing
    return float(v)

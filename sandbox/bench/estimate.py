"""``sandbox bench train --sweep FILE``: a sweep's GPU-minutes, from one timed stack of each kind of its trials.

It times a sweep's grid: one stack of each kind of trial the runner would stack
(its grid points differing only in learning rate and seed share a stack; kinds of equal shapes and settings,
e.g. zero and noise tokens, are timed once), and estimates the GPU-minutes of the whole sweep at those rates:
per kind, its stacks x (steps x the stack's ms per step + the start-up measured with it + its evaluations, every
one of the run's, from three timed ones), one stack after another on one GPU with no early stop (an upper bound:
the runner's second worker under MPS overlaps start-ups and fills what a small stack leaves). Each kind's
set-up is timed both from cold compile caches and with warm ones (a second group of the kind in the same process,
its compilations dropped: what torch's on-disk caches give), and a second figure charges a kind's later stacks the
warm set-up (``minutes_with_warm_caches``), as a sweep's workers find the first stack's compilation in the caches.
A sweep with many kinds can be timed over several runs: ``--time-limit SECONDS`` stops before a kind that would
not fit, and a later run given the earlier runs' estimate.json files (``--timed JSON...``) times only the kinds
they lack and estimates from all the rows; ``--kinds NAMES`` times only the named kinds.
With ``--ref`` each kind's stack is also trained by the other code in the same run: its ms per stacked step,
the speed-up and the loss gap go beside this code's (the estimate stays this code's); ``--profile`` lists each
kind's stacked step by kernel.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from sandbox.bench.runs import ROOT, loss_gap, print_profile, run_one


def sweep_kinds(path: str, cap: int = 12) -> list[dict]:
    """The kinds of stack of a sweep file: per kind of equal cost (the run config without seed, name, learning
    rate and the task's content: its kind, length and vocabulary stay), the config of its first trial, its
    trials and stacks, and the stack size the runner would use (``packing.group_size``)."""
    from sandbox.config import to_dict
    from sandbox.sweep.packing import group_size
    from sandbox.sweep.spec import load_sweep
    from sandbox.train import stack_key
    spec = load_sweep(path)
    size = group_size(spec, cap)
    stacks: dict[str, list[dict]] = {}
    for p in spec.points():
        cfg = spec.point_config(p)
        stacks.setdefault(stack_key(cfg), []).append(to_dict(cfg))
    kinds: dict[str, dict] = {}
    for key, trials in stacks.items():
        cost = json.loads(key)
        cost["task"] = {k: cost["task"].get(k) for k in ("name", "seq_len", "vocab_size")}
        k = kinds.setdefault(json.dumps(cost, sort_keys=True),
                             {"data": trials[0], "trials": 0, "stacks": 0, "replicas": min(size, len(trials))})
        k["trials"] += len(trials)
        k["stacks"] += math.ceil(len(trials) / size)
    kinds = list(kinds.values())
    for k, name in zip(kinds, _unique_names([k["data"] for k in kinds])):
        k["name"] = name
    return kinds


def _unique_names(configs: list[dict]) -> list[str]:
    """Each config's ``kind_name``; where several share one (kinds that differ in a setting the name leaves
    out, e.g. ``model.n_heads`` or an ablation's switches), each gets the settings in which they differ."""
    from sandbox.config import flatten
    names = [kind_name(d) for d in configs]
    flat = [flatten(d) for d in configs]
    for name in set(names):
        same = [i for i, n in enumerate(names) if n == name]
        if len(same) > 1:
            keys = [k for k in flat[same[0]] if k not in _NOT_COST and not k.startswith("task.")
                    and len({repr(flat[i].get(k)) for i in same}) > 1]
            for i in same:
                names[i] = "_".join([name] + [f"{k.rsplit('.', 1)[-1]}{flat[i].get(k)}" for k in keys])
    return names


_NOT_COST = ("seed", "name", "train.lr")    # with the task's content: what a kind's trials may differ in


def config_words(d: dict) -> list[str]:
    """A run config (``to_dict`` form) in a few words: mixer, width, length and the mixer's shaping options."""
    m = d["model"]
    names = [m["mixer"]] if isinstance(m["mixer"], str) else list(dict.fromkeys(m["mixer"]))    # a layer pattern
    extra = {k: v for n in names if isinstance(m.get(n), dict) for k, v in m[n].items()}
    return ["+".join(names), f"d{m['d_model']}", f"T{d['task'].get('seq_len')}"] + \
        [f"{k}{extra[k]}" for k in ("topk", "conv_size", "n", "k", "num_slots") if extra.get(k)]


def kind_name(d: dict) -> str:
    return "_".join(config_words(d))


def estimate_sweep(path: str, steps: int, out: Path, only: list[str] | None = None,
                   timed: list[str] | None = None, ref: Path | None = None, profile: bool = False,
                   time_limit: float | None = None) -> int:
    """Time one stack of each kind of ``path``'s trials (or of the kinds named in ``only``); print and write
    the estimated GPU-minutes of the sweep (of those kinds). ``timed``: estimate.json files of earlier runs, whose
    rows join this estimate and whose kinds are not timed again (without a GPU the others are listed as not timed).
    ``time_limit``: start no kind once the seconds spent and the longest kind so far would pass it; the kinds left
    are listed as not timed, for a later run with this one's estimate.json in ``timed``."""
    kinds = sweep_kinds(path)
    names = [k["name"] for k in kinds]
    if only:
        unknown = [n for n in only if n not in names]
        if unknown:
            print(f"sandbox bench train: error: --kinds: {path} has no kind {', '.join(unknown)}; its kinds: "
                  f"{', '.join(names)}", file=sys.stderr)
            return 2
        kinds = [k for k, n in zip(kinds, names) if n in only]
    found = {}
    for f in timed or []:
        try:
            data = json.loads(Path(f).read_text())
        except (OSError, ValueError) as e:
            print(f"sandbox bench train: error: --timed: {f}: {e}", file=sys.stderr)
            return 2
        found.update({r["kind"]: {**r, "gpu": data["gpu"], "steps": data["steps"], "torch": data["torch"]}
                      for r in data["rows"] if "error" not in r})       # a kind that failed is timed again
    todo = [k for k in kinds if k["name"] not in found]
    new: dict[str, dict] = {}
    gpu = version = None
    if todo:
        import torch
        if torch.cuda.is_available():
            gpu, version = torch.cuda.get_device_name(), torch.__version__
            other = sorted({r["gpu"] for r in found.values()} - {gpu})
            if other:
                print(f"sandbox bench train: error: --timed: rows timed on {', '.join(other)}, this GPU is {gpu}: "
                      f"an estimate joins rows of one GPU", file=sys.stderr)
                return 2
            t0, longest = time.monotonic(), 0.0
            for kind in todo:
                if time_limit is not None and time.monotonic() - t0 + longest > time_limit:
                    print(f"--time-limit {time_limit:.0f} s: {len(todo) - len(new)} kinds left for a later call",
                          flush=True)
                    break
                t = time.monotonic()
                new[kind["name"]] = time_kind(kind, steps, out, ref, profile)
                longest = max(longest, time.monotonic() - t)
        elif not found:
            print("sandbox bench train: error: needs a CUDA GPU", file=sys.stderr)
            return 1
    rows = [new[k["name"]] if k["name"] in new else every_evaluation(found[k["name"]], k["data"]["train"])
            for k in kinds if k["name"] in new or k["name"] in found]
    missing = [k["name"] for k in kinds if k["name"] not in new and k["name"] not in found]
    if gpu is None:
        gpu, steps, version = (rows[0]["gpu"], rows[0]["steps"], rows[0]["torch"]) if rows else ("-", steps, "-")
    return _write_estimate(path, rows, gpu, version, steps, len(names), out, missing)


def timed_data(kind: dict, steps: int) -> dict:
    """The config a timing of ``kind`` trains: its first trial's, ``steps`` long, with TIMED_ROUNDS evaluations,
    compiled, no early stop."""
    d = json.loads(json.dumps(kind["data"]))
    d["train"].update(steps=steps, eval_every=steps // TIMED_ROUNDS, log_every=25, early_stop=None, compile=True)
    return d


def time_kind(kind: dict, steps: int, out: Path, ref: Path | None = None, profile: bool = False) -> dict:
    """Train one stack of ``kind`` for ``steps`` steps from cold compile caches, set it up again with warm ones, and
    return its estimate row: ms per stacked step, start-up in parts, evaluations, and the GPU-minutes of the kind's
    stacks (with ``ref``, the same stack by that code beside it; with ``profile``, its step by kernel)."""
    d = timed_data(kind, steps)
    trial_steps, rounds = kind["data"]["train"]["steps"], eval_rounds(kind["data"]["train"])
    timed_rounds = eval_rounds(d["train"])
    name = kind["name"]
    res = run_one(ROOT, name, d, out / name, replicas=kind["replicas"], warm=True, profile=profile)
    row = {"kind": name, "trials": kind["trials"], "stacks": kind["stacks"], "replicas": kind["replicas"]}
    if "error" in res or not res.get("steps_per_sec"):
        error = res.get("error", "no steady steps logged")
        print(f"{name}: {error}", flush=True)
        return {**row, "error": error}
    ms = 1e3 / res["steps_per_sec"]
    # the stack's evaluations: the first (which may compile kernels for the test batch's shape) and the others
    eval_s, first = res.get("eval_s") or 0.0, res.get("first_eval_s") or 0.0
    start = res["wall_s"] - steps * ms / 1e3 - eval_s
    setup, warm_setup = res.get("setup_s"), res.get("warm_setup_s")
    row.update(ms_per_stack_step=ms, trial_steps_per_s=kind["replicas"] * 1e3 / ms, start_s=start,
               setup_s=setup, eval_s=eval_s, first_eval_s=first,
               evals_s=first + (rounds - 1) * (eval_s - first) / max(timed_rounds - 1, 1),
               eval_rounds=rounds, warm_setup_s=warm_setup, import_s=res.get("import_s"),
               train_s=trial_steps * ms / 1e3, peak_gib=res["peak_gib"])
    row["gpu_minutes"] = minutes = kind["stacks"] * stack_seconds(row) / 60
    if ref is not None:       # the same stack by the other code, side by side (its own compile caches' state)
        old = run_one(ref, name, d, out / name / "ref", replicas=kind["replicas"])
        if "error" in old or not old.get("steps_per_sec"):
            row["ref_error"] = old.get("error", "no steady steps")
        else:
            row.update(ref_ms_per_stack_step=1e3 / old["steps_per_sec"],
                       speedup=1e3 / old["steps_per_sec"] / ms, loss_gap=loss_gap(res["loss"], old["loss"]),
                       ref_eval_s=old.get("eval_s"))
    print(f"{name}: {kind['trials']} trials in {kind['stacks']} stacks of {kind['replicas']}: "
          f"{ms:.2f} ms per stacked step, {row['trial_steps_per_s']:.0f} trial-steps/s, start-up {start:.0f} s "
          f"({_start_parts(row)}; set-up {row['warm_setup_s'] or 0:.0f} s with warm caches), {rounds} "
          f"evaluations {row['evals_s']:.1f} s, {minutes:.1f} GPU-minutes" + _against_ref(row), flush=True)
    print_profile(res)
    if res.get("profile"):
        (out / name / "profile.json").write_text(json.dumps({"kernels": res["profile"],
                                                                "by_op_one_replica": res["by_op"]}))
    return row


# Evaluations a timed stack makes (at steps/3, 2 steps/3 and its last step); a run of the sweep makes a dozen or so,
# each of the whole stack (the test split's forward, and per replica a checkpoint and TensorBoard scalars). The
# first is timed apart from the others: it may compile kernels for the test batch's shape.
TIMED_ROUNDS = 3


def eval_rounds(train: dict) -> int:
    """Evaluations a run of ``train``'s settings makes: every ``eval_every`` steps and at its last step."""
    return math.ceil(train["steps"] / train["eval_every"])


def stack_seconds(row: dict) -> float:
    """A stack's wall time, one after another from cold caches: start-up, training, evaluations."""
    return row["start_s"] + row["train_s"] + row["evals_s"]


def every_evaluation(row: dict, train: dict) -> dict:
    """An estimate.json row of any version with every evaluation of the run counted. Rows from before 2026-11-26
    timed one evaluation of the stack (``eval_s``, at its last step) within ``start_s`` and counted no other."""
    if "error" in row or "evals_s" in row:
        return row
    rounds = eval_rounds(train)
    row = {**row, "start_s": row["start_s"] - row["eval_s"], "evals_s": rounds * row["eval_s"], "eval_rounds": rounds}
    row["gpu_minutes"] = row["stacks"] * stack_seconds(row) / 60
    return row


def _write_estimate(path: str, rows: list[dict], gpu: str, version: str, steps: int, n_kinds: int, out: Path,
                    missing: list[str] | None = None) -> int:
    timed = [r for r in rows if "error" not in r]
    total = sum(r["gpu_minutes"] for r in timed)
    which = f"{len(rows)} of its {n_kinds} kinds" if len(rows) < n_kinds else "all its kinds"
    warm_minutes = minutes_with_warm_caches(timed) if timed and all(r.get("warm_setup_s") is not None for r in timed) \
        else None
    lines = [f"{path} ({which}) on {gpu}: about **{total:.1f} GPU-minutes** with every stack compiling from a "
             f"cold start (stacks one after another, no early stop, timed over {steps} steps each)"]
    if warm_minutes is not None:
        lines += ["", f"With a kind's later stacks finding its compilation in torch's caches (a sweep's way): about "
                      f"**{warm_minutes:.1f} GPU-minutes**"]
    if missing:
        lines += ["", f"Not timed: {', '.join(missing)}"]
    lines += ["", "| kind | trials | stacks x replicas | ms / stacked step | trial-steps / s | start-up s | of it "
                  "| set-up s, warm caches | evaluations s (a stack's run) | GPU-min, cold starts |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['kind']}: {r['error']} | {r['trials']} | {r['stacks']} x {r['replicas']} | - | - | - | - "
                         "| - | - | - |")
        else:
            warm = "-" if r.get("warm_setup_s") is None else f"{r['warm_setup_s']:.0f}"
            lines.append(f"| {r['kind']} | {r['trials']} | {r['stacks']} x {r['replicas']} | {r['ms_per_stack_step']:.2f} "
                         f"| {r['trial_steps_per_s']:.0f} | {r['start_s']:.0f} | {_start_parts(r)} | {warm} "
                         f"| {r['evals_s']:.1f} ({r['eval_rounds']}) | {r['gpu_minutes']:.1f} |")
    against = [r for r in rows if "speedup" in r or "ref_error" in r]
    if against:
        lines += ["", "Against the other code (`--ref`), the same stacks in the same call (evaluations: the seconds of "
                      "the timed run's, this code's and the other's):", "",
                  "| kind | ms / stacked step | ref ms / stacked step | speed-up | loss gap | evaluations s | ref |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['kind']} | {r['ms_per_stack_step']:.2f} | {r['ref_error']} | - | - | - | - |" if "ref_error" in r
                  else f"| {r['kind']} | {r['ms_per_stack_step']:.2f} | {r['ref_ms_per_stack_step']:.2f} | {r['speedup']:.3f} "
                  f"| {'-' if r['loss_gap'] is None else format(r['loss_gap'], '.1e')} | {_seconds(r.get('eval_s'))} "
                  f"| {_seconds(r.get('ref_eval_s'))} |" for r in against]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "estimate.md").write_text(text)
    (out / "estimate.json").write_text(json.dumps({"sweep": path, "gpu": gpu, "torch": version,
                                                   "steps": steps, "kinds": f"{len(rows)} of {n_kinds}",
                                                   "gpu_minutes": total, "gpu_minutes_warm_caches": warm_minutes,
                                                   "rows": rows}, indent=1))
    return 1 if any("error" in r for r in rows) or missing else 0


def minutes_with_warm_caches(rows: list[dict]) -> float:
    """GPU-minutes of the timed kinds' stacks one after another, each kind's first stack starting cold
    (``start_s``) and its later ones with its set-up from warm caches (``warm_setup_s`` in place of ``setup_s``)."""
    return sum(r["stacks"] * stack_seconds(r) - (r["stacks"] - 1) * (r["setup_s"] - r["warm_setup_s"])
               for r in rows) / 60


def _against_ref(row: dict) -> str:
    if "ref_error" in row:
        return f"; ref: {row['ref_error']}"
    if "speedup" not in row:
        return ""
    gap = "-" if row["loss_gap"] is None else f"{row['loss_gap']:.1e}"
    return f"; ref {row['ref_ms_per_stack_step']:.2f} ms, speed-up {row['speedup']:.3f}, loss gap {gap}"


def _seconds(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _start_parts(row: dict) -> str:
    """A timed stack's start-up in parts: its group's set-up (build, pool, compilation, capture) and the rest of
    the training call outside its steady steps and evaluations (the final checkpoints, logs, the result's files)."""
    if row.get("setup_s") is None:
        return "-"
    return f"set-up {row['setup_s']:.0f}, other {row['start_s'] - row['setup_s']:.0f}"

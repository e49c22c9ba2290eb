"""``sandbox bench train``: the training-step yardstick.

A fixed set of reference configurations (the papers' settings, batch 256), each trained for a few
hundred steps in a process of its own (``step_worker.py``), by this checkout and, with ``--ref``,
by another commit's code in the same call, so every speed claim is a ratio measured side by side.
For each configuration: ms/step and tokens/s at steady state, the task generator's share of the
step (``gen %``: drawing the batches on their own, host time included; with ``--profile`` also
``gen GPU %``: the GPU time its kernels add to each step, which is what a step pays while the host
draws ahead of the GPU), the seconds a run spends outside its steady steps (start-up, compilation, graph capture, the data
pool, the final evaluation), peak GPU memory, the roofline (FLOPs and the bytes the step must move, against this GPU's
measured bf16 matrix rate and copy bandwidth) and how far above it the step runs, and the largest
relative difference of the training loss from the reference code's over the first 200 steps.
With ``--replicas R`` the stacked replicas of each configuration are timed as well (trial-steps/s).

With ``--sweep FILE`` it times a sweep's grid instead: one stack of each kind of trial the runner would stack
(its grid points differing only in learning rate and seed share a stack; kinds of equal shapes and settings,
e.g. zero and noise tokens, are timed once), and estimates the GPU-minutes of the whole sweep at those rates:
per kind, its stacks x (steps x the stack's ms per step + the start-up measured with it + its evaluations, every
one of the run's, from three timed ones), one stack after another on one GPU with no early stop (an upper bound: a second worker under MPS overlaps start-ups). Each kind's
set-up is also timed with warm compile caches, and a second figure simulates the sweep worker, whose helper
compiles the next stacks ahead (``minutes_compiling_ahead``). ``--kinds NAMES`` times only the named kinds, for a
sweep with more kinds than one GPU call can time; ``--timed JSON...`` joins such calls' estimate.json files.
With ``--ref`` each kind's stack is also trained by the other code in the same call: its ms per stacked step,
the speed-up and the loss gap go beside this code's (the estimate stays this code's); ``--profile`` lists each
kind's stacked step by kernel.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MQAR = {"name": "mqar", "vocab_size": 8192}


def _cfg(task: dict, model: dict, **train) -> dict:
    return {"task": {**MQAR, **task}, "model": {"n_layers": 2, **model},
            "train": {"batch_size": 256, "lr": 1e-3, **train}}


REFERENCE = {
    "attention_d64_t64": _cfg({"seq_len": 64, "num_kv_pairs": 4},
                              {"mixer": "attention", "d_model": 64, "positions": "learned", "channel_mixer": "none"}),
    "gla_d64_t128": _cfg({"seq_len": 128, "num_kv_pairs": 8},
                         {"mixer": "gla", "d_model": 64, "n_heads": 1, "channel_mixer": "none"}),
    "gla_d128_t192": _cfg({"seq_len": 192, "num_kv_pairs": 16, "gap": 64},
                          {"mixer": "gla", "d_model": 128, "n_heads": 2}),
    "gla_topk8_d128_t192": _cfg({"seq_len": 192, "num_kv_pairs": 16, "gap": 64},
                                {"mixer": "gla", "d_model": 128, "n_heads": 2, "gla": {"topk": 8}}),
    "gla_conv4_d128_t256": _cfg({"seq_len": 256, "num_kv_pairs": 16},
                                {"mixer": "gla", "d_model": 128, "n_heads": 2, "gla": {"conv_size": 4}}),
    "sse_n4k1_d128_t256": _cfg({"seq_len": 256, "num_kv_pairs": 16},
                               {"mixer": "sse", "d_model": 128, "n_heads": 2, "sse": {"n": 4, "k": 1}}),
    "gated_deltanet_d128_t256": _cfg({"seq_len": 256, "num_kv_pairs": 16},
                                     {"mixer": "gated_deltanet", "d_model": 128, "n_heads": 2}),
    # Figure 8's costly mixer, as its sweeps train it (64 slots, conv 4, gap 192)
    "gsa_d128_t320": _cfg({"seq_len": 320, "num_kv_pairs": 16, "gap": 192},
                          {"mixer": "gsa", "d_model": 128, "n_heads": 2, "gsa": {"num_slots": 64, "conv_size": 4}}),
    "gla_d512_t576": _cfg({"seq_len": 576, "num_kv_pairs": 16, "gap": 448},
                          {"mixer": "gla", "d_model": 512, "n_heads": 2}),
}

ROOT = Path(__file__).resolve().parents[2]          # this checkout (holds the sandbox package)
MIN_STEPS = 150  # the steady rate: the median of the rates logged every 25 steps after the first 100


def knows_compile(code: Path) -> bool:
    """Whether a version's config has ``train.compile`` (fb670ab, before it, does not and rejects the key)."""
    import re
    text = (code / "sandbox" / "config.py").read_text()
    return re.search(r"^\s+compile\s*:", text, re.M) is not None


def ref_code(ref: str) -> Path:
    """A directory holding another version's ``sandbox`` package: ``ref`` itself if it is one, else
    a git worktree of that commit (made once, under the system's temp directory)."""
    if (Path(ref) / "sandbox" / "__init__.py").exists():
        return Path(ref).resolve()
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                         capture_output=True, text=True)
    if rev.returncode:
        raise ValueError(f"--ref: {ref!r} is neither a directory with a sandbox package nor a commit here")
    sha = rev.stdout.strip()
    path = Path(tempfile.gettempdir()) / f"sandbox-ref-{sha[:12]}"
    if not (path / "sandbox" / "__init__.py").exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), sha], check=True,
                       capture_output=True)
    return path


def run_one(code: Path, name: str, data: dict, out: Path, *, replicas: int = 1, roofline: bool = False,
            profile: bool = False, warm: bool = False) -> dict:
    shutil.rmtree(out / "run", ignore_errors=True)       # a finished run there would only return its result
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(data))
    cmd = [sys.executable, str(Path(__file__).with_name("step_worker.py")), str(out / "config.json"),
           str(out / "run"), "--replicas", str(replicas)] + (["--roofline"] if roofline else []) + \
        (["--profile"] if profile else []) + (["--warm"] if warm else [])
    env = dict(os.environ, PYTHONPATH=str(code), PYTHONUNBUFFERED="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(out))
    (out / "log.txt").write_text(p.stdout + p.stderr)
    if p.returncode:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"{name}: exit {p.returncode}: {tail[:300]}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def loss_gap(a: list, b: list, upto: int = 200) -> float | None:
    """Largest |a - b| / |b| over the logged steps <= upto that both runs logged."""
    bs = dict((s, v) for s, v in b)
    gaps = [abs(v - bs[s]) / abs(bs[s]) for s, v in a if s <= upto and s in bs and bs[s]]
    return max(gaps) if gaps else None


def summarise(name: str, data: dict, new: dict, ref: dict | None, stacked: dict | None) -> dict:
    row = {"config": name}
    if "error" in new:
        return {**row, "error": new["error"]}
    tokens = data["train"]["batch_size"] * data["task"]["seq_len"]
    ms = 1e3 / new["steps_per_sec"]
    steps = data["train"]["steps"]
    row.update(ms=ms, tokens_per_s=tokens / ms * 1e3, generator_pct=100 * new["generator_ms"] / ms,
               start_s=new["wall_s"] - steps * ms / 1e3)
    prof = new.get("profile", [])
    gen = _generator_row(prof)
    if gen < len(prof) - 1:   # the GPU time its kernels add to each step
        row["generator_gpu_pct"] = 100 * prof[gen + 1]["ms_per_step"] / ms
    if new["peak_gib"] is not None:
        row["peak_gib"] = new["peak_gib"]
    if "flops" in new:
        pk = new["peaks"]
        t_flops, t_bytes = new["flops"] / pk["bf16_flops"] * 1e3, new["bytes"] / pk["copy_bytes_per_s"] * 1e3
        row.update(flops=new["flops"], bytes=new["bytes"], roofline_ms=max(t_flops, t_bytes),
                   bound="bytes" if t_bytes > t_flops else "flops", x_roofline=ms / max(t_flops, t_bytes))
    if ref is not None:
        if "error" in ref:
            row["ref_error"] = ref["error"]
        else:
            ref_ms = 1e3 / ref["steps_per_sec"]
            row.update(ref_ms=ref_ms, ref_start_s=ref["wall_s"] - steps * ref_ms / 1e3, speedup=ref_ms / ms,
                       ref_generator_pct=100 * ref["generator_ms"] / ref_ms, ref_peak_gib=ref["peak_gib"],
                       loss_gap_200=loss_gap(new["loss"], ref["loss"]))
    if stacked is not None and "error" not in stacked:
        R = stacked["replicas"]
        row.update(replicas=R, stacked_ms=1e3 / stacked["steps_per_sec"],
                   trial_steps_per_s=R * stacked["steps_per_sec"], stacked_peak_gib=stacked["peak_gib"])
        if "speedup" in row:
            row["stacked_speedup"] = row["trial_steps_per_s"] / ref["steps_per_sec"]
    elif stacked is not None:
        row["stacked_error"] = stacked["error"]
    return row


def table(rows: list[dict]) -> str:
    cols = [("config", "config", "{}"), ("ms", "ms/step", "{:.3f}"), ("tokens_per_s", "Mtok/s", None),
            ("generator_pct", "gen %", "{:.1f}"), ("generator_gpu_pct", "gen GPU %", "{:.1f}"),
            ("start_s", "start s", "{:.1f}"),
            ("peak_gib", "peak GiB", "{:.2f}"),
            ("roofline_ms", "roofline ms", "{:.3f}"), ("x_roofline", "x roofline", "{:.1f}"),
            ("ref_ms", "ref ms/step", "{:.3f}"), ("speedup", "speed-up", "{:.2f}"),
            ("loss_gap_200", "loss gap", "{:.2e}"), ("trial_steps_per_s", "stacked trial-steps/s", "{:.0f}"),
            ("stacked_speedup", "stacked vs ref", "{:.2f}")]
    cols = [c for c in cols if any(c[0] in r for r in rows)]
    lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for key, _, fmt in cols:
            v = r.get(key)
            if v is None:
                cells.append(r.get("error", "-") if key == "config" else "-")
            elif key == "tokens_per_s":
                cells.append(f"{v / 1e6:.1f}")
            else:
                cells.append(fmt.format(v))
        if "error" in r:
            cells[0] = f"{r['config']}: {r['error']}"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    return list(kinds.values())


def config_words(d: dict) -> list[str]:
    """A run config (``to_dict`` form) in a few words: mixer, width, length and the mixer's shaping options."""
    m = d["model"]
    extra = m.get(m["mixer"]) if isinstance(m.get(m["mixer"]), dict) else {}
    return [m["mixer"], f"d{m['d_model']}", f"T{d['task'].get('seq_len')}"] + \
        [f"{k}{extra[k]}" for k in ("topk", "conv_size", "n", "k", "num_slots") if extra.get(k)]


def kind_name(d: dict) -> str:
    return "_".join(config_words(d))


def estimate_sweep(path: str, steps: int, out: Path, only: list[str] | None = None,
                   timed: list[str] | None = None, ref: Path | None = None, profile: bool = False) -> int:
    """Time one stack of each kind of ``path``'s trials (or of the kinds named in ``only``); print and write
    the estimated GPU-minutes of the sweep (of those kinds). With ``timed`` (estimate.json files of earlier
    calls, e.g. one per ``--kinds`` part), time nothing and estimate from their rows."""
    kinds = sweep_kinds(path)
    names = [kind_name(k["data"]) for k in kinds]
    if only:
        unknown = [n for n in only if n not in names]
        if unknown:
            print(f"sandbox bench train: error: --kinds: {path} has no kind {', '.join(unknown)}; its kinds: "
                  f"{', '.join(names)}", file=sys.stderr)
            return 2
        kinds = [k for k, n in zip(kinds, names) if n in only]
    if timed:
        found = {}
        for f in timed:
            try:
                data = json.loads(Path(f).read_text())
            except (OSError, ValueError) as e:
                print(f"sandbox bench train: error: --timed: {f}: {e}", file=sys.stderr)
                return 2
            found.update({r["kind"]: {**r, "gpu": data["gpu"], "steps": data["steps"], "torch": data["torch"]}
                          for r in data["rows"]})
        rows = [every_evaluation(found[kind_name(k["data"])], k["data"]["train"]) for k in kinds
                if kind_name(k["data"]) in found]
        missing = [kind_name(k["data"]) for k in kinds if kind_name(k["data"]) not in found]
        gpu, steps, version = (rows[0]["gpu"], rows[0]["steps"], rows[0]["torch"]) if rows else ("-", steps, "-")
        return _write_estimate(path, rows, gpu, version, steps, len(names), out, missing)
    import torch
    if not torch.cuda.is_available():
        print("sandbox bench train: error: needs a CUDA GPU", file=sys.stderr)
        return 1
    rows = []
    for kind in kinds:
        d = json.loads(json.dumps(kind["data"]))
        trial_steps, rounds = d["train"]["steps"], eval_rounds(d["train"])
        d["train"].update(steps=steps, eval_every=steps // TIMED_ROUNDS, log_every=25, early_stop=None, compile=True)
        timed_rounds = eval_rounds(d["train"])
        name = kind_name(d)
        res = run_one(ROOT, name, d, out / name, replicas=kind["replicas"], warm=True, profile=profile)
        row = {"kind": name, "trials": kind["trials"], "stacks": kind["stacks"], "replicas": kind["replicas"]}
        if "error" in res or not res.get("steps_per_sec"):
            error = res.get("error", "no steady steps logged")
            rows.append({**row, "error": error})
            print(f"{name}: {error}", flush=True)
            continue
        ms = 1e3 / res["steps_per_sec"]
        # the stack's evaluations: the first (which may compile kernels for the test batch's shape) and the others
        eval_s, first = res.get("eval_s") or 0.0, res.get("first_eval_s") or 0.0
        start = res["wall_s"] - steps * ms / 1e3 - eval_s
        row.update(ms_per_stack_step=ms, trial_steps_per_s=kind["replicas"] * 1e3 / ms, start_s=start,
                   setup_s=res.get("setup_s"), eval_s=eval_s, first_eval_s=first,
                   evals_s=first + (rounds - 1) * (eval_s - first) / max(timed_rounds - 1, 1),
                   eval_rounds=rounds, warm_setup_s=res.get("warm_setup_s"), import_s=res.get("import_s"),
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
        rows.append(row)
        print(f"{name}: {kind['trials']} trials in {kind['stacks']} stacks of {kind['replicas']}: "
              f"{ms:.2f} ms per stacked step, {row['trial_steps_per_s']:.0f} trial-steps/s, start-up {start:.0f} s "
              f"({_start_parts(row)}; set-up {row['warm_setup_s'] or 0:.0f} s with warm caches), {rounds} "
              f"evaluations {row['evals_s']:.1f} s, {minutes:.1f} GPU-minutes" + _against_ref(row), flush=True)
        print_profile(res)
        if res.get("profile"):
            (out / name / "profile.json").write_text(json.dumps({"kernels": res["profile"],
                                                                    "by_op_one_replica": res["by_op"]}))
    return _write_estimate(path, rows, torch.cuda.get_device_name(), torch.__version__, steps, len(names), out)


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
    ahead = minutes_compiling_ahead(timed) if timed and all(r.get("warm_setup_s") is not None for r in timed) \
        else None
    lines = [f"{path} ({which}) on {gpu}: about **{total:.1f} GPU-minutes** with every stack compiling from a "
             f"cold start (stacks one after another, no early stop, timed over {steps} steps each)"]
    if ahead is not None:
        from sandbox.train.precompile import HELPERS
        lines += ["", f"With {HELPERS} helper processes compiling the next stacks' steps while one trains (the sweep "
                      f"worker's way, simulated from the times below): about **{ahead:.1f} GPU-minutes**"]
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
                                                   "gpu_minutes": total, "gpu_minutes_compiling_ahead": ahead,
                                                   "rows": rows}, indent=1))
    return 1 if any("error" in r for r in rows) or missing else 0


def minutes_compiling_ahead(rows: list[dict], helpers: int | None = None) -> float:
    """GPU-minutes of the timed kinds' stacks trained one after another by one worker whose ``helpers`` helper
    processes compile the next stacks' steps meanwhile (sandbox/train/precompile.py), from each kind's measured
    times: its training (``train_s``), its start-up from cold caches (``start_s``, of which ``setup_s`` is the
    set-up) and its set-up with warm ones (``warm_setup_s``). The first stack starts cold; once it is ready the
    helpers start (``import_s``), and each takes the next stack in the queue whenever it is free, compiling it in
    its cold set-up's time. A stack whose step is compiled when it starts pays the warm set-up; one that starts
    before pays the cold start-up (a helper that had begun on it finishes it), and one that starts before any
    helper took it is left to itself. ``helpers``: the runner's (``precompile.HELPERS``) unless given. The
    helpers' own GPU work (one step per stack) is left out."""
    if helpers is None:
        from sandbox.train.precompile import HELPERS as helpers
    seq = [r for r in rows for _ in range(r["stacks"])]
    t = stack_seconds(seq[0])
    free = [seq[0]["setup_s"] + seq[0]["import_s"]] * helpers     # when each helper can take another stack
    compiled = {}                                                  # stack -> when a helper finishes its step
    taken = 1                                                      # stacks before this one are taken or started
    for i, r in enumerate(seq[1:], 1):
        taken = max(taken, i)
        while taken < len(seq) and min(free) <= t:                # helpers free before stack i starts
            h = free.index(min(free))
            compiled[taken] = free[h] = free[h] + seq[taken]["setup_s"]
            taken += 1
        warm = compiled.get(i, float("inf")) <= t
        t += stack_seconds(r) - (r["setup_s"] - r["warm_setup_s"] if warm else 0.0)
    return t / 60


def _generator_row(prof: list[dict]) -> int:
    """Where a profile's generator block starts (its marker row; the step's kernels come before it)."""
    return next((i for i, k in enumerate(prof) if k["kernel"].startswith("GENERATOR")), len(prof))


def print_profile(res: dict) -> None:
    """The 40 largest kernels of a timed run's step (``--profile``; the json keeps them all), and the
    generator's."""
    rows = res.get("profile", [])
    cut = _generator_row(rows)
    for k in rows[:min(cut, 41)] + rows[cut:]:
        print(f"    {k['ms_per_step']:8.4f} ms  {k['calls']:6.1f}x  {k['kernel']}")


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


def main_train(argv=None) -> int:
    p = argparse.ArgumentParser(prog="sandbox bench train", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default=",".join(REFERENCE), help="comma-separated names (default: all): "
                   + ", ".join(REFERENCE))
    p.add_argument("--steps", type=int, default=400, help="training steps per configuration (default 400)")
    p.add_argument("--ref", help="another version to time in the same call: a commit or a checkout directory")
    p.add_argument("--replicas", type=int, default=0, help="also time R stacked replicas (R learning rates)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key in every configuration, e.g. --set train.compile=false")
    p.add_argument("--profile", action="store_true", help="also list the GPU time of each kernel of the step")
    p.add_argument("--out", default="runs/bench_train", help="directory for runs, logs and bench.json/bench.md")
    p.add_argument("--sweep", metavar="FILE", help="time one stack of each kind of this sweep's trials instead, and "
                   "estimate the sweep's GPU-minutes (estimate.md/.json in --out)")
    p.add_argument("--kinds", metavar="NAMES", help="with --sweep: time only these kinds (comma-separated, as "
                   "estimate.md names them, e.g. gsa_d64_T320_conv_size4_num_slots64)")
    p.add_argument("--timed", nargs="+", metavar="JSON", help="with --sweep: time nothing; estimate from the rows of "
                   "earlier calls' estimate.json (e.g. one per --kinds part; a kind in several files: the last one's row)")
    a = p.parse_args(argv)
    if a.steps < MIN_STEPS and not a.timed:
        print(f"sandbox bench train: error: --steps {a.steps}: the steady rate is read after the first 100 steps "
              f"(compilation, graph capture), from the rate logged every 25: give --steps {MIN_STEPS} or more",
              file=sys.stderr)
        return 2
    if a.ref and a.timed:
        print("sandbox bench train: error: --ref times the other code; --timed times nothing", file=sys.stderr)
        return 2
    try:
        ref = ref_code(a.ref) if a.ref else None
    except ValueError as e:
        print(f"sandbox bench train: error: {e}", file=sys.stderr)
        return 2
    if a.sweep:
        only = [n.strip() for n in a.kinds.split(",") if n.strip()] if a.kinds else None
        return estimate_sweep(a.sweep, a.steps, Path(a.out), only, a.timed, ref, a.profile)
    if a.timed:
        print("sandbox bench train: error: --timed needs --sweep FILE", file=sys.stderr)
        return 2
    if a.kinds:
        print("sandbox bench train: error: --kinds needs --sweep FILE", file=sys.stderr)
        return 2
    names = [n.strip() for n in a.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in REFERENCE]
    if unknown:
        print(f"sandbox bench train: error: --configs: unknown {unknown}; known: {', '.join(REFERENCE)}",
              file=sys.stderr)
        return 2
    import torch
    if not torch.cuda.is_available():
        print("sandbox bench train: error: needs a CUDA GPU", file=sys.stderr)
        return 1
    from sandbox.config import parse_override, set_dotted
    out = Path(a.out)
    rows = []
    for name in names:
        data = json.loads(json.dumps(REFERENCE[name]))
        data["train"].update(steps=a.steps, eval_every=a.steps, log_every=25, early_stop=None)
        for item in a.set:
            set_dotted(data, *parse_override(item))
        # the steady step of a long run: compiled from the start (auto would decide after 50 steps, and not
        # compile a run this short), in the reference code too where it has the key
        mine = {**data, "train": {"compile": True, **data["train"]}}
        new = run_one(ROOT, name, mine, out / name / "new", roofline=True, profile=a.profile)
        old = run_one(ref, name, mine if ref and knows_compile(ref) else data, out / name / "ref") if ref else None
        stacked = run_one(ROOT, name, mine, out / name / "stacked", replicas=a.replicas) if a.replicas > 1 else None
        rows.append(summarise(name, data, new, old, stacked))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
        print_profile(new)
        if new.get("profile"):
            (out / name / "profile.json").write_text(json.dumps({"kernels": new["profile"], "by_op": new["by_op"]}))
        if new.get("by_op"):
            print("    by operator (eager replay of the compiled step; own kernels' time):")
        for k in new.get("by_op", []):
            print(f"    {k['ms_per_step']:8.4f} ms  {k['calls']:6.1f}x  {k['op']}  [{k['where'] or '-'}]")
    gpu = torch.cuda.get_device_name()
    text = (f"GPU: {gpu}; torch {torch.__version__}; steps {a.steps}; batch 256; ref: {a.ref or '-'}\n\n"
            + table(rows) + "\n")
    print("\n" + text)
    (out / "bench.md").write_text(text)
    (out / "bench.json").write_text(json.dumps({"gpu": gpu, "torch": torch.__version__, "ref": a.ref,
                                                "steps": a.steps, "rows": rows}, indent=1))
    return 1 if any("error" in r for r in rows) else 0

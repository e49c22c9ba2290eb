"""``sandbox bench sweep FILE``: how much training a sweep gets out of a GPU, against another version.

The sweep runs for a fixed window of wall time with this checkout's runner and default packing, and
then, with ``--ref``, with another commit's runner (``--ref-args``, e.g. its ``--workers-per-gpu 8``),
each from an empty directory and empty compile caches on the same GPU. At the end of a window the launcher is interrupted
(its trials checkpoint and write ``result.json``), and the yardstick is the trial-steps done per
second of the window: the sum over the trials of the steps each trained. Both runners take the grid
in the same order, so a faster runner also reaches the larger (slower) grid points sooner: the two
windows hold different mixes of the grid, and the ratio is not the one over the whole sweep (the two
for the Figure 8 slice: results/throughput/README.md).
A window longer than the sweep ends with its last trial. Per grid point it also lists the best accuracy of
the trials that finished in both windows.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from sandbox.bench.estimate import config_words
from sandbox.bench.runs import ROOT, ref_code


def run_window(code: Path, sweep_file: Path, out: Path, seconds: float, args: list[str]) -> dict:
    """Run ``sandbox sweep`` of the version in ``code`` for ``seconds``, then stop it; what it trained."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1",        # that version first, then what it needs (e.g. optuna)
               PYTHONPATH=os.pathsep.join(p for p in (str(code), os.environ.get("PYTHONPATH")) if p),
               # compile caches of its own, empty: each window starts as on a fresh machine
               TORCHINDUCTOR_CACHE_DIR=str(out / "cache" / "inductor"), TRITON_CACHE_DIR=str(out / "cache" / "triton"))
    cmd = [sys.executable, "-m", "sandbox.cli", "sweep", str(sweep_file), "--out", str(out / "sweep"), "--no-live",
           *args]
    with open(out / "launcher.log", "w") as log:
        t0 = time.time()
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(code))
        try:
            p.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        window = min(seconds, time.time() - t0)
    return {"window_s": round(window, 1), **count(out / "sweep")}


def count(sweep_dir: Path) -> dict:
    """Trial-steps, trials by status, and the best accuracy of each finished trial by its grid point."""
    steps, status, best = 0, {}, {}
    for res_file in sorted(sweep_dir.glob("trials/*/result.json")):
        try:
            res = json.loads(res_file.read_text())
        except ValueError:
            continue
        steps += int(res.get("steps") or 0)
        status[res["status"]] = status.get(res["status"], 0) + 1
        if res["status"] in ("completed", "early_stopped", "stopped"):
            cfg = dict(res["config"])
            lr = cfg["train"].pop("lr")
            for k in ("name", "seed"):
                cfg.pop(k, None)
            key = json.dumps(cfg, sort_keys=True)
            best.setdefault(key, []).append((res["best_accuracy"], lr))
    return {"trial_steps": steps, "status": status, "best": best}


def describe(key: str) -> str:
    """A grid point's config in a few words (mixer, width, length, the mixer's options, the task's gap and noise)."""
    c = json.loads(key)
    return " ".join(config_words(c) + [f"gap{c['task'].get('gap', 0)}", f"noise{c['task'].get('noise', 0)}"])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sandbox bench sweep", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("file", help="the sweep YAML (both versions must read it)")
    p.add_argument("--seconds", type=float, default=300, help="wall-time window of each runner (default 300)")
    p.add_argument("--ref", help="another version to run in the same call: a commit or a checkout directory")
    p.add_argument("--ref-args", default="--workers-per-gpu 8",
                   help="options of the other version's `sandbox sweep` (default: --workers-per-gpu 8)")
    p.add_argument("--args", default="", help="options of this checkout's `sandbox sweep` (default: none)")
    p.add_argument("--out", default="runs/bench_sweep", help="directory for both sweeps and bench.json")
    return p


def main_sweep(argv=None) -> int:
    """``argv``: the words after ``sandbox bench sweep``, or the options the CLI parsed with ``parser()``."""
    a = argv if isinstance(argv, argparse.Namespace) else parser().parse_args(argv)
    sweep_file = Path(a.file).resolve()
    if not sweep_file.exists():
        print(f"sandbox bench sweep: error: {a.file}: no such file", file=sys.stderr)
        return 2
    out = Path(a.out).resolve()
    runs = {"new": run_window(ROOT, sweep_file, out / "new", a.seconds, a.args.split())}
    if a.ref:
        runs["ref"] = run_window(ref_code(a.ref), sweep_file, out / "ref", a.seconds, a.ref_args.split())
    lines = [f"window {a.seconds:.0f} s per runner; file {a.file}; ref {a.ref or '-'} ({a.ref_args})", "",
             "| runner | trial-steps | trial-steps/s | trials by status |", "|---|---|---|---|"]
    for name, r in runs.items():
        r["rate"] = r["trial_steps"] / max(r["window_s"], 1e-9)
        lines.append(f"| {name} | {r['trial_steps']} | {r['rate']:.0f} | "
                     + ", ".join(f"{k} {v}" for k, v in sorted(r["status"].items())) + " |")
    if "ref" in runs and runs["ref"]["rate"]:
        lines += ["", f"ratio (new / ref): **{runs['new']['rate'] / runs['ref']['rate']:.2f}x** trial-steps per "
                      f"GPU-second (over each window: a faster runner reaches the larger grid points sooner)"]
        both = sorted(set(runs["new"]["best"]) & set(runs["ref"]["best"]))
        if both:
            lines += ["", "Best accuracy of the trials that finished in both windows, by grid point:", "",
                      "| grid point | new: best (lr) | ref: best (lr) |", "|---|---|---|"]
            for key in both:
                cell = [max(runs[n]["best"][key]) for n in ("new", "ref")]
                lines.append(f"| {describe(key)} | " + " | ".join(f"{b:.4f} ({lr:g})" for b, lr in cell) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    (out / "bench.md").write_text(text)
    (out / "bench.json").write_text(json.dumps({"seconds": a.seconds, "file": a.file, "ref": a.ref,
                                                "ref_args": a.ref_args, "runs": runs}, indent=1))
    return 0

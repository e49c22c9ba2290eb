"""Time to result on a GPU: the whole command's wall, as a researcher waits for it, this code against another commit.

    python benchmarks/time_to_result.py --ref .ref/fb670ab --out OUT [--what train,compare,rule]
                                        [--configs NAMES] [--time-limit SECONDS]

``train``: ``sandbox train`` of each configuration below (its own process, from the command to its exit), cold
(empty Inductor, Triton and CUDA caches of its own, as on a fresh machine) and then warm (the same caches, another
seed and learning rate: the second command of a researcher's session): by the other code (``--ref``: a commit or a
checkout), by this code's ``train.compile: auto`` and by its uncompiled path (``train.compile=false``); where auto
does not compile, its compiled path too at 2000 steps (the rule's constants need both). Each run's result says where
its time went (start-up, compilation, graph capture, training, evaluation).

``compare``: ``sandbox compare`` of GLA conv 4 against GLA conv 4 top-8 at Figure 8's size, 5 seeds each, cold and
then warm (other seeds and learning rate).

``rule``: the constants of ``train.compile: auto`` from the 2000-step runs of this code (each configuration's
uncompiled and compiled steps/s, and what compiling adds to the set-up with cold and with warm caches), written as
OUT/compile_rule.json, the format of results/throughput/compile_rule.json (copy it there to use them).

Python's bytecode is compiled first, not timed, into a folder every measured process reads and adds to
(``PYTHONPYCACHEPREFIX``, with ``PYTHONDONTWRITEBYTECODE`` dropped): both codes, the standard library and the
installed packages, torch's compiler stack among them. An installed torch has its bytecode (pip compiles it); an
image that ships without it, and forbids writing it, would charge every process the compilation of that source.

Measurements accumulate in OUT/time_to_result.json: a rerun into the same OUT, or one given earlier files
(``--resume``), skips what they hold, so a long list can be measured over several runs (``--time-limit`` starts
nothing that would end past it, judged by the longest measurement so far; a warm run whose cold run was on another
machine repeats that cold run first).
OUT/time_to_result.md holds the tables. The runs themselves go to /tmp.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIG8_TASK = {"name": "mqar", "seq_len": 320, "num_kv_pairs": 16, "vocab_size": 8192, "gap": 192,
             "test_examples": 1024}
FIG8_MODEL = {"mixer": "gla", "d_model": 128, "n_layers": 2, "n_heads": 2, "channel_mixer": "swiglu"}
FIG8_TRAIN = {"batch_size": 256, "lr": 2e-3, "eval_every": 250, "eval_batch_size": 512}
# issue 75's configurations: (run config, the step counts each is timed at)
CONFIGS = {
    "zoology_attention_d64_t64": (
        {"task": {"name": "mqar", "seq_len": 64, "num_kv_pairs": 4, "vocab_size": 8192},
         "model": {"mixer": "attention", "d_model": 64, "n_layers": 2, "positions": "learned", "channel_mixer": "none"},
         "train": {"batch_size": 256, "lr": 1e-3}}, (2000,)),
    "fig8_gla_d128_t320": ({"task": FIG8_TASK, "model": FIG8_MODEL, "train": FIG8_TRAIN}, (2000, 3000)),
    "fig8_gla_topk8_conv4_d128_t320": (
        {"task": FIG8_TASK, "model": {**FIG8_MODEL, "gla": {"topk": 8, "conv_size": 4}}, "train": FIG8_TRAIN},
        (2000, 3000)),
    "gated_deltanet_d128_t256": (
        {"task": {"name": "mqar", "seq_len": 256, "num_kv_pairs": 16, "vocab_size": 8192},
         "model": {"mixer": "gated_deltanet", "d_model": 128, "n_layers": 2, "n_heads": 2},
         "train": {"batch_size": 256, "lr": 1e-3}}, (2000,)),
}
RULE_STEPS = 2000
COMPARE = ("gla+conv_size=4", "gla+conv_size=4+topk=8")
COMPARE_TASK = {"task": FIG8_TASK, "model": FIG8_MODEL,
                "train": {**FIG8_TRAIN, "steps": 3000, "early_stop": 0.99}}
COMPARE_SEEDS = 5
# cold: seed 0 at the configuration's learning rate; warm: another seed and half the learning rate
WARM = {"cold": (0, 1.0), "warm": (5, 0.5)}
CACHE_ROOT = Path("/tmp/time_to_result_caches")   # per measurement: Inductor's, Triton's and CUDA's caches
RUNS_ROOT = Path("/tmp/time_to_result_runs")      # the runs' directories (checkpoints, events): not the output
PYCACHE = Path("/tmp/time_to_result_pycache")     # Python's bytecode, for every measured process


def cache_env(key: str, fresh: bool) -> dict:
    root = CACHE_ROOT / key.replace("/", "_")
    if fresh:
        shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in bytecode_env().items() if k != "SANDBOX_COMPILE_CACHE"}
    return {**env, "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton"),
            "CUDA_CACHE_PATH": str(root / "cuda"), "PYTHONUNBUFFERED": "1"}


def timed(cmd: list[str], code: Path, env: dict, cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    """``cmd``'s wall, run with ``code``'s sandbox first on the path (and the rest of this process's path, less this
    checkout: packages installed beside it)."""
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    t = time.perf_counter()
    p = subprocess.run(cmd, env={**env, "PYTHONPATH": os.pathsep.join([str(code), *rest])}, cwd=str(cwd),
                       capture_output=True, text=True)
    return time.perf_counter() - t, p


def train_once(code: Path, data: dict, out: Path, env: dict, sets: list[str]) -> dict:
    """``sandbox train`` of ``data`` by ``code`` in a process of its own: its wall and what its result says."""
    import yaml
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "config.yaml").write_text(yaml.safe_dump(data))
    cmd = [sys.executable, "-m", "sandbox.cli", "train", str(out / "config.yaml"), "--out", str(out / "run"),
           "--no-progress"] + [a for s in sets for a in ("--set", s)]
    wall, p = timed(cmd, code, env, out)
    row = {"wall_s": round(wall, 2), "exit": p.returncode}
    if p.returncode:
        return {**row, "error": (p.stdout + p.stderr)[-2000:]}
    res = json.loads((out / "run" / "result.json").read_text())
    keep = ("status", "steps", "steps_per_sec", "setup_s", "eval_s", "phases", "compiled_at", "compile_cache",
            "final_accuracy", "wall_time_s")
    return {**row, **{k: res[k] for k in keep if k in res}}


def compare_once(env: dict, out: Path, seed: int, lr: float) -> dict:
    import yaml
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "task.yaml").write_text(yaml.safe_dump(COMPARE_TASK))
    cmd = [sys.executable, "-m", "sandbox.cli", "compare", *COMPARE, "--task", str(out / "task.yaml"), "--seeds",
           str(COMPARE_SEEDS), "--out", str(out / "runs"), "--set", f"seed={seed}", "--set", f"train.lr={lr}"]
    wall, p = timed(cmd, ROOT, env, out)
    row = {"wall_s": round(wall, 2), "exit": p.returncode}
    if p.returncode:
        return {**row, "error": (p.stdout + p.stderr)[-2000:]}
    got = json.loads((out / "runs" / "compare.json").read_text())
    return {**row, "log": p.stdout[-3000:],
            "variants": [{k: v.get(k) for k in ("label", "mean", "wall_time_s", "phases", "statuses")}
                         for v in got["variants"]]}


def auto_compiles(data: dict) -> tuple[bool, str]:
    """What this code's ``train.compile: auto`` decides for ``data`` on a GPU, and why."""
    import torch

    from sandbox.config import load_config
    from sandbox.train import compile as compiling
    decision = compiling.decide("auto", load_config(data=data), 1, torch.device("cuda"), True)
    return decision.compile, decision.reason


def train_plan(names: list[str], with_ref: bool, what: set) -> list[tuple[str, Path | None, dict, bool]]:
    """(key, code, config, compiled) of each pair of ``sandbox train`` measurements (cold, then warm); code None:
    the other code. The rule alone needs this code's uncompiled and compiled runs at RULE_STEPS."""
    plan, rule = [], "rule" in what
    with_ref = with_ref and "train" in what
    for name in names:
        base, counts = CONFIGS[name]
        for steps in counts if "train" in what else (RULE_STEPS,):
            data = json.loads(json.dumps(base))
            data["train"].update(steps=steps, early_stop=None)
            auto, _ = auto_compiles(data)
            paths = (["ref"] if with_ref else []) + ["eager"]
            if auto or (rule and steps == RULE_STEPS):
                paths.append("compiled")
            plan += [(f"train/{name}/{steps}/{path}", None if path == "ref" else ROOT, data, path == "compiled")
                     for path in paths]
    return plan


def bytecode_env() -> dict:
    """This process's environment, its Python reading and writing bytecode in ``PYCACHE``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(PYCACHE)}


def compile_bytecode(*codes: Path) -> None:
    """Both codes', the standard library's and the installed packages' bytecode, into ``PYCACHE``."""
    import sysconfig
    where = [code / "sandbox" for code in codes] + [Path(sysconfig.get_paths()[k]) for k in ("stdlib", "purelib",
                                                                                                "platlib")]
    where += [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).is_dir()
              and Path(p).resolve() != ROOT]
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *sorted({str(w) for w in where})],
                   capture_output=True, env=bytecode_env())


def git_commit(code: Path) -> str:
    """The commit of a checkout; a copied tree (no repository of its own) is named by its folder, since git would
    answer for the repository around it."""
    top = subprocess.run(["git", "-C", str(code), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode or Path(top.stdout.strip()).resolve() != Path(code).resolve():
        return Path(code).name
    p = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip()


def rule_rows(done: dict) -> list[dict]:
    """The compile rule's references from this code's 2000-step runs: each configuration's uncompiled and compiled
    steps/s, and the set-up seconds compiling adds, with cold and with warm caches (the rule charges the cold)."""
    rows = []
    for name, (base, _) in CONFIGS.items():
        got = {(path, cache): done.get(f"train/{name}/{RULE_STEPS}/{path}/{cache}")
               for path in ("eager", "compiled") for cache in WARM}
        if any(r is None or "error" in r for r in got.values()):
            continue
        data = json.loads(json.dumps(base))
        data["train"].update(steps=RULE_STEPS, early_stop=None)
        cost = {cache: round(got["compiled", cache]["setup_s"] - got["eager", cache]["setup_s"], 2) for cache in WARM}

        def rate(path):
            return round(sum(got[path, c]["steps_per_sec"] for c in WARM) / len(WARM), 1)

        rows.append({"name": name, "config": data, "eager_steps_per_s": rate("eager"),
                     "compiled_steps_per_s": rate("compiled"), "compile_s": max(cost["cold"], 0.1),
                     "compile_cold_s": cost["cold"], "compile_warm_s": cost["warm"]})
    return rows


def write_rule(out: Path, done: dict, meta: dict, current: Path | None = None) -> None:
    """OUT/compile_rule.json: the rule's file (``current``, by default the one ``train.compile: auto`` reads) with the
    configurations measured here replaced and the others kept, each row naming the commit, date, GPU and torch it
    was measured at, so that timing one configuration updates its row alone."""
    from sandbox.train.compile import RULE_FILE
    rows = rule_rows(done)
    if not rows:
        return
    measured = {k: meta[k] for k in ("commit", "date", "gpu", "torch")}
    current = RULE_FILE if current is None else current
    kept = json.loads(current.read_text())["references"] if current.is_file() else []
    new = {r["name"]: {**r, "measured": measured} for r in rows}
    merged = [new.pop(r["name"], r) for r in kept] + list(new.values())
    doc = {"about": "The constants of train.compile: auto (sandbox/train/compile.py): per reference configuration, "
                    "one run's steps/s uncompiled (CUDA graph) and compiled, and the seconds compiling adds to a "
                    "run's set-up (compile_s, what the rule charges: from empty caches; compile_cold_s, "
                    "compile_warm_s: from empty and from warm compile caches), and where and when it was measured.",
           "command": "python benchmarks/time_to_result.py --what rule --configs NAMES --out OUT, then copy "
                      "OUT/compile_rule.json to results/throughput/compile_rule.json (the configurations not timed "
                      "keep their rows)",
           "source": f"{RULE_STEPS}-step runs of `sandbox train`, batch 256: steps/s from their results (the mean of "
                     "the cold and the warm run), compile_s from their set-up seconds, compiled less uncompiled",
           "references": merged}
    (out / "compile_rule.json").write_text(json.dumps(doc, indent=1) + "\n")


def _ratio(a, b) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}"


def _wall(r) -> float | None:
    return None if r is None or "error" in r else r["wall_s"]


def report(done: dict, meta: dict) -> str:
    lines = [f"GPU {meta['gpu']}, torch {meta['torch']}, this code {meta['commit']}, other code {meta['ref']}, "
             f"{meta['date']}. Whole-process wall of `sandbox train` (s); cold: empty compile caches, warm: the "
             "second command (another seed and learning rate). Targets (issue 75): warm <= 0.5x the other code "
             "(0.7x Zoology), cold <= 1.0x, and within 1.1x of this code's uncompiled path.", "",
             "| configuration | steps | auto | other cold | this cold | x | other warm | this warm | x "
             "| uncompiled cold | uncompiled warm | this / uncompiled cold, warm |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, (base, counts) in CONFIGS.items():
        for steps in counts:
            def get(path, cache):
                return done.get(f"train/{name}/{steps}/{path}/{cache}")
            if not any(get(p, c) for p in ("ref", "eager", "compiled") for c in WARM):
                continue
            data = json.loads(json.dumps(base))
            data["train"].update(steps=steps, early_stop=None)
            auto = "compiled" if auto_compiles(data)[0] else "eager"
            w = {(p, c): _wall(get(p, c)) for p in ("ref", "eager", "compiled") for c in WARM}
            lines.append(f"| {name} | {steps} | {auto} | {w['ref', 'cold'] or '-'} | {w[auto, 'cold'] or '-'} "
                         f"| {_ratio(w[auto, 'cold'], w['ref', 'cold'])} | {w['ref', 'warm'] or '-'} "
                         f"| {w[auto, 'warm'] or '-'} | {_ratio(w[auto, 'warm'], w['ref', 'warm'])} "
                         f"| {w['eager', 'cold'] or '-'} | {w['eager', 'warm'] or '-'} "
                         f"| {_ratio(w[auto, 'cold'], w['eager', 'cold'])}, "
                         f"{_ratio(w[auto, 'warm'], w['eager', 'warm'])} |")
    lines += ["", "Where each run of this code went (s): start-up, compile (first steps), capture, train, eval; "
                  "its steps/s once ready; what torch's caches gave the compilation.", "",
              "| measurement | wall | start-up | compile | capture | train | eval | steps/s | cache |",
              "|---|---|---|---|---|---|---|---|---|"]
    for key, r in done.items():
        if key.startswith("train/") and "/ref/" not in key:
            if "error" in r:
                lines.append(f"| {key} | error: {r['error'][-200:]!r} | | | | | | | |")
                continue
            p = r.get("phases") or {}
            lines.append(f"| {key} | {r['wall_s']} | " + " | ".join(f"{p.get(k, 0):.1f}" for k in
                                                                    ("startup", "compile", "capture", "train", "eval"))
                         + f" | {r.get('steps_per_sec')} | {r.get('compile_cache') or '-'} |")
    rows = rule_rows(done)
    if rows:
        lines += ["", f"The compile rule's constants ({RULE_STEPS} steps; OUT/compile_rule.json):", "",
                  "| reference | uncompiled steps/s | compiled steps/s | compile s, cold | compile s, warm "
                  "| break-even steps (cold) |", "|---|---|---|---|---|---|"]
        for r in rows:
            saved_ms = 1e3 / r["eager_steps_per_s"] - 1e3 / r["compiled_steps_per_s"]
            even = f"{r['compile_s'] / saved_ms * 1e3:.0f}" if saved_ms > 0 else "never"
            lines.append(f"| {r['name']} | {r['eager_steps_per_s']} | {r['compiled_steps_per_s']} "
                         f"| {r['compile_cold_s']} | {r['compile_warm_s']} | {even} |")
    cmp = {c: done.get(f"compare/{c}") for c in WARM}
    if any(cmp.values()):
        lines += ["", f"`sandbox compare {' '.join(COMPARE)}` at Figure 8's size, {COMPARE_SEEDS} seeds each "
                      "(targets: <= 45 s warm, <= 90 s cold):", "",
                  "| caches | wall s | per variant: wall, start-up, compile, train, eval (s) |", "|---|---|---|"]
        for c, r in cmp.items():
            if r is None:
                continue
            if "error" in r:
                lines.append(f"| {c} | error | {r['error'][-200:]!r} |")
                continue
            parts = "; ".join(f"{v['label']}: {v['wall_time_s']}, " + ", ".join(
                f"{(v['phases'] or {}).get(k, 0):.1f}" for k in ("startup", "compile", "train", "eval"))
                for v in r["variants"])
            lines.append(f"| {c} | {r['wall_s']} | {parts} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for time_to_result.json/.md, compile_rule.json and the runs")
    p.add_argument("--ref", help="the other code: a commit or a checkout directory (issue 75: fb670ab)")
    p.add_argument("--what", default="train,compare,rule", help="comma-separated: train, compare, rule")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated: " + ", ".join(CONFIGS))
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="start no measurement that would end past this (judged by the longest so far)")
    p.add_argument("--resume", nargs="+", default=[], metavar="JSON",
                   help="time_to_result.json files of earlier calls: their measurements are kept, not repeated")
    a = p.parse_args(argv)
    what = {w.strip() for w in a.what.split(",") if w.strip()}
    names = [n.strip() for n in a.configs.split(",") if n.strip()]
    bad = sorted(what - {"train", "compare", "rule"}) + [n for n in names if n not in CONFIGS]
    if bad:
        p.error(f"unknown {', '.join(bad)}")
    import torch
    if not torch.cuda.is_available():
        print("time_to_result: error: needs a CUDA GPU", file=sys.stderr)
        return 1
    from sandbox.bench.runs import ref_code
    ref = ref_code(a.ref) if a.ref else None
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "time_to_result.json"
    done = {}
    for f in [*a.resume, *([path] if path.exists() else [])]:
        done.update(json.loads(Path(f).read_text())["done"])
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": git_commit(ROOT),
            "ref": git_commit(ref) if ref else None, "date": datetime.date.today().isoformat()}
    compile_bytecode(ROOT, *([ref] if ref else []))
    plan = train_plan(names, ref is not None, what) if what & {"train", "rule"} else []
    if "compare" in what:
        plan.append(("compare", ROOT, COMPARE_TASK, False))
    t0, longest = time.monotonic(), 0.0
    for pair, code, data, compiled in plan:
        here = (CACHE_ROOT / f"{pair}/cold".replace("/", "_")).exists()    # the cold run's caches, on this machine
        todo = [c for c in WARM if f"{pair}/{c}" not in done]
        if not todo:
            continue
        if "cold" not in todo and not here:
            todo = list(WARM)        # its cold run was on another machine: a warm run needs it here first
        for cache in todo:
            if a.time_limit is not None and time.monotonic() - t0 + longest > a.time_limit:
                print(f"--time-limit {a.time_limit:.0f} s: the rest is left for a later call", flush=True)
                break
            t = time.monotonic()
            seed, lr_factor = WARM[cache]
            env = cache_env(f"{pair}/cold", fresh=cache == "cold")     # warm: the cold run's caches
            where = RUNS_ROOT / f"{pair}/{cache}".replace("/", "_")
            if pair == "compare":
                row = compare_once(env, where, seed, data["train"]["lr"] * lr_factor)
            else:
                sets = [f"seed={seed}", f"train.lr={data['train']['lr'] * lr_factor:g}"]
                if code is not None:
                    sets.append(f"train.compile={str(compiled).lower()}")
                row = train_once(code or ref, data, where, env, sets)
            done[f"{pair}/{cache}"] = row
            longest = max(longest, time.monotonic() - t)
            print(f"{pair}/{cache}: {row.get('wall_s')} s" + (f" ERROR {row['error'][-300:]}" if "error" in row
                                                               else ""), flush=True)
            path.write_text(json.dumps({"meta": meta, "done": done}, indent=1))
        else:
            continue
        break
    path.write_text(json.dumps({"meta": meta, "done": done}, indent=1))
    if "rule" in what:
        write_rule(out, done, meta)
    text = report(done, meta)
    (out / "time_to_result.md").write_text(text)
    print("\n" + text)
    return 1 if any("error" in r for r in done.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

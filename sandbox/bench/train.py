"""``sandbox bench train``: the training-step yardstick.

A fixed set of reference configurations (the papers' settings, batch 256), each trained for a few
hundred steps in a process of its own (``step_worker.py``), by this checkout and, with ``--ref``,
by another commit's code in the same run, so every speed claim is a ratio measured side by side.
For each configuration: ms/step and tokens/s at steady state, the task generator's share of the
step (``gen %``: drawing the batches on their own, host time included; with ``--profile`` also
``gen GPU %``: the GPU time its kernels add to each step, which is what a step pays while the host
draws ahead of the GPU), the seconds a run spends outside its steady steps (start-up, compilation, graph capture, the data
pool, the final evaluation), peak GPU memory, the roofline (FLOPs and the bytes the step must move, against this GPU's
measured bf16 matrix rate and copy bandwidth) and how far above it the step runs, and the largest
relative difference of the training loss from the reference code's over the first 200 steps.
With ``--replicas R`` the stacked replicas of each configuration are timed as well (trial-steps/s).

With ``--sweep FILE`` it estimates a sweep's GPU-minutes instead (``estimate.py``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sandbox.bench.estimate import estimate_sweep
from sandbox.bench.runs import MIN_STEPS, ROOT, generator_row, knows_compile, loss_gap, print_profile, ref_code, run_one

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
    gen = generator_row(prof)
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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sandbox bench train", description=__doc__.split("\n\n")[0].replace("``", ""))
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
    p.add_argument("--timed", nargs="+", metavar="JSON", help="with --sweep: the rows of earlier calls' estimate.json "
                   "join this estimate, and their kinds are not timed again (a kind in several files: the last one's "
                   "row); with every kind in them, or without a GPU, nothing is timed")
    p.add_argument("--time-limit", type=float, metavar="SECONDS", help="with --sweep: start no kind that would end "
                   "after SECONDS (judged by the longest kind so far); the rest are left for a call with --timed")
    return p


def main_train(argv=None) -> int:
    """``argv``: the words after ``sandbox bench train``, or the options the CLI parsed with ``parser()``."""
    a = argv if isinstance(argv, argparse.Namespace) else parser().parse_args(argv)
    if a.steps < MIN_STEPS and not a.timed:
        print(f"sandbox bench train: error: --steps {a.steps}: the steady rate is read after the first 100 steps "
              f"(compilation, graph capture), from the rate logged every 25: give --steps {MIN_STEPS} or more",
              file=sys.stderr)
        return 2
    try:
        ref = ref_code(a.ref) if a.ref else None
    except ValueError as e:
        print(f"sandbox bench train: error: {e}", file=sys.stderr)
        return 2
    if a.sweep:
        only = [n.strip() for n in a.kinds.split(",") if n.strip()] if a.kinds else None
        return estimate_sweep(a.sweep, a.steps, Path(a.out), only, a.timed, ref, a.profile, a.time_limit)
    if a.timed:
        print("sandbox bench train: error: --timed needs --sweep FILE", file=sys.stderr)
        return 2
    for flag, given in (("--kinds", a.kinds), ("--time-limit", a.time_limit)):
        if given is not None:
            print(f"sandbox bench train: error: {flag} needs --sweep FILE", file=sys.stderr)
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
        # the steady step of a long run: compiled (auto weighs the run's length, and would not compile a run this
        # short), in the reference code too where it has the key
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

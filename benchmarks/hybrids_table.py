"""Train the hybrid configs and print the comparison table of docs/hybrids.md.

    python benchmarks/hybrids_table.py                       # every configs/hybrids/*.yaml
    python benchmarks/hybrids_table.py configs/hybrids/lalte.yaml configs/hybrids/gdn.yaml
    python benchmarks/hybrids_table.py --set task.seq_len=4096 --out runs/hybrids-4096

Each config trains into ``OUT/<name>`` (an existing finished run is reused, an interrupted one
resumes). Columns:

* acc / best: final and best test accuracy (result.json);
* capped acc: LTE layers decoding through the capped inference cache (lte_cache), on the same
  test set; equal to ``acc`` when no head ever exceeds its cap;
* kept/head: for LTE layers, out-of-window tokens with r > 0.5 per head, averaged over one test
  batch (the training mask's retention; what the cache would hold without a cap), one group per
  LTE layer; cache/head: the capped cache's final occupancy per head;
* ms/step: 1000 / steps_per_sec from result.json (training steps only, evaluations excluded).

The table is printed as Markdown and written to ``OUT/table.md``.
"""
from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox.config import load_config  # noqa: E402
from sandbox.mixers.lte import LearnableTokenEviction  # noqa: E402
from sandbox.analysis.lte_eval import evaluate_with_cache  # noqa: E402
from sandbox.mixers.lte import use_cache  # noqa: E402
from sandbox.train import TrainingDiverged, build, resolve_device, train  # noqa: E402

FINISHED = ("completed", "early_stopped")


def lte_stats(cfg, run_dir: Path, batch_size: int, cache_eval: bool) -> dict:
    """Retention per head of each LTE layer on one test batch, and the capped-cache accuracy."""
    device = resolve_device(cfg.train.device)
    task, model = build(cfg, device)
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location=device, weights_only=False)
    model.load_state_dict(ckpt["model"])
    model.eval()
    layers = [m for m in model.mixers if isinstance(m, LearnableTokenEviction)]
    x, _ = next(iter(task.test_batches(batch_size)))
    use_bf16 = device.type == "cuda" and cfg.train.precision != "fp32"
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_bf16 else nullcontext
    for m in layers:
        m.capture = {}
    with torch.no_grad(), autocast():
        model(x)
    kept = [m.capture["retained_count"].float().cpu().tolist() for m in layers]
    out = {"kept": kept, "capped_acc": None, "cache": None}
    if cache_eval:
        out["capped_acc"] = evaluate_with_cache(model, task, batch_size)["test/accuracy"]
        with use_cache(model), torch.no_grad():
            model(x)
        out["cache"] = [m.capture["retained_count"].float().cpu().tolist() for m in layers]
    for m in layers:
        m.capture = None
    return out


def run_one(path: Path, out_root: Path, overrides, args) -> dict:
    cfg = load_config(path, overrides)
    name = cfg.name or path.stem
    run_dir = out_root / name
    result_path = run_dir / "result.json"
    finished = result_path.exists() and json.loads(result_path.read_text())["status"] in FINISHED
    if not finished:
        if args.no_train:
            return {"name": name, "error": "no finished run (and --no-train)"}
        print(f"== training {name} -> {run_dir}", flush=True)
        try:
            train(cfg, run_dir, progress=args.progress)
        except (TrainingDiverged, RuntimeError) as e:          # diverged or out of memory: next row
            return {"name": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    res = json.loads(result_path.read_text())
    sps = res.get("steps_per_sec")
    row = {"name": name, "mixers": "+".join(cfg.model.layer_mixers()), "acc": res["final_accuracy"],
           "best": res["best_accuracy"], "steps": res["steps"], "ms_step": 1000.0 / sps if sps else None,
           "params": res["params"], "state": res["state_size"], "status": res["status"]}
    if "lte" in cfg.model.layer_mixers():
        row.update(lte_stats(cfg, run_dir, cfg.train.eval_batch_size, not args.no_cache_eval))
    return row


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _heads(groups):
    if not groups:
        return "-"
    return "; ".join("/".join(f"{c:.0f}" for c in g) for g in groups)


def table(rows) -> str:
    head = ("| run | mixers | acc | best | capped acc | kept/head | cache/head | ms/step | steps | params "
            "| state |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['error']} |" + " |" * 9)
            continue
        lines.append(f"| {r['name']} | {r['mixers']} | {_fmt(r['acc'], '.3f')} | {_fmt(r['best'], '.3f')} | "
                     f"{_fmt(r.get('capped_acc'), '.3f')} | {_heads(r.get('kept'))} | {_heads(r.get('cache'))} | "
                     f"{_fmt(r['ms_step'], '.1f')} | {r['steps']} | {r['params']:,} | {r['state']:,} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="*", help="run YAMLs (default: configs/hybrids/*.yaml)")
    p.add_argument("--out", default="runs/hybrids", help="root of the run directories")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override for every config, e.g. --set task.seq_len=4096 (repeatable)")
    p.add_argument("--no-train", action="store_true", help="only tabulate finished runs")
    p.add_argument("--no-cache-eval", action="store_true", help="skip the capped-cache evaluation of LTE runs")
    p.add_argument("--progress", action="store_true", help="show the training progress bar")
    args = p.parse_args(argv)
    paths = [Path(c) for c in args.configs] or sorted((ROOT / "configs" / "hybrids").glob("*.yaml"))
    out_root = Path(args.out)
    rows = []
    for path in paths:
        rows.append(run_one(path, out_root, args.set, args))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    print("\n" + text)
    out_root.mkdir(parents=True, exist_ok=True)
    (out_root / "table.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

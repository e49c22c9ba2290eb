"""Score every LTE row of a finished lalte_hybrid sweep twice and write ``SWEEP_DIR/lte_eval.csv``.

    python figures/lalte_hybrid/score_twice.py SWEEP_DIR [--device cuda] [--batch-size 256]

For each row with an lte layer, each distance G and each seed, the run the verdict reads (the learning rate with the
best val accuracy) is loaded at the step chosen on val (its ``chosen.pt``), and scored on the test split with the
training mask (every token scoring r > 0.5 kept, no cap) and through the capped decode cache (``sandbox lte-eval``'s
``score_run``). One CSV row per run: the sweep's own test accuracy (at the step chosen on val), those weights'
accuracy with the mask and through the cache, and the KV entries each head holds at the last position.
``verdict.py`` reads the file for claims 4 and 6; ``picture.py`` draws it.
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import sys
from pathlib import Path

from sandbox.analysis.lte_eval import score_run
from sandbox.analysis.verdicts.claims import Table

HERE = Path(__file__).resolve().parent
FIELDS = ("row", "G", "seed", "train.lr", "run_dir", "sweep_test_accuracy", "selected_on", "chosen_step",
          "weights_step", "mask_accuracy",
          "capped_accuracy",
          "kept_uncapped", "kept_uncapped_max", "cache_out_of_window", "cache_out_of_window_max", "kv_per_head",
          "held_per_head")


def figure():
    """This folder's verdict.py (the rows, the geometry, the CSV's name), loaded by path."""
    spec = importlib.util.spec_from_file_location("lalte_hybrid_verdict", HERE / "verdict.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def score(sweep_dir, device: str = "auto", batch_size: int = 256, log=print) -> Path:
    """Writes and returns ``sweep_dir/lte_eval.csv``. A run already scored there (the same run chosen for its cell)
    keeps its row; a chosen run without a checkpoint here (trained on another machine, whose checkpoints did not
    travel) keeps the row scored where it trained, or is left out and named. So the sweep's parts can be scored on
    each machine that trained some of them, each call adding its rows to the file."""
    fig, t = figure(), Table(sweep_dir)
    _, pairs, gaps = fig.geometry(t)
    path = Path(sweep_dir) / fig.SCORES
    before = {}
    if path.exists():
        with path.open(newline="") as f:
            before = {(r["row"], int(r["G"]), int(r["seed"])): r for r in csv.DictReader(f)}
    out, missing, visited = [], [], set()

    def write(final: bool = False):
        # after every run scored too, so that a machine's time limit does not take what it scored; until the end
        # the cells not reached yet keep their earlier rows
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, FIELDS)
            w.writeheader()
            w.writerows(out + ([] if final else [r for k, r in before.items() if k not in visited]))

    for row in fig.lte_rows(pairs):
        for g in gaps.values():
            chosen = t.best_rows(**fig.rows(pairs)[row], **{"task.distance": g})
            for seed, r in sorted(chosen.items()):
                visited.add((row, g, seed))
                run = Path(r["sweep_dir"]) / r["run_dir"]
                old = before.get((row, g, seed))
                if old is not None and Path(old["run_dir"]).name == run.name and fig.at_chosen_step(old):
                    out.append(old)                                                 # trial folders are unique
                    continue
                if not (run / "checkpoint.pt").is_file():
                    missing.append(f"{row}, G {g}, seed {seed} ({run})")
                    if old is not None and fig.at_chosen_step(old):
                        out.append(old)          # scored where an earlier choice trained; the new one cannot be
                    continue
                res = score_run(run, device, batch_size)
                scored = _csv_row(row, g, seed, r, run, res)
                out.append(scored)
                write()
                log(f"{row}, G {g}, seed {seed}: mask {res['mask']:.4f}, capped {res['capped']:.4f} ({run})"
                    + ("" if fig.at_chosen_step(scored) else f"; not the chosen step {scored['chosen_step']} but "
                       f"{scored['weights_step']}: its weights there were not kept, so claims 4 and 6 leave it out"))
    for m in missing:
        log(f"not scored here, no checkpoint: {m}")
    write(final=True)
    return path


def _csv_row(row: str, g: int, seed: int, r: dict, run: Path, res: dict) -> dict:
    layers = res["layers"]
    kept = [v for layer in layers for v in layer["kept"]]
    held = [v for layer in layers for v in layer["held"]]
    # what a head holds at the last position: its window, its sinks and its out-of-window entries
    kv = [min(layer["window"], res["seq_len"]) + layer["sinks"] + v for layer in layers for v in layer["held"]]
    on_val = r.get("test_at_best_val") not in (None, "")        # runs from before the val split: best test accuracy
    return {"row": row, "G": g, "seed": seed, "train.lr": r.get("train.lr"), "run_dir": str(run),
            "sweep_test_accuracy": r["test_at_best_val"] if on_val else r.get("best_accuracy"),
            "selected_on": "val" if on_val else "test",
            "chosen_step": str(int(float(r["best_val_step"] if on_val else r["best_step"]))),
            "weights_step": str(res["step"]), "mask_accuracy": round(res["mask"], 6),
            "capped_accuracy": round(res["capped"], 6), "kept_uncapped": round(sum(kept) / len(kept), 2),
            "kept_uncapped_max": round(max(kept), 2), "cache_out_of_window": round(sum(held) / len(held), 2),
            "cache_out_of_window_max": round(max(held), 2), "kv_per_head": round(sum(kv) / len(kv), 2),
            "held_per_head": "; ".join(f"layer {i}: {[round(v, 1) for v in layer['held']]} of {layer['cap']}"
                                       for i, layer in enumerate(layers))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep_dir")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda")
    p.add_argument("--batch-size", type=int, default=256)
    args = p.parse_args(argv)
    try:
        path = score(args.sweep_dir, args.device, args.batch_size)
    except ValueError as e:
        print(f"score_twice: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

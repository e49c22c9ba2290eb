"""ms per training step of the hybrid rows (``configs/hybrids/*.yaml``: MQAR at seq_len 2048, batch 32, d_model
128, 4 heads, bf16) along each path, measured in one process on one GPU:

  eager    no compile, no CUDA graph, SDPA with boolean masks: how the hybrids trained before they were graph-safe
  dense    compiled and replayed as a CUDA graph, SDPA with boolean masks (``swa.FLEX`` off)
  flex     compiled and replayed as a CUDA graph, FlexAttention with block masks (what ``train`` now does on CUDA)
  stack3   three replicas (learning rates 1e-3, 2e-3, 3e-3) stacked, compiled and replayed: ms per replica
           (under vmap attention is SDPA: FlexAttention has no batching rule)

    python benchmarks/hybrid_speed.py --out results/hybrids/speed.json
        [--rows gdn_swa lalte gdn_moba lansa] [--paths eager dense flex] [--steps 50] [--lte-evicted]
        [--set KEY=VALUE ...] [--device cuda]

(``--device cpu --paths eager`` with small ``--set`` shapes only checks that the script runs.)

Every path of a row starts from the same weights and trains on the same batches; each records ms per step (the
median of three timed spans of ``--steps`` steps, after 6 warm-up steps that compile and capture), the seconds
those warm-up steps took, the peak GPU memory, and the mean training loss of the warm-up steps (the paths should
agree to bf16 rounding). LTE's scores start above 0.5 (every token kept: FlexAttention's block mask is full);
``--lte-evicted`` adds a row ``lalte_evicted`` whose retention head's bias starts at -4 (nearly every token
evicted: the sparse end). The JSON is rewritten after every measurement, so a run cut short keeps what it
measured. The ``eager`` path runs on code from before this script (``PYTHONPATH=OLD_CHECKOUT ... --paths eager``),
which times the old code's own eager step for comparison.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch

from sandbox.config import load_config
from sandbox.tasks import TrainBatches
from sandbox.train import build
import torch.compiler
from sandbox.train.step import Step

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 6            # compile, two eager steps on the capture stream, the capture, replays
SPANS = 3


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def models_for(row: str, lrs: list[float], device: torch.device, overrides: list[str]):
    """The row's task, configs and freshly initialised models (same seed: same weights)."""
    name = "lalte" if row == "lalte_evicted" else row
    cfgs = [load_config(ROOT / "configs" / "hybrids" / f"{name}.yaml",
                        [*overrides, f"train.lr={lr}", f"train.device={device.type}"]) for lr in lrs]
    built = [build(c, device) for c in cfgs]
    models = [m for _, m in built]
    if row == "lalte_evicted":
        for m in models:
            for mixer in m.mixers:
                if hasattr(mixer, "cnn"):
                    with torch.no_grad():
                        mixer.cnn.head.bias.fill_(-4.0)
    return built[0][0], cfgs, models


def measure(row: str, path: str, steps: int, device: torch.device, overrides: list[str]) -> dict:
    from sandbox.mixers import swa
    stacked = path == "stack3"
    task, cfgs, models = models_for(row, [1e-3, 2e-3, 3e-3] if stacked else [1e-3], device, overrides)
    tc = cfgs[0].train
    if hasattr(swa, "FLEX"):          # code from before FlexAttention has no switch
        swa.FLEX = path == "flex"
    torch.compiler.reset()      # drop this process's compilations (the on-disk caches stay)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    fast = path != "eager" and device.type == "cuda"       # on the CPU every path runs eagerly (a smoke test)
    step = Step(models, [c.train for c in cfgs], per_row=getattr(task, "max_targets", None),
                autocast_dtype=torch.bfloat16, capture_after=2 if fast else None, compile=fast)
    batches = TrainBatches(task, tc.batch_size, WARMUP + SPANS * steps)
    sync(device)
    t0 = time.perf_counter()
    for s in range(WARMUP):
        step(*batches[s])
    sync(device)
    setup_s = time.perf_counter() - t0
    loss = (step.loss_sum / WARMUP).tolist()
    spans = []
    for k in range(SPANS):
        first = WARMUP + k * steps
        sync(device)
        t0 = time.perf_counter()
        for s in range(first, first + steps):
            step(*batches[s])
        sync(device)
        spans.append(1e3 * (time.perf_counter() - t0) / steps / len(models))
    out = {"ms": statistics.median(spans), "ms_spans": spans, "setup_s": setup_s,
           "peak_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if device.type == "cuda" else None,
           "warmup_loss": loss, "replicas": len(models)}
    del step, models, batches
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", nargs="+", default=["gdn_swa", "lalte", "gdn_moba", "lansa"])
    ap.add_argument("--paths", nargs="+", default=["eager", "dense", "flex"],
                    choices=["eager", "dense", "flex", "stack3"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lte-evicted", action="store_true", help="add the row lalte_evicted")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for every row")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    device = torch.device(a.device)
    rows = a.rows + (["lalte_evicted"] if a.lte_evicted else [])
    res = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else None, "torch": torch.__version__,
           "commit": commit(), "date": time.strftime("%Y-%m-%d"), "steps_per_span": a.steps, "overrides": a.set,
           "rows": {}}
    for row in rows:
        for path in a.paths:
            r = measure(row, path, a.steps, device, a.set)
            res["rows"].setdefault(row, {})[path] = r
            base = res["rows"][row].get("eager")
            if base and path != "eager":
                r["speedup_vs_eager"] = base["ms"] / r["ms"]
            print(f"{row:14s} {path:7s} {r['ms']:8.2f} ms/step  setup {r['setup_s']:6.1f} s  "
                  f"peak {r['peak_gib'] or 0:5.1f} GiB  warm-up loss {r['warmup_loss'][0]:.4f}", flush=True)
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

"""Time and profile whole training steps: where does a step's GPU time go?

    python benchmarks/profile_step.py --mixer gla --d-model 256 --seq-len 512 --kv 64 --batch 128 \
        --impls triton,torch --graphs on,off [--profile]

For each kernel impl and CUDA-graph setting: ms per training step (task sampling + forward +
backward + AdamW, the same work as sandbox/train.py, through the same GraphedStep) as the median
over timed steps, and the ratio against the first combination. With --profile, the 15 largest
GPU kernels of one step and the share of task sampling.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from sandbox.config import load_config
from sandbox.graph_step import GraphedStep
from sandbox.tasks import TrainBatches
from sandbox.train import build, scored_positions


def make(args, impl):
    data = {"task": {"name": "mqar", "seq_len": args.seq_len, "num_kv_pairs": args.kv, "vocab_size": 8192},
            "model": {"mixer": args.mixer, "d_model": args.d_model, "n_layers": 2, "n_heads": args.heads},
            "train": {"batch_size": args.batch}}
    if args.mixer != "attention":
        data["model"][args.mixer] = {"impl": impl}
    cfg = load_config(data=data, overrides=args.set)
    return build(cfg, torch.device(args.device))


def step_fn(task, model, opt, batch, device, graph: bool):
    batches = TrainBatches(task, batch)      # as sandbox/train.py samples

    def loss_fn(x, y):
        pos, y = scored_positions(y, task.max_targets)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda",
                            cache_enabled=not graph):
            loss = F.cross_entropy(model(x, pos).float().flatten(0, 1), y.flatten(), ignore_index=-100)
        return loss, loss

    fb = GraphedStep(loss_fn, list(model.parameters()), torch.zeros((), device=device),
                     capture_after=2 if graph else None)

    def step(i):
        fb(*batches[i])
        opt.step()
    return step


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mixer", default="gla")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--kv", type=int, default=64)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--impls", default="triton,torch")
    p.add_argument("--graphs", default="on", help="CUDA graph settings to time, e.g. on,off")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. --set model.gla.topk=16 (repeatable)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    results = {}
    combos = [(i, g) for i in args.impls.split(",") for g in args.graphs.split(",")]
    for impl, graph in combos:
        task, model = make(args, impl)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type == "cuda")
        graph = graph == "on" and device.type == "cuda"
        step = step_fn(task, model, opt, args.batch, device, graph)
        impl = f"{impl}+graph" if graph else impl
        for i in range(3):
            step(i)
        times = []
        for i in range(args.steps):
            sync(device)
            t = time.perf_counter()
            step(100 + i)
            sync(device)
            times.append(1000 * (time.perf_counter() - t))
        results[impl] = statistics.median(times)
        tag = " ".join(args.set)
        peak = f", peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if device.type == "cuda" else ""
        print(f"{args.mixer} {tag} d{args.d_model} T{args.seq_len} B{args.batch} impl={impl}: "
              f"{results[impl]:.2f} ms/step ({1000 / results[impl]:.1f} steps/s){peak}", flush=True)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        if args.profile and len(results) == 1:   # the first combination
            sync(device)
            t = time.perf_counter()
            batches = TrainBatches(task, args.batch)
            for i in range(args.steps):
                batches[200 + i]
            sync(device)
            print(f"  task sampling alone: {1000 * (time.perf_counter() - t) / args.steps:.2f} ms/batch "
                  f"({batches.ahead} batches per generator call)")
            acts = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=acts) as prof:
                for i in range(3):
                    step(300 + i)
                sync(device)
            key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
            print(prof.key_averages().table(sort_by=key, row_limit=15, max_name_column_width=60))
    first = next(iter(results))
    for impl, ms in results.items():
        print(f"ratio {impl}/{first}: {ms / results[first]:.2f}")


if __name__ == "__main__":
    main()

"""The training loss (``sandbox/kernels/cross_entropy.py``) against torch.compile's code for ``F.cross_entropy`` of the
float32 logits, at the logits of a stack of 9 Figure 8 runs (9 x 256 sequences x 16 scored positions, 8192 classes)
and of one Figure 8 run (256 x 16), in bf16, one target in 20 the ignore index.

    python benchmarks/loss_speed.py [--tiles BV,WARPS ...] [--out FILE.json]

Times (median ms, each call replayed from a CUDA graph: triton's do_bench_cudagraph): the forward alone and the
forward with the logits' gradient, both compiled; the op's forward kernel at each ``--tiles``; reading the logits
once (a sum), the forward's least traffic. Errors of the loss and the gradient against float64. Needs a GPU.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

import sandbox.kernels.triton_cross_entropy as tce
from sandbox.kernels.cross_entropy import cross_entropy


def torch_loss(logits, y):
    return F.cross_entropy(logits.float(), y, ignore_index=-100, reduction="none")


def rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", nargs="*", default=["8192,8", "8192,16", "4096,8", "2048,4", "8192,4"])
    ap.add_argument("--out")
    a = ap.parse_args()
    V = 8192
    bench = lambda f: triton.testing.do_bench_cudagraph(f, rep=100)  # noqa: E731
    res = {}
    for name, N in (("stack_of_9", 9 * 256 * 16), ("one_run", 256 * 16)):
        gen = torch.Generator(device="cuda").manual_seed(0)
        logits = (2 * torch.randn(N, V, device="cuda", generator=gen)).to(torch.bfloat16).requires_grad_()
        y = torch.randint(0, V, (N,), device="cuda", generator=gen)
        y = torch.where(torch.rand(N, device="cuda", generator=gen) < 0.05, -100, y)
        w = torch.rand(N, device="cuda", generator=gen)
        r = {"rows": N, "ms": {}, "err": {}}
        ms = r["ms"]
        ref_in = logits.detach().double().requires_grad_()
        ref = F.cross_entropy(ref_in, y, ignore_index=-100, reduction="none")
        (ref * w).sum().backward()
        for label, f in (("torch", torch_loss), ("op", cross_entropy)):
            c = torch.compile(f)
            fwd = lambda: c(logits.detach(), y)  # noqa: E731
            both = lambda: torch.autograd.grad((c(logits, y) * w).sum(), logits)  # noqa: E731
            out, (g,) = fwd(), both()
            r["err"][f"{label}_loss"], r["err"][f"{label}_grad"] = rel(out, ref.detach()), rel(g, ref_in.grad)
            ms[f"{label}_forward"] = bench(fwd)
            ms[f"{label}_forward_backward"] = bench(both)
        ms["read_once"] = bench(lambda: logits.detach().sum(dtype=torch.float32))
        for t in a.tiles:
            bv, warps = (int(v) for v in t.split(","))
            ms[f"kernel_{t}"] = bench(
                lambda: tce.cross_entropy_rows_triton(logits.detach(), y, -100, bv=bv, warps=warps))
        res[name] = r
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

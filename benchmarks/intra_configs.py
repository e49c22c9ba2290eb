"""Tile sizes and warps of the intra-chunk kernels (diagonal gate): ms of ``_fwd_intra`` +
``_bwd_intra`` alone per configuration, at the shapes where they dominate a training step.

    python benchmarks/intra_configs.py [--shapes "128,512,2,64,128;8,4096,4,128,128"]

Each configuration is checked against the current one (same dq, dk, dv within bf16 noise)
before it is timed; the first row is the configuration in use.
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.testing

from sandbox.kernels import triton_chunk as fwd_mod
from sandbox.kernels import triton_chunk_bwd as bwd_mod
from sandbox.kernels.triton_chunk import chunk_gla


def run(shape, cfg):
    B, T, H, K, V = shape
    fwd_mod._intra_cfg = bwd_mod._intra_cfg = lambda gate, k, v: cfg
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn(B, T, H, K, device="cuda", generator=gen).bfloat16().requires_grad_() for _ in range(2))
    v = torch.randn(B, T, H, V, device="cuda", generator=gen).bfloat16().requires_grad_()
    g = (torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device="cuda", generator=gen)) / 16).requires_grad_()
    do = torch.randn(B, T, H, V, device="cuda", generator=gen).bfloat16()

    def fb():
        o, _ = chunk_gla(q, k, v, g, scale=K ** -0.5)
        o.backward(do)
    fb()
    grads = [x.grad.float().clone() for x in (q, k, v, g)]
    ms = triton.testing.do_bench(fb, warmup=10, rep=50, grad_to_none=[q, k, v, g], return_mode="median")
    return ms, grads


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="128,512,2,64,128;8,4096,4,128,128;64,512,2,256,256")
    args = p.parse_args()
    base = fwd_mod._intra_cfg
    for s in args.shapes.split(";"):
        shape = tuple(int(x) for x in s.split(","))
        current = base(2, shape[3], shape[4])
        cfgs = [current] + [c for c in itertools.product([16, 32], [32, 64], [64, 128], [4, 8])
                            if c != current and c[1] <= max(16, shape[3]) and c[2] <= max(16, shape[4])]
        ref = None
        rows = []
        for cfg in cfgs:
            try:
                ms, grads = run(shape, cfg)
            except Exception as e:   # out of shared memory / registers: skip
                print(f"{shape} {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
                continue
            if ref is None:
                ref = grads
            err = max(float((a - b).abs().max() / (b.abs().max() + 1e-6)) for a, b in zip(grads, ref))
            rows.append((ms, cfg, err))
            print(f"{shape} BC,BK,BV,warps={cfg}: {ms:.3f} ms fwd+bwd  (max rel diff vs current {err:.1e})", flush=True)
        best = min(r for r in rows if r[2] < 2e-2)
        print(f"== {shape}: current {rows[0][0]:.3f} ms, best {best[0]:.3f} ms with {best[1]}", flush=True)


if __name__ == "__main__":
    main()

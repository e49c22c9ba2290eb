"""The matrix products of a stack of R replicas (``torch.func.vmap`` over the model's linear layers), at the Figure 8
slice's shapes: x [R, N, in] with N = 256 x 320 tokens per replica, and each layer's weight [R, out, in].

    python benchmarks/stacked_matmul_speed.py [--replicas 3] [--d 64 128 256 512] [--out FILE.json]

For each weight of a GLA block with a short conv and SwiGLU, times (median ms, triton's do_bench) the three
products of a stacked linear layer as batched products: the forward ``x W^T``, the input gradient ``g W`` and the
weight gradient ``g^T x``, whose reduction runs over all N tokens of a replica and whose output is small, so a
batched product's grid has few tiles. Beside it, the weight gradient as S partial products over N / S tokens each
summed in float32 (a split of the reduction), and one plain product per replica. Names cuBLAS's kernel for each
(to find it in a step's profile) and checks every variant against the float32 product. Needs a GPU.
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
from torch.profiler import ProfilerActivity, profile


def shapes(d: int) -> dict[str, tuple[int, int]]:
    """[out, in] of each weight of one block (``sandbox.model`` with mixer gla, 2 heads, SwiGLU)."""
    return {"in_proj": (3 * d + 16, d), "o_proj": (d, d), "up": (4 * d, d), "down": (d, 2 * d)}


def kernel_of(fn) -> str:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if e.device_type.name == "CUDA" and "Memset" not in e.key]
    return " + ".join(n[:70] for n in names)


def split_k(g, x, S):
    R, N, O = g.shape
    parts = torch.bmm(g.view(R * S, N // S, O).transpose(1, 2), x.view(R * S, N // S, x.shape[-1]),
                      out_dtype=torch.float32)
    return parts.view(R, S, O, -1).sum(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--d", type=int, nargs="*", default=[64, 128, 256, 512])
    ap.add_argument("--splits", type=int, nargs="*", default=[4, 8, 16, 32])
    ap.add_argument("--out")
    a = ap.parse_args()
    R, N = a.replicas, 256 * 320
    bench = lambda f: triton.testing.do_bench(f, warmup=25, rep=100)  # noqa: E731
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for d in a.d:
        for name, (O, I) in shapes(d).items():
            x = torch.randn(R, N, I, device="cuda", generator=gen).to(torch.bfloat16)
            g = torch.randn(R, N, O, device="cuda", generator=gen).to(torch.bfloat16)
            w = torch.randn(R, O, I, device="cuda", generator=gen).to(torch.bfloat16)
            ref = torch.bmm(g.transpose(1, 2).float(), x.float())
            flop = 2 * R * N * O * I
            variants = {
                "forward x W^T": lambda: torch.bmm(x, w.transpose(1, 2)),
                "input grad g W": lambda: torch.bmm(g, w),
                "weight grad bmm": lambda: torch.bmm(g.transpose(1, 2), x),
                "weight grad per replica mm": lambda: torch.stack([g[r].T @ x[r] for r in range(R)]),
                **{f"weight grad split {S}": (lambda S=S: split_k(g, x, S)) for S in a.splits},
            }
            for label, fn in variants.items():
                ms = bench(fn)
                row = {"d": d, "weight": name, "out": O, "in": I, "variant": label, "ms": ms,
                       "tflops": flop / ms / 1e9, "kernel": kernel_of(fn)}
                if label.startswith("weight grad"):
                    row["rel_err"] = float((fn().float() - ref).abs().max() / ref.abs().max())
                rows.append(row)
                print(f"d{d:4d} {name:8s} [{O:4d},{I:4d}] {label:28s} {ms:7.4f} ms {row['tflops']:6.1f} TFLOP/s"
                      f"{'  err %.1e' % row['rel_err'] if 'rel_err' in row else '':12s}  {row['kernel']}", flush=True)
            del x, g, w, ref
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"replicas": R, "tokens": N, "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

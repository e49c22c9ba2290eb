"""SwiGLU's up projection and gate as one op (``sandbox/kernels/swiglu.py``) against torch.compile's code for
``silu(a) * b`` with ``[a, b] = x W^T`` (cuBLAS product, the gate fused by Inductor), in bf16, at the rows of a
stack of 9 Figure 8 runs (9 groups of 256 x 320 rows, d_model 128, hidden 256, each group its own weight) and of
one Figure 8 run (256 x 192 rows).

    python benchmarks/swiglu_speed.py [--tiles BM,BH,BK,WARPS,STAGES ...] [--out FILE.json]

Times (median ms, replayed from a CUDA graph: triton's do_bench_cudagraph), both compiled: the forward, and the
forward with the gradients of x and w; each kernel alone at each ``--tiles``; the least traffic of the op's
forward (reading x, writing y: a copy of that many bytes). Errors of y, dx and dw against float64.
Needs a GPU.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

import sandbox.kernels.triton_swiglu as ts
from sandbox.kernels.swiglu import swiglu


def unfused(x, w):
    a, b = torch.bmm(x, w.transpose(1, 2)).chunk(2, -1)
    return F.silu(a) * b


def fused(x, w):
    return torch.ops.sandbox.swiglu(x, w)


def rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", nargs="*", default=["128,64,64,4,3", "64,128,64,4,3", "128,128,64,8,3",
                                                    "128,64,128,4,2", "64,64,64,4,4"])
    ap.add_argument("--out")
    a = ap.parse_args()
    D, H = 128, 256
    bench = lambda f: triton.testing.do_bench_cudagraph(f, rep=100)  # noqa: E731
    res = {}
    assert swiglu is not None   # (the import registers the op)
    for name, G, M in (("stack_of_9", 9, 256 * 320), ("one_run", 1, 256 * 192)):
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(G, M, D, device="cuda", generator=gen).to(torch.bfloat16).requires_grad_()
        w = (torch.randn(G, 2 * H, D, device="cuda", generator=gen) / D ** 0.5).to(torch.bfloat16).requires_grad_()
        dy = torch.randn(G, M, H, device="cuda", generator=gen).to(torch.bfloat16)
        r = {"G": G, "M": M, "ms": {}, "err": {}}
        xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        ref = unfused(xd, wd)
        ref.backward(dy.double())
        for label, f in (("torch", unfused), ("op", fused)):
            c = torch.compile(f)
            fwd = lambda: c(x.detach(), w.detach())  # noqa: E731
            both = lambda: torch.autograd.grad(c(x, w), (x, w), dy)  # noqa: E731
            y, (dx, dw) = fwd(), both()
            r["err"].update({f"{label}_y": rel(y, ref.detach()), f"{label}_dx": rel(dx, xd.grad),
                             f"{label}_dw": rel(dw, wd.grad)})
            r["ms"][f"{label}_forward"] = bench(fwd)
            r["ms"][f"{label}_forward_backward"] = bench(both)
        # a copy that reads and writes as many bytes as the forward must (x in, y out)
        src = torch.empty(G * M * (H + D) // 2, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        r["ms"]["copy_x_and_y_bytes"] = bench(lambda: dst.copy_(src))
        for t in a.tiles:
            tiles = tuple(int(v) for v in t.split(","))
            r["ms"][f"forward_{t}"] = bench(lambda: ts.swiglu_triton(x.detach(), w.detach(), tiles))
            r["ms"][f"backward_{t}"] = bench(lambda: ts.swiglu_grad_triton(dy, x.detach(), w.detach(), tiles))
        res[name] = r
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

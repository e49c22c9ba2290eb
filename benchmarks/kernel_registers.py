"""Registers and spills of the project's Triton kernels on Hopper, without a GPU.

    python benchmarks/kernel_registers.py [--out FILE.txt]

Runs the Triton kernels of the Figure 8 grid's mixers once on small CPU tensors under the interpreter (GLA's chunk
kernels at its head shape K 32, V 64 and at GSA's second pass, K 64 slots, V 64; GSA's slot scores; the short conv;
the top-k mask; the embedding gradient), records each launch's constexprs and warps, compiles each for sm_90a and
prints what ptxas reports: registers per thread and the bytes spilled to local memory. A kernel at 255 registers
that spills is a candidate for more warps or smaller tiles, to be timed on the GPU (a spilling configuration
can still be the fastest one). Triton here may not be the GPU image's (3.6): the counts are indicative.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import subprocess
import sys
import tempfile

CONSTEXPR = ("tl.constexpr", "constexpr")
SHOWN = ("K", "V", "BK", "BV", "BT", "BC", "BM", "BD", "W", "GATE")


def capture(path: str) -> None:
    """Under TRITON_INTERPRET=1: launch the kernels and write each distinct launch's signature to ``path``."""
    import torch
    import torch.nn.functional as F
    import triton.language as tl
    import triton.runtime.interpreter as interp

    from sandbox.kernels.slot_scores import slot_scores
    from sandbox.kernels.triton_chunk import chunk_gla
    from sandbox.kernels.triton_embedding import embedding_grad_triton
    from sandbox.kernels.triton_short_conv import short_conv_grad_triton, short_conv_triton
    from sandbox.kernels.triton_topk_mask import topk_mask_triton

    dtypes = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32",
              torch.int16: "i16", torch.bool: "i1", torch.uint8: "u8", torch.int8: "i8"}
    seen: dict = {}
    run = interp.InterpretedFunction.run

    def record(self, *args, grid, **kw):
        params = inspect.signature(self.fn).parameters
        bound = {**dict(zip(params, args)), **{k: v for k, v in kw.items() if k in params}}
        sig, cons = {}, {}
        for k, p in params.items():
            v = bound.get(k)
            if p.annotation in (tl.constexpr, *CONSTEXPR) or v is None:
                sig[k], cons[k] = "constexpr", v
            elif isinstance(v, torch.Tensor):
                sig[k] = "*" + dtypes[v.dtype]
            elif isinstance(v, bool):
                sig[k] = "i1"
            elif isinstance(v, int):
                sig[k] = "i32" if abs(v) < 2 ** 31 else "i64"
            else:
                sig[k] = "fp32"
        opts = {k: v for k, v in kw.items() if k in ("num_warps", "num_stages")}
        key = json.dumps([self.fn.__module__, self.fn.__name__, cons, opts], sort_keys=True, default=str)
        seen.setdefault(key, {"module": self.fn.__module__, "name": self.fn.__name__, "sig": sig, "constexprs": cons,
                              "opts": opts})
        return run(self, *args, grid=grid, **kw)

    interp.InterpretedFunction.run = record
    g_ = torch.Generator().manual_seed(0)
    B, T, H = 2, 128, 2

    def rand(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g_).to(dtype).requires_grad_()

    for K, V in ((32, 64), (64, 64)):              # GLA d128's heads; GSA d128's second pass (64 slots as keys)
        g = F.logsigmoid(torch.randn(B, T, H, K, generator=g_)).div(16).requires_grad_()
        chunk_gla(rand(B, T, H, K), rand(B, T, H, K), rand(B, T, H, V), g)[0].float().sum().backward()
    gs = F.logsigmoid(torch.randn(B, T, H, 64, generator=g_)).div(8).requires_grad_()
    o, _ = slot_scores(rand(B, T, H, 64), rand(B, T, H, 64), rand(B, T, H, 64), gs, impl="triton")
    o.float().sum().backward()
    x, w = torch.randn(B, T, 256, generator=g_).bfloat16(), torch.randn(1, 256, 4, generator=g_)
    short_conv_grad_triton(short_conv_triton(x, w, [64, 64, 128]), x, w)
    topk_mask_triton(torch.randn(B * T * H, 32, generator=g_).bfloat16(), 8)
    topk_mask_triton(torch.randn(B * T * H, 64, generator=g_), 16)
    ids = torch.where(torch.rand(B * T, generator=g_) < 0.8, 0, torch.randint(1, 512, (B * T,), generator=g_))
    embedding_grad_triton(ids, torch.randn(B * T, 128, generator=g_), 512)
    with open(path, "w") as f:
        json.dump(list(seen.values()), f)


def report(path: str) -> list[str]:
    """Compile each recorded launch for sm_90a; one line per launch with ptxas's registers and spills."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    ptxas = get_ptxas(90)
    ptxas = getattr(ptxas, "path", ptxas)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for c in json.load(open(path)):
            fn = getattr(importlib.import_module(c["module"]), c["name"])
            shown = {k: v for k, v in c["constexprs"].items() if k in SHOWN}
            where = f"{c['module'].rsplit('.', 1)[-1]}.{c['name']} {shown} warps {c['opts'].get('num_warps', 4)}"
            try:
                k = triton.compile(ASTSource(fn=fn, signature=c["sig"], constexprs=c["constexprs"]),
                                   target=GPUTarget("cuda", 90, 32), options=c["opts"])
            except Exception as e:  # a kernel this Triton cannot compile is reported, not fatal
                lines.append(f"{where}: does not compile here ({str(e).splitlines()[-1][:120]})")
                continue
            ptx = os.path.join(tmp, "k.ptx")
            with open(ptx, "w") as f:
                f.write(k.asm["ptx"])
            out = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", ptx, "-o", os.path.join(tmp, "k.cubin")],
                                 capture_output=True, text=True).stderr
            regs = next((ln.split("Used ")[1].split(" registers")[0] for ln in out.splitlines() if "Used " in ln), "?")
            spill = next((ln.strip().split(", ")[1] for ln in out.splitlines() if "spill stores" in ln), "?")
            lines.append(f"{where}: {regs} registers, {spill}, shared {k.metadata.shared} B")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="also write the lines here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "launches.json")
        env = dict(os.environ, TRITON_INTERPRET="1")
        code = f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import kernel_registers as k; " \
               f"k.capture({path!r})"
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if p.returncode:
            print(f"kernel_registers: the interpreted launches failed:\n{p.stderr[-2000:]}", file=sys.stderr)
            return 1
        lines = report(path)
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

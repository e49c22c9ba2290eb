"""Per-kernel GPU time of the chunked GLA forward+backward (diagonal gate, bf16), the registers,
spills and shared memory of every compiled kernel, and the effect of the warp count of the two
heaviest kernels (each variant checked against the first one before it is timed).

    python benchmarks/gla_profile.py [--shapes "64,512,2,64;64,512,2,256"] [--warps "fwd_intra=4,4/2;bwd_chunk=8,8/2"]

A shape is B,T,H,K with V = K, or B,T,H,K,V (the Figure 8 GLA step's heads: 256,192,2,32,64; a stack of 9: 2304,...).
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton.testing
from torch.profiler import ProfilerActivity, profile

from sandbox.bench.checks import make_inputs
from sandbox.kernels import triton_chunk as fwd_mod
from sandbox.kernels import triton_chunk_bwd as bwd_mod
from sandbox.kernels import triton_chunk_common as common_mod
from sandbox.kernels.triton_chunk import chunk_gla

MODULES = {"fwd_intra": (fwd_mod, "_fwd_intra"), "bwd_chunk": (bwd_mod, "_bwd_chunk"),
           "states": (common_mod, "_states"), "bwd_dA": (bwd_mod, "_bwd_dA"), "fwd_o": (fwd_mod, "_fwd_o"), "gate_prep": (fwd_mod, "_gate_prep")}
ORIGINAL = {name: getattr(mod, attr) for name, (mod, attr) in MODULES.items()}


class _Warps:
    """A kernel launched with another warp count ("8"), optionally a number of pipeline stages ("8/2")
    and a register cap ("8:128"; ptxas then spills instead of using more)."""

    def __init__(self, fn, spec):
        ws, _, r = str(spec).partition(":")
        w, _, st = ws.partition("/")
        self.fn = fn
        self.opts = {"num_warps": int(w), **({"num_stages": int(st)} if st else {}), **({"maxnreg": int(r)} if r else {})}

    def __getitem__(self, grid):
        launch = self.fn[grid]
        return lambda *a, **kw: launch(*a, **{**kw, **self.opts})


def compiled_info():
    """(kernel, warps, registers, spills, shared bytes) of every compiled variant of our kernels."""
    out = []
    for name, fn in ORIGINAL.items():
        for cache in getattr(fn, "device_caches", {}).values():
            kernels = next((c for c in (cache if isinstance(cache, tuple) else (cache,)) if isinstance(c, dict)), {})
            for ker in kernels.values():
                md = getattr(ker, "metadata", None)
                spec = f"{getattr(md, 'num_warps', None)}/{getattr(md, 'num_stages', None)}:{getattr(md, 'maxnreg', None)}"
                out.append((name, spec, getattr(ker, "n_regs", None),
                            getattr(ker, "n_spills", None), getattr(md, "shared", None)))
    return out


ORIGINAL_TILES = bwd_mod._bwd_tiles


def run(shape, warps, cprofile=False, tiles=None):
    bwd_mod._bwd_tiles = (lambda K, V: tiles) if tiles else ORIGINAL_TILES
    for name, (mod, attr) in MODULES.items():
        setattr(mod, attr, _Warps(ORIGINAL[name], warps[name]) if name in warps else ORIGINAL[name])
    B, T, H, K, V = shape if len(shape) == 5 else (*shape, shape[-1])
    torch.manual_seed(0)
    inp = make_inputs(B, T, H, K, V, "diag", torch.bfloat16, "cuda")
    ts = [inp[n].requires_grad_() for n in ("q", "k", "v", "g")]
    do = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)

    def fb():
        chunk_gla(*ts, scale=K ** -0.5)[0].backward(do)
    fb()
    grads = [t.grad.float().clone() for t in ts]
    ms = triton.testing.do_bench(fb, warmup=25, rep=100, grad_to_none=ts, return_mode="median")
    for t in ts:
        t.grad = None
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fb()
            for t in ts:
                t.grad = None
        torch.cuda.synchronize()
    if cprofile:
        import cProfile
        import pstats
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            fb()
            for t in ts:
                t.grad = None
        pr.disable()
        torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(22)
    kern = sorted(((e.key, e.self_device_time_total / 5e3) for e in prof.key_averages()
                   if e.self_device_time_total > 0), key=lambda r: -r[1])
    return ms, grads, kern


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="64,512,2,64;64,512,2,256")
    p.add_argument("--tiles", default="", help='K x V tiles of the backward gradient kernel to try, e.g. "64x64,32x64"')
    p.add_argument("--cprofile", action="store_true", help="where the host time of 200 fwd+bwd goes (first variant)")
    p.add_argument("--warps", default="",
                   help='e.g. "fwd_intra=4,8;bwd_chunk=4,4:128" (warps[:register cap]; first = the one in use)')
    a = p.parse_args()
    options = {}
    for part in filter(None, a.warps.split(";")):
        name, ws = part.split("=")
        options[name] = ws.split(",")
    names = list(options)
    for shape in [tuple(int(x) for x in s.split(",")) for s in a.shapes.split(";")]:
        base = None
        tiles = [tuple(int(x) for x in t.split("x")) for t in a.tiles.split(",")] if a.tiles else [None]
        for tile, combo in itertools.product(tiles, itertools.product(*(options[n] for n in names)) if names else [()]):
            warps = dict(zip(names, combo))
            if tile:
                warps["bwd_tiles"] = tile
            ms, grads, kern = run(shape, {n: w for n, w in warps.items() if n in MODULES}, a.cprofile and base is None,
                                  tile)
            if base is None:
                base = grads
            err = max(((g - b).abs().max() / b.abs().max().clamp_min(1e-6)).item() for g, b in zip(grads, base))
            print(f"{shape} warps {warps or 'as in use'}: {ms:.3f} ms fwd+bwd (max rel diff vs first {err:.1e})")
            for key, t in kern[:9]:
                print(f"   {t:7.4f} ms  {key[:70]}")
    for name, w, regs, spills, shared in compiled_info():
        print(f"compiled {name:10s} warps {w} registers {regs} spills {spills} shared {shared}")


if __name__ == "__main__":
    main()

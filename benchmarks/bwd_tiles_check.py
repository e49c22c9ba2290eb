"""One configuration of the backward gradient kernel (K x V tiles, warps) checked against the float64
reference on the family cases (every gate, strong decay, varlen; bf16 and fp32), then timed.  Run one
configuration per process: a kernel that faults leaves the CUDA context unusable.

    python benchmarks/bwd_tiles_check.py --tiles 32x64 --warps 4
"""
from __future__ import annotations

import argparse


from sandbox.bench.checks import family_checks
from sandbox.kernels import triton_chunk_bwd as bwd_mod


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tiles", default="")
    p.add_argument("--warps", type=int, default=0)
    a = p.parse_args()
    if a.tiles:
        tiles = tuple(int(x) for x in a.tiles.split("x"))
        bwd_mod._bwd_tiles = lambda K, V: tiles
    if a.warps:
        fn = bwd_mod._bwd_chunk

        class W:
            def __getitem__(self, grid):
                launch = fn[grid]
                return lambda *x, **kw: launch(*x, **{**kw, "num_warps": a.warps})
        bwd_mod._bwd_chunk = W()
    res = family_checks("cuda")
    bad = [n for n, c in res.items() if not c["ok"]]
    print(f"tiles {a.tiles or 'default'} warps {a.warps or 'default'}: {len(res) - len(bad)}/{len(res)} checks passed;"
          f" failed {bad}")
    for n in bad:
        print("  ", n, {k: f"{v:.1e}" for k, v in res[n]["errors"].items()})


if __name__ == "__main__":
    main()

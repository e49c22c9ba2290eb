"""The embedding's deterministic weight gradient (``triton_embedding.py``) in its parts, at a stack of 9 Figure 8
runs: 9 x 256 sequences of 320 tokens, 128 columns, 9 tables of 8192 rows folded into one (the vmap rule), 3/4 of
the positions the filler token of their replica (MQAR's filler takes 60-90%).

    python benchmarks/embedding_speed.py [--replicas 9] [--dim 128] [--warps 4,8,16] [--out FILE.json]

Times (median ms, triton's do_bench): the lookup (the forward; and torch's indexing), the whole gradient, its id
sort, ``_tile_sums`` at each warp count, ``_row_sums``, and a float32 copy of the gradient (what reading and writing
it once costs). Needs a GPU.
"""
from __future__ import annotations

import argparse
import json

import torch
import triton

import sandbox.kernels.triton_embedding as te


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=9)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--warps", default="4,8,16")
    ap.add_argument("--out")
    a = ap.parse_args()
    R, V, D = a.replicas, 8192, a.dim
    N = R * 256 * 320
    gen = torch.Generator(device="cuda").manual_seed(0)
    rep = torch.arange(R, device="cuda").repeat_interleave(N // R)
    tok = torch.randint(1, V, (N,), device="cuda", generator=gen)
    filler = torch.rand(N, device="cuda", generator=gen) < 0.75
    ids = torch.where(filler, 0, tok) + rep * V
    grad = torch.randn(N, D, device="cuda", generator=gen)
    rows = R * V
    bench = lambda f: triton.testing.do_bench(f, warmup=25, rep=200)  # noqa: E731
    res = {"N": N, "D": D, "rows": rows, "ms": {}}
    ms = res["ms"]
    ms["whole"] = bench(lambda: te.embedding_grad_triton(ids, grad, rows))
    ms["copy_fp32"] = bench(lambda: grad.clone())
    table = torch.randn(rows, D, device="cuda", generator=gen)
    ms["lookup"] = bench(lambda: te.embedding_triton(table, ids))
    ms["lookup_torch"] = bench(lambda: table[ids])
    res["lookup_equal"] = bool(torch.equal(te.embedding_triton(table, ids), table[ids]))
    key = torch.int16 if rows <= torch.iinfo(torch.int16).max else torch.int32
    ms["sort"] = bench(lambda: torch.sort(ids.to(key), stable=True))
    sid, perm = torch.sort(ids.to(key), stable=True)
    bounds = torch.zeros(2, rows, dtype=torch.int32, device="cuda")
    part = torch.empty(N, D, dtype=torch.float32, device="cuda")
    out = torch.empty(rows, D, dtype=torch.float32, device="cuda")
    grid = (triton.cdiv(N, te.BT), triton.cdiv(D, te.BD))
    for w in (int(x) for x in a.warps.split(",")):
        ms[f"tile_sums_w{w}"] = bench(lambda: te._tile_sums[grid](sid, perm, grad, part, bounds, N, D, rows,
                                                                   BT=te.BT, BD=te.BD, num_warps=w))
    te._tile_sums[grid](sid, perm, grad, part, bounds, N, D, rows, BT=te.BT, BD=te.BD)
    ms["row_sums"] = bench(lambda: te._row_sums[(rows, triton.cdiv(D, te.BD))](part, bounds, out, D, rows, BT=te.BT,
                                                                              BD=te.BD, BLK=te.BLK))
    ref = torch.zeros(rows, D, device="cuda", dtype=torch.float64).index_add_(0, ids, grad.double())
    got = te.embedding_grad_triton(ids, grad, rows)
    res["max_rel_err"] = float((got.double() - ref).abs().max() / ref.abs().max())
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

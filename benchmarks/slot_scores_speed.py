"""GSA's slot-score kernels (``triton_slot_scores.py``) timed at a stack of 9 Figure 8 GSA runs, beside another
commit's and with each kernel's warp count varied.

    python benchmarks/slot_scores_speed.py [--batch 2304] [--dk 64] [--ref .ref/COMMIT] [--warps 2,4,8]
                                           [--out FILE.json]

Inputs as GSA makes them under autocast: q and k bf16 [B, T, H, d_k], slot writes s and log-gates g fp32 [B, T,
H, m], 16 of the m slots chosen per step (the others neither write nor decay). The forward (``_fwd``) and
backward (``_bwd``) are timed separately with triton's do_bench (median ms). Against ``--ref`` the outputs and
gradients are compared (largest absolute difference over the largest value) and the same calls timed.
``--warps``: each kernel's launch again at these warp counts, the others at their defaults, then every kernel at
its fastest together (``WARPS_BY_BK`` in the kernel module holds the chosen values). The floor is the bytes each
half must read and write once (its inputs, outputs and saved tensors) at 4.8 TB/s. Needs a GPU.
"""
from __future__ import annotations

import argparse
import json
import types
from pathlib import Path

import torch
import triton

import sandbox.kernels.triton_slot_scores as ss

BW = 4.8e12
KERNELS = {"fwd_states": "fwd_ms", "fwd_o": "fwd_ms", "bwd_walk": "bwd_ms"}    # each kernel and the half it is timed in


def _load_ref(root: str):
    """The other commit's kernels and launchers, without its custom-op registrations (their names are taken)."""
    src = (Path(root) / "sandbox/kernels/triton_slot_scores.py").read_text()
    src = src.split("# -----------------------------------------------------------------------------")[0]
    mod = types.ModuleType("ref_slot_scores")
    mod.__file__ = str(Path(root) / "sandbox/kernels/triton_slot_scores.py")
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    return mod


def _inputs(B, T, H, dk, m, top, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.nn.functional.silu(torch.randn(B, T, H, dk, device="cuda", generator=gen)).bfloat16()
    k = torch.nn.functional.silu(torch.randn(B, T, H, dk, device="cuda", generator=gen)).bfloat16()
    f = torch.randn(B, T, H, m, device="cuda", generator=gen)
    chosen = torch.zeros_like(f, dtype=torch.bool).scatter_(-1, f.topk(top, -1).indices, True)
    g = (torch.nn.functional.logsigmoid(f) / 8).masked_fill(~chosen, 0.).clamp_min(-8.)
    s = torch.softmax(f.masked_fill(~chosen, float("-inf")), -1)
    do = torch.randn(B, T, H, m, device="cuda", generator=gen)
    return q, k, s, g, do


def _time(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))


def _run(mod, x, scale):
    q, k, s, g, do = x
    o, _, gc, h = mod._fwd(q, k, s, g, scale, False)
    grads = mod._bwd(q, k, s, gc, h, o, do, scale)
    return (o, *grads), (lambda: mod._fwd(q, k, s, g, scale, False)), (lambda: mod._bwd(q, k, s, gc, h, o, do, scale))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default=None, help="another checkout (e.g. .ref/5aa7edf) whose kernels to time beside")
    ap.add_argument("--warps", default="", help="comma-separated warp counts to try for each kernel, e.g. 1,2,4")
    ap.add_argument("--batch", type=int, default=9 * 256, help="sequences (replicas x batch); default 2304")
    ap.add_argument("--dk", type=int, default=64, help="query/key width per head (d_model / 2 heads); default 64")
    ap.add_argument("--out", default=None, help="write the numbers to this JSON file")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("slot_scores_speed.py: needs a CUDA GPU")
    B, T, H, dk, m = args.batch, 320, 2, args.dk, 64
    x = _inputs(B, T, H, dk, m, 16)
    scale = dk ** -0.5
    rows, nt = B * T * H, B * H * triton.cdiv(T, ss.C)
    fwd_bytes = rows * (2 * dk * 2 + 2 * m * 4 + 2 * m * 4) + nt * m * dk * 2           # q k s g in; o gc h out
    bwd_bytes = rows * (2 * dk * 2 + 4 * m * 4 + 2 * dk * 4 + 2 * m * 4) + nt * m * dk * 2   # + do o; dq dk ds dg
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "shape": {"B": B, "T": T, "H": H, "dk": dk, "m": m, "top": 16}, "ref": args.ref,
           "floor_ms": {"fwd": fwd_bytes / BW * 1e3, "bwd": bwd_bytes / BW * 1e3}}
    outs, fwd, bwd = _run(ss, x, scale)
    bk = max(16, triton.next_power_of_2(dk))
    row = ss.warps_row(bk)                         # the launch settings in use: varied in place below
    res["this"] = {"fwd_ms": _time(fwd), "bwd_ms": _time(bwd), "warps": dict(row)}
    print("this", res["this"], "floor", res["floor_ms"], flush=True)
    if args.ref:
        ref = _load_ref(args.ref)
        ref_outs, rfwd, rbwd = _run(ref, x, scale)
        names = ("o", "dq", "dk", "ds", "dg")
        res["ref_gap"] = {n: float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))
                          for n, a, b in zip(names, outs, ref_outs)}
        res["ref"] = {"fwd_ms": _time(rfwd), "bwd_ms": _time(rbwd)}
        print("ref", res["ref"], "gap", res["ref_gap"], flush=True)
    # each kernel alone at every warp count tried (the others at their defaults), then all at their best together
    warps = [int(v) for v in args.warps.split(",") if v]
    res["settings"], best, defaults = [], {}, dict(row)
    for kernel, half in (KERNELS if warps else {}).items():
        for w in warps:
            row[kernel] = w
            try:
                _, fwd, bwd = _run(ss, x, scale)
                r = {"kernel": kernel, "warps": w, "fwd_ms": _time(fwd), "bwd_ms": _time(bwd)}
                if kernel not in best or r[half] < best[kernel][half]:
                    best[kernel] = r
            except Exception as e:  # e.g. out of shared memory or registers at this tile
                r = {"kernel": kernel, "warps": w, "error": f"{type(e).__name__}: {str(e)[:200]}"}
            row.update(defaults)
            res["settings"].append(r)
            print(r, flush=True)
    if best:
        row.update({kernel: r["warps"] for kernel, r in best.items()})
        outs_b, fwd, bwd = _run(ss, x, scale)
        gap = max(float((a.float() - b.float()).abs().max()) for a, b in zip(outs_b, outs))
        res["best"] = {"warps": dict(row), "fwd_ms": _time(fwd), "bwd_ms": _time(bwd),
                       "largest_difference_from_defaults": gap}
        row.update(defaults)
        print("best", res["best"], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

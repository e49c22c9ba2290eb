"""The top-k mask kernel against another commit's and torch.topk, at the row counts of a stack of 9 runs.

    python benchmarks/topk_mask_speed.py [--ref .ref/COMMIT] [--out FILE.json]

Two cases: GSA's 64 slots, top 16, fp32 scores, and GLA's 32 features, top 8, bf16 (rows = 9 replicas x
batch 256 x T 320 x 2 heads). For each it counts the entries where the mask differs from torch.topk's choice
(on distinct values) and from the reference kernel's (on random values and on heavily tied small integers),
then times the kernel, the reference kernel and torch.topk with triton's do_bench (median ms). The floor is the
bytes a mask must move (read the row, write a byte per entry) at the H200's 4.8 TB/s. Needs a GPU.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import torch
import triton

from sandbox.kernels.triton_topk_mask import topk_mask_triton

ROWS = 9 * 256 * 320 * 2
CASES = (("gsa_slots64_top16_fp32", 64, 16, torch.float32), ("gla_rows32_top8_bf16", 32, 8, torch.bfloat16))


def _load_ref(root: str):
    path = Path(root) / "sandbox/kernels/triton_topk_mask.py"
    spec = importlib.util.spec_from_file_location("ref_topk_mask", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.topk_mask_triton


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default=None, help="another checkout (e.g. .ref/0d0f28e) whose kernel to time beside")
    ap.add_argument("--out", default=None, help="write the numbers to this JSON file")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("topk_mask_speed.py: needs a CUDA GPU")
    ref = _load_ref(args.ref) if args.ref else None
    results = {}
    for name, c, k, dtype in CASES:
        x = torch.randn(ROWS, c, device="cuda").to(dtype)
        distinct = torch.rand(ROWS, c, device="cuda").argsort(-1).to(dtype)
        want = torch.zeros(ROWS, c, dtype=torch.bool, device="cuda")
        want.scatter_(-1, distinct.float().topk(k, -1).indices, True)
        r = {"differ_from_topk": int((topk_mask_triton(distinct, k) != want).sum())}
        fns = {"kernel_ms": lambda: topk_mask_triton(x, k), "torch_topk_ms": lambda: x.topk(k, -1)}
        if ref is not None:
            ties = torch.randint(-3, 4, (ROWS, c), device="cuda").to(dtype)
            r["differ_from_ref_on_randn"] = int((topk_mask_triton(x, k) != ref(x, k)).sum())
            r["differ_from_ref_on_ties"] = int((topk_mask_triton(ties, k) != ref(ties, k)).sum())
            fns["ref_kernel_ms"] = lambda: ref(x, k)
        for label, f in fns.items():
            r[label] = float(triton.testing.do_bench(f, warmup=50, rep=300, return_mode="median"))
        r["bytes_floor_ms"] = (x.numel() * x.element_size() + x.numel()) / 4.8e12 * 1e3
        results[name] = r
        print(name, {key: round(v, 4) if isinstance(v, float) else v for key, v in r.items()}, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                              "triton": triton.__version__, "rows": ROWS, "ref": args.ref,
                                              "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""SDPA's backends on this GPU: the first call of a shape (from an empty CUDA cache, then again from the cache the
first process left) and the steady forward + backward, per backend, each in a process of its own.

    python benchmarks/sdpa_backends.py OUT.json

The default backend's kernels are listed, to show which one torch picks.
"""
import json
import os
import subprocess
import sys

CHILD = r'''
import contextlib, json, sys, time, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
b, h, t, dh, backend = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.randn(8, 8, device="cuda").sum().item()          # CUDA initialised before the clock
q, k, v = (torch.randn(b, h, t, dh, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
ctx = contextlib.nullcontext() if backend == "DEFAULT" else sdpa_kernel([getattr(SDPBackend, backend)])
def once():
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
with ctx:
    t0 = time.perf_counter(); once(); torch.cuda.synchronize(); first = time.perf_counter() - t0
    for _ in range(10):
        once()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(100):
        once()
    torch.cuda.synchronize(); steady = (time.perf_counter() - t0) / 100
    names = []
    if backend == "DEFAULT":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
            once(); torch.cuda.synchronize()
        names = sorted({e.name[:80] for e in p.events()
                        if any(s in e.name.lower() for s in ("cudnn", "flash", "fmha", "attention"))})
print(json.dumps({"first_s": round(first, 3), "steady_ms": round(steady * 1e3, 4), "kernels": names}))
'''
SHAPES = [(256, 1, 64, 64), (256, 2, 256, 64), (512, 1, 512, 64)]     # [b, h, t, dh]: Zoology's, the ablations' control
BACKENDS = ["DEFAULT", "CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"]


def main(out_path: str) -> None:
    out = {}
    for shape in SHAPES:
        for backend in BACKENDS:
            cache = f"/tmp/sdpa_cache_{backend}_{'x'.join(map(str, shape))}"
            subprocess.run(["rm", "-rf", cache])
            for state in ("cold", "warm"):
                p = subprocess.run([sys.executable, "-c", CHILD, *map(str, shape), backend], capture_output=True,
                                   text=True, env={**os.environ, "CUDA_CACHE_PATH": cache})
                key = f"{'x'.join(map(str, shape))}/{backend}/{state}"
                out[key] = json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-400:]}
                print(key, out[key], flush=True)
                with open(out_path, "w") as f:
                    json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])

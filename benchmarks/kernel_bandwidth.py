"""How close each of Inductor's kernels in a training step runs to the GPU's copy bandwidth.

    python benchmarks/kernel_bandwidth.py [--sweep FILE --kinds NAME,...] [--configs NAME,...] [--steps 20] [--out F.md]

For each stack (a sweep's kind, its runner's stack size) or reference configuration (``sandbox bench train``'s
names, one run), in this process: Inductor compiles the step with ``benchmark_kernel`` on, so that each of its
kernels carries the bytes it must read and write (``kernel_num_gb``: every input and output buffer once), the step
runs 10 steps and is then profiled over ``--steps``. Per kernel: GPU ms per step, launches, GB per launch, the
achieved rate, and the time against what those bytes take at the measured device-to-device copy rate
(``x copy``; 1.0 = at bandwidth), and the step's time split by who wrote the kernels. cuBLAS and the project's
own Triton kernels carry no byte count and are listed by time alone (``short_conv_speed.py`` sets the short
convolution against a copy; ``gla_profile.py`` times the GLA kernels' variants). Needs a GPU.
"""
from __future__ import annotations

import argparse
import os

os.environ["TORCHINDUCTOR_BENCHMARK_KERNEL"] = "1"   # read when Inductor's config is first imported

import torch  # noqa: E402
from torch.profiler import ProfilerActivity  # noqa: E402

from sandbox.bench.estimate import sweep_kinds  # noqa: E402
from sandbox.bench.step_worker import _profiled_steps, _top, peaks  # noqa: E402
from sandbox.bench.train import REFERENCE  # noqa: E402


def loaded_modules() -> list:
    """The Python modules Inductor has loaded in this process (its compiled graphs and kernels)."""
    from torch._inductor.codecache import PyCodeCache
    return list(PyCodeCache.modules) + list(PyCodeCache.modules_no_attr.values())


def kernel_bytes(modules: list) -> dict[str, float]:
    """GB per launch of every Inductor kernel in ``modules``, by name; a name that two compiled graphs gave to
    kernels of different sizes is left out (the profile cannot tell them apart)."""
    found: dict[str, set[float]] = {}
    for mod in modules:
        for obj in vars(mod).values():
            meta = getattr(obj, "inductor_meta", None)
            if isinstance(meta, dict) and meta.get("kernel_num_gb") is not None:
                found.setdefault(meta.get("kernel_name", ""), set()).add(float(meta["kernel_num_gb"]))
    return {name: gbs.pop() for name, gbs in found.items() if len(gbs) == 1}


def report(label: str, datas: list[dict], steps: int, copy_rate: float) -> str:
    before = {id(m) for m in loaded_modules()}
    _, prof = _profiled_steps(datas, steps, activities=[ProfilerActivity.CUDA])
    rows, gb = _top(prof, steps), kernel_bytes([m for m in loaded_modules() if id(m) not in before])
    total = rows[0]["ms_per_step"]
    lines = [f"## {label}: {total:.3f} ms of kernels per step", "",
             "| kernel | ms / step | launches | GB / launch | TB/s | x copy |", "|---|---|---|---|---|---|"]
    known = known_ms = 0.0
    for r in rows[1:]:
        g = next((v for k, v in gb.items() if k.startswith(r["kernel"][:90])), None)
        if g is None:
            if r["ms_per_step"] >= 0.02:
                lines.append(f"| {r['kernel'][:80]} | {r['ms_per_step']:.4f} | {r['calls']:.0f} | | | |")
            continue
        rate = g * r["calls"] / (r["ms_per_step"] * 1e-3) / 1e3          # TB/s
        floor = g * 1e9 * r["calls"] / copy_rate * 1e3                     # ms at the copy rate
        known += floor
        known_ms += r["ms_per_step"]
        if r["ms_per_step"] >= 0.02:
            lines.append(f"| {r['kernel'][:80]} | {r['ms_per_step']:.4f} | {r['calls']:.0f} | {g:.3f} | {rate:.2f} "
                         f"| {r['ms_per_step'] / floor:.2f} |")
    split: dict[str, float] = {}
    for r in rows[1:]:
        who = family(r["kernel"])
        split[who] = split.get(who, 0.0) + r["ms_per_step"]
    lines += ["", f"Inductor's kernels with a byte count: {known_ms:.3f} ms per step, {known:.3f} ms at the copy rate "
                  f"({known_ms / max(known, 1e-9):.2f}x). By who wrote the kernel: "
              + ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(split.items(), key=lambda kv: -kv[1]))
              + ". Rows under 0.02 ms left out.", ""]
    return "\n".join(lines)


def family(kernel: str) -> str:
    if kernel.startswith("triton_"):
        return "Inductor"
    if kernel.startswith(("nvjet", "sm90_", "cutlass")) or "cublas" in kernel or "gemm" in kernel.lower():
        return "cuBLAS"
    if kernel.startswith("void "):
        return "aten"
    return "the project's Triton kernels"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweep", help="a sweep YAML whose kinds of stack to profile (with --kinds)")
    p.add_argument("--kinds", default="", help="with --sweep: the kinds' names, comma-separated (default: all)")
    p.add_argument("--configs", default="", help=f"reference configurations: {', '.join(REFERENCE)}")
    p.add_argument("--steps", type=int, default=20, help="profiled steps (after 10 of warm-up)")
    p.add_argument("--out", help="also write the tables to this file (Inductor prints each compiled module's path)")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a GPU")
    pk = peaks()
    parts = [f"{torch.cuda.get_device_name()}: copy {pk['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + write), "
             f"bf16 products {pk['bf16_flops'] / 1e12:.0f} TFLOP/s\n"]
    print(parts[0])
    jobs = []
    if a.sweep:
        only = {n.strip() for n in a.kinds.split(",") if n.strip()}
        for k in sweep_kinds(a.sweep):
            if not only or k["name"] in only:
                jobs.append((f"{k['name']} (a stack of {k['replicas']})", [k["data"]] * k["replicas"]))
    for name in filter(None, (n.strip() for n in a.configs.split(","))):
        if name not in REFERENCE:
            p.error(f"--configs: no configuration {name}")
        jobs.append((name, [REFERENCE[name]]))
    if not jobs:
        p.error("nothing to profile: give --sweep (and --kinds) or --configs")
    for label, datas in jobs:
        parts.append(report(label, datas, a.steps, pk["copy_bytes_per_s"]))
        print(parts[-1], flush=True)
        torch._dynamo.reset()
        if a.out:
            with open(a.out, "w") as f:
                f.write("\n".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a run's cold start goes: building the group, its first (compiled or eager) step, the steps after it.

    python benchmarks/compile_time.py --config NAME[,NAME...] [--eager] [--threads N,...] [--together N] [--profile N]
    python benchmarks/compile_time.py SWEEP KIND [KIND ...] [same options]

For each configuration (``--config``: a reference of ``sandbox bench train``, e.g. gated_deltanet_d128_t256, one
run) or each kind of a sweep's stacks (as ``sandbox bench train --sweep`` names them, the kind's replicas; part 1's
stacks of 9 with 3 seeds) a fresh process builds the group into empty Inductor, Triton and CUDA caches of its own,
and times: the imports, the group's build (models, data pools), the first step (compiled: Dynamo, AOTAutograd,
Inductor and the Triton kernels they and the project's kernels need; ``--eager``: the project's Triton kernels
compiling at their first launch), the second and third. Dynamo's table of compile phases follows
(``torch._dynamo.utils.compile_times``). ``--threads`` repeats each with TORCHINDUCTOR_COMPILE_THREADS set to each
value; ``--together N`` starts N processes of the first one at once (a sweep's cold start, where the first kinds
compile side by side). ``--profile N`` runs the build and the first step under cProfile and prints the N functions
with the most time in them and under them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

T0 = time.perf_counter()


def configs_of(sweep: str | None, name: str, eager: bool) -> list:
    """The run configs of one timing: a ``sandbox bench train`` reference (one run), or a sweep kind's stack."""
    from sandbox.config import load_config
    if sweep is None:
        from sandbox.bench.train import REFERENCE
        cfgs = [load_config(data=REFERENCE[name])]
    else:
        from sandbox.bench.estimate import sweep_kinds
        (k,) = [k for k in sweep_kinds(sweep) if k["name"] == name]
        seeds = 3 if k["replicas"] == 9 else 1       # part 1 stacks 3 seeds x 3 learning rates
        cfgs = []
        for i in range(k["replicas"]):
            c = load_config(data=k["data"])
            c.seed, c.train.lr = i % seeds, c.train.lr * 2.0 ** (i // seeds - 1)
            cfgs.append(c)
    for c in cfgs:
        c.train.steps, c.train.compile = 5, not eager
    return cfgs


def child(sweep: str | None, name: str, eager: bool, profile: int = 0) -> None:
    import cProfile
    import io
    import pstats

    import torch

    from sandbox.train.group import Group
    t_import = time.perf_counter() - T0
    cfgs = configs_of(sweep, name, eager)
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    t = time.perf_counter()
    group = Group(cfgs)
    t_build = time.perf_counter() - t
    times = []
    for s in range(3):
        t = time.perf_counter()
        group.step(*group.batch(s))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        if prof and s == 0:
            prof.disable()
    table = ""
    if prof:
        for order in ("cumulative", "tottime"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(profile)
            table += buf.getvalue()
    from torch._dynamo.utils import compile_times
    print(json.dumps({"name": name, "eager": eager, "import_s": t_import, "build_s": t_build, "step_s": times,
                      "threads": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "default"),
                      "phases": compile_times(repr="str", aggregate=True), "profile": table}))


def run(sweep, names, threads, together, eager, profile=0) -> list[dict]:
    procs = []
    for name in names:
        for _ in range(together):
            tmp = tempfile.mkdtemp(prefix="compile_time_")
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor", "TRITON_CACHE_DIR": f"{tmp}/triton",
                   "CUDA_CACHE_PATH": f"{tmp}/cuda"}
            if threads:
                env["TORCHINDUCTOR_COMPILE_THREADS"] = threads
            where = ["--config", name] if sweep is None else [sweep, name]
            procs.append(subprocess.Popen([sys.executable, __file__, *where, "--child"]
                                          + (["--eager"] if eager else [])
                                          + (["--profile", str(profile)] if profile else []), env=env,
                                          stdout=subprocess.PIPE, text=True))
        if together == 1:       # one at a time: nothing else on the CPUs
            procs[-1].wait()
    out = []
    for p in procs:
        text, _ = p.communicate()
        out.append(json.loads(text.strip().splitlines()[-1]))
    return out


def main() -> int:
    a = argparse.ArgumentParser()
    a.add_argument("sweep", nargs="?", help="a sweep file (with KIND names), or none with --config")
    a.add_argument("kinds", nargs="*")
    a.add_argument("--config", help="comma-separated references of `sandbox bench train` (one run each)")
    a.add_argument("--eager", action="store_true", help="the step uncompiled (train.compile: false)")
    a.add_argument("--threads", default="", help="comma-separated TORCHINDUCTOR_COMPILE_THREADS values to try")
    a.add_argument("--together", type=int, default=1)
    a.add_argument("--quiet", action="store_true", help="without Dynamo's table")
    a.add_argument("--profile", type=int, default=0, help="cProfile the build and first step: the top N functions")
    a.add_argument("--child", action="store_true")
    args = a.parse_args()
    sweep, names = (None, args.config.split(",")) if args.config else (args.sweep, args.kinds)
    if not names:
        a.error("name kinds of a sweep, or --config NAME")
    if args.child:
        child(sweep, names[0], args.eager, args.profile)
        return 0
    for threads in (args.threads.split(",") if args.threads else [""]):
        for r in run(sweep, names if args.together == 1 else names[:1], threads, args.together, args.eager,
                     args.profile):
            steps = ", ".join(f"{s:.1f}" for s in r["step_s"])
            print(f"{r['name']} ({'eager' if r['eager'] else 'compiled'}, compile threads {r['threads']}, "
                  f"{args.together} at once): import {r['import_s']:.1f} s, build {r['build_s']:.1f} s, "
                  f"steps {steps} s", flush=True)
            if not args.quiet:
                print(r["phases"], flush=True)
            if r.get("profile"):
                print(r["profile"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

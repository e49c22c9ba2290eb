"""Where a stack's cold start goes: building the group, compiling its step, the first compiled steps.

    python benchmarks/compile_time.py SWEEP KIND [KIND ...] [--threads N,...] [--together N] [--warm-kernels]

For each kind (as ``sandbox bench train --sweep`` names them) a fresh process builds one stack as a sweep worker
would (the kind's replicas; part 1's stacks of 9 with 3 seeds), into empty Inductor and Triton caches of its own,
and times: the imports, the group's build (models, data pools), the first compiled step (Dynamo, AOTAutograd,
Inductor, Triton), the second. Dynamo's own table of compile phases follows (``torch._dynamo.utils.compile_times``).
``--threads`` repeats each with TORCHINDUCTOR_COMPILE_THREADS set to each value (how much the parallel Triton
compilation matters); ``--together N`` starts N processes of the first kind at once (a sweep's cold start, where the
first kinds compile side by side); ``--warm-kernels`` times each also with the sweep's kernel warm-up helper
(``precompile.warm_kernels``) started before the group is built, as a worker's cold stack does. ``--profile N`` runs
the build and the first step under cProfile and prints the N functions with the most time in them and under them.
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


def child(sweep: str, kind: str, warm_kernels: bool, profile: int = 0) -> None:
    import cProfile
    import io
    import pstats

    import torch

    from sandbox.bench.estimate import sweep_kinds
    from sandbox.config import load_config
    from sandbox.train.group import Group
    t_import = time.perf_counter() - T0
    (k,) = [k for k in sweep_kinds(sweep) if k["name"] == kind]
    seeds = 3 if k["replicas"] == 9 else 1       # part 1 stacks 3 seeds x 3 learning rates
    cfgs = []
    for i in range(k["replicas"]):
        c = load_config(data=k["data"])
        c.seed, c.train.lr = i % seeds, c.train.lr * 2.0 ** (i // seeds - 1)
        c.train.steps = 5
        cfgs.append(c)
    prof = cProfile.Profile() if profile else None
    t = time.perf_counter()
    if warm_kernels:
        from sandbox.train import precompile
        precompile.warm_kernels(cfgs)
    if prof:
        prof.enable()
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
    print(json.dumps({"kind": kind, "import_s": t_import, "build_s": t_build, "step_s": times,
                      "threads": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "default"),
                      "warm_kernels": warm_kernels,
                      "phases": compile_times(repr="str", aggregate=True), "profile": table}))


def run(sweep, kinds, threads, together, warm, profile=0) -> list[dict]:
    procs = []
    for kind in kinds:
        for _ in range(together):
            tmp = tempfile.mkdtemp(prefix="compile_time_")
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor", "TRITON_CACHE_DIR": f"{tmp}/triton"}
            if threads:
                env["TORCHINDUCTOR_COMPILE_THREADS"] = threads
            procs.append(subprocess.Popen([sys.executable, __file__, sweep, kind, "--child"]
                                          + (["--warm-kernels"] if warm else [])
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
    a.add_argument("sweep")
    a.add_argument("kinds", nargs="+")
    a.add_argument("--threads", default="", help="comma-separated TORCHINDUCTOR_COMPILE_THREADS values to try")
    a.add_argument("--together", type=int, default=1)
    a.add_argument("--warm-kernels", action="store_true")
    a.add_argument("--quiet", action="store_true", help="without Dynamo's table")
    a.add_argument("--profile", type=int, default=0, help="cProfile the build and first step: the top N functions")
    a.add_argument("--child", action="store_true")
    args = a.parse_args()
    if args.child:
        child(args.sweep, args.kinds[0], args.warm_kernels, args.profile)
        return 0
    for threads in (args.threads.split(",") if args.threads else [""]):
        for warm in ([False, True] if args.warm_kernels else [False]):
            for r in run(args.sweep, args.kinds if args.together == 1 else args.kinds[:1], threads, args.together,
                         warm, args.profile):
                steps = ", ".join(f"{s:.1f}" for s in r["step_s"])
                print(f"{r['kind']} (compile threads {r['threads']}, {args.together} at once, kernel warm-up "
                      f"{'on' if warm else 'off'}): import {r['import_s']:.1f} s, build {r['build_s']:.1f} s, "
                      f"steps {steps} s", flush=True)
                if not args.quiet:
                    print(r["phases"], flush=True)
                if r.get("profile"):
                    print(r["profile"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

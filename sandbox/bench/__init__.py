"""Benchmarks and GPU checks: ``sandbox bench kernels`` (kernels.py, with the float64 checks of
checks.py), ``sandbox bench train`` (train.py: the training-step yardstick; estimate.py: with ``--sweep``,
a sweep's GPU-minutes from one timed stack of each kind; both time each configuration in a process of its
own, runs.py and step_worker.py) and ``sandbox bench sweep`` (sweep.py: trial-steps per GPU-second of a
whole sweep runner, against another version's)."""
from __future__ import annotations

import importlib

# name -> (module with parser() and main_<name>(args), the line `sandbox bench --help` shows)
BENCHES = {
    "kernels": ("sandbox.bench.kernels", "Triton kernels against float64 references, then timed against torch, "
                                         "fla and flash attention (GPU)"),
    "train": ("sandbox.bench.train", "ms per training step of reference configurations, or a sweep's GPU-minutes "
                                     "(--sweep), against another version (GPU)"),
    "sweep": ("sandbox.bench.sweep", "trial-steps per GPU-second of a whole sweep runner, against another "
                                     "version (GPU)"),
}


def add_cli(sub) -> None:
    """``sandbox bench kernels|train|sweep [options]``: each benchmark's options come from its module's
    ``parser()``, so ``--help`` at every level lists them."""
    p = sub.add_parser("bench", help="benchmarks (GPU): kernels, training steps, sweep runners",
                       description="Speed yardsticks, each measured against a reference in the same process "
                                   "or call.")
    benches = p.add_subparsers(dest="bench", metavar="BENCH")
    for name, (module, line) in BENCHES.items():
        mod = importlib.import_module(module)
        own = mod.parser()
        b = benches.add_parser(name, parents=[own], add_help=False, help=line, description=own.description)
        b.set_defaults(func=getattr(mod, f"main_{name}"))

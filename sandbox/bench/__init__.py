"""Benchmarks and GPU checks: ``sandbox bench kernels`` (kernels.py, with the float64 checks of
checks.py), ``sandbox bench train`` (train.py: the training-step yardstick; estimate.py: with ``--sweep``,
a sweep's GPU-minutes from one timed stack of each kind; both time each configuration in a process of its
own, runs.py and step_worker.py) and ``sandbox bench sweep`` (sweep.py: trial-steps per GPU-second of a
whole sweep runner, against another version's)."""
from __future__ import annotations

import argparse


def main(what: str, argv) -> int:
    if what == "kernels":
        from sandbox.bench.kernels import main_kernels
        return main_kernels(argv)
    if what == "sweep":
        from sandbox.bench.sweep import main_sweep
        return main_sweep(argv)
    from sandbox.bench.train import main_train
    return main_train(argv)


def add_cli(sub) -> None:
    """``sandbox bench kernels|train|sweep [options]`` (``--help`` after the name lists the options)."""
    p = sub.add_parser("bench", add_help=False, help="benchmarks (GPU): `sandbox bench kernels [--check]`, "
                       "`sandbox bench train`, `sandbox bench sweep FILE`")
    p.add_argument("what", choices=["kernels", "train", "sweep"])
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda a: main(a.what, a.rest))

"""Benchmarks and GPU checks: ``sandbox bench kernels`` (kernels.py, with the float64 checks of
checks.py) and ``sandbox bench train`` (train.py: the training-step yardstick, one process per
configuration through step_worker.py)."""
from __future__ import annotations

import argparse


def main(what: str, argv) -> int:
    if what == "kernels":
        from sandbox.bench.kernels import main_kernels
        return main_kernels(argv)
    from sandbox.bench.train import main_train
    return main_train(argv)


def add_cli(sub) -> None:
    """``sandbox bench kernels|train [options]`` (``--help`` after the name lists the options)."""
    p = sub.add_parser("bench", help="benchmarks (GPU): `sandbox bench kernels [--check]`, `sandbox bench train`",
                       add_help=False)
    p.add_argument("what", choices=["kernels", "train"])
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda a: main(a.what, a.rest))

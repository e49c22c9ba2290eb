"""Kernel benchmark: `python benchmarks/bench_kernels.py [--check] [--shapes B,T,H,K;...] [--out FILE]`.

Same as `sandbox bench kernels`; see sandbox/bench/kernels.py.
"""
import sys

from sandbox.bench.kernels import main_kernels

if __name__ == "__main__":
    sys.exit(main_kernels(sys.argv[1:]))

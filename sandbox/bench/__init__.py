"""Benchmarks and GPU checks: ``sandbox bench kernels`` (kernels.py, with the float64 checks of
checks.py)."""

"""Test-wide settings.

The tests run small shapes, where torch's intra-op threads cost more than they save (a mixer test file ran 4x
faster on one thread on a 2-core machine): each test process, and every process a test starts, uses one thread,
and pytest-xdist spreads the test processes over the cores instead.
"""
import os

os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402  (after the thread count, which torch reads at import)

torch.set_num_threads(1)

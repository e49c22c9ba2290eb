"""Test-wide settings.

The tests run small shapes, where torch's intra-op threads cost more than they save (a mixer test file ran 4x
faster on one thread on a 2-core machine): each test process, and every process a test starts, uses one thread,
and pytest-xdist spreads the test processes over the cores instead.

The tests that stop the local PostgreSQL server take it alone, and the tests that only use it share it (the
``postgres_alone`` and ``postgres_shared`` fixtures): xdist would otherwise run a test against a server that
another test has just stopped.
"""
import fcntl
import os
import tempfile
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402  (after the thread count, which torch reads at import)

torch.set_num_threads(1)


def _postgres_lock(exclusive: bool):
    """Held for a test's length: exclusive for a test that stops the server, shared for one that only uses it."""
    with open(Path(tempfile.gettempdir()) / "sandbox-tests-postgres.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture
def postgres_alone():
    yield from _postgres_lock(exclusive=True)


@pytest.fixture
def postgres_shared():
    yield from _postgres_lock(exclusive=False)

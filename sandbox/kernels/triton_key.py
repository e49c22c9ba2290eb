"""Triton's key of its own installation, computed in a thread while the process gets ready to train.

Before a process launches its first Triton kernel, Triton keys its on-disk cache with a hash of its own
installation (``triton.runtime.cache.triton_key``): SHA-256 over libtriton (about 400 MB) and its compiler's
sources. That took 0.4 s of every ``sandbox train`` on an H200 host (cProfile, 2026-11-29), paid again by each
process even when every kernel then comes from the cache. Reading and hashing release the GIL, so a thread,
started once a run has chosen a GPU, computes it while the main thread builds the models and initialises CUDA.
The key is what Triton's own function returns (and caches for the process), only computed sooner; should the
main thread ask before the thread is done, it computes the key itself, as it would have anyway.
"""
from __future__ import annotations

import threading

_thread: threading.Thread | None = None


def compute_soon() -> threading.Thread | None:
    """Start computing Triton's installation key in a daemon thread (once per process); the thread, or None
    where Triton is not installed or keeps no such key."""
    global _thread
    if _thread is None:
        try:
            from triton.runtime.cache import triton_key
        except ImportError:
            return None
        _thread = threading.Thread(target=triton_key, name="triton-key", daemon=True)
        _thread.start()
    return _thread

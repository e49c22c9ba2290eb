"""Ctrl-C and SIGTERM during training act between steps, not inside one.

Python raises ``KeyboardInterrupt`` wherever the main thread is when the signal comes. Inside a
stacked step (``torch.func.vmap`` over ``functional_call``) that can be while functorch swaps the
replicas' batched tensors in or out: its layer stack is then left broken, the parameters stay
batched, and the checkpoints and ``result.json`` that the interrupt was to write fail to save (seen
on the CPU: 2 in 40 interrupts of a stack of 3). So while training, SIGINT and SIGTERM are held and
handed to the handler that was installed before (the default ``KeyboardInterrupt``, or a sweep
worker's) at the next step boundary, ``HeldSignals.deliver``. A second signal while one is held
acts at once.
"""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class HeldSignals:
    def __init__(self):
        self.pending: tuple[int, object] | None = None
        self.previous: dict[int, object] = {}

    def __enter__(self) -> "HeldSignals":
        if threading.current_thread() is threading.main_thread():   # only there can handlers be set
            for s in SIGNALS:
                self.previous[s] = signal.signal(s, self._hold)
        return self

    def _hold(self, signum, frame) -> None:
        if self.pending is not None:
            self._act(signum, frame)
        else:
            self.pending = (signum, frame)

    def deliver(self) -> None:
        """Hand a held signal to its own handler now (which may raise, e.g. KeyboardInterrupt)."""
        if self.pending is not None:
            signum, frame = self.pending
            self.pending = None
            self._act(signum, frame)

    def _act(self, signum, frame) -> None:
        handler = self.previous.get(signum, signal.SIG_DFL)
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:            # e.g. SIGTERM's: end the process as it would have
            self._restore()
            os.kill(os.getpid(), signum)

    def _restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    def __exit__(self, exc_type, exc, tb) -> None:
        self._restore()
        self.deliver()                  # one that came after the last step (or during an error) acts now


def process_alive(pid: int, module: str) -> bool:
    """Is ``pid`` a live process of ``python -m module`` on this host? (With /proc, a reused pid or a zombie is
    not, and one still in its exec is; without /proc, any live pid counts.)"""
    if Path("/proc/self").exists():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if not cmdline:         # a zombie, or a process just started and still in its exec (no command yet)
                return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
            return module.encode() in cmdline
        except (OSError, IndexError):
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

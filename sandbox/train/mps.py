"""A private CUDA MPS control daemon, so that several training processes share one GPU's units at once rather
than taking turns (1.5-2.1x the work of processes time-slicing one H200: results/sweep_packing/README.md).

The daemon keeps its pipe and log directories under the folder it is given, so it touches no other user of the
GPU; a process is its client when its environment holds ``env`` before it first uses CUDA. Used by the sweep's
workers (``sandbox.sweep.packing``) and by ``sandbox compare``'s two variants on one GPU.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


class MPS:
    """A private CUDA MPS control daemon for the processes started with ``env``."""

    def __init__(self, folder: Path):
        self.root = Path(folder) / "mps"
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.root / "pipe"),
                    "CUDA_MPS_LOG_DIRECTORY": str(self.root / "log")}
        self.running = False
        self.reason = ""

    def start(self) -> bool:
        """Start the daemon; False (and ``reason``) where MPS is not available here."""
        binary = shutil.which("nvidia-cuda-mps-control")
        if binary is None:
            self.reason = "nvidia-cuda-mps-control is not installed"
            return False
        for d in self.env.values():
            Path(d).mkdir(parents=True, exist_ok=True)
        try:
            p = subprocess.run([binary, "-d"], env={**os.environ, **self.env}, capture_output=True, text=True,
                               timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            self.reason = f"nvidia-cuda-mps-control -d failed: {e}"
            return False
        if p.returncode:
            self.reason = f"nvidia-cuda-mps-control -d exited {p.returncode}: {(p.stderr or p.stdout).strip()[:200]}"
            return False
        self.running = True
        return True

    def stop(self) -> None:
        if not self.running:
            return
        try:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env={**os.environ, **self.env},
                           capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            pass
        self.running = False

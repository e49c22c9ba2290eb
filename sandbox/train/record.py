"""The result of one run: what ``result.json`` holds, what a sweep attaches to its trial and writes as a row of
``results.csv``, and what the plots and verdicts read back. One record, so that its fields are named once.

``RunResult.to_dict()`` is the file's content. ``RunResult.from_dict()`` reads any earlier ``result.json`` (a
field it lacks is None; a key it does not know is dropped). ``SUMMARY_FIELDS`` are the record less its bulky parts
(the resolved config and the evaluation history): what a trial carries and a results row shows.

Provenance (``commit``, ``torch``, ``triton``, ``gpu``) says what produced the numbers, so that a result read
months later can be matched to its code and machine.
"""
from __future__ import annotations

import dataclasses
import functools
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("running", "completed", "early_stopped", "stopped", "diverged", "failed", "interrupted")


@dataclass
class RunResult:
    status: str | None                          # one of STATUSES (None: a file that did not say)
    error: str | None = None                    # why it ended if not by itself (diverged, failed, stopped)
    config: dict = field(default_factory=dict)  # the resolved run config (every default filled in)
    # test accuracy: at the last evaluation, and the best one with its step
    final_accuracy: float | None = None
    best_accuracy: float | None = None
    best_step: int | None = None
    # validation accuracy, and the test accuracy at the step chosen on it (None where the run had no val split)
    val_accuracy: float | None = None
    best_val_accuracy: float | None = None
    best_val_step: int | None = None
    test_at_best_val: float | None = None
    steps: int | None = None                    # the last step trained
    # where the time went: the whole run, its training between logs, its group's start-up, its evaluations
    wall_time_s: float | None = None
    train_time_s: float | None = None
    setup_s: float | None = None
    eval_s: float | None = None
    first_eval_s: float | None = None
    steps_per_sec: float | None = None          # its steps once its group was ready, over their seconds
    replicas: int | None = None                 # runs trained together as one stacked model
    compiled_at: int | None = None              # the step from which it ran compiled (None: eager)
    compile_cache: str | None = None            # what torch's compile caches gave its compilation (compile.py)
    phases: dict | None = None                  # seconds per phase over its groups: startup, compile, capture,
                                                # train, eval
    params: int | None = None
    state_size: int | None = None               # recurrent state elements (attention: its key/value cache)
    device: str | None = None
    # provenance
    commit: str | None = None                   # the checkout's git commit, "-dirty" if changed (None outside one)
    torch: str | None = None
    triton: str | None = None
    gpu: str | None = None                      # the GPU's name (None on the CPU)
    history: list[dict] = field(default_factory=list)     # one dict of metrics per evaluation, with its step

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunResult:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{"status": None, **{k: v for k, v in data.items() if k in known}})

    def summary(self) -> dict:
        return {k: getattr(self, k) for k in SUMMARY_FIELDS}


FIELDS = tuple(f.name for f in dataclasses.fields(RunResult))
SUMMARY_FIELDS = tuple(f for f in FIELDS if f not in ("config", "history"))


def val_choice(history: list[dict]) -> dict:
    """The validation fields of a result from its evaluations: the last val accuracy, the best one and its step
    (the earliest of equals), and the test accuracy at that step; empty for a run without a val split."""
    evals = [h for h in history if h.get("val/accuracy") is not None]
    if not evals:
        return {}
    best = max(evals, key=lambda h: h["val/accuracy"])          # max keeps the first of equals
    return {"val_accuracy": evals[-1]["val/accuracy"], "best_val_accuracy": best["val/accuracy"],
            "best_val_step": best["step"], "test_at_best_val": best.get("test/accuracy")}


def provenance(device) -> dict[str, Any]:
    """commit, torch, triton and gpu of this process, for a run on ``device``."""
    import torch
    gpu = torch.cuda.get_device_name(device) if getattr(device, "type", str(device)).startswith("cuda") else None
    return {"commit": _commit(), "torch": torch.__version__, "triton": _version("triton"), "gpu": gpu}


@functools.lru_cache(maxsize=1)
def _commit() -> str | None:
    try:
        # "-dirty" where the code differs from its commit: a copy of a working tree names the commit it started from
        out = subprocess.run(["git", "describe", "--always", "--abbrev=40", "--dirty"],
                             cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(package)
    except PackageNotFoundError:
        return None

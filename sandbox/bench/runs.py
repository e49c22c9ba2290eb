"""A configuration trained in a process of its own (``step_worker.py``), by this checkout's code or by another
version's (``ref_code``: a directory or a commit, checked out as a git worktree), and what it measured: steady
ms per step, the seconds outside the steady steps, peak memory, the losses, and with ``--profile`` the GPU time
of each kernel. ``sandbox bench train`` (the yardstick, ``train.py``) and its sweep estimate (``estimate.py``) run
every timing through here, so both versions of a comparison run the same way, side by side in one run.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]          # this checkout (holds the sandbox package)
MIN_STEPS = 150  # the steady rate: the median of the rates logged every 25 steps after the first 100


def knows_compile(code: Path) -> bool:
    """Whether a version's config has ``train.compile`` (fb670ab, before it, does not and rejects the key)."""
    import re
    text = (code / "sandbox" / "config.py").read_text()
    return re.search(r"^\s+compile\s*:", text, re.M) is not None


def ref_code(ref: str) -> Path:
    """A directory holding another version's ``sandbox`` package: ``ref`` itself if it is one, else
    a git worktree of that commit (made once, under the system's temp directory)."""
    if (Path(ref) / "sandbox" / "__init__.py").exists():
        return Path(ref).resolve()
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                         capture_output=True, text=True)
    if rev.returncode:
        raise ValueError(f"--ref: {ref!r} is neither a directory with a sandbox package nor a commit here")
    sha = rev.stdout.strip()
    path = Path(tempfile.gettempdir()) / f"sandbox-ref-{sha[:12]}"
    if not (path / "sandbox" / "__init__.py").exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), sha], check=True,
                       capture_output=True)
    return path


def run_one(code: Path, name: str, data: dict, out: Path, *, replicas: int = 1, roofline: bool = False,
            profile: bool = False, warm: bool = False) -> dict:
    shutil.rmtree(out / "run", ignore_errors=True)       # a finished run there would only return its result
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(data))
    cmd = [sys.executable, str(Path(__file__).with_name("step_worker.py")), str(out / "config.json"),
           str(out / "run"), "--replicas", str(replicas)] + (["--roofline"] if roofline else []) + \
        (["--profile"] if profile else []) + (["--warm"] if warm else [])
    env = dict(os.environ, PYTHONPATH=str(code), PYTHONUNBUFFERED="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(out))
    (out / "log.txt").write_text(p.stdout + p.stderr)
    if p.returncode:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"{name}: exit {p.returncode}: {tail[:300]}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def loss_gap(a: list, b: list, upto: int = 200) -> float | None:
    """Largest |a - b| / |b| over the logged steps <= upto that both runs logged."""
    bs = dict((s, v) for s, v in b)
    gaps = [abs(v - bs[s]) / abs(bs[s]) for s, v in a if s <= upto and s in bs and bs[s]]
    return max(gaps) if gaps else None


def generator_row(prof: list[dict]) -> int:
    """Where a profile's generator block starts (its marker row; the step's kernels come before it)."""
    return next((i for i, k in enumerate(prof) if k["kernel"].startswith("GENERATOR")), len(prof))


def print_profile(res: dict) -> None:
    """The 40 largest kernels of a timed run's step (``--profile``; the json keeps them all), and the
    generator's."""
    rows = res.get("profile", [])
    cut = generator_row(rows)
    for k in rows[:min(cut, 41)] + rows[cut:]:
        print(f"    {k['ms_per_step']:8.4f} ms  {k['calls']:6.1f}x  {k['kernel']}")

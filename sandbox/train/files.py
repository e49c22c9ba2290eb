"""Files that other processes read while they may be rewritten (results, checkpoints, the sweep's name, paces):
written to a temporary file of this process and renamed, so a reader sees the old or the new content, never a
part. A write cut off (Ctrl-C during a checkpoint's save, a killed process, a full disk) leaves the old file."""
from __future__ import annotations

import json
import os
from pathlib import Path


def _replace(path: Path, write) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, obj, **dumps) -> None:
    _replace(path, lambda tmp: tmp.write_text(json.dumps(obj, **dumps)))


def save_torch(path: Path, obj) -> None:
    import torch
    _replace(path, lambda tmp: torch.save(obj, tmp))

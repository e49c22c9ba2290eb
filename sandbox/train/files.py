"""Files that other processes read while they may be rewritten (results, checkpoints, the sweep's name, paces):
written to a temporary file of this process and renamed, so a reader sees the old or the new content, never a
part. A write cut off (Ctrl-C during a checkpoint's save, a killed process, a full disk) leaves the old file.

``save_torch_soon`` writes a checkpoint in a background thread, in the order of the calls, so that training goes
on meanwhile (writing a stack's checkpoints took most of an evaluation's time; results/throughput/README.md);
``saves_done`` waits for those writes (before a result says a run ended, or another group reads
the checkpoints)."""
from __future__ import annotations

import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

_writer: ThreadPoolExecutor | None = None     # one thread: a path's writes land in the order they were asked for
_pending: list[Future] = []


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


def save_torch_soon(path: Path, obj) -> None:
    """``save_torch`` in the background. ``obj`` must not change afterwards: give it copies (CPU tensors of their
    own, a copied state). A write that failed before raises here, or in ``saves_done``."""
    global _writer
    _raise_failed()
    if _writer is None:
        _writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoints")
    _pending.append(_writer.submit(save_torch, path, obj))


def _raise_failed() -> None:
    while _pending and _pending[0].done():
        _pending.pop(0).result()


def saves_done() -> None:
    """Wait until every ``save_torch_soon`` file is written. A Ctrl-C meanwhile waits for them too (the files stay
    whole and current), then is raised."""
    interrupted = None
    while _pending:
        try:
            _pending[0].result()
        except KeyboardInterrupt as e:       # the signal, in this thread: the write goes on in its own
            interrupted = e
            continue
        finally:
            if _pending and _pending[0].done():
                _pending.pop(0)
    if interrupted is not None:
        raise interrupted

"""Compile a stack's training step in a helper process while the stack trains uncompiled.

A stack that compiles in its own process leaves the GPU idle for the whole compilation (18-27 s on the
H200, measured in a fresh process; up to a third of a short Figure 8 stack). Once the stack's step is
captured, and where the GPU has room (``room``), a helper builds the same group, compiles its step and
runs it once: that fills the on-disk caches (Inductor's FX graph cache and AOTAutograd's cache, under
``TORCHINDUCTOR_CACHE_DIR``). The stack meanwhile goes on with its uncompiled CUDA graph, and when it
compiles, it only traces the step (Dynamo) and finds the rest in the caches.

A separate process, not a thread: compiling traces through functorch's vmap, whose state is shared by
the threads of a process, and a thread compiling beside the stack's own vmapped steps breaks both.

    python -m sandbox.train.precompile < configs.json     # a JSON list of run configs (``to_dict``)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

STEPS = 3           # the helper's runs are this long: its batch pool holds no more than it uses


def room(device) -> bool:
    """Whether a helper fits beside the stack: on a GPU with room for twice what this process holds at its
    peak (the helper holds about as much, and other workers may share the GPU)."""
    import torch
    if device.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(device)
    return free > 2 * torch.cuda.max_memory_reserved(device)


def start(cfgs) -> subprocess.Popen:
    """Start compiling the step of the stack of runs ``cfgs`` in a helper process (its output discarded)."""
    from sandbox.config import to_dict
    data = json.dumps([to_dict(c) for c in cfgs])
    p = subprocess.Popen([sys.executable, "-m", "sandbox.train.precompile"], stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    p.stdin.write(data.encode())
    p.stdin.close()
    return p


def main() -> int:
    from sandbox.config import config_from_dict
    from sandbox.train.group import Group
    cfgs = []
    for d in json.loads(sys.stdin.read()):
        d["train"]["steps"] = STEPS
        cfgs.append(config_from_dict(d, "<precompile>"))
    group = Group(cfgs)
    group.step.compile_now()
    group.step(*group.batch(0))       # an eager (not yet captured) compiled step: forward and backward
    if group.device.type == "cuda":
        import torch
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())

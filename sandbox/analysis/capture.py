"""Load a trained run and record what its mixers expose through the capture hook.

``load_run(run_dir)`` rebuilds the model from the checkpoint's config and weights;
``capture(model, task, ...)`` switches ``mixer.capture`` on, runs test batches and returns
one dict per layer of tensors concatenated over the batches (on the CPU, float32), with
whatever each mixer recorded (``keys``, ``values``, ``gates``, ``routing*``, ``final_state``...).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from sandbox.config import RunConfig, config_from_dict


@dataclass
class LoadedRun:
    run_dir: Path
    cfg: RunConfig
    model: torch.nn.Module
    task: object
    step: int                 # training step of the weights loaded
    result: dict | None       # result.json, when present


def load_run(run_dir, device: str = "cpu") -> LoadedRun:
    """Model (eval mode) and task of a run directory written by ``train``: its weights at the step chosen on val
    where it has them, else its final checkpoint (``train.loop.weights_file``)."""
    from sandbox.train import build, resolve_device
    from sandbox.train.loop import weights_file

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run_dir: {run_dir} is not a directory")
    ckpt_path = weights_file(run_dir)
    if not ckpt_path.is_file():
        raise ValueError(f"run_dir: {run_dir} has no checkpoint.pt (is it a run directory of `sandbox train`?)")
    result = None
    if (run_dir / "result.json").is_file():
        result = json.loads((run_dir / "result.json").read_text())
    dev = resolve_device(device)
    ckpt = torch.load(ckpt_path, map_location=dev, weights_only=False)
    config = ckpt.get("config") or (result or {}).get("config")
    if not isinstance(config, dict):
        raise ValueError(f"run_dir: {ckpt_path} holds no config")
    cfg = config_from_dict(config, str(ckpt_path))
    task, model = build(cfg, dev)
    model.load_state_dict(ckpt["model"])
    model.eval()
    return LoadedRun(run_dir, cfg, model, task, int(ckpt.get("step", ckpt.get("state", {}).get("step", 0))), result)


def _concat(parts: list[torch.Tensor]) -> torch.Tensor:
    try:
        return torch.cat(parts, 0)
    except RuntimeError:           # shapes that do not stack along the batch: keep the first batch
        return parts[0]


@torch.no_grad()
def capture(model, task, batches: int = 4, batch_size: int = 64, layers=None) -> tuple[list[dict], dict]:
    """Run ``batches`` test batches with capture on. Returns ``(per_layer, data)``: one dict of
    tensors per layer (empty for layers not asked for) and ``data = {"inputs", "targets"}``."""
    if batches < 1 or batch_size < 1:
        raise ValueError(f"batches: need batches >= 1 and batch_size >= 1, got {batches}, {batch_size}")
    mixers = list(model.mixers)
    wanted = range(len(mixers)) if layers is None else list(layers)
    for l in wanted:
        if not 0 <= l < len(mixers):
            raise ValueError(f"layer: {l} is out of range; the model has layers 0..{len(mixers) - 1}")
    parts: list[dict[str, list]] = [dict() for _ in mixers]
    data: dict[str, list] = {"inputs": [], "targets": []}
    try:
        for i, (x, y) in enumerate(task.test_batches(batch_size)):
            if i >= batches:
                break
            for l in wanted:
                mixers[l].capture = {}
            model(x)
            data["inputs"].append(x.cpu())
            data["targets"].append(y.cpu())
            for l in wanted:
                for name, t in mixers[l].capture.items():
                    t = t.cpu()
                    parts[l].setdefault(name, []).append(t.float() if t.is_floating_point() else t)
    finally:
        for m in mixers:
            m.capture = None
    per_layer = [{k: _concat(v) for k, v in p.items()} for p in parts]
    return per_layer, {k: torch.cat(v, 0) for k, v in data.items() if v}

"""One training run: AdamW + warmup/cosine, bf16 autocast on CUDA, periodic test
accuracy, early stop, resumable checkpoint, TensorBoard scalars + hparams,
a rich progress bar and ``result.json``.

The hot loop never synchronises with the device except every ``log_every`` steps
(one ``.item()`` for the running loss, which is also where NaN is caught) and at
evaluations.
"""
from __future__ import annotations

import json
import math
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from sandbox.config import RunConfig, flatten, to_dict
from sandbox.graph_step import GraphedStep, graph_safe
from sandbox.model import LanguageModel
from sandbox.tasks import TrainBatches, make_task


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


class StopTraining(Exception):
    """Raised by an ``on_eval`` callback to end a run early (e.g. an Optuna pruner)."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"train.device: {name} requested but CUDA is not available")
    return torch.device(name)


def build(cfg: RunConfig, device: torch.device):
    """The task and a freshly initialised model (initialised on the CPU so the seed gives
    the same weights on any device)."""
    task = make_task(cfg.task.params, seed=cfg.seed, device=device)
    torch.manual_seed(cfg.seed)
    model = LanguageModel(cfg.model, task.vocab_size, task.seq_len)
    return task, model.to(device)


def use_cuda_graph(setting, device: torch.device, model) -> bool:
    """``train.cuda_graph``: auto = on CUDA when every mixer is graph-safe; true insists."""
    if setting == "auto":
        return device.type == "cuda" and graph_safe(model)
    if setting and device.type != "cuda":
        raise ValueError(f"train.cuda_graph: true needs a CUDA device, got {device}")
    if setting and not graph_safe(model):
        names = sorted({m.mixer_name for m in model.mixers if not m.graph_safe()})
        raise ValueError(f"train.cuda_graph: true, but mixer(s) {', '.join(names)} are not graph-safe")
    return bool(setting)


def lr_lambda(steps: int, warmup_frac: float) -> Callable[[int], float]:
    warmup = int(warmup_frac * steps)

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return f


def scored_positions(targets: torch.Tensor, per_row: int | None):
    """``(positions [B, P], targets [B, P])`` covering every scored target when a row has at most
    ``per_row`` of them (``None``: all positions). Fixed shapes, so no host sync."""
    if per_row is None or per_row >= targets.shape[1]:
        return None, targets
    pos = torch.topk((targets != -100).to(torch.float16), per_row, dim=1, sorted=False).indices
    return pos, targets.gather(1, pos)


@torch.no_grad()
def evaluate(model, task, batch_size: int, autocast) -> dict:
    model.eval()
    correct = torch.zeros((), device=task.device, dtype=torch.int64)
    scored = torch.zeros((), device=task.device, dtype=torch.int64)
    loss_sum = torch.zeros((), device=task.device, dtype=torch.float64)
    for x, y in task.test_batches(batch_size):
        pos, y = scored_positions(y, getattr(task, "max_targets", None))
        with autocast():
            logits = model(x, pos)
        mask = y != -100
        correct += ((logits.argmax(-1) == y) & mask).sum()
        scored += mask.sum()
        loss_sum += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100,
                                    reduction="sum").double()
    model.train()
    n = max(int(scored), 1)
    return {"test/accuracy": int(correct) / n, "test/loss": float(loss_sum) / n}


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def _hparams(cfg: RunConfig) -> dict:
    out = {}
    for k, v in flatten(to_dict(cfg)).items():
        out[k] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out


def _progress(enabled: bool, total: int, title: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    return Progress(TextColumn(f"[bold]{title}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    TextColumn("{task.fields[info]}"), disable=not enabled, transient=False)


def train(cfg: RunConfig, out_dir, *, progress: bool = True,
          on_eval: Callable[[int, dict], None] | None = None) -> dict:
    """Train one run into ``out_dir`` (resuming from its checkpoint if one is there).

    Returns the result dict also written to ``out_dir/result.json``. Raises
    ``TrainingDiverged`` on NaN/inf loss (after writing result.json with status
    "diverged").
    """
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams as hparams_summary

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.train.device)
    tc = cfg.train
    task, model = build(cfg, device)
    use_bf16 = tc.precision == "bf16" or (tc.precision == "auto" and device.type == "cuda")
    use_graph = use_cuda_graph(tc.cuda_graph, device, model)
    # a graph replays its casts, so autocast must not cache them across the capture
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=not use_graph)) \
        if use_bf16 else nullcontext

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=tc.lr, betas=tuple(tc.betas), fused=device.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(tc.steps, tc.warmup_frac))

    config_dict = to_dict(cfg)
    state = {"step": 0, "best_accuracy": 0.0, "best_step": 0, "accuracy": None, "train_time": 0.0,
             "history": []}
    ckpt_path = out / "checkpoint.pt"
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=False)
        if ckpt["config"] != config_dict:
            raise ValueError(f"{out}: holds a checkpoint of a different config; choose another --out")
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        state = ckpt["state"]

    writer = SummaryWriter(log_dir=str(out))
    if state["step"] == 0:
        # hparams in the run's own folder (add_hparams would create a sub-run)
        for s in hparams_summary(_hparams(cfg), {"test/accuracy": 0.0, "test/best_accuracy": 0.0}):
            writer.file_writer.add_summary(s)

    def save():
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(), "state": state, "config": config_dict}, ckpt_path)

    n_params = model.num_params()
    state_size = model.state_size(task.seq_len)
    status, error = "running", None
    t_start = time.perf_counter()

    def result() -> dict:
        steps_done = state["step"]
        return {"status": status, "error": error, "config": config_dict,
                "final_accuracy": state["accuracy"], "best_accuracy": state["best_accuracy"],
                "best_step": state["best_step"], "steps": steps_done,
                "wall_time_s": round(time.perf_counter() - t_start, 3),
                "train_time_s": round(state["train_time"], 3),
                "steps_per_sec": round(steps_done / state["train_time"], 2) if state["train_time"] else None,
                "params": n_params, "state_size": state_size, "device": str(device),
                "history": state["history"]}

    def do_eval(step: int) -> bool:
        metrics = evaluate(model, task, tc.eval_batch_size, autocast)
        acc = metrics["test/accuracy"]
        state["accuracy"] = acc
        if acc > state["best_accuracy"] or state["best_step"] == 0:
            state["best_accuracy"], state["best_step"] = max(acc, state["best_accuracy"]), step
        metrics["test/best_accuracy"] = state["best_accuracy"]
        state["history"].append({"step": step, **metrics})
        for k, v in metrics.items():
            writer.add_scalar(k, v, step)
        writer.flush()
        save()
        if on_eval is not None:
            on_eval(step, metrics)
        return tc.early_stop is not None and acc >= tc.early_stop

    per_row = getattr(task, "max_targets", None)
    batches = TrainBatches(task, tc.batch_size)
    title = cfg.name or f"{'+'.join(dict.fromkeys(cfg.model.layer_mixers()))} d{cfg.model.d_model}"
    model.train()
    loss_acc = torch.zeros((), device=device)

    def loss_fn(x, y):
        pos, y = scored_positions(y, per_row)
        with autocast():
            logits = model(x, pos)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
            aux = model.aux_loss()
        return (loss + aux if aux is not None else loss), loss

    forward_backward = GraphedStep(loss_fn, list(model.parameters()), loss_acc,
                                   capture_after=2 if use_graph else None)
    n_acc = 0
    t_log = time.perf_counter()
    steps_at_log = state["step"]
    stopped = False
    try:
        with _progress(progress, tc.steps, title) as bar:
            bar_task = bar.add_task("train", total=tc.steps, completed=state["step"], info="")
            while state["step"] < tc.steps and not stopped:
                step = state["step"]
                forward_backward(*batches[step])
                if tc.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
                opt.step()
                sched.step()
                n_acc += 1
                state["step"] = step = step + 1
                last = step == tc.steps
                if step % tc.log_every == 0 or last or step % tc.eval_every == 0:
                    mean_loss = loss_acc.item() / n_acc       # the one sync per log interval
                    now = time.perf_counter()
                    state["train_time"] += now - t_log
                    sps = (step - steps_at_log) / max(now - t_log, 1e-9)
                    if not math.isfinite(mean_loss):
                        raise TrainingDiverged(f"loss became {mean_loss} at step {step} (lr {tc.lr:g})")
                    writer.add_scalar("train/loss", mean_loss, step)
                    writer.add_scalar("train/lr", sched.get_last_lr()[0], step)
                    writer.add_scalar("perf/steps_per_sec", sps, step)
                    loss_acc.zero_()
                    n_acc = 0
                    if step % tc.eval_every == 0 or last:
                        stopped = do_eval(step)
                    acc = state["accuracy"]
                    bar.update(bar_task, completed=step, info=f"loss {mean_loss:.3f}  acc "
                               f"{'-' if acc is None else f'{acc:.3f}'}  {sps:.1f} steps/s")
                    t_log = time.perf_counter()
                    steps_at_log = step
        status = "early_stopped" if stopped and state["step"] < tc.steps else "completed"
    except TrainingDiverged as e:
        status, error = "diverged", str(e)
        raise
    except StopTraining as e:
        status, error = "stopped", str(e) or "stopped by callback"
    except KeyboardInterrupt:
        status, error = "interrupted", "interrupted; rerun with the same --out to resume"
        save()
        raise
    except BaseException as e:
        status, error = "failed", f"{type(e).__name__}: {e}"
        raise
    finally:
        res = result()
        _write_json(out / "result.json", res)
        if status in ("completed", "early_stopped", "stopped"):
            writer.add_scalar("test/final_accuracy", state["accuracy"] or 0.0, state["step"])
        writer.close()
    return res

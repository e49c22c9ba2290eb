"""The run loop: AdamW + warm-up/cosine, bf16 autocast on CUDA, periodic test accuracy, early
stop, resumable checkpoints, TensorBoard scalars + hparams, a rich progress bar and
``result.json`` - for one run, or for several runs that train as one stacked model.

``train(cfg, out)`` is one run. ``train_replicas(cfgs, outs)`` trains runs whose configs differ
only in ``train.lr`` and ``seed`` together (``group.py``, ``step.py``): each keeps its own
directory, checkpoint, TensorBoard events, early stop and result, exactly as if it had run alone.

The hot loop never synchronises with the device except once when the step is ready (to time the
group's start), every ``log_every`` steps (one read of the running losses, which is also where a
non-finite loss is caught) and at evaluations.
"""
from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from typing import Callable

import torch

from sandbox.config import RunConfig, flatten, to_dict
from sandbox.train.evaluation import evaluate_stack
from sandbox.train.files import save_torch_soon, saves_done, write_json
import sandbox.train.precompile as precompile
from sandbox.train.group import Group, stack_key, worth_regrouping
from sandbox.train.signals import HeldSignals
from sandbox.train.step import cache_warm, mark_cache_warm

DONE = ("completed", "early_stopped")          # a rerun of such a directory returns its result


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


class StopTraining(Exception):
    """Raised by an ``on_eval`` callback to end a run early (e.g. an Optuna pruner)."""


def _hparams(cfg: RunConfig) -> dict:
    out = {}
    for k, v in flatten(to_dict(cfg)).items():
        out[k] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out


def _progress(enabled: bool, title: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    return Progress(TextColumn(f"[bold]{title}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    TextColumn("{task.fields[info]}"), disable=not enabled, transient=False)


class _Run:
    """One replica's bookkeeping: its directory, TensorBoard writer, state, checkpoint and result."""

    def __init__(self, cfg: RunConfig, out: Path, task, model, t_start: float):
        from torch.utils.tensorboard import SummaryWriter

        self.cfg, self.out, self.task, self.model, self.t_start = cfg, out, task, model, t_start
        self.config = to_dict(cfg)
        # train_time: the seconds between its logs, evaluations left out (its group's first step, which may
        # compile, in it); trained_steps over trained_time: its steps once the group was ready, its training rate
        self.state = {"step": 0, "best_accuracy": 0.0, "best_step": 0, "accuracy": None, "train_time": 0.0,
                      "trained_steps": 0, "trained_time": 0.0, "history": []}
        self.status, self.error = "running", None
        self.ckpt = out / "checkpoint.pt"
        self.writer = SummaryWriter(log_dir=str(out))
        self.params, self.state_size = model.num_params(), model.state_size(task.seq_len)
        self.compiled_at = None          # the step from which the training step ran compiled (its first, or None)
        # where a run's wall time goes besides its replayed steps: the group's start-up (building, data pool,
        # compilation and graph capture) and its evaluations (with the checkpoint saved at each)
        self.setup_s, self.eval_s = 0.0, 0.0
        self.first_eval_s = None         # its first evaluation (which may compile kernels for the test batch)
        self.precompiled = None          # whether the step's kind was in the on-disk caches (a helper's) at the start

    def load(self, step, r: int, device) -> None:
        if not self.ckpt.exists():
            from torch.utils.tensorboard.summary import hparams as hparams_summary
            # hparams in the run's own folder (add_hparams would create a sub-run)
            for s in hparams_summary(_hparams(self.cfg), {"test/accuracy": 0.0, "test/best_accuracy": 0.0}):
                self.writer.file_writer.add_summary(s)
            return
        ckpt = torch.load(self.ckpt, map_location=device, weights_only=False)
        if ckpt["config"] != self.config:
            raise ValueError(f"{self.out}: holds a checkpoint of a different config; choose another --out")
        self.model.load_state_dict(ckpt["model"])
        step.load_optimizer_state(r, ckpt["optimizer"])
        self.state = ckpt["state"]

    def save(self, step, r: int) -> None:
        """The checkpoint, written in the background (``finish`` waits for it): copies on the CPU of what training
        changes next (the parameters, views of the stack's flat weights, which torch.save would store whole)."""
        model = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        save_torch_soon(self.ckpt, {"model": model, "optimizer": step.optimizer_state(r, "cpu"),
                                    "state": copy.deepcopy(self.state), "config": self.config})

    def result(self, replicas: int = 1) -> dict:
        from sandbox.train.record import RunResult, provenance, val_choice
        s = self.state
        return RunResult(
            status=self.status, error=self.error, config=self.config,
            final_accuracy=s["accuracy"], best_accuracy=s["best_accuracy"], best_step=s["best_step"], steps=s["step"],
            **val_choice(s["history"]),
            wall_time_s=round(time.perf_counter() - self.t_start, 3), train_time_s=round(s["train_time"], 3),
            steps_per_sec=round(s["trained_steps"] / s["trained_time"], 2) if s.get("trained_time") else None,
            setup_s=round(self.setup_s, 3), eval_s=round(self.eval_s, 3),
            first_eval_s=None if self.first_eval_s is None else round(self.first_eval_s, 3),
            replicas=replicas, compiled_at=self.compiled_at, precompiled=self.precompiled, params=self.params,
            state_size=self.state_size, device=str(self.task.device), **provenance(self.task.device),
            history=s["history"]).to_dict()

    def finish(self, status: str, error: str | None = None, replicas: int = 1) -> dict:
        self.status, self.error = status, error
        res = self.result(replicas)
        saves_done()                    # a result that says the run ended comes with its final checkpoint
        write_json(self.out / "result.json", res, indent=2, default=str)
        if status in ("completed", "early_stopped", "stopped"):
            self.writer.add_scalar("test/final_accuracy", self.state["accuracy"] or 0.0, self.state["step"])
        self.writer.close()
        return res


def _finished(out: Path) -> dict | None:
    """The stored result of a run directory that already ended (its checkpoint is its final state)."""
    path = out / "result.json"
    if path.exists() and (out / "checkpoint.pt").exists():
        try:
            res = json.loads(path.read_text())
        except ValueError:
            return None
        if res.get("status") in DONE:
            return res
    return None


def train(cfg: RunConfig, out_dir, *, progress: bool = True,
          on_eval: Callable[[int, dict], None] | None = None) -> dict:
    """Train one run into ``out_dir`` (resuming from its checkpoint if one is there).

    Returns the result dict also written to ``out_dir/result.json``. Raises
    ``TrainingDiverged`` on NaN/inf loss (after writing result.json with status "diverged").
    """
    res = train_replicas([cfg], [out_dir], progress=progress, on_eval=[on_eval] if on_eval else None)[0]
    if res["status"] == "diverged":
        raise TrainingDiverged(res["error"])
    return res


def train_replicas(cfgs: list[RunConfig], out_dirs: list, *, progress: bool = True,
                   on_eval: list[Callable[[int, dict], None] | None] | None = None,
                   prefetch: Callable[[], list[list[RunConfig]]] | None = None) -> list[dict]:
    """Train runs that differ only in ``train.lr`` and ``seed`` as one stacked model, each into its own
    directory (resuming from checkpoints; runs whose checkpoints are at different steps train as
    separate stacks). A directory whose run
    already ended returns its stored result. ``on_eval[r](step, metrics)`` may raise ``StopTraining``
    to stop run r alone. ``prefetch()``, called once a group is captured, names the stacks that will train
    next in this process (a sweep worker's queue): a helper compiles their steps meanwhile (precompile.py).
    Returns the result of each run (a diverged run has status "diverged")."""
    if len({stack_key(c) for c in cfgs}) != 1:
        raise ValueError("train_replicas: the runs must differ only in train.lr, seed and name")
    outs = [Path(o) for o in out_dirs]
    results: list[dict | None] = [_finished(o) for o in outs]
    callbacks = on_eval or [None] * len(cfgs)
    t_start = time.perf_counter()
    while True:
        todo = [i for i, r in enumerate(results) if r is None]
        if not todo:
            return results
        # runs resumed from checkpoints at different steps train as separate groups, the earliest first;
        # a group that shrank enough hands its running replicas back to train as a new group
        saves_done()                            # the checkpoints a regrouped stack handed back
        at = {i: _checkpoint_step(outs[i]) for i in todo}
        todo = [i for i in todo if at[i] == min(at.values())]
        done = _train_group([cfgs[i] for i in todo], [outs[i] for i in todo], progress,
                            [callbacks[i] for i in todo], t_start, prefetch)
        for i, res in zip(todo, done):
            results[i] = res


def _checkpoint_step(out: Path) -> int:
    ckpt = out / "checkpoint.pt"
    if not ckpt.exists():
        return 0
    return int(torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)["state"]["step"])


def _train_group(cfgs, outs, progress, callbacks, t_start, prefetch=None) -> list[dict]:
    """Train one stacked group; the runs it hands back unfinished (None) continue from their checkpoints."""
    t_group = time.perf_counter()
    tc = cfgs[0].train
    R = len(cfgs)
    for o in outs:
        o.mkdir(parents=True, exist_ok=True)
    warming = precompile.warm_kernels(cfgs)    # a cold compilation here: a helper compiles the Triton kernels
    group = Group(cfgs)
    device, step, batch = group.device, group.step, group.batch
    # helpers compile the steps of the stacks that train next (``prefetch``, precompile.py), started once this
    # stack's own memory is known, and outlive it
    helpers, ahead = [], []
    runs = [_Run(c, o, t, m, t_start) for c, o, t, m in zip(cfgs, outs, group.tasks, group.models)]
    for r, run in enumerate(runs):
        run.load(step, r, device)
    start = runs[0].state["step"]           # train_replicas groups the runs by their checkpoints' step
    step.start_at(start)
    if step.compiled:                       # train.compile: true, or auto on CUDA: from its first step
        if not group.warm:                  # a helper compiling this kind now: its caches, not a second compilation
            precompile.wait(step.kind)
            group.warm = cache_warm(step.kind)
        for run in runs:
            run.compiled_at, run.precompiled = start, group.warm

    active = list(range(R))
    title = cfgs[0].name or f"{'+'.join(dict.fromkeys(cfgs[0].model.layer_mixers()))} d{cfgs[0].model.d_model}"
    if R > 1:
        title += f" x{R}"

    def stop(r, status, error=None):
        step.freeze(r)
        active.remove(r)
        if status != "diverged":                         # keep the last finite checkpoint
            runs[r].save(step, r)
        results[r] = runs[r].finish(status, error, R)

    def do_evals(s, which) -> None:
        """Evaluate the replicas ``which`` at step ``s`` (all in one stacked forward; each is charged its share)."""
        if not which:
            return
        t_eval = time.perf_counter()
        metrics = evaluate_stack(step, group.tasks, tc.eval_batch_size)
        share = (time.perf_counter() - t_eval) / len(which)
        for r in which:
            record_eval(r, s, metrics[r], share)

    def record_eval(r, s, metrics, forward_s) -> None:
        run = runs[r]
        t_eval = time.perf_counter() - forward_s
        acc = metrics["test/accuracy"]
        run.state["accuracy"] = acc
        if acc > run.state["best_accuracy"] or run.state["best_step"] == 0:
            run.state["best_accuracy"], run.state["best_step"] = max(acc, run.state["best_accuracy"]), s
        metrics["test/best_accuracy"] = run.state["best_accuracy"]
        run.state["history"].append({"step": s, **metrics})
        for k, v in metrics.items():
            run.writer.add_scalar(k, v, s)
        run.writer.flush()
        run.save(step, r)
        run.eval_s += time.perf_counter() - t_eval
        if run.first_eval_s is None:
            run.first_eval_s = run.eval_s
        try:
            if callbacks[r] is not None:
                callbacks[r](s, metrics)
        except StopTraining as e:
            return stop(r, "stopped", str(e) or "stopped by callback")
        if tc.early_stop is not None and acc >= tc.early_stop and s < tc.steps:
            stop(r, "early_stopped")

    results: list[dict | None] = [None] * R
    if start and start % tc.eval_every == 0:       # interrupted between a step and its evaluation
        do_evals(start, [r for r in active
                         if not runs[r].state["history"] or runs[r].state["history"][-1]["step"] != start])
    n_acc, s = 0, start
    t_log = time.perf_counter()
    steps_at_log = s
    # the seconds the group spent starting (building, pool, compilation, capture), and when it got ready
    setup_s, t_ready, ready, s_ready = 0.0, 0.0, False, start
    try:
        with _progress(progress, title) as bar, HeldSignals() as held:
            bar_task = bar.add_task("train", total=tc.steps, completed=s, info="")
            while s < tc.steps and active:
                held.deliver()          # Ctrl-C / SIGTERM act here, between steps (signals.py says why)
                step(*batch(s))
                n_acc += 1
                s += 1
                if not ready and (step.graph is not None or step.capture_after is None):
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    t_ready, ready, s_ready = time.perf_counter(), True, s
                    setup_s = t_ready - t_group
                    for run in runs:
                        run.setup_s = setup_s
                    if step.compiled:                # its caches are warm now: helpers leave its kind out
                        mark_cache_warm(step.kind, setup_s)
                    if warming is not None:          # its kernels are compiled: by then by this process too
                        precompile.stop(warming)
                    fit = 0 if prefetch is None or precompile.running() else precompile.room(device)
                    if fit:
                        ahead = prefetch()
                        helpers = precompile.start(ahead, fit)
                for r in active:
                    runs[r].state["step"] = s
                last = s == tc.steps
                if s % tc.log_every == 0 or last or s % tc.eval_every == 0:
                    losses = (step.loss_sum / n_acc).tolist()        # the one sync per log interval
                    lrs = step.lr.tolist()
                    now = time.perf_counter()
                    sps = (s - steps_at_log) / max(now - t_log, 1e-9)
                    for r in list(active):
                        run = runs[r]
                        run.state["train_time"] += now - t_log
                        if ready:                # the part of this interval after the group got ready
                            run.state["trained_time"] = run.state.get("trained_time", 0.0) + now - max(t_log, t_ready)
                            run.state["trained_steps"] = run.state.get("trained_steps", 0) + s - max(steps_at_log,
                                                                                                   s_ready)
                        if not math.isfinite(losses[r]):
                            stop(r, "diverged", f"loss became {losses[r]} at step {s} (lr {run.cfg.train.lr:g})")
                            continue
                        run.writer.add_scalar("train/loss", losses[r], s)
                        run.writer.add_scalar("train/lr", lrs[r], s)
                        run.writer.add_scalar("perf/steps_per_sec", sps, s)
                    step.loss_sum.zero_()
                    n_acc = 0
                    if (s % tc.eval_every == 0 or last) and active:
                        do_evals(s, list(active))
                    info = _info([runs[r] for r in active] or runs, [losses[r] for r in active] or losses, sps)
                    bar.update(bar_task, completed=s, info=info)
                    steady = ready and t_log >= t_ready          # sps then counts replayed steps only
                    if steady and worth_regrouping(len(active), R, tc.steps - s, 1 / max(sps, 1e-9), setup_s):
                        for r in active:         # hand the running replicas back, to go on as a smaller group
                            runs[r].save(step, r)
                            runs[r].writer.close()
                        return results
                    t_log = time.perf_counter()
                    steps_at_log = s
        for r in list(active):
            stop(r, "completed")
    except KeyboardInterrupt:
        for r in list(active):
            runs[r].save(step, r)
            results[r] = runs[r].finish("interrupted", "interrupted; rerun with the same --out to resume", R)
        raise
    except BaseException as e:
        for r in list(active):
            results[r] = runs[r].finish("failed", f"{type(e).__name__}: {e}", R)
        raise
    finally:
        if warming is not None:
            precompile.stop(warming)
        if not ahead:
            for helper in helpers:
                precompile.stop(helper)
    return results


def _info(runs, losses, sps) -> str:
    accs = [r.state["accuracy"] for r in runs if r.state["accuracy"] is not None]
    acc = f"{max(accs):.3f}" if accs else "-"
    if len(runs) == 1:
        return f"loss {losses[0]:.3f}  acc {acc}  {sps:.1f} steps/s"
    return f"loss {min(losses):.3f}-{max(losses):.3f}  best acc {acc}  {len(runs)} running  {sps:.1f} steps/s"

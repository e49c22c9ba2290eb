"""The run loop: AdamW + warm-up/cosine, bf16 autocast on CUDA, periodic test accuracy, early
stop, resumable checkpoints, TensorBoard scalars + hparams, a rich progress bar and
``result.json`` - for one run, or for several runs that train as one stacked model.

``train(cfg, out)`` is one run. ``train_replicas(cfgs, outs)`` trains runs whose configs differ
only in ``train.lr`` and ``seed`` together (``group.py``, ``step.py``): each keeps its own
directory, checkpoint, TensorBoard events, early stop and result, exactly as if it had run alone.

A group's start-up is timed in phases (``PHASES``): building it, its first steps (compiling the step, or
the kernels' first launches), capturing the CUDA graph; then training and evaluations. Each run's result
keeps their seconds, summed over its groups. The hot loop never synchronises with the device except
after each start-up step (to time its phase), every ``log_every`` steps (one read of the running
losses, which is also where a non-finite loss is caught) and at evaluations.
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
import sandbox.train.compile as compiling
from sandbox.train.evaluation import evaluate_stack
from sandbox.train.files import save_torch_soon, saves_done, write_json
from sandbox.train.group import Group, stack_key, worth_regrouping
from sandbox.train.progress import Progress
from sandbox.train.record import val_choice
from sandbox.train.signals import HeldSignals

DONE = ("completed", "early_stopped")          # a rerun of such a directory returns its result
PHASES = ("startup", "compile", "capture", "train", "eval")


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


class StopTraining(Exception):
    """Raised by an ``on_eval`` callback to end a run early (e.g. an Optuna pruner)."""


def _hparams(cfg: RunConfig) -> dict:
    out = {}
    for k, v in flatten(to_dict(cfg)).items():
        out[k] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out


class _Run:
    """One replica's bookkeeping: its directory, TensorBoard writer, state, checkpoint and result."""

    def __init__(self, cfg: RunConfig, out: Path, task, model, t_start: float):
        from torch.utils.tensorboard import SummaryWriter

        self.cfg, self.out, self.task, self.model, self.t_start = cfg, out, task, model, t_start
        self.config = to_dict(cfg)
        # train_time: the seconds between its logs, evaluations left out (its group's first step, which may
        # compile, in it); trained_steps over trained_time: its steps once the group was ready, its training rate
        self.state = {"step": 0, "best_accuracy": 0.0, "best_step": 0, "accuracy": None, "train_time": 0.0,
                      "trained_steps": 0, "trained_time": 0.0, "history": [], "phases": dict.fromkeys(PHASES, 0.0)}
        self.status, self.error = "running", None
        self.ckpt = out / "checkpoint.pt"
        self.chosen = out / CHOSEN
        self.writer = SummaryWriter(log_dir=str(out))
        self.params, self.state_size = model.num_params(), model.state_size(task.seq_len)
        self.compiled_at = None          # the step from which the training step ran compiled (its first, or None)
        self.compile_cache = None        # what torch's caches gave its compilation (compile.cache_outcome)
        # this group's start-up (building, data pool, compilation and graph capture) and evaluations (with the
        # checkpoint saved at each); state["phases"] sums every phase over the run's groups
        self.setup_s, self.eval_s = 0.0, 0.0
        self.first_eval_s = None         # its first evaluation (which may compile kernels for the test batch)

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
        self.state.setdefault("phases", dict.fromkeys(PHASES, 0.0))   # a checkpoint from before phases

    def save(self, step, r: int, chosen: bool = False) -> None:
        """The checkpoint, written in the background (``finish`` waits for it): copies on the CPU of what training
        changes next (the parameters, views of the stack's flat weights, which torch.save would store whole).
        ``chosen``: these weights are also the run's best on val so far (``chosen.pt``, see ``weights_file``)."""
        model = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        if chosen:
            save_torch_soon(self.chosen, {"model": model, "step": self.state["step"], "config": self.config})
        save_torch_soon(self.ckpt, {"model": model, "optimizer": step.optimizer_state(r, "cpu"),
                                    "state": copy.deepcopy(self.state), "config": self.config})

    def result(self, replicas: int = 1) -> dict:
        from sandbox.train.record import RunResult, provenance
        s = self.state
        return RunResult(
            status=self.status, error=self.error, config=self.config,
            final_accuracy=s["accuracy"], best_accuracy=s["best_accuracy"], best_step=s["best_step"], steps=s["step"],
            **val_choice(s["history"]),
            wall_time_s=round(time.perf_counter() - self.t_start, 3), train_time_s=round(s["train_time"], 3),
            steps_per_sec=round(s["trained_steps"] / s["trained_time"], 2) if s.get("trained_time") else None,
            setup_s=round(self.setup_s, 3), eval_s=round(self.eval_s, 3),
            first_eval_s=None if self.first_eval_s is None else round(self.first_eval_s, 3),
            phases={k: round(v, 3) for k, v in s["phases"].items()},
            replicas=replicas, compiled_at=self.compiled_at, compile_cache=self.compile_cache, params=self.params,
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


# The weights at the step chosen on val, the step whose test accuracy a verdict reads. A run may learn and then
# lose it (laLTE at a distance of 8 windows: 0.92 at step 4500, 0.005 at 8000), so analyses that load a model
# (state pictures, the capped-cache scores) load these rather than the final checkpoint.
CHOSEN = "chosen.pt"


def weights_file(run_dir) -> Path:
    """The file an analysis of a run loads: ``chosen.pt`` (a dict with ``model``, ``step``, ``config``) where the run
    chose a step on val, else its final ``checkpoint.pt`` (a run without a val split, or from before chosen.pt)."""
    chosen = Path(run_dir) / CHOSEN
    return chosen if chosen.is_file() else Path(run_dir) / "checkpoint.pt"


def ended_result(out: Path) -> dict | None:
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
                   on_eval: list[Callable[[int, dict], None] | None] | None = None) -> list[dict]:
    """Train runs that differ only in ``train.lr`` and ``seed`` as one stacked model, each into its own
    directory (resuming from checkpoints; runs whose checkpoints are at different steps train as
    separate stacks). A directory whose run already ended returns its stored result. ``on_eval[r](step,
    metrics)`` may raise ``StopTraining`` to stop run r alone. Returns the result of each run (a diverged
    run has status "diverged"). Raises ``Unstackable`` (before training) for several runs of a mixer that
    cannot train stacked."""
    if len({stack_key(c) for c in cfgs}) != 1:
        raise ValueError("train_replicas: the runs must differ only in train.lr, seed and name")
    outs = [Path(o) for o in out_dirs]
    results: list[dict | None] = [ended_result(o) for o in outs]
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
                            [callbacks[i] for i in todo], t_start, len(cfgs))
        for i, res in zip(todo, done):
            results[i] = res


def _checkpoint_step(out: Path) -> int:
    ckpt = out / "checkpoint.pt"
    if not ckpt.exists():
        return 0
    return int(torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)["state"]["step"])


def _train_group(cfgs, outs, progress, callbacks, t_start, stack) -> list[dict]:
    """Train one stacked group; the runs it hands back unfinished (None) continue from their checkpoints."""
    with Progress(progress, _title(cfgs)) as shown, HeldSignals() as held:
        group = _Stack(cfgs, outs, callbacks, t_start, stack, shown)
        try:
            group.evaluate_if_interrupted()
            while group.running():
                held.deliver()          # Ctrl-C / SIGTERM act here, between steps (signals.py says why)
                group.step()
                if group.at_log():
                    group.log()
                    if group.worth_regrouping():
                        group.hand_back()
                        break
            else:
                group.complete()
        except KeyboardInterrupt:
            group.end_all("interrupted", "interrupted; rerun with the same --out to resume", save=True)
            raise
        except BaseException as e:
            group.end_all("failed", f"{type(e).__name__}: {e}")
            raise
    return group.results


def _title(cfgs) -> str:
    title = cfgs[0].name or f"{'+'.join(dict.fromkeys(cfgs[0].model.layer_mixers()))} d{cfgs[0].model.d_model}"
    return title + (f" x{len(cfgs)}" if len(cfgs) > 1 else "")


class _Stack:
    """A stacked group of runs while it trains: its ``Group``, each replica's ``_Run``, which still train, and
    the clocks of its start-up phases and of its logging intervals."""

    def __init__(self, cfgs, outs, callbacks, t_start, stack, shown: Progress):
        self.t_group = time.perf_counter()
        self.tc, self.callbacks, self.shown = cfgs[0].train, callbacks, shown
        shown.phase("building the model and the data")
        for o in outs:
            o.mkdir(parents=True, exist_ok=True)
        self.group = Group(cfgs, stack)
        self.runs = [_Run(c, o, t, m, t_start) for c, o, t, m in zip(cfgs, outs, self.group.tasks, self.group.models)]
        for r, run in enumerate(self.runs):
            run.load(self.group.step, r, self.group.device)
        self.s = self.runs[0].state["step"]          # train_replicas groups the runs by their checkpoints' step
        self.group.step.start_at(self.s)
        if self.group.step.compiled:
            for run in self.runs:
                run.compiled_at = self.s
        self.active = list(range(len(cfgs)))
        self.results: list[dict | None] = [None] * len(cfgs)
        self._add_phase("startup", shown.phase_done())
        self.ready, self.t_ready, self.s_ready, self.setup_s = False, 0.0, self.s, 0.0
        self.n_acc, self.t_log, self.steps_at_log, self.sps, self.steady = 0, time.perf_counter(), self.s, 0.0, False

    def _add_phase(self, phase: str, seconds: float) -> None:
        for run in self.runs:
            run.state["phases"][phase] += seconds

    # -- the steps ---------------------------------------------------------------------------------------------
    def running(self) -> bool:
        return self.s < self.tc.steps and bool(self.active)

    def step(self) -> None:
        """One training step of every replica; until the step is ready, each is timed as a start-up phase."""
        step, batch = self.group.step, self.group.batch(self.s)
        if self.ready:
            step(*batch)
        else:
            self._start_up_step(batch)
        self.n_acc += 1
        self.s += 1
        for r in self.active:
            self.runs[r].state["step"] = self.s

    def _start_up_step(self, batch) -> None:
        step, cuda = self.group.step, self.group.device.type == "cuda"
        phase = step.next_phase
        if phase == "capture":
            label = "capturing the CUDA graph"
        elif step.compiled:
            label = "compiling the step"
        else:
            label = "first steps, not compiled" if cuda else "first step"
        if self.shown.label != label:
            self.shown.phase(label)
        before = compiling.cache_counts() if step.compiled and step.calls == 0 else None
        step(*batch)
        if cuda:
            torch.cuda.synchronize()
        if before is not None:
            outcome = compiling.cache_outcome(before)
            for run in self.runs:
                run.compile_cache = outcome
        if step.ready or step.next_phase != phase:
            self._add_phase(phase, self.shown.phase_done(self._note(phase)))
        if step.ready:
            self.ready, self.t_ready, self.s_ready = True, time.perf_counter(), self.s + 1
            self.setup_s = self.t_ready - self.t_group
            for run in self.runs:
                run.setup_s = self.setup_s
            self.shown.training(self.tc.steps, self.s + 1)

    def _note(self, phase: str) -> str:
        """What the start-up line of ``phase`` adds: why the step is compiled or not, and from which cache."""
        if phase != "compile" or (self.group.device.type != "cuda" and not self.group.step.compiled):
            return ""
        why = self.group.compile.reason
        if not self.group.step.compiled:
            return f"{why}; the kernels compile on their first launch"
        return f"{why}; {CACHE_NOTES.get(self.runs[0].compile_cache, '')}"

    # -- logs, evaluations, early stops ------------------------------------------------------------------------
    def at_log(self) -> bool:
        s, tc = self.s, self.tc
        return s % tc.log_every == 0 or s == tc.steps or s % tc.eval_every == 0

    def log(self) -> None:
        """The running losses (the one sync per interval), TensorBoard, divergence, evaluations, the bar."""
        s, tc, step = self.s, self.tc, self.group.step
        losses = (step.loss_sum / self.n_acc).tolist()
        lrs = step.lr.tolist()
        now = time.perf_counter()
        self.sps = (s - self.steps_at_log) / max(now - self.t_log, 1e-9)
        for r in list(self.active):
            run = self.runs[r]
            run.state["train_time"] += now - self.t_log
            if self.ready:                       # the part of this interval after the group got ready
                trained = now - max(self.t_log, self.t_ready)
                run.state["trained_time"] = run.state.get("trained_time", 0.0) + trained
                run.state["trained_steps"] = run.state.get("trained_steps", 0) + s - max(self.steps_at_log,
                                                                                        self.s_ready)
                run.state["phases"]["train"] += trained
            if not math.isfinite(losses[r]):
                self.stop(r, "diverged", f"loss became {losses[r]} at step {s} (lr {run.cfg.train.lr:g})")
                continue
            run.writer.add_scalar("train/loss", losses[r], s)
            run.writer.add_scalar("train/lr", lrs[r], s)
            run.writer.add_scalar("perf/steps_per_sec", self.sps, s)
        step.loss_sum.zero_()
        self.n_acc = 0
        if (s % tc.eval_every == 0 or s == tc.steps) and self.active:
            self.evaluate(s, list(self.active))
        shown = self.active or range(len(self.runs))
        self.shown.update(s, _info([self.runs[r] for r in shown], [losses[r] for r in shown], self.sps))
        self.steady = self.ready and self.t_log >= self.t_ready      # sps then counts replayed steps only
        self.t_log, self.steps_at_log = time.perf_counter(), s

    def evaluate_if_interrupted(self) -> None:
        """A run interrupted between a step and its evaluation gets that evaluation first."""
        s = self.s
        if s and s % self.tc.eval_every == 0:
            self.evaluate(s, [r for r in self.active if not self.runs[r].state["history"]
                              or self.runs[r].state["history"][-1]["step"] != s])
            self.t_log = time.perf_counter()

    def evaluate(self, s: int, which: list[int]) -> None:
        """Evaluate the replicas ``which`` at step ``s`` (all in one stacked forward; each is charged its share)."""
        if not which:
            return
        t_eval = time.perf_counter()
        metrics = evaluate_stack(self.group.step, self.group.tasks, self.tc.eval_batch_size)
        share = (time.perf_counter() - t_eval) / len(which)
        for r in which:
            self._record_eval(r, s, metrics[r], share)

    def _record_eval(self, r: int, s: int, metrics: dict, forward_s: float) -> None:
        run = self.runs[r]
        t_eval = time.perf_counter() - forward_s
        acc = metrics["test/accuracy"]
        run.state["accuracy"] = acc
        if acc > run.state["best_accuracy"] or run.state["best_step"] == 0:
            run.state["best_accuracy"], run.state["best_step"] = max(acc, run.state["best_accuracy"]), s
        metrics["test/best_accuracy"] = run.state["best_accuracy"]
        run.state["history"].append({"step": s, **metrics})
        chosen = val_choice(run.state["history"]).get("best_val_step") == s      # the step a result will choose
        for k, v in metrics.items():
            run.writer.add_scalar(k, v, s)
        run.writer.flush()
        run.save(self.group.step, r, chosen)
        seconds = time.perf_counter() - t_eval
        run.eval_s += seconds
        run.state["phases"]["eval"] += seconds
        if run.first_eval_s is None:
            run.first_eval_s = run.eval_s
        try:
            if self.callbacks[r] is not None:
                self.callbacks[r](s, metrics)
        except StopTraining as e:
            return self.stop(r, "stopped", str(e) or "stopped by callback")
        # validation decides when to stop (test is read, never used to choose)
        chooser = metrics.get("val/accuracy", acc)
        if self.tc.early_stop is not None and chooser >= self.tc.early_stop and s < self.tc.steps:
            self.stop(r, "early_stopped")

    # -- ends --------------------------------------------------------------------------------------------------
    def stop(self, r: int, status: str, error: str | None = None) -> None:
        """Run r trains no further: frozen in the stack, its checkpoint (unless diverged) and result written."""
        self.group.step.freeze(r)
        self.active.remove(r)
        if status != "diverged":                         # keep the last finite checkpoint
            self.runs[r].save(self.group.step, r)
        self.results[r] = self.runs[r].finish(status, error, len(self.runs))

    def complete(self) -> None:
        for r in list(self.active):
            self.stop(r, "completed")

    def end_all(self, status: str, error: str, save: bool = False) -> None:
        """Every running replica ends with ``status`` (interrupted: saved to resume; failed: as it was)."""
        for r in list(self.active):
            if save:
                self.runs[r].save(self.group.step, r)
            self.results[r] = self.runs[r].finish(status, error, len(self.runs))

    def worth_regrouping(self) -> bool:
        """Whether the running replicas should go on as a smaller group (judged on steady intervals only)."""
        return self.steady and worth_regrouping(
            len(self.active), len(self.runs), self.tc.steps - self.s, 1 / max(self.sps, 1e-9), self.setup_s)

    def hand_back(self) -> None:
        """Save the running replicas to go on as a new group (their results stay None)."""
        for r in self.active:
            self.runs[r].save(self.group.step, r)
            self.runs[r].writer.close()


# what torch's caches gave a compilation, as the start-up line says it
CACHE_NOTES = {"reused": "reused this process's compilation", "cached": "loaded from torch's compile caches",
               "cold": "cold: nothing in torch's compile caches", "partly cached": "partly from torch's compile caches"}


def _info(runs, losses, sps) -> str:
    accs = [r.state["accuracy"] for r in runs if r.state["accuracy"] is not None]
    acc = f"{max(accs):.3f}" if accs else "-"
    if len(runs) == 1:
        return f"loss {losses[0]:.3f}  acc {acc}  {sps:.1f} steps/s"
    return f"loss {min(losses):.3f}-{max(losses):.3f}  best acc {acc}  {len(runs)} running  {sps:.1f} steps/s"

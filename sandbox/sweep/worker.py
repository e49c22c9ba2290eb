"""A sweep worker process: pulls WAITING trials from the study until none are left and
trains each with ``sandbox.train.train`` (``python -m sandbox.sweep.worker``, started
by the launcher in sandbox/sweep/runner.py with one ``CUDA_VISIBLE_DEVICES`` GPU).

A diverging, out-of-memory or raising trial is recorded as failed with its reason and
the worker goes on. SIGINT/SIGTERM (or the launcher dying) interrupts the running
trial at once: ``train`` saves a checkpoint and the trial is requeued to resume.
Storage outages are ridden through (storage.py): evaluations are sent from a background
thread; past ``--storage-timeout`` the trial is stopped the same way and the worker exits
with EXIT_STORAGE (its trial is requeued by whoever reaches the storage next).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from sandbox.sweep.storage import DEFAULT_TIMEOUT_S, EXIT_STORAGE, StorageUnavailable, TrialReporter
from sandbox.sweep.study import (FINAL_FAIL, HOST, heartbeat_interval, holds, load_study, make_pruner,
                                 open_storage, requeue, trials_in, uses_heartbeat)


class _Worker:
    def __init__(self, sweep_dir: Path, study, parent: int, gpu: str | None):
        self.dir, self.study, self.parent, self.gpu = sweep_dir, study, parent, gpu
        self.spec = study.user_attrs["spec"]
        self.training = False
        self.stop = False

    def on_signal(self, signum, frame):
        self.stop = True
        self.study._storage.stop_retrying()      # stopping: do not wait out an outage
        if self.training:
            raise KeyboardInterrupt

    def watch_parent(self):
        while not self.stop:
            if os.getppid() != self.parent:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(1.0)

    def claim(self):
        """Take a WAITING trial (atomically, as Optuna's own queue does); drop duplicates."""
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.trial import TrialState

        storage = self.study._storage
        for t in trials_in(self.study, (TrialState.WAITING,)):
            try:
                if not storage.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                    continue
            except UpdateFinishedTrialError:
                continue
            if uses_heartbeat(storage):
                storage.record_heartbeat(t._trial_id)
            storage.set_trial_user_attr(t._trial_id, "worker", f"{HOST}:{os.getpid()}:{self.gpu or 'cpu'}")
            point = t.user_attrs.get("point_id")
            retry = "retry_of" in t.user_attrs      # earlier failures of its point are what it retries
            for o in trials_in(self.study):
                if retry and o.state == TrialState.FAIL and o.number < t.number:
                    continue
                if o.number != t.number and o.user_attrs.get("point_id") == point and holds(o) and (
                        o.state not in (TrialState.RUNNING, TrialState.WAITING) or o.number < t.number):
                    storage.set_trial_user_attr(t._trial_id, "duplicate_of", o.number)
                    storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
                    break
            else:
                return t._trial_id
        return None

    def on_storage_lost(self):
        # the storage stayed away past --storage-timeout, noticed in a background thread (the
        # main thread's own storage calls raise StorageUnavailable): stop the trial like Ctrl-C
        if threading.current_thread() is not threading.main_thread():
            os.kill(os.getpid(), signal.SIGINT)

    def run(self) -> int:
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)
        self.study._storage.guard.on_give_up = self.on_storage_lost
        threading.Thread(target=self.watch_parent, daemon=True).start()
        while not self.stop:
            tid = self.claim()
            if tid is None:
                return 0
            code = self.run_trial(tid)
            if code is not None:
                return code
        return 0

    def run_trial(self, tid: int) -> int | None:
        import optuna
        import torch
        from sandbox.sweep.spec import build_config
        from sandbox.sweep.study import objective_value
        from sandbox.train import StopTraining, TrainingDiverged, train

        study, storage = self.study, self.study._storage
        trial = optuna.trial.Trial(study, tid)
        attrs = storage.get_trial(tid).user_attrs
        run_dir = attrs.get("run_dir") or f"trials/{trial.number}-{attrs['point_id'][:8]}"
        storage.set_trial_user_attr(tid, "run_dir", run_dir)
        obj = self.spec["objective"]
        pruning = self.spec["pruning"]
        beat = threading.Event()
        if uses_heartbeat(storage):
            def heartbeat():
                while not beat.wait(heartbeat_interval(storage)):
                    storage.record_heartbeat(tid)
            threading.Thread(target=heartbeat, daemon=True).start()

        reporter = TrialReporter(trial, storage.guard)     # training never waits for the storage

        def on_eval(step, metrics):
            reporter.report(metrics[obj["metric"]], step)
            if pruning and reporter.should_prune(step):
                raise StopTraining(f"pruned at step {step}: {obj['metric']} {metrics[obj['metric']]:.4f} "
                                   f"below the median of its grid point")

        failure = None
        try:
            cfg = build_config(self.spec["base"], {**attrs["grid"], **attrs["tune"]})
            cfg.name = f"{study.study_name}/{Path(run_dir).name}"
            path = self.dir / run_dir
            _drop_unreadable_checkpoint(path / "checkpoint.pt")
            if self.stop:
                raise KeyboardInterrupt
            self.training = True
            try:
                res = train(cfg, path, progress=False, on_eval=on_eval)
            finally:
                self.training = False
        except KeyboardInterrupt:
            beat.set()
            reporter.abandon()
            requeue(study, storage.get_trial(tid), "interrupted", count=False)
            return 130
        except TrainingDiverged as e:
            failure = f"diverged: {e}"
        except torch.cuda.OutOfMemoryError as e:
            failure = f"CUDA out of memory: {str(e).splitlines()[0]}"
        except Exception as e:              # any other error is this trial's, not the sweep's
            failure = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        beat.set()
        try:
            reporter.close()                # the evaluations not sent yet (e.g. during an outage)
            if failure is not None:
                storage.set_trial_user_attr(tid, FINAL_FAIL, failure)
                _attach_result(storage, tid, self.dir / run_dir)
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                print(f"trial {trial.number} failed: {failure}", flush=True)
                if "CUDA error" in failure:     # the CUDA context may be broken: let the launcher respawn us
                    return 3
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                return None
            _attach_result(storage, tid, self.dir / run_dir, res)
            if res["status"] == "stopped":
                storage.set_trial_user_attr(tid, "pruned", res["error"])
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(trial, objective_value(res["history"], obj["metric"], obj["mode"], obj["direction"]))
        except optuna.exceptions.UpdateFinishedTrialError:
            # declared lost meanwhile (e.g. a heartbeat missed during a long stall): its retry counts
            print(f"trial {trial.number} was declared lost while it ran; its retry counts", flush=True)
            return None
        print(f"trial {trial.number} {res['status']} in {res['wall_time_s']:.1f} s", flush=True)
        return None


def _drop_unreadable_checkpoint(path: Path) -> None:
    """A worker killed while saving can leave a truncated checkpoint; start that run afresh."""
    if path.exists():
        import torch
        try:
            torch.load(path, map_location="cpu", weights_only=False)
        except Exception:
            path.unlink()


def _attach_result(storage, tid: int, run_dir: Path, res: dict | None = None) -> None:
    if res is None and (run_dir / "result.json").exists():
        try:
            res = json.loads((run_dir / "result.json").read_text())
        except ValueError:
            res = None
    if res is not None:
        keep = ("status", "final_accuracy", "best_accuracy", "best_step", "steps", "wall_time_s",
                "train_time_s", "steps_per_sec", "params", "state_size", "device")
        storage.set_trial_user_attr(tid, "result", {k: res.get(k) for k in keep})


def worker_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sandbox.sweep.worker")
    p.add_argument("--worker", required=True, help="sweep directory")
    p.add_argument("--study", required=True)
    p.add_argument("--storage")
    p.add_argument("--heartbeat", type=int)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--storage-timeout", type=float, default=DEFAULT_TIMEOUT_S)
    a = p.parse_args(argv)
    import optuna
    import torch
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(a.threads)
    sweep_dir = Path(a.worker)
    try:
        storage = open_storage(sweep_dir, a.storage, a.heartbeat, a.storage_timeout)
        study = load_study(storage, a.study)
        if study.user_attrs["spec"]["pruning"]:
            study.pruner = make_pruner(study.user_attrs["spec"]["pruning"])
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES") or None
        return _Worker(sweep_dir, study, a.parent, gpu).run()
    except StorageUnavailable as e:     # the one place a worker ends for the storage
        print(f"worker stopped: {e}", flush=True)
        return EXIT_STORAGE


if __name__ == "__main__":
    sys.exit(worker_main())

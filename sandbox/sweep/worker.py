"""A sweep worker process: pulls WAITING trials from the study until none are left and
trains them with ``sandbox.train.train_replicas`` (``python -m sandbox.sweep.worker``,
started by the launcher in sandbox/sweep/runner.py with one ``CUDA_VISIBLE_DEVICES`` GPU).

With ``--stack N`` it takes up to N waiting trials whose configurations differ only in
learning rate and seed (a grid point's tuned values) and trains them as stacked replicas
of one model: one process start, one compilation and one data pool for all of them, and
each still its own trial, run directory, early stop and result. Trials that resume from
checkpoints go first, stacked with those interrupted at the same step. A later stack of a kind compiled
before (by this worker or another) finds its compilation in torch's caches and pays only the tracing.

A group that runs out of GPU memory while other processes hold most of it is requeued and the
worker exits with ``EXIT_MEMORY`` (the launcher then runs one worker fewer on that GPU); alone on
it, a stack is retried in halves. Between groups a worker hands its cached GPU memory back.

With ``--until`` (a time limit) it only takes trials that finish before it at the pace measured for their
kind of stack (``packing.fits``, ``packing.pace_for``; stacks shrink near the end), and exits with
``EXIT_TIME_LIMIT`` when none does. Where nothing fits before it has taken any work, it trains one trial
of a kind with no pace of its own alone: that kind's size was a guess, and the run measures it.

A diverging, out-of-memory or raising trial is recorded as failed with its reason and
the worker goes on. SIGINT/SIGTERM (or the launcher dying) interrupts the running
trials at once: ``train`` saves their checkpoints and they are requeued to resume.
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

from sandbox.sweep import packing
from sandbox.sweep.report import RESULT_KEYS
from sandbox.sweep.storage import DEFAULT_TIMEOUT_S, EXIT_STORAGE, StorageUnavailable, TrialReporter
from sandbox.sweep.study import (FINAL_FAIL, HOST, heartbeat_interval, holds, load_study, make_pruner, objective_value,
                                 open_storage, requeue, superseded, trials_in, uses_heartbeat)



class _Worker:
    def __init__(self, sweep_dir: Path, study, parent: int, gpu: str | None, stack: int = 1,
                 until: float | None = None):
        self.dir, self.study, self.parent, self.gpu, self.stack = sweep_dir, study, parent, gpu, stack
        self.spec = study.user_attrs["spec"]
        self.training = False
        self.stop = False
        self.until = until                  # epoch seconds by which claimed work must be done (None: no limit)
        self.paces: dict[str, tuple[str, float, float]] = {}   # stack key -> (family, trial-steps/s, trial-steps)
                                                               # over the groups this worker measured
        self.out_of_time = False
        self.claimed = False                # whether this worker took any work in this launch
        self._keys: dict[int, tuple[str | None, int | None]] = {}      # number -> (stack key, steps left)
        self._kinds: dict[int, tuple[str | None, str, int | None]] = {}  # number -> (stack key, family, steps)

    def on_signal(self, signum, frame):
        if self.stop:           # a stop is under way: the launcher and the storage guard may both ask for it,
            return              # and a second KeyboardInterrupt would cut off the checkpoints the first one saves
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

    def claim(self) -> list[int]:
        """Take a WAITING trial and, up to ``--stack``, the waiting trials that can train stacked with it."""
        from optuna.trial import TrialState
        # workers that start together would each take one trial of the same stack: begin with a stack no
        # running trial belongs to (it is being claimed by another worker), if the queue has one
        busy = {self._stack_key(t) for t in trials_in(self.study, (TrialState.RUNNING,))} - {None}
        fits = self._fits()
        # interrupted trials first (a requeued copy sits at the end of the queue): they have work in hand
        first = self._claim_one(lambda t: self._resumes(t) and self._stack_key(t) not in busy and fits(t, 0))
        if first is None and busy:
            first = self._claim_one(lambda t: self._stack_key(t) not in busy and fits(t, 0))
        if first is None:
            first = self._claim_one(lambda t: fits(t, 0))
        if first is None and self.until is not None and not self.claimed:
            # nothing fits at a launch's start: a kind never measured is only a guess (sized from another
            # width's or mixer's pace, which may be stale), so train one trial of it alone and measure it
            # (MetaLA d256, guessed from a part-1 pace 8x below today's, fit no call at all)
            measured = set(self._paces()) | {None}        # kinds with a pace of their own (None: invalid)
            if packing.fits(0, None, self.until - time.time()):
                first = self._claim_one(lambda t: self._kind(t)[0] not in measured)
            if first is not None:
                self.claimed = True
                return [first]
        if first is None:
            self.out_of_time = self.until is not None and bool(trials_in(self.study, (TrialState.WAITING,)))
            return []
        t = self.study._storage.get_trial(first)
        key, used = self._stack_key(t), self._steps_left(t) or 0
        group = [first]
        self.claimed = True
        while key is not None and len(group) < self.stack:
            tid = self._claim_one(lambda t: self._stack_key(t) == key and fits(t, used))
            if tid is None:
                break
            group.append(tid)
            used += self._steps_left(self.study._storage.get_trial(tid)) or 0
        return group

    def _fits(self):
        """``fits(trial, steps already claimed)``: whether adding the trial keeps the group inside the time limit,
        at the pace measured for its kind of stack (``packing.pace_for``)."""
        if self.until is None:
            return lambda t, used: True
        left = self.until - time.time()
        paces = self._paces()

        def fits(t, used):
            key, family, _ = self._kind(t)
            rate = packing.pace_for(key, family, paces) if key is not None else None
            return packing.fits(used + (self._steps_left(t) or 0), rate, left)  # unknown: invalid, fails at once
        return fits

    def _paces(self) -> dict[str, tuple[str, float]]:
        """Paces by stack key, from the group that trained the most trial-steps of it, the latest among
        equals: the groups the sweep completed before (a completed trial's steps x replicas over its group's
        wall time), then this launch's (its workers' records, the slowest worker's where several trained a
        kind). The longest group is the measure least swayed by start-up: a Gated DeltaNet d256 trial that
        stopped early at step 750 on a fresh machine spent most of its 94 s starting and on uncompiled
        steps (8 trial-steps/s, where a 3500-step trial of the kind ran at 15), and sized by it no later
        trial of the kind fitted a call. The latest among equals, as the code and the runner change between
        launches (Figure 8's MetaLA d128 ran at 14 trial-steps/s as a lone trial among 14 time-sliced
        workers of the first runner, its later stacks at 100-112)."""
        from optuna.trial import TrialState
        best: dict[str, tuple[float, str, float]] = {}       # key -> (trial-steps, family, pace)
        done = [t for t in trials_in(self.study, (TrialState.COMPLETE,)) if t.datetime_complete is not None]
        for t in sorted(done, key=lambda t: t.datetime_complete):
            res = t.user_attrs.get("result") or {}
            try:
                trained = float(res["steps"]) * int(res.get("replicas") or 1)
                rate = trained / float(res["wall_time_s"])
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                continue
            key, family, _ = self._kind(t)
            if key is not None and trained >= best.get(key, (0.0,))[0]:
                best[key] = (trained, family, rate)
        for key, (family, rate, trained) in {**packing.known_paces(self.dir), **self.paces}.items():
            if trained >= best.get(key, (0.0,))[0]:
                best[key] = (trained, family, rate)
        return {key: (family, rate) for key, (_, family, rate) in best.items()}

    def _kind(self, t) -> tuple[str | None, str, int | None]:
        """(stack key, family, training steps) of a trial's configuration (key None: not a valid one)."""
        if t.number not in self._kinds:
            from sandbox.sweep.spec import build_config
            try:
                cfg = build_config(self.spec["base"], {**t.user_attrs["grid"], **t.user_attrs["tune"]})
                self._kinds[t.number] = (*_kind_of(cfg), cfg.train.steps)
            except Exception:
                self._kinds[t.number] = (None, "", None)
        return self._kinds[t.number]

    def _resumes(self, t) -> bool:
        run_dir = t.user_attrs.get("run_dir")
        return bool(run_dir) and (self.dir / run_dir / "checkpoint.pt").exists()

    def _stack_key(self, t) -> str | None:
        """What a trial must share with the others of a stack (None: it trains alone). A trial that resumes
        stacks with those whose checkpoints are at the same step (an interrupted stack goes on as one)."""
        return self._describe(t)[0]

    def _steps_left(self, t) -> int | None:
        """The training steps a trial has left (None: unknown, e.g. an invalid configuration)."""
        return self._describe(t)[1]

    def _describe(self, t) -> tuple[str | None, int | None]:
        if t.number not in self._keys:
            key, _, left = self._kind(t)
            if key is not None and self._resumes(t):
                try:        # the step its checkpoint holds, as the interrupted run recorded it
                    res = json.loads((self.dir / t.user_attrs["run_dir"] / "result.json").read_text())
                    key = f"{key}@{int(res['steps'])}" if res.get("status") == "interrupted" else None
                    left = max(0, left - int(res["steps"]))
                except (OSError, ValueError, KeyError, TypeError):
                    key = None
            self._keys[t.number] = (key, left)
        return self._keys[t.number]

    def _claim_one(self, wanted=lambda t: True):
        """Take a WAITING trial that ``wanted`` accepts (atomically, as Optuna's own queue does); drop
        duplicates."""
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.trial import TrialState

        storage = self.study._storage
        for t in trials_in(self.study, (TrialState.WAITING,)):
            if not wanted(t):
                continue
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
            trials = trials_in(self.study)
            gone = superseded(trials)               # finished trials that a retrain replaces
            for o in trials:
                if (retry and o.state == TrialState.FAIL and o.number < t.number) or o.number in gone:
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
            tids = self.claim()
            if not tids:
                if self.out_of_time:
                    print("no waiting trial finishes before the time limit at this worker's pace; stopping",
                          flush=True)
                    return packing.EXIT_TIME_LIMIT
                return 0
            code = self.run_group(tids)
            packing.release_gpu_memory()        # what this group cached, for the GPU's other workers
            if code is not None:
                return code
        return 0

    def run_group(self, tids: list[int]) -> int | None:
        """Train the claimed trials (stacked when there are several) and record how each ended."""
        import optuna
        import torch
        from sandbox.sweep.spec import build_config
        from sandbox.train import StopTraining, train_replicas

        study, storage = self.study, self.study._storage
        obj, pruning = self.spec["objective"], self.spec["pruning"]
        trials, run_dirs, reporters, callbacks, cfgs = [], [], [], [], []
        for tid in tids:
            trial = optuna.trial.Trial(study, tid)
            attrs = storage.get_trial(tid).user_attrs
            run_dir = attrs.get("run_dir") or f"trials/{trial.number}-{attrs['point_id'][:8]}"
            storage.set_trial_user_attr(tid, "run_dir", run_dir)
            reporter = TrialReporter(trial, storage.guard)     # training never waits for the storage

            def on_eval(step, metrics, reporter=reporter):
                packing.mark_training(self.dir, True)       # set up and training: the launcher's fill rule
                reporter.report(metrics[obj["metric"]], step)
                if pruning and reporter.should_prune(step):
                    raise StopTraining(f"pruned at step {step}: {obj['metric']} {metrics[obj['metric']]:.4f} "
                                       f"below the median of its grid point")

            trials.append(trial)
            run_dirs.append(run_dir)
            reporters.append(reporter)
            callbacks.append(on_eval)
            cfgs.append((attrs, run_dir))
        beat = threading.Event()
        if uses_heartbeat(storage):
            def heartbeat():
                while not beat.wait(heartbeat_interval(storage)):
                    for tid in tids:
                        storage.record_heartbeat(tid)
            threading.Thread(target=heartbeat, daemon=True).start()

        results, failure = None, None
        try:
            configs = []
            for attrs, run_dir in cfgs:
                cfg = build_config(self.spec["base"], {**attrs["grid"], **attrs["tune"]})
                cfg.name = f"{study.study_name}/{Path(run_dir).name}"
                configs.append(cfg)
            if self.stop:
                raise KeyboardInterrupt
            self.training = True
            left = [self._steps_left(t) or 0 for t in (storage.get_trial(tid) for tid in tids)]
            t_group = time.time()
            try:
                results = train_replicas(configs, [self.dir / d for d in run_dirs], progress=False,
                                         on_eval=callbacks)
            finally:
                self.training = False
                packing.mark_training(self.dir, False)
            self._measure_pace(configs, left, results, time.time() - t_group)
        except KeyboardInterrupt:
            beat.set()
            for tid, reporter in zip(tids, reporters):
                reporter.abandon()
                requeue(study, storage.get_trial(tid), "interrupted", count=False)
            return 130
        except ValueError as e:
            if len(tids) > 1 and "cannot train stacked" in str(e):      # a mixer that must train alone
                beat.set()
                self.stack = 1
                return next((c for c in (self.run_group([tid]) for tid in tids) if c is not None), None)
            failure = f"ValueError: {str(e).splitlines()[0]}"
        except torch.cuda.OutOfMemoryError as e:
            beat.set()
            torch.cuda.empty_cache()
            if packing.gpu_shared():    # other workers hold the memory: these trials may fit once they are done
                for tid, reporter in zip(tids, reporters):
                    reporter.abandon()
                    requeue(study, storage.get_trial(tid), "out of GPU memory while other processes held most of it")
                print(f"trials {', '.join(str(t.number) for t in trials)}: out of GPU memory while other processes "
                      f"held most of it; requeued, and this worker stops (one fewer on this GPU)", flush=True)
                return packing.EXIT_MEMORY
            if len(tids) > 1:           # the stack did not fit: train it (and stack from now on) in halves
                self.stack = max(1, len(tids) // 2)
                print(f"trials {', '.join(str(t.number) for t in trials)}: out of GPU memory as a stack of "
                      f"{len(tids)}; training them in stacks of {self.stack}", flush=True)
                for part in (tids[:self.stack], tids[self.stack:]):
                    code = self.run_group(part)
                    if code is not None:
                        return code
                return None
            failure = f"CUDA out of memory: {str(e).splitlines()[0]}"
        except Exception as e:              # any other error is these trials', not the sweep's
            failure = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        beat.set()
        code = None
        for i, (tid, trial, run_dir, reporter) in enumerate(zip(tids, trials, run_dirs, reporters)):
            res = results[i] if results is not None else None
            why = failure if res is None else f"diverged: {res['error']}" if res["status"] == "diverged" else None
            try:
                reporter.close()                # the evaluations not sent yet (e.g. during an outage)
                if why is not None:
                    storage.set_trial_user_attr(tid, FINAL_FAIL, why)
                    _attach_result(storage, tid, self.dir / run_dir, res)
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    print(f"trial {trial.number} failed: {why}", flush=True)
                    if "CUDA error" in why:     # the CUDA context may be broken: let the launcher respawn us
                        code = 3
                    continue
                _attach_result(storage, tid, self.dir / run_dir, res)
                if res["status"] == "stopped":
                    storage.set_trial_user_attr(tid, "pruned", res["error"])
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                else:
                    study.tell(trial, objective_value(res["history"], obj["metric"], obj["mode"], obj["direction"]))
            except optuna.exceptions.UpdateFinishedTrialError:
                # declared lost meanwhile (e.g. a heartbeat missed during a long stall): its retry counts
                print(f"trial {trial.number} was declared lost while it ran; its retry counts", flush=True)
                continue
            stacked = f" (stacked with {len(tids) - 1} more)" if len(tids) > 1 else ""
            print(f"trial {trial.number} {res['status']} in {res['wall_time_s']:.1f} s{stacked}", flush=True)
        if failure is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()
        return code


    def _measure_pace(self, configs, left, results, wall: float) -> None:
        """Trial-steps per second over the group just trained, start-up included (what sizes later claims of
        its kind of stack), kept where the group trained at least as many trial-steps as this worker's
        longest of the kind before."""
        trained = sum(max(0, n - (c.train.steps - res["steps"])) for c, n, res in zip(configs, left, results)
                      if res is not None and res.get("steps") is not None)
        key, family = _kind_of(configs[0])
        if trained and wall > 0 and trained >= self.paces.get(key, ("", 0.0, 0.0))[2]:   # the longest group
            self.paces[key] = (family, trained / wall, trained)
            packing.record_pace(self.dir, self.paces)


def _kind_of(cfg) -> tuple[str, str]:
    """(stack key, family) of a configuration: what a pace is measured for, and its kin (same mixer, width and
    length), whose pace stands in for a kind not measured yet."""
    from sandbox.train import stack_key
    seq_len = getattr(cfg.task.params, "seq_len", None)
    return stack_key(cfg), f"{cfg.model.mixer}|{cfg.model.d_model}|{seq_len}"


def _attach_result(storage, tid: int, run_dir: Path, res: dict | None = None) -> None:
    if res is None and (run_dir / "result.json").exists():
        try:
            res = json.loads((run_dir / "result.json").read_text())
        except ValueError:
            res = None
    if res is not None:
        storage.set_trial_user_attr(tid, "result", {k: res.get(k) for k in ("status", *RESULT_KEYS)})


def worker_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sandbox.sweep.worker")
    p.add_argument("--worker", required=True, help="sweep directory")
    p.add_argument("--study", required=True)
    p.add_argument("--storage")
    p.add_argument("--heartbeat", type=int)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--storage-timeout", type=float, default=DEFAULT_TIMEOUT_S)
    p.add_argument("--stack", type=int, default=1, help="trials trained together as stacked replicas, at most")
    p.add_argument("--until", type=float, help="time limit (epoch seconds): take only trials that finish by then")
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
        return _Worker(sweep_dir, study, a.parent, gpu, a.stack, a.until).run()
    except StorageUnavailable as e:     # the one place a worker ends for the storage
        print(f"worker stopped: {e}", flush=True)
        return EXIT_STORAGE


if __name__ == "__main__":
    sys.exit(worker_main())

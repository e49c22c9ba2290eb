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
``EXIT_TIME_LIMIT`` when none does. Once nothing fits, what waits is trained anyway while a start-up and as
long again of training are left, those with checkpoints first: the limit stops it with checkpoints and the
next launch goes on from them. So a GPU does not idle out the rest of a limit, a kind whose pace was a guess
gets measured, and a trial longer than any launch goes further each time.

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
import traceback
from pathlib import Path

from dataclasses import dataclass

from sandbox.sweep import packing
from sandbox.sweep.storage import DEFAULT_TIMEOUT_S, EXIT_STORAGE, StorageUnavailable, TrialReporter
from sandbox.sweep.study import (FINAL_FAIL, HOST, heartbeat_interval, holds, load_study, objective_value,
                                 open_storage, point_values, requeue, superseded, trials_in, uses_heartbeat)



class _Worker:
    def __init__(self, sweep_dir: Path, study, parent: int, gpu: str | None, stack: int = 1,
                 until: float | None = None, points: set[str] | None = None):
        self.dir, self.study, self.parent, self.gpu, self.stack = sweep_dir, study, parent, gpu, stack
        self.spec = study.user_attrs["spec"]
        self.training = False
        self.stop = False
        self.until = until                  # epoch seconds by which claimed work must be done (None: no limit)
        self.points = points                # the point ids this launch trains (None: any waiting trial)
        # stack key -> (family, trial-steps/s, trial-steps, replicas) of the longest group of it this worker trained
        self.paces: dict[str, tuple[str, float, float, int]] = {}
        self.trained_kinds: set[str] = set()    # stack keys this process compiled: their next start-up is short
        self.out_of_time = False
        self._keys: dict[int, tuple[str | None, int | None]] = {}      # number -> (stack key, steps left)
        self._kinds: dict[int, tuple[str | None, str, int | None]] = {}  # number -> (stack key, family, steps)

    def on_signal(self, signum, frame):
        if self.stop:           # a stop is under way: the launcher and the storage guard may both ask for it,
            return              # and a second KeyboardInterrupt would cut off the checkpoints the first one saves
        self.stop = True
        self.study.storage.stop_retrying()      # stopping: do not wait out an outage
        if self.training:
            raise KeyboardInterrupt

    def watch_parent(self):
        while not self.stop:
            if os.getppid() != self.parent:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(1.0)

    def claim(self) -> list[int]:
        """Take a WAITING trial and, up to ``--stack``, the waiting trials that can train stacked with it (their
        numbers)."""
        from optuna.trial import TrialState
        # workers that start together would each take one trial of the same stack: begin with a stack no
        # running trial belongs to (it is being claimed by another worker), if the queue has one
        busy = {self._stack_key(t) for t in trials_in(self.study, (TrialState.RUNNING,))} - {None}
        fits = self._fits()
        # interrupted trials first (a requeued copy sits at the end of the queue): they have work in hand
        first = self._claim_one(lambda t: self._resumes(t) and self._stack_key(t) not in busy and fits(t, 0, 1))
        if first is None and busy:
            first = self._claim_one(lambda t: self._stack_key(t) not in busy and fits(t, 0, 1))
        if first is None:
            first = self._claim_one(lambda t: fits(t, 0, 1))
        joins = fits
        if first is None and self.until is not None:
            # nothing finishes before the limit: rather than leave the GPU idle, train what waits anyway (those in
            # hand first); the limit stops it with checkpoints and the next launch goes on from them. This also
            # measures a kind whose pace was a guess, and takes trials longer than any launch further each time
            anyway = self._train_anyway()
            first = self._claim_one(lambda t: self._resumes(t) and anyway(t, 0, 1))
            if first is None:
                first = self._claim_one(lambda t: anyway(t, 0, 1))
            joins = anyway
        if first is None:
            self.out_of_time = self.until is not None and any(map(self._ours, trials_in(self.study,
                                                                                        (TrialState.WAITING,))))
            return []
        t = self.study.trial_by_number(first)
        key, used = self._stack_key(t), self._steps_left(t) or 0
        group = [first]
        while key is not None and len(group) < self.stack:
            tid = self._claim_one(lambda t: self._stack_key(t) == key and joins(t, used, len(group) + 1))
            if tid is None:
                break
            group.append(tid)
            used += self._steps_left(self.study.trial_by_number(tid)) or 0
        return group

    def _fits(self):
        """``fits(trial, steps already claimed, trials with it)``: whether adding the trial keeps the group inside
        the time limit, at the pace measured for its kind of stack (``packing.pace_for``)."""
        if self.until is None:
            return lambda t, used, trials: True
        left = self.until - time.time()
        paces = self._paces()

        def fits(t, used, trials):
            key, family, _ = self._kind(t)
            pace = packing.pace_for(key, family, paces) if key is not None else None
            startup = packing.WARM_STARTUP_S if key in self.trained_kinds else packing.STARTUP_S
            return packing.fits(used + (self._steps_left(t) or 0), trials, pace, left, startup)  # invalid: fails
        return fits

    def _train_anyway(self):
        """``anyway(trial, steps already claimed, trials with it)``: whether the trial can still start, with a
        start-up and as long again of training before the limit. A limit of a minute or two would otherwise cut
        off trials that had hardly begun, and each resumption pays its start-up again."""
        left = self.until - time.time()

        def anyway(t, used, trials):
            return self._stack_key(t) is not None and left >= 2 * packing.STARTUP_S
        return anyway

    def _paces(self) -> dict[str, tuple[str, float, int]]:
        """Paces by stack key, from the group that trained the most trial-steps of it, the latest among equals: the
        groups the sweep completed before (a completed trial's steps x replicas over its group's wall time less
        its start-up), the interrupted runs waiting to resume (their training rate), then this launch's (its
        workers' records, the slowest worker's where several trained a kind). The longest group is the measure
        least swayed by start-up: a trial that stopped early spent most of its wall time starting and on
        uncompiled steps, at half its kind's pace, and sized by it no later trial of the kind fitted the limit.
        The latest among equals, as the code and the runner change between launches, and a kind's pace with them.
        Each pace: (family, trial-steps/s, replicas of the group)."""
        from optuna.trial import TrialState
        best: dict[str, tuple[float, str, float, int]] = {}       # key -> (trial-steps, family, pace, replicas)

        def keep(key, family, trained, rate, replicas):
            if key is not None and rate and trained >= best.get(key, (0.0,))[0]:
                best[key] = (trained, family, rate, replicas)

        done = [t for t in trials_in(self.study, (TrialState.COMPLETE,)) if t.datetime_complete is not None]
        for t in sorted(done, key=lambda t: t.datetime_complete):
            res = t.user_attrs.get("result") or {}
            try:
                replicas = int(res.get("replicas") or 1)
                trained = float(res["steps"]) * replicas
                rate = packing.training_pace(trained, float(res["wall_time_s"]), res.get("setup_s"))
            except (KeyError, TypeError, ValueError):
                continue
            keep(*self._kind(t)[:2], trained, rate, replicas)
        for t in filter(self._resumes, trials_in(self.study, (TrialState.WAITING,))):
            try:        # an interrupted run's training rate, start-ups left out, over all its launches
                res = json.loads((self.dir / t.user_attrs["run_dir"] / "result.json").read_text())
                replicas = int(res.get("replicas") or 1)
                rate, trained = float(res["steps_per_sec"]) * replicas, float(res["steps"]) * replicas
            except (OSError, ValueError, KeyError, TypeError):
                continue
            keep(*self._kind(t)[:2], trained, rate, replicas)
        for key, (family, rate, trained, replicas) in {**packing.known_paces(self.dir), **self.paces}.items():
            keep(key, family, trained, rate, replicas)
        return {key: (family, rate, replicas) for key, (_, family, rate, replicas) in best.items()}

    def _kind(self, t) -> tuple[str | None, str, int | None]:
        """(stack key, family, training steps) of a trial's configuration (key None: not a valid one)."""
        if t.number not in self._kinds:
            from sandbox.sweep.spec import build_config
            try:
                cfg = build_config(self.spec["base"], _values(t))
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

    def _claim_one(self, wanted=lambda t: True) -> int | None:
        """Take a WAITING trial that ``wanted`` accepts (atomically, as Optuna's own queue does); drop
        duplicates. Its number, or None."""
        from optuna.trial import TrialState

        study = self.study
        for t in trials_in(study, (TrialState.WAITING,)):
            if not self._ours(t) or not wanted(t) or not study.claim(t.number):
                continue
            if uses_heartbeat(study.storage):
                study.beat(t.number)
            study.set_trial_attr(t.number, "worker", f"{HOST}:{os.getpid()}:{self.gpu or 'cpu'}")
            earlier = self._held_elsewhere(t)
            if earlier is None:
                return t.number
            study.set_trial_attr(t.number, "duplicate_of", earlier)
            study.fail(t.number)
        return None

    def _ours(self, t) -> bool:
        return self.points is None or t.user_attrs.get("point_id") in self.points

    def _held_elsewhere(self, t) -> int | None:
        """The number of an earlier trial that holds ``t``'s point (done, or claimed before it), if any."""
        from optuna.trial import TrialState

        point = t.user_attrs.get("point_id")
        retry = "retry_of" in t.user_attrs      # earlier failures of its point are what it retries
        trials = trials_in(self.study)
        gone = superseded(trials)               # finished trials that a retrain replaces
        # and failures that a retry replaced: a retrain of the retry's run must not count as their duplicate
        gone.update({int(o.user_attrs["retry_of"]): o for o in trials
                     if "retry_of" in o.user_attrs and "duplicate_of" not in o.user_attrs})
        for o in trials:
            if (retry and o.state == TrialState.FAIL and o.number < t.number) or o.number in gone:
                continue
            if o.number != t.number and o.user_attrs.get("point_id") == point and holds(o) and (
                    o.state not in (TrialState.RUNNING, TrialState.WAITING) or o.number < t.number):
                return o.number
        return None

    def on_storage_lost(self):
        # the storage stayed away past --storage-timeout, noticed in a background thread (the
        # main thread's own storage calls raise StorageUnavailable): stop the trial like Ctrl-C
        if threading.current_thread() is not threading.main_thread():
            os.kill(os.getpid(), signal.SIGINT)

    def run(self) -> int:
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)
        self.study.storage.guard.on_give_up = self.on_storage_lost
        threading.Thread(target=self.watch_parent, daemon=True).start()
        while not self.stop:
            numbers = self.claim()
            if not numbers:
                if self.out_of_time:
                    print("no waiting trial finishes before the time limit at this worker's pace; stopping",
                          flush=True)
                    return packing.EXIT_TIME_LIMIT
                return 0
            code = self.run_group(numbers)
            packing.release_gpu_memory()        # what this group cached, for the GPU's other workers
            if code is not None:
                return code
        return 0

    def run_group(self, numbers: list[int]) -> int | None:
        """Train the claimed trials (stacked when there are several) and record how each ended. Returns an exit
        code where this worker must stop, else None."""
        import torch
        from sandbox.train import Unstackable, ended_result, train_replicas

        group = [self._start(n, stack=numbers[0]) for n in numbers]
        beating = self._heartbeat(numbers)
        try:
            configs = [self._config(g) for g in group]     # an invalid point fails as its trials, below
            if self.stop:
                raise KeyboardInterrupt
            left = [self._steps_left(self.study.trial_by_number(g.number)) or 0 for g in group]
            t_group = time.time()
            self.training = True
            try:
                results = train_replicas(configs, [self.dir / g.run_dir for g in group], progress=False,
                                         on_eval=[g.on_eval for g in group])
            finally:
                self.training = False
                packing.mark_training(self.dir, False)
            self._measure_pace(configs, left, results, time.time() - t_group)
        except KeyboardInterrupt:
            beating.set()
            # replicas that ended before the stop (an early stop within the stack) keep their results now: the
            # run directories may not be there for a next launch to read
            ended = {g.number: r for g in group if (r := ended_result(self.dir / g.run_dir)) is not None}
            self._record([g for g in group if g.number in ended], list(ended.values()))
            self._requeue([g for g in group if g.number not in ended], "interrupted", count=False)
            return 130
        except Unstackable:                 # a mixer that must train alone: these trials, one by one
            beating.set()
            self.stack = 1
            for g in group:
                g.reporter.abandon()
            return next((c for c in (self.run_group([n]) for n in numbers) if c is not None), None)
        except ValueError as e:
            beating.set()
            return self._record(group, None, _first_line(e))
        except torch.cuda.OutOfMemoryError as e:
            beating.set()
            return self._out_of_memory(group, e)
        except StorageUnavailable:          # the sweep's, not these trials': the worker ends (worker_main)
            beating.set()
            raise
        except Exception as e:              # any other error is these trials', not the sweep's
            beating.set()
            traceback.print_exc()           # where it came from, in the worker's log; the study keeps one line
            code = self._record(group, None, _first_line(e))
            # the CUDA context may be broken: let the launcher start a fresh worker
            return 3 if isinstance(e, getattr(torch, "AcceleratorError", ())) else code
        beating.set()
        return self._record(group, results)

    def _start(self, number: int, stack: int) -> _Claimed:
        """A claimed trial's run directory and evaluation callback (which reports to the study from a background
        thread, so training never waits for the storage, and asks the pruner)."""
        from sandbox.train import StopTraining

        study, obj, pruning = self.study, self.spec["objective"], self.spec["pruning"]
        t = study.trial_by_number(number)
        run_dir = t.user_attrs.get("run_dir") or f"trials/{number}-{t.user_attrs['point_id'][:8]}"
        study.set_trial_attr(number, "run_dir", run_dir)
        study.set_trial_attr(number, "stack", stack)        # the first trial of its stack: what trained together
        reporter = TrialReporter(study.trial(number), study.storage.guard)

        def on_eval(step, metrics):
            packing.mark_training(self.dir, True)       # set up and training: the launcher's fill rule
            reporter.report(metrics[obj["metric"]], step)
            if pruning and reporter.should_prune(step):
                raise StopTraining(f"pruned at step {step}: {obj['metric']} {metrics[obj['metric']]:.4f} "
                                   f"below the median of its grid point")
        return _Claimed(number, run_dir, reporter, on_eval)

    def _config(self, g: _Claimed):
        """The trial's run configuration; its steps go to the study (what its progress is counted against)."""
        from sandbox.sweep.spec import build_config
        config = build_config(self.spec["base"], _values(self.study.trial_by_number(g.number)))
        config.name = f"{self.study.study_name}/{Path(g.run_dir).name}"
        self.study.set_trial_attr(g.number, "steps", config.train.steps)
        return config

    def _heartbeat(self, numbers: list[int]) -> threading.Event:
        """With a database: beat for the trials until the returned event is set."""
        done = threading.Event()
        storage = self.study.storage
        if uses_heartbeat(storage):
            def beat():
                while not done.wait(heartbeat_interval(storage)):
                    for n in numbers:
                        self.study.beat(n)
            threading.Thread(target=beat, daemon=True).start()
        return done

    def _requeue(self, group: list[_Claimed], reason: str, count: bool = True) -> None:
        for g in group:
            g.reporter.abandon()
            requeue(self.study, self.study.trial_by_number(g.number), reason, count=count)

    def _out_of_memory(self, group: list[_Claimed], e: BaseException) -> int | None:
        """A group out of GPU memory: requeued if other workers hold the memory (and this worker stops, one fewer
        on the GPU), else trained in halves, else failed."""
        import torch
        torch.cuda.empty_cache()
        numbers = ", ".join(str(g.number) for g in group)
        if packing.gpu_shared():    # other workers hold the memory: these trials may fit once they are done
            self._requeue(group, "out of GPU memory while other processes held most of it")
            print(f"trials {numbers}: out of GPU memory while other processes held most of it; requeued, and this "
                  f"worker stops (one fewer on this GPU)", flush=True)
            return packing.EXIT_MEMORY
        if len(group) == 1:
            return self._record(group, None, f"CUDA out of memory: {str(e).splitlines()[0]}")
        self.stack = max(1, len(group) // 2)    # the stack did not fit: train it (and stack from now on) in halves
        print(f"trials {numbers}: out of GPU memory as a stack of {len(group)}; training them in stacks of "
              f"{self.stack}", flush=True)
        for g in group:
            g.reporter.abandon()
        for part in (group[:self.stack], group[self.stack:]):
            code = self.run_group([g.number for g in part])
            if code is not None:
                return code
        return None

    def _record(self, group: list[_Claimed], results: list[dict] | None, failure: str | None = None) -> int | None:
        """Tell the study how each trial ended: complete with its objective, pruned, or failed (``failure``: the
        whole group's training raised)."""
        import optuna
        import torch
        from sandbox.train.record import RunResult

        study, obj = self.study, self.spec["objective"]
        for i, g in enumerate(group):
            res = RunResult.from_dict(results[i]) if results is not None else _stored_result(self.dir / g.run_dir)
            why = failure
            if results is not None and res.status == "diverged":
                why = f"diverged: {res.error}"
            try:
                g.reporter.close()                # the evaluations not sent yet (e.g. during an outage)
                if res is not None:
                    study.set_trial_attr(g.number, "result", res.summary())
                if why is not None:
                    study.set_trial_attr(g.number, FINAL_FAIL, why)
                    study.tell(g.number, state=optuna.trial.TrialState.FAIL)
                    print(f"trial {g.number} failed: {why}", flush=True)
                    continue
                if res.status == "stopped":
                    study.set_trial_attr(g.number, "pruned", res.error)
                    study.tell(g.number, state=optuna.trial.TrialState.PRUNED)
                else:
                    study.tell(g.number, objective_value(res.history, obj["metric"], obj["mode"], obj["direction"]))
            except optuna.exceptions.UpdateFinishedTrialError:
                # declared lost meanwhile (e.g. a heartbeat missed during a long stall): its retry counts
                print(f"trial {g.number} was declared lost while it ran; its retry counts", flush=True)
                continue
            stacked = f" (stacked with {len(group) - 1} more)" if len(group) > 1 else ""
            print(f"trial {g.number} {res.status} in {res.wall_time_s:.1f} s{stacked}", flush=True)
        if failure is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None

    def _measure_pace(self, configs, left, results, wall: float) -> None:
        """Trial-steps per second over the group just trained, its start-up left out (what sizes later claims
        of its kind of stack), kept where the group trained at least as many trial-steps as this worker's
        longest of the kind before."""
        trained = sum(max(0, n - (c.train.steps - res["steps"])) for c, n, res in zip(configs, left, results)
                      if res is not None and res.get("steps") is not None)
        setup = max((res.get("setup_s") or 0.0 for res in results if res is not None), default=0.0)
        key, family = _kind_of(configs[0])
        self.trained_kinds.add(key)
        rate = packing.training_pace(trained, wall, setup)
        if rate is not None and trained >= self.paces.get(key, ("", 0.0, 0.0, 1))[2]:   # the longest group
            self.paces[key] = (family, rate, trained, len(configs))
            packing.record_pace(self.dir, self.paces)


def _kind_of(cfg) -> tuple[str, str]:
    """(stack key, family) of a configuration: what a pace is measured for, and its kin (same mixer, width and
    length), whose pace stands in for a kind not measured yet."""
    from sandbox.train import stack_key
    seq_len = getattr(cfg.task.params, "seq_len", None)
    return stack_key(cfg), f"{cfg.model.mixer}|{cfg.model.d_model}|{seq_len}"


@dataclass
class _Claimed:
    """A trial this worker trains: its number, run directory, reporter and evaluation callback."""
    number: int
    run_dir: str
    reporter: TrialReporter
    on_eval: object


def _values(t) -> dict:
    grid, tune = point_values(t)
    return {**grid, **tune}


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _stored_result(run_dir: Path):
    """The RunResult a failed group's run wrote (result.json), if any."""
    from sandbox.train.record import RunResult
    try:
        return RunResult.from_dict(json.loads((run_dir / "result.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


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
    p.add_argument("--points", help="a JSON list of the point ids to train (default: any waiting trial)")
    a = p.parse_args(argv)
    import optuna
    import torch
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(a.threads)
    sweep_dir = Path(a.worker)
    try:
        storage = open_storage(sweep_dir, a.storage, a.heartbeat, a.storage_timeout)
        study = load_study(storage, a.study)
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES") or None
        points = set(json.loads(Path(a.points).read_text())) if a.points else None
        return _Worker(sweep_dir, study, a.parent, gpu, a.stack, a.until, points).run()
    except StorageUnavailable as e:     # the one place a worker ends for the storage
        print(f"worker stopped: {e}", flush=True)
        return EXIT_STORAGE


if __name__ == "__main__":
    sys.exit(worker_main())

"""``sandbox sweep FILE.yaml``: a sweep YAML -> one Optuna study -> worker processes.

The launcher validates the sweep (sandbox/sweep_spec.py), creates or loads the study
(named after the sweep), enqueues every point the study does not hold yet, and keeps
one worker process per slot (``--workers-per-gpu`` on every visible GPU, or
``--workers`` on CPU) alive until the queue is empty. Workers pull WAITING trials,
train them with ``sandbox.train.train`` into ``SWEEP_DIR/trials/<number>-<point id>``
and report every evaluation to Optuna (pruning). Outputs and the live table are in
sandbox/sweep_report.py.

Trial bookkeeping (all in the study, so any machine can resume or report):
  user_attrs  grid, tune, sample, grid_id, point_id   what the trial is
              run_dir, worker ("host:pid:gpu")         where it runs
              result (train's summary), failure         how it ended; a ``failure``
                                                        is final and never re-run
              lost, duplicate_of                        superseded trials (FAIL)
              retry_of, retry_reason, retries           a copy of a lost trial
A trial whose worker died (seen by the launcher on its own host, or by a missed
heartbeat with PostgreSQL) or that was interrupted is marked FAIL and re-enqueued
as a copy that trains in the same run directory, resuming its checkpoint.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

# machine name recorded on trials (set it where machines share a hostname, e.g. containers)
HOST = os.environ.get("SANDBOX_SWEEP_HOST") or socket.gethostname()
MAX_RETRIES = 3          # a point whose worker dies this many times is recorded as failed
REAP_GRACE_S = 60        # a RUNNING trial no worker has claimed yet is lost after this long
FINAL_FAIL = "failure"


# ---- storage and study ------------------------------------------------------------------

def open_storage(sweep_dir: Path, url: str | None, heartbeat: int | None = None):
    """The journal file inside the sweep directory, or an RDB (PostgreSQL) URL with heartbeats."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage

    if not url:
        path = str(sweep_dir / "study.journal")
        return JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))
    hb = heartbeat or 10
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna.storages.RDBStorage(_driver_url(url), heartbeat_interval=hb, grace_period=max(3 * hb, hb + 5),
                                      heartbeat_stale_trial_callback=_requeue_stale)


def _driver_url(url: str) -> str:
    """SQLAlchemy 2.1 reads postgresql:// as psycopg 3; use psycopg2 (the `postgres` extra) when
    psycopg 3 is not installed."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in ("postgresql", "postgres"):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            return f"postgresql+psycopg2://{rest}"
    return url


def heartbeat_interval(storage) -> int | None:
    """Seconds between heartbeats if the storage (an RDB one, possibly behind Optuna's
    cache) checks them, else None."""
    get = getattr(storage, "get_heartbeat_interval", None)
    return get() if get is not None else None


def uses_heartbeat(storage) -> bool:
    return heartbeat_interval(storage) is not None


def _pruner(pruning: dict | None):
    import optuna
    from sandbox.sweep_report import GridMedianPruner
    return GridMedianPruner(**pruning) if pruning else optuna.pruners.NopPruner()


def load_study(storage, name: str, pruning: dict | None = None):
    """The study (every trial's values are enqueued, so the sampler never samples)."""
    import optuna
    return optuna.load_study(study_name=name, storage=storage, pruner=_pruner(pruning),
                             sampler=optuna.samplers.RandomSampler(seed=0))


def _trials(study, states=None):
    return study.get_trials(deepcopy=False, states=states)


def requeue(study, trial, reason: str, count: bool = True) -> int | None:
    """Fail a lost RUNNING trial (or take one a heartbeat check just failed) and enqueue a copy
    that resumes the same run directory. The copy records ``retry_of`` and ``retry_reason``
    (a finished trial's attributes cannot change). After MAX_RETRIES lost runs the point is
    recorded as failed instead."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState, create_trial

    storage, tid = study._storage, trial._trial_id
    retries = trial.user_attrs.get("retries", 0) + int(count)
    if trial.state == TrialState.RUNNING:
        try:
            storage.set_trial_user_attr(tid, "lost", reason)
            if retries > MAX_RETRIES:
                storage.set_trial_user_attr(tid, FINAL_FAIL, f"its worker was lost {retries} times; last: {reason}")
            if not storage.set_trial_state_values(tid, state=TrialState.FAIL):
                return None
        except UpdateFinishedTrialError:       # someone else finished or failed it first
            return None
    if retries > MAX_RETRIES:
        return None
    keep = ("grid", "tune", "sample", "grid_id", "point_id", "run_dir")
    attrs = {k: trial.user_attrs[k] for k in keep if k in trial.user_attrs}
    attrs.update(retries=retries, retry_of=trial.number, retry_reason=reason)
    template = create_trial(state=TrialState.WAITING, user_attrs=attrs, system_attrs={"fixed_params": {}})
    return storage.get_trial_number_from_id(storage.create_new_trial(study._study_id, template_trial=template))


def _requeue_stale(study, trial) -> None:       # RDBStorage's heartbeat-stale callback
    requeue(study, trial, f"no heartbeat from {trial.user_attrs.get('worker', 'its worker')}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(study, heartbeat: bool) -> list[str]:
    """Requeue RUNNING trials whose worker on this host is gone (and, with heartbeats,
    those of any machine that stopped beating)."""
    import optuna
    from optuna.trial import TrialState

    notes = []
    if heartbeat:
        optuna.storages.fail_stale_trials(study)
    now = time.time()
    for t in _trials(study, (TrialState.RUNNING,)):
        worker = t.user_attrs.get("worker")
        if worker:
            host, pid, _ = worker.rsplit(":", 2)
            if host == HOST and not _pid_alive(int(pid)):
                if requeue(study, t, f"worker {worker} died") is not None:
                    notes.append(f"trial {t.number}: worker {worker} died; requeued")
        elif not heartbeat and t.datetime_start and now - t.datetime_start.timestamp() > REAP_GRACE_S:
            if requeue(study, t, "no worker claimed it") is not None:
                notes.append(f"trial {t.number}: never claimed; requeued")
    return notes


def holds(trial) -> bool:
    """Does this trial settle its point (done, running, queued, or failed for a reason)?
    A lost trial does not; its retry (or, without one, a rerun of the sweep) does."""
    from optuna.trial import TrialState
    if trial.state == TrialState.FAIL:
        return FINAL_FAIL in trial.user_attrs and "duplicate_of" not in trial.user_attrs
    return True


def enqueue_points(study, spec) -> int:
    held = {t.user_attrs.get("point_id") for t in _trials(study) if holds(t)}
    n = 0
    for p in spec.points():
        if p.point_id in held:
            continue
        study.enqueue_trial({}, user_attrs={"grid": p.grid, "tune": p.tune, "sample": p.sample,
                                            "grid_id": p.grid_id, "point_id": p.point_id})
        n += 1
    return n


def prepare_study(spec, storage):
    """Create or load the sweep's study, refusing one that holds another sweep's base config."""
    import optuna
    from sandbox.config import ConfigError, flatten

    study = optuna.create_study(study_name=spec.name, storage=storage, load_if_exists=True,
                                direction=spec.objective.direction)
    fp = spec.fingerprint()
    old = study.user_attrs.get("spec")
    if old is None:
        study.set_user_attr("spec", fp)
    elif old != fp:
        a, b = flatten(old), flatten(fp)
        key = next((k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)), "base")
        raise ConfigError(spec.source, key, f"differs from the study {spec.name!r} already in this storage "
                          f"({a.get(key)!r} there, {b.get(key)!r} here); change `name` or the output directory")
    return study


# ---- worker --------------------------------------------------------------------------------

class _Worker:
    def __init__(self, sweep_dir: Path, study, parent: int, gpu: str | None):
        self.dir, self.study, self.parent, self.gpu = sweep_dir, study, parent, gpu
        self.spec = study.user_attrs["spec"]
        self.training = False
        self.stop = False

    def on_signal(self, signum, frame):
        self.stop = True
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
        for t in _trials(self.study, (TrialState.WAITING,)):
            try:
                if not storage.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                    continue
            except UpdateFinishedTrialError:
                continue
            if uses_heartbeat(storage):
                storage.record_heartbeat(t._trial_id)
            storage.set_trial_user_attr(t._trial_id, "worker", f"{HOST}:{os.getpid()}:{self.gpu or 'cpu'}")
            point = t.user_attrs.get("point_id")
            for o in _trials(self.study):
                if o.number != t.number and o.user_attrs.get("point_id") == point and holds(o) and (
                        o.state not in (TrialState.RUNNING, TrialState.WAITING) or o.number < t.number):
                    storage.set_trial_user_attr(t._trial_id, "duplicate_of", o.number)
                    storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
                    break
            else:
                return t._trial_id
        return None

    def run(self) -> int:
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)
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
        from sandbox.sweep_report import objective_value
        from sandbox.sweep_spec import build_config
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

        def on_eval(step, metrics):
            trial.report(metrics[obj["metric"]], step)
            if pruning and trial.should_prune():
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
            requeue(study, storage.get_trial(tid), "interrupted", count=False)
            return 130
        except TrainingDiverged as e:
            failure = f"diverged: {e}"
        except torch.cuda.OutOfMemoryError as e:
            failure = f"CUDA out of memory: {str(e).splitlines()[0]}"
        except Exception as e:              # any other error is this trial's, not the sweep's
            failure = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        beat.set()
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
    p = argparse.ArgumentParser(prog="python -m sandbox.sweep")
    p.add_argument("--worker", required=True, help="sweep directory")
    p.add_argument("--study", required=True)
    p.add_argument("--storage")
    p.add_argument("--heartbeat", type=int)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    import optuna
    import torch
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(a.threads)
    sweep_dir = Path(a.worker)
    storage = open_storage(sweep_dir, a.storage, a.heartbeat)
    study = load_study(storage, a.study)
    if study.user_attrs["spec"]["pruning"]:
        study.pruner = _pruner(study.user_attrs["spec"]["pruning"])
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES") or None
    return _Worker(sweep_dir, study, a.parent, gpu).run()


# ---- launcher ------------------------------------------------------------------------------

def visible_gpus() -> list[str]:
    import torch
    if not torch.cuda.is_available():
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()][: torch.cuda.device_count()]
    return [str(i) for i in range(torch.cuda.device_count())]


class GpuSampler(threading.Thread):
    """Samples ``nvidia-smi`` utilisation every few seconds while the sweep runs."""

    def __init__(self, period: float = 2.0):
        super().__init__(daemon=True)
        self.period, self.samples, self.done = period, [], threading.Event()
        self.enabled = shutil.which("nvidia-smi") is not None

    def run(self):
        while self.enabled and not self.done.wait(self.period):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                     timeout=10).stdout
                self.samples.append({int(i): (float(u), float(m)) for i, u, m in
                                     (line.split(", ") for line in out.strip().splitlines())})
            except (OSError, ValueError, subprocess.SubprocessError):
                pass

    def latest(self) -> str:
        if not self.samples:
            return ""
        return "  ".join(f"gpu{i} {u:.0f}%" for i, (u, _) in sorted(self.samples[-1].items()))


def run_sweep(spec, sweep_dir: Path, *, storage_url: str | None = None, workers: int | None = None,
              workers_per_gpu: int | None = None, heartbeat: int | None = None, live: bool | None = None) -> int:
    from sandbox import sweep_report as report

    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    console = report.make_console()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    # One launcher per journal: it may then treat every RUNNING trial whose worker process is
    # gone as lost. With a shared database several launchers (machines) may share a directory.
    lock = open(sweep_dir / ".lock", "w")
    try:
        if not storage_url:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ValueError(f"{sweep_dir}: another `sandbox sweep` is running here "
                         f"(see `sandbox sweep status {sweep_dir}`)") from None
    storage = open_storage(sweep_dir, storage_url, heartbeat)
    hb = uses_heartbeat(storage)
    prepare_study(spec, storage)
    shutil.copyfile(spec.source, sweep_dir / "sweep.yaml")
    (sweep_dir / "sweep.json").write_text(json.dumps({"study": spec.name, "source": str(spec.source),
                                                      "storage": _public_url(storage_url) if storage_url else None}))
    study = load_study(storage, spec.name, spec.fingerprint()["pruning"])
    notes = reap(study, hb)
    added = enqueue_points(study, spec)

    gpus = visible_gpus()
    if workers and workers_per_gpu:
        raise ValueError("--workers and --workers-per-gpu: give one of them")
    if gpus:
        n = workers or (workers_per_gpu or 1) * len(gpus)
        slots = [gpus[i % len(gpus)] for i in range(n)]
    else:
        if workers_per_gpu:
            raise ValueError("--workers-per-gpu: no GPU is visible here; use --workers N")
        slots = [None] * (workers or 1)
    threads = int(os.environ.get("OMP_NUM_THREADS") or 0) or max(1, (os.cpu_count() or 1) // len(slots))
    (sweep_dir / "logs").mkdir(exist_ok=True)
    where = f"{len(gpus)} GPU(s) x {len(slots) // len(gpus)}" if gpus else "CPU"
    console.print(f"sweep [bold]{spec.name}[/]: {len(spec.points())} points ({added} newly queued), "
                  f"{len(slots)} workers on {where}; storage "
                  f"{_public_url(storage_url) if storage_url else sweep_dir / 'study.journal'}; "
                  f"dir {sweep_dir}; logs {sweep_dir / 'logs'}")
    for note in notes:
        console.print(note)

    def spawn(slot: int) -> subprocess.Popen:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if slots[slot] is not None:
            env["CUDA_VISIBLE_DEVICES"] = slots[slot]
        cmd = [sys.executable, "-m", "sandbox.sweep", "--worker", str(sweep_dir), "--study", spec.name,
               "--parent", str(os.getpid()), "--threads", str(threads)]
        if storage_url:
            cmd += ["--storage", storage_url, "--heartbeat", str(heartbeat or 10)]
        log = open(sweep_dir / "logs" / f"worker-{slot}.log", "a")
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    procs: dict[int, subprocess.Popen] = {}
    crashes, interrupted = 0, False
    t0 = time.time()
    sampler = GpuSampler()
    sampler.start()
    board = report.Board(console, spec.name, t0, live, spec.objective.direction)
    try:
        with board:
            while True:
                for slot, p in list(procs.items()):
                    code = p.poll()
                    if code is not None:
                        del procs[slot]
                        if code not in (0, 130):
                            crashes += 1
                            board.note(f"worker {slot} (pid {p.pid}) exited with {code}; see logs/worker-{slot}.log")
                for note in reap(study, hb):
                    board.note(note)
                trials = _trials(study)
                waiting = sum(t.state.name == "WAITING" for t in trials)
                running = sum(t.state.name == "RUNNING" for t in trials)
                crashed = crashes > 3 * len(slots)
                if waiting and not crashed:
                    for slot in [s for s in range(len(slots)) if s not in procs][:waiting]:
                        procs[slot] = spawn(slot)
                board.update(trials, len(procs), sampler.latest())
                if not procs:
                    if crashed:
                        board.note("workers keep crashing; stopping (see the logs)")
                        break
                    if not waiting and not running:
                        break
                    # else: trials still run elsewhere (another machine, or a previous launcher's
                    # worker finishing); wait, so that a retry of theirs is picked up here
                time.sleep(1.0)
    except KeyboardInterrupt:
        interrupted = True
        console.print("interrupted: stopping workers (their trials are requeued and resume from a checkpoint)")
        _stop_workers(procs, study)
    finally:
        sampler.done.set()
        wall = time.time() - t0
        trials = _trials(study)
        report.write_outputs(sweep_dir, study, trials, wall_s=wall, since=t0, gpu_samples=sampler.samples,
                             console=console)
        lock.close()
    if interrupted:
        console.print(f"rerun `sandbox sweep {spec.source}` (same --out) to resume")
        return 130
    left = [t for t in trials if t.state.name in ("WAITING", "RUNNING")]
    return 1 if left else 0


def _stop_workers(procs: dict, study) -> None:
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.time() + 60
    try:
        for p in procs.values():
            p.wait(timeout=max(0.1, deadline - time.time()))
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    reap(study, False)


def _public_url(url: str) -> str:
    """The storage URL without its password (for files and messages)."""
    import re
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


# ---- CLI -------------------------------------------------------------------------------------

def cmd_sweep(args) -> int:
    from sandbox.sweep_spec import load_sweep
    from sandbox import sweep_report

    if args.target[0] == "status":
        if len(args.target) != 2:
            raise ValueError("usage: sandbox sweep status SWEEP_DIR")
        return sweep_report.status(Path(args.target[1]), args.storage)
    if len(args.target) != 1:
        raise ValueError("usage: sandbox sweep FILE.yaml  |  sandbox sweep status SWEEP_DIR")
    for flag in ("workers", "workers_per_gpu", "heartbeat"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise ValueError(f"--{flag.replace('_', '-')}: must be >= 1, got {v}")
    spec = load_sweep(args.target[0])
    if args.dry_run:
        return sweep_report.print_points(spec)
    out = Path(args.out) if args.out else Path("sweeps_out") / spec.name
    return run_sweep(spec, out, storage_url=args.storage, workers=args.workers,
                     workers_per_gpu=args.workers_per_gpu, heartbeat=args.heartbeat,
                     live=False if args.no_live else None)


def add_cli(sub) -> None:
    s = sub.add_parser("sweep", help="run a sweep YAML on Optuna (or: sweep status DIR)",
                       description="Run every point of a sweep YAML as Optuna trials in worker processes; "
                                   "rerunning the same command resumes. `sandbox sweep status DIR` shows progress.")
    s.add_argument("target", nargs="+", metavar="FILE.yaml | status DIR")
    s.add_argument("--out", help="sweep directory (default sweeps_out/<sweep name>)")
    s.add_argument("--workers", type=int, help="number of worker processes (default: 1 on CPU, "
                   "--workers-per-gpu x GPUs otherwise)")
    s.add_argument("--workers-per-gpu", type=int, help="worker processes per visible GPU (default 1)")
    s.add_argument("--storage", help="shared Optuna storage, e.g. postgresql://user:pw@host/db "
                   "(default: a journal file in the sweep directory)")
    s.add_argument("--heartbeat", type=int, help="seconds between worker heartbeats with --storage "
                   "(default 10; a trial is retried after 3 missed)")
    s.add_argument("--dry-run", action="store_true", help="validate and list the points, run nothing")
    s.add_argument("--no-live", action="store_true", help="print progress lines instead of a live table")
    s.set_defaults(func=cmd_sweep)


if __name__ == "__main__":
    sys.exit(worker_main())

"""The launcher of ``sandbox sweep FILE.yaml``: a sweep YAML -> one Optuna study -> worker processes.

It validates the sweep (spec.py), creates or loads the study (study.py), enqueues every
point the study does not hold yet, and keeps one worker process (worker.py) per slot
alive until the queue is empty. How a GPU is filled (packing.py): each worker trains the
trials of a grid point stacked (``--stack``); a GPU has one worker, or under CUDA MPS two
to start with and more while its measured utilisation stays low as they train (or
``--workers-per-gpu N`` under MPS); on CPU ``--workers``. It requeues the trials of workers
that die, samples GPU utilisation, shows the live table and writes the outputs (report.py).
With ``--time-limit`` it stops at the limit as Ctrl-C would, and before it the workers take
only what finishes in time.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.train.files import write_json
from sandbox.train.mps import MPS
from sandbox.sweep import packing
from sandbox.sweep.storage import DEFAULT_TIMEOUT_S, EXIT_STORAGE, StorageUnavailable
from sandbox.sweep.study import (adopt_base, enqueue_points, open_storage, prepare_study, reap, trials_in,
                                  unpack_journal, uses_heartbeat)

# ---- launcher ------------------------------------------------------------------------------

def visible_gpus() -> list[str]:
    import torch
    if not torch.cuda.is_available():
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()][: torch.cuda.device_count()]
    return [str(i) for i in range(torch.cuda.device_count())]


def worker_slots(gpus: list[str], workers: int | None, workers_per_gpu: int | None) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES of each worker (None: a CPU worker)."""
    if workers and workers_per_gpu:
        raise ValueError("--workers and --workers-per-gpu: give one of them")
    if not gpus:
        if workers_per_gpu:
            raise ValueError("--workers-per-gpu: no GPU is visible here; use --workers N")
        return [None] * (workers or 1)
    n = workers or (workers_per_gpu or 1) * len(gpus)
    return [gpus[i % len(gpus)] for i in range(n)]      # round-robin: GPUs fill evenly


class GpuSampler(threading.Thread):
    """Samples ``nvidia-smi`` utilisation every few seconds while the sweep runs, on the sweep's
    own GPUs where CUDA_VISIBLE_DEVICES names them by index (others may run other work)."""

    def __init__(self, gpus: list[str] = (), period: float = 2.0):
        super().__init__(daemon=True)
        self.period, self.samples, self.times, self.done = period, [], [], threading.Event()
        self.total_mib: dict[int, float] = {}
        self.enabled = shutil.which("nvidia-smi") is not None
        self.select = ["-i", ",".join(gpus)] if gpus and all(g.isdigit() for g in gpus) else []

    def run(self):
        while self.enabled and not self.done.wait(self.period):
            try:
                out = subprocess.run(["nvidia-smi", *self.select,
                                      "--query-gpu=index,utilization.gpu,memory.used,memory.total",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                     timeout=10).stdout
                rows = [line.split(", ") for line in out.strip().splitlines()]
                self.total_mib = {int(i): float(t) for i, _, _, t in rows}
                self.samples.append({int(i): (float(u), float(m)) for i, u, m, _ in rows})
                self.times.append(time.time())
            except (OSError, ValueError, subprocess.SubprocessError):
                pass

    def latest(self) -> str:
        if not self.samples:
            return ""
        return "  ".join(f"gpu{i} {u:.0f}%" for i, (u, _) in sorted(self.samples[-1].items()))


@dataclass
class Plan:
    """How a launch fills its machine: the workers' GPUs (None: CPU), the trials stacked in each, MPS, whether
    it adds workers to a GPU that stays underfilled, the time limit, and each worker's CPU threads."""
    slots: list
    stack: int
    mps: MPS | None
    grow: bool
    until: float | None
    threads: int
    notes: list[str] = field(default_factory=list)


def run_sweep(spec, sweep_dir: Path, *, storage_url: str | None = None, workers: int | None = None,
              workers_per_gpu: int | None = None, heartbeat: int | None = None, live: bool | None = None,
              retry_failed: bool = False, storage_timeout: float = DEFAULT_TIMEOUT_S, stack: int | None = None,
              time_limit: float | None = None, retrain: list[str] = ()) -> int:
    """Run a sweep to its end (or its time limit, or Ctrl-C): 0 when every trial finished, 1 when some are left,
    130 when interrupted."""
    import optuna
    from sandbox.sweep import report

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    console = report.make_console()
    gpus = visible_gpus()
    worker_slots(gpus, workers, workers_per_gpu)          # argument errors before anything starts
    lock = _lock(sweep_dir, shared=bool(storage_url))
    try:
        study, added, notes = _open_study(spec, sweep_dir, storage_url, heartbeat, storage_timeout, retry_failed,
                                          retrain)
        plan = _plan(spec, sweep_dir, gpus, workers, workers_per_gpu, stack, time_limit, console)
        _announce(console, spec, sweep_dir, storage_url, gpus, plan, added, time_limit, notes + plan.notes)
        launch = _Launch(spec, sweep_dir, study, plan, gpus, storage_url, heartbeat, storage_timeout)
        t0 = time.time()
        try:
            outcome = launch.supervise(report.Board(console, spec.name, t0, live, spec.objective.direction))
        finally:
            if plan.mps is not None:
                plan.mps.stop()
            report.write_outputs(sweep_dir, study, trials_in(study), wall_s=time.time() - t0, since=t0,
                                 gpu_samples=launch.sampler.samples, console=console)
    finally:
        lock.close()
    return _closing(console, spec, study, outcome, launch.points)


def _lock(sweep_dir: Path, shared: bool):
    """One launcher per journal: it may then treat every RUNNING trial whose worker process is gone as lost. With
    a shared database several launchers (machines) may share a directory."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    lock = open(sweep_dir / ".lock", "w")
    try:
        if not shared:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ValueError(f"{sweep_dir}: another `sandbox sweep` is running here "
                         f"(see `sandbox sweep status {sweep_dir}`)") from None
    return lock


def _open_study(spec, sweep_dir, storage_url, heartbeat, storage_timeout, retry_failed, retrain):
    """The sweep's study, its lost trials requeued and its points not held yet queued: (study, trials newly
    queued, notes)."""
    # sweep.json first: `sandbox sweep status` (and anything polling the directory) finds the study name as
    # soon as the journal exists; written whole (a rerun rewrites it while others may read it)
    write_json(sweep_dir / "sweep.json", {"study": spec.name, "source": str(spec.source),
                                          "storage": _public_url(storage_url) if storage_url else None,
                                          "overrides": spec.overrides})
    unpacked = None if storage_url else unpack_journal(sweep_dir)
    storage = open_storage(sweep_dir, storage_url, heartbeat, storage_timeout)
    study = prepare_study(spec, storage)
    shutil.copyfile(spec.source, sweep_dir / "sweep.yaml")
    notes = reap(study, uses_heartbeat(storage), adopt_foreign=True)
    adopted = adopt_base(study, spec)
    if adopted:
        notes.insert(0, adopted)
    if unpacked:
        notes.insert(0, unpacked)
    added = enqueue_points(study, spec, retry_failed, retrain)
    return study, added, notes


def _plan(spec, sweep_dir, gpus, workers, workers_per_gpu, stack, time_limit, console) -> Plan:
    stack = packing.group_size(spec) if stack is None else stack
    mps, grow, notes = None, False, []
    if gpus and time_limit is not None and workers_per_gpu is None and not workers:
        # stacks are sized to the limit by paces measured alone; a second worker would slow them to half
        notes.append("packing: one worker per GPU under a time limit (a second one, sharing the GPU, would "
                     "slow the stacks each sized to the limit; --workers-per-gpu N to pack anyway)")
        workers_per_gpu = 1
    if gpus and (workers_per_gpu is None or workers_per_gpu > 1) and not workers:
        mps = MPS(sweep_dir)
        if not mps.start():
            if workers_per_gpu:
                console.print(f"packing: CUDA MPS is unavailable ({mps.reason}): one worker per GPU, since "
                              f"processes without MPS only take turns on a GPU")
                workers_per_gpu = 1
            mps = None
        if mps is not None and workers_per_gpu is None:
            workers_per_gpu, grow = packing.START_WORKERS_PER_GPU, True
    if sys.dont_write_bytecode and not sys.pycache_prefix:
        notes.append("start-up: Python may not write bytecode here (PYTHONDONTWRITEBYTECODE), so every worker "
                     "compiles torch's source again as it imports it (seconds each); PYTHONPYCACHEPREFIX=DIR "
                     "with that variable unset gives them one cache")
    slots = worker_slots(gpus, workers, workers_per_gpu)
    until = time.time() + time_limit if time_limit is not None else None
    packing.clear_pace(sweep_dir)
    threads = int(os.environ.get("OMP_NUM_THREADS") or 0) or max(1, (os.cpu_count() or 1) // len(slots))
    return Plan(slots, stack, mps, grow, until, threads, notes)


def _announce(console, spec, sweep_dir, storage_url, gpus, plan: Plan, added, time_limit, notes) -> None:
    slots = plan.slots
    where = f"{len(gpus)} GPU(s) x {len(slots) // len(gpus)}" if gpus else "CPU"
    overrides = f" with --set {' --set '.join(spec.overrides)}" if spec.overrides else ""
    console.print(f"sweep [bold]{spec.name}[/]{overrides}: {len(spec.points())} trials over {spec.grid_points} "
                  f"grid points ({added} newly queued), {len(slots)} workers on {where}; storage "
                  f"{_public_url(storage_url) if storage_url else sweep_dir / 'study.journal'}; "
                  f"dir {sweep_dir}; logs {sweep_dir / 'logs'}", highlight=False)
    console.print(f"packing: up to {plan.stack} trials of a grid point stacked in each worker; "
                  + (f"{len(slots) // len(gpus)} worker(s) per GPU" if gpus else f"{len(slots)} CPU worker(s)")
                  + (f" under CUDA MPS (private daemon in {plan.mps.root})" if plan.mps else "")
                  + (f", one more while a GPU stays under {packing.IDLE_BELOW:.0f}% busy for "
                     f"{packing.WINDOW_S:.0f} s with its workers training (at most {packing.MAX_WORKERS_PER_GPU})"
                     if plan.grow else ""), highlight=False)
    if plan.until is not None:
        console.print(f"time limit: {time_limit:.0f} s (until {time.strftime('%H:%M:%S', time.localtime(plan.until))}"
                      f"); workers take only trials that finish by then at their kind's measured pace, and stop "
                      f"the rest in order at the limit", highlight=False)
    for note in notes:
        console.print(note, highlight=False)


@dataclass
class Outcome:
    interrupted: bool = False
    out_of_time: bool = False        # a worker found that no waiting trial finishes before the limit
    timed_out: bool = False          # the limit came with workers still training


class _Launch:
    """Keeps one worker process per slot alive while trials wait, requeues the trials of workers that die, adds
    workers to an underfilled GPU, and shows the progress."""

    def __init__(self, spec, sweep_dir, study, plan: Plan, gpus, storage_url, heartbeat, storage_timeout):
        self.spec, self.dir, self.study, self.plan, self.gpus = spec, sweep_dir, study, plan, gpus
        self.storage_url, self.heartbeat, self.storage_timeout = storage_url, heartbeat, storage_timeout
        self.procs: dict[int, subprocess.Popen] = {}
        self.crashes = 0
        self.retired: set[int] = set()      # slots not refilled: their worker ran out of memory next to others
        self.changed = {g: time.time() for g in gpus}
        self.sampler = GpuSampler(gpus)
        self.outcome = Outcome()
        # this file's points: a study two files share (a figure's control and its rows) trains, in this launch,
        # only what this file asks for, whatever else waits in it. Named for this launch alone: launchers on
        # several machines may share the directory.
        self.points = {p.point_id for p in spec.points()}
        self.points_file = sweep_dir / "logs" / f"points-{uuid.uuid4().hex[:12]}.json"

    def supervise(self, board) -> Outcome:
        (self.dir / "logs").mkdir(exist_ok=True)
        write_json(self.points_file, sorted(self.points))
        self.sampler.start()
        hb = uses_heartbeat(self.study.storage)
        try:
            with board:
                while True:
                    self._collect_exits(board)
                    for note in reap(self.study, hb):
                        board.note(note)
                    trials = [t for t in trials_in(self.study) if t.user_attrs.get("point_id") in self.points]
                    waiting = sum(t.state.name == "WAITING" for t in trials)
                    running = sum(t.state.name == "RUNNING" for t in trials)
                    crashed = self.crashes > 3 * len(self.plan.slots)
                    if waiting and not crashed and not self.outcome.out_of_time:
                        waiting = self._fill(waiting)
                        if self.plan.grow and waiting > 0:
                            self._grow(board)
                    board.update(trials, len(self.procs), self.sampler.latest())
                    if self._done(board, waiting, running, crashed):
                        break
                    time.sleep(1.0)
        except KeyboardInterrupt:
            self.outcome.interrupted = True
            board.console.print("interrupted: stopping workers (their trials are requeued and resume from a "
                                "checkpoint)")
            _stop_workers(self.procs, self.study)
        except StorageUnavailable:
            _stop_workers(self.procs, self.study)      # they checkpoint; the caller says how to resume
            raise
        finally:
            self.sampler.done.set()
            self.points_file.unlink(missing_ok=True)
        return self.outcome

    def _collect_exits(self, board) -> None:
        slots = self.plan.slots
        for slot, p in list(self.procs.items()):
            code = p.poll()
            if code is None:
                continue
            del self.procs[slot]
            self.outcome.out_of_time |= code == packing.EXIT_TIME_LIMIT
            if code == packing.EXIT_MEMORY and any(slots[s] == slots[slot] for s in self.procs):
                self.retired.add(slot)
                self.changed[slots[slot]] = float("inf")      # and no more workers there
                board.note(f"packing: gpu{slots[slot]} ran out of memory; going on with "
                           f"{sum(slots[s] == slots[slot] for s in self.procs)} worker(s) there")
            if code not in (0, 130, EXIT_STORAGE, packing.EXIT_TIME_LIMIT, packing.EXIT_MEMORY):
                self.crashes += 1
                board.note(f"worker {slot} (pid {p.pid}) exited with {code}; see logs/worker-{slot}.log")

    def _fill(self, waiting: int) -> int:
        """Start a worker in each free slot while trials wait; the waiting trials no worker was started for."""
        free = [s for s in range(len(self.plan.slots)) if s not in self.procs and s not in self.retired]
        for slot in free[:waiting]:
            self.procs[slot] = self._spawn(slot)
            waiting -= self.plan.stack
        return waiting

    def _grow(self, board) -> None:
        """One more worker on a GPU that stayed underfilled with all its workers training (under MPS)."""
        slots, now, sampler = self.plan.slots, time.time(), self.sampler
        for g in self.gpus:
            n = sum(slots[s] == g for s in self.procs)
            since = packing.training_since(self.dir, [self.procs[s].pid for s in self.procs if slots[s] == g])
            if (g.isdigit() and n < packing.MAX_WORKERS_PER_GPU and now - self.changed[g] > packing.WINDOW_S
                    and since is not None
                    and packing.underfilled(sampler.samples, sampler.times, int(g), now, since=since)
                    and packing.room_for_one_more(sampler.samples[-1][int(g)][1], sampler.total_mib.get(int(g), 0.0),
                                                  n)):
                slots.append(g)
                self.changed[g] = now
                self.procs[len(slots) - 1] = self._spawn(len(slots) - 1)
                board.note(f"packing: gpu{g} stayed under {packing.IDLE_BELOW:.0f}% busy with its workers "
                           f"training; worker {n + 1} on it")

    def _done(self, board, waiting: int, running: int, crashed: bool) -> bool:
        if self.plan.until is not None and time.time() >= self.plan.until and self.procs:
            self.outcome.timed_out = True
            board.note("time limit reached: stopping the running trials (they resume from checkpoints)")
            _stop_workers(self.procs, self.study)
            self.procs.clear()
            return True
        if self.procs:
            return False
        if self.outcome.out_of_time:
            board.note(f"time limit: {waiting} waiting trial(s) would not finish before it; they stay queued")
            return True
        if crashed:
            board.note("workers keep crashing; stopping (see the logs)")
            return True
        # trials still running elsewhere (another machine, or a previous launcher's worker finishing): wait, so
        # that a retry of theirs is picked up here
        return not waiting and not running

    def _spawn(self, slot: int) -> subprocess.Popen:
        plan = self.plan
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(plan.mps.env if plan.mps else {}))
        if plan.slots[slot] is not None:
            env["CUDA_VISIBLE_DEVICES"] = plan.slots[slot]
        cmd = [sys.executable, "-m", "sandbox.sweep.worker", "--worker", str(self.dir), "--study", self.spec.name,
               "--parent", str(os.getpid()), "--threads", str(plan.threads), "--storage-timeout",
               str(self.storage_timeout), "--stack", str(plan.stack), "--points", str(self.points_file)]
        if plan.until is not None:
            cmd += ["--until", f"{plan.until:.3f}"]
        if self.storage_url:
            cmd += ["--storage", self.storage_url, "--heartbeat", str(self.heartbeat or 10)]
        with open(self.dir / "logs" / f"worker-{slot}.log", "a") as log:    # workers get their own session:
            return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,   # a terminal's Ctrl-C
                                    start_new_session=True)                             # reaches the launcher only


def _closing(console, spec, study, outcome: Outcome, points: set[str]) -> int:
    again = f"sandbox sweep {spec.source}" + "".join(f" --set {o}" for o in spec.overrides)
    if outcome.interrupted:
        console.print(f"rerun `{again}` (same --out) to resume")
        return 130
    left = [t for t in trials_in(study) if t.state.name in ("WAITING", "RUNNING")
            and t.user_attrs.get("point_id") in points]
    if left and (outcome.timed_out or outcome.out_of_time):
        console.print(f"time limit: {len(left)} trial(s) left; rerun `{again}` (same --out) to go on")
    return 1 if left else 0


def _stop_workers(procs: dict, study) -> None:
    study.storage.stop_retrying()      # stopping: an outage is not waited out
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
    try:
        reap(study, False)
    except StorageUnavailable:          # nor could the workers requeue theirs: the next run does
        pass


def _public_url(url: str) -> str:
    """The storage URL without its password (for files and messages)."""
    import re
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)

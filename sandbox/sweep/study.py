"""The sweep's Optuna study: storage, the trial queue and its bookkeeping.

One study per sweep, named after it, in a journal file inside the sweep directory
(one machine, no server) or in a shared database given by URL (PostgreSQL; several
machines, with heartbeats). Every trial's values are fixed when it is enqueued, so
Optuna's sampler never samples; the study is the queue, the record and the pruner's
memory.

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
The pruner compares trials of one grid point only (``GridMedianPruner``).
Optuna's private ``study._storage`` / ``study._study_id`` are used for the atomic
queue operations that its public API only exposes inside ``Study.optimize``.
"""
from __future__ import annotations

import os
import statistics
import socket
import time
import warnings
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState, create_trial

# machine name recorded on trials (set it where machines share a hostname, e.g. containers)
HOST = os.environ.get("SANDBOX_SWEEP_HOST") or socket.gethostname()
MAX_RETRIES = 3          # a point whose worker dies this many times is recorded as failed
REAP_GRACE_S = 60        # a RUNNING trial no worker has claimed yet is lost after this long
FINAL_FAIL = "failure"


# ---- storage and study ------------------------------------------------------------------

def open_storage(sweep_dir: Path, url: str | None, heartbeat: int | None = None):
    """The journal file inside the sweep directory, or an RDB (PostgreSQL) URL with heartbeats."""
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


def make_pruner(pruning: dict | None):
    return GridMedianPruner(**pruning) if pruning else optuna.pruners.NopPruner()


def load_study(storage, name: str, pruning: dict | None = None):
    """The study (every trial's values are enqueued, so the sampler never samples)."""
    return optuna.load_study(study_name=name, storage=storage, pruner=make_pruner(pruning),
                             sampler=optuna.samplers.RandomSampler(seed=0))


def trials_in(study, states=None):
    return study.get_trials(deepcopy=False, states=states)


def requeue(study, trial, reason: str, count: bool = True) -> int | None:
    """Fail a lost RUNNING trial (or take one a heartbeat check just failed) and enqueue a copy
    that resumes the same run directory. The copy records ``retry_of`` and ``retry_reason``
    (a finished trial's attributes cannot change). After MAX_RETRIES lost runs the point is
    recorded as failed instead."""

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


def _worker_alive(pid: int) -> bool:
    """Is ``pid`` a live sweep worker on this host? (With /proc, a reused pid or a zombie is not.)"""
    cmdline = Path(f"/proc/{pid}/cmdline")
    if Path("/proc/self").exists():
        try:
            return b"sandbox.sweep.worker" in cmdline.read_bytes()
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(study, heartbeat: bool, adopt_foreign: bool = False) -> list[str]:
    """Requeue RUNNING trials whose worker on this host is gone (and, with heartbeats,
    those of any machine that stopped beating). ``adopt_foreign`` (a launcher starting on a
    journal, which only one machine uses at a time): trials of workers on other hosts are
    lost too, e.g. a sweep directory copied from a machine that was taken away."""

    notes = []
    if heartbeat:
        optuna.storages.fail_stale_trials(study)
    now = time.time()
    for t in trials_in(study, (TrialState.RUNNING,)):
        worker = t.user_attrs.get("worker")
        if worker:
            host, pid, _ = worker.rsplit(":", 2)
            gone = not _worker_alive(int(pid)) if host == HOST else adopt_foreign and not heartbeat
            if gone and requeue(study, t, f"worker {worker} died") is not None:
                notes.append(f"trial {t.number}: worker {worker} died; requeued")
        elif not heartbeat and t.datetime_start and now - t.datetime_start.timestamp() > REAP_GRACE_S:
            if requeue(study, t, "no worker claimed it") is not None:
                notes.append(f"trial {t.number}: never claimed; requeued")
    return notes


def holds(trial) -> bool:
    """Does this trial settle its point (done, running, queued, or failed for a reason)?
    A lost trial does not; its retry (or, without one, a rerun of the sweep) does."""
    if trial.state == TrialState.FAIL:
        return FINAL_FAIL in trial.user_attrs and "duplicate_of" not in trial.user_attrs
    return True


def enqueue_points(study, spec, retry_failed: bool = False) -> int:
    """Queue every point no trial holds yet; ``retry_failed``: also those whose trials failed."""
    trials = trials_in(study)
    held = {t.user_attrs.get("point_id") for t in trials
            if holds(t) and not (retry_failed and t.state == TrialState.FAIL)}
    failed = {t.user_attrs.get("point_id"): t.number for t in trials if t.state == TrialState.FAIL and holds(t)}
    n = 0
    for p in spec.points():
        if p.point_id in held:
            continue
        attrs = {"grid": p.grid, "tune": p.tune, "sample": p.sample, "grid_id": p.grid_id, "point_id": p.point_id}
        if p.point_id in failed:   # the worker must not take the failed trial for a duplicate
            attrs.update(retry_of=failed[p.point_id], retry_reason="--retry-failed")
        study.enqueue_trial({}, user_attrs=attrs)
        n += 1
    return n


def prepare_study(spec, storage):
    """Create or load the sweep's study, refusing one that holds another sweep's base config."""
    from sandbox.config import ConfigError, flatten

    study = optuna.create_study(study_name=spec.name, storage=storage, load_if_exists=True,
                                direction=spec.objective.direction)
    fp = spec.fingerprint()
    old = study.user_attrs.get("spec")
    if old is None:
        study.set_user_attr("spec", fp)
        return study
    # base keys only one side has are config fields added or removed by a newer sandbox: no change
    a, b = flatten({"base": old["base"]}), flatten({"base": fp["base"]})
    a.update(objective=old.get("objective"), pruning=old.get("pruning"))
    b.update(objective=fp["objective"], pruning=fp["pruning"])
    for key in sorted(set(a) & set(b)):
        if a[key] != b[key]:
            raise ConfigError(spec.source, key, f"differs from the study {spec.name!r} already in this storage "
                              f"({a[key]!r} there, {b[key]!r} here); change `name` or the output directory")
    return study


# ---- objective and pruning ---------------------------------------------------------------

def objective_value(history: list[dict], metric: str, mode: str, direction: str) -> float:
    values = [h[metric] for h in history if h.get(metric) is not None]
    if not values:
        raise ValueError(f"objective: the run has no {metric} evaluation")
    if mode == "final":
        return float(values[-1])
    return float(max(values) if direction == "maximize" else min(values))


class GridMedianPruner(optuna.pruners.BasePruner):
    """Median pruning among the trials of the same grid point only: comparing a small
    model's learning rates with a large model's accuracy would prune the small model
    for being small. A trial is stopped when its best value so far is worse than the
    median, at the same step, of the finished trials of its grid point."""

    def __init__(self, median: bool = True, warmup_evals: int = 1, min_trials: int = 2):
        self.warmup_evals, self.min_trials = warmup_evals, min_trials

    def prune(self, study, trial) -> bool:
        step = trial.last_step
        if step is None or len(trial.intermediate_values) <= self.warmup_evals:
            return False
        maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
        best = max if maximize else min
        gid = trial.user_attrs.get("grid_id")
        others = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            if t.user_attrs.get("grid_id") == gid and t.number != trial.number:
                upto = [v for s, v in t.intermediate_values.items() if s <= step]
                if upto and step in t.intermediate_values:
                    others.append(best(upto))
        if len(others) < self.min_trials:
            return False
        mine = best(trial.intermediate_values[s] for s in trial.intermediate_values if s <= step)
        med = statistics.median(others)
        return mine < med if maximize else mine > med

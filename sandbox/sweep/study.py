"""The sweep's Optuna study: storage, the trial queue and its bookkeeping.

One study per sweep, named after it, in a journal file inside the sweep directory
(one machine, no server) or in a shared database given by URL (PostgreSQL; several
machines, with heartbeats). Every trial's values are fixed when it is enqueued, so
Optuna's sampler never samples; the study is the queue, the record and the pruner's
memory.

A trial's grid and tuned values are its Optuna ``params``, with their distributions
(spec.py says which), from the moment it is queued: Optuna's tools read a sweep's storage
as they read any study (``study.trials_dataframe()``, ``optuna.visualization``,
``optuna-dashboard sqlite:///...`` or on the journal). ``point_values`` reads them back
(and reads the studies written before, which kept them in the ``grid`` and ``tune``
attributes).

Trial bookkeeping (all in the study, so any machine can resume or report):
  params      grid and tuned values                    what the trial runs
  user_attrs  grid_keys, tune_keys, sample,            which params are which, and
              grid_id, point_id                        the trial's identity
              run_dir, worker ("host:pid:gpu"), stack  where it runs, with which others
              result (train's RunResult summary),      how it ended; a ``failure``
              failure                                  is final and never re-run
              lost, duplicate_of                       superseded trials (FAIL)
              retry_of, retry_reason, retries          a copy of a lost trial
              retrain_of, retrain_reason               a finished trial trained again
                                                       (``--retrain``); the one it
                                                       retrains is superseded
A trial whose worker died (seen by the launcher on its own host, or by a missed
heartbeat with PostgreSQL) or that was interrupted is marked FAIL and re-enqueued
as a copy that trains in the same run directory, resuming its checkpoint (``requeue``).
Optuna's ``RetryHeartbeatStaleTrialCallback`` does the same for a missed heartbeat, but it
copies every attribute of the lost trial (its dead worker, which the reaper would take
for the copy's until a worker claims it), records no reason, and leaves a point lost for
good after its last retry instead of failing it; the journal path needs ``requeue``
anyway, so both paths use it.
Every storage call is retried through outages (storage.py), and silence measured
while the storage was unreachable does not make a trial lost.
The pruner compares trials of one grid point only (``GridMedianPruner``).
"""
from __future__ import annotations

import gzip
import json
import logging
import os
import random
import shutil
import statistics
import socket
import time
import warnings
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState, create_trial

from sandbox.sweep.spec import from_param
from sandbox.sweep.storage import (DEFAULT_TIMEOUT_S, MAX_BACKOFF_S, GuardedHeartbeatStorage, GuardedStorage,
                                   SafeJournalFile, StorageGuard, cached)
from sandbox.train.signals import process_alive

# machine name recorded on trials (set it where machines share a hostname, e.g. containers)
HOST = os.environ.get("SANDBOX_SWEEP_HOST") or socket.gethostname()
MAX_RETRIES = 3          # a point whose worker dies this many times is recorded as failed
REAP_GRACE_S = 60        # a RUNNING trial no worker has claimed yet is lost after this long
FINAL_FAIL = "failure"


# ---- storage and study ------------------------------------------------------------------

def unpack_journal(sweep_dir: Path) -> str | None:
    """A committed run keeps its journal gzipped (``study.journal.gz``, figures/README.md): a sweep resumed in such
    a directory unpacks it first rather than starting an empty study beside it. Returns a note when it did."""
    path, packed = sweep_dir / "study.journal", sweep_dir / "study.journal.gz"
    if path.exists() or not packed.exists():
        return None
    with gzip.open(packed, "rb") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return f"{packed.name}: unpacked to {path.name}; the study goes on from it"


def open_storage(sweep_dir: Path, url: str | None, heartbeat: int | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S, say=None):
    """The journal file inside the sweep directory, or an RDB (PostgreSQL) URL with heartbeats;
    either way behind a ``StorageGuard`` that retries every call for up to ``timeout`` seconds
    of outage (opening included), printing one line (through ``say``) when it starts and ends."""
    from optuna.storages.journal import JournalFileOpenLock, JournalStorage

    guard = StorageGuard(timeout, say=say)
    if not url:
        path = str(sweep_dir / "study.journal")
        journal = guard.call(lambda: JournalStorage(SafeJournalFile(path, lock_obj=JournalFileOpenLock(path))))
        return GuardedStorage(journal, guard, sweep_dir)
    hb = heartbeat or 10
    grace = max(3 * hb, hb + 5)
    # after an outage every thread retries at least once per heartbeat interval, so a worker
    # beats again well within the fresh grace period the trials get (storage.py)
    guard.max_backoff = min(MAX_BACKOFF_S, hb)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # the pool logs dropped connections with their tracebacks; the guard's one line says it
    logging.getLogger("sqlalchemy").addHandler(logging.NullHandler())
    rdb = guard.call(_open_rdb, url, hb, grace)
    return GuardedHeartbeatStorage(cached(rdb), guard, grace, sweep_dir)


def _open_rdb(url: str, heartbeat: int, grace: int):
    import sqlalchemy.exc as sa

    kwargs = {"pool_pre_ping": True}      # a pooled connection the server dropped is replaced, not used
    if url.startswith(("postgresql", "postgres")):
        # give up on a silent server instead of hanging: connecting, and a connection that went quiet
        kwargs["connect_args"] = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 10,
                                  "keepalives_interval": 5, "keepalives_count": 3}
    for attempt in range(6):
        try:
            return optuna.storages.RDBStorage(_driver_url(url), engine_kwargs=kwargs, heartbeat_interval=heartbeat,
                                              grace_period=grace, heartbeat_stale_trial_callback=_requeue_stale)
        except (sa.IntegrityError, sa.ProgrammingError) as e:
            # machines starting at once on an empty database race to create its tables and
            # types; the loser finds them there on the next try
            if attempt == 5 or not any(w in str(e) for w in ("already exists", "duplicate key")):
                raise
            time.sleep(0.2 + 0.5 * random.random())


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


class SweepStudy(optuna.study.Study):
    """The sweep's study and the storage it was opened on. Optuna's ``Study`` reads the trials, tells their
    results and (through ``trial``) reports evaluations; what it does only inside ``optimize`` - claim a waiting
    trial, set a trial's attribute or state, add a trial and learn its number - goes through the storage's public
    ``BaseStorage`` methods here, by trial number: a sweep's worker claims the trials that stack with each other,
    not the oldest waiting one that ``Study.ask`` would give it."""

    def __init__(self, storage, name: str):
        # every trial's values are enqueued, so the sampler never samples
        super().__init__(study_name=name, storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
        self.pruner = make_pruner((self.user_attrs.get("spec") or {}).get("pruning"))
        self.storage = storage
        self.study_id = storage.get_study_id_from_name(name)
        self._ids: dict[int, int] = {}

    def trial_id(self, number: int) -> int:
        if number not in self._ids:      # a trial's id never changes: one look-up each
            self._ids[number] = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        return self._ids[number]

    def trial_by_number(self, number: int):
        """The trial as it is now (a FrozenTrial)."""
        return self.storage.get_trial(self.trial_id(number))

    def set_trial_attr(self, number: int, key: str, value) -> None:
        self.storage.set_trial_user_attr(self.trial_id(number), key, value)

    def claim(self, number: int) -> bool:
        """Take a WAITING trial (RUNNING from now on); False if another worker took it first."""
        try:
            return self.storage.set_trial_state_values(self.trial_id(number), state=TrialState.RUNNING)
        except UpdateFinishedTrialError:
            return False

    def fail(self, number: int) -> bool:
        """Mark a trial FAIL (raises UpdateFinishedTrialError if it has finished meanwhile)."""
        return self.storage.set_trial_state_values(self.trial_id(number), state=TrialState.FAIL)

    def beat(self, number: int) -> None:
        self.storage.record_heartbeat(self.trial_id(number))

    def add(self, template) -> int:
        """``add_trial`` of a trial made by ``create_trial`` (which validates it) that returns its number."""
        tid = self.storage.create_new_trial(self.study_id, template_trial=template)
        return self.storage.get_trial_number_from_id(tid)

    def trial(self, number: int):
        """An ``optuna.trial.Trial`` to report evaluations and ask the pruner through (what ``ask`` returns)."""
        return optuna.trial.Trial(self, self.trial_id(number))


def load_study(storage, name: str) -> SweepStudy:
    """The sweep's study, with the pruner its sweep file asked for."""
    return SweepStudy(storage, name)


def trials_in(study, states=None):
    return study.get_trials(deepcopy=False, states=states)


def point_values(trial) -> tuple[dict, dict]:
    """(grid values, tuned values) of a trial, in the sweep file's order: from its params, or, for a trial of a
    study written before params held them, from its ``grid`` and ``tune`` attributes."""
    a = trial.user_attrs
    if "grid" in a:
        return a["grid"], a.get("tune", {})
    params = trial.params
    return ({k: from_param(params[k]) for k in a.get("grid_keys", ()) if k in params},
            {k: from_param(params[k]) for k in a.get("tune_keys", ()) if k in params})


def requeue(study, trial, reason: str, count: bool = True) -> int | None:
    """Fail a lost RUNNING trial (or take one a heartbeat check just failed) and enqueue a copy
    that resumes the same run directory. The copy records ``retry_of`` and ``retry_reason``
    (a finished trial's attributes cannot change). After MAX_RETRIES lost runs the point is
    recorded as failed instead."""
    retries = trial.user_attrs.get("retries", 0) + int(count)
    if trial.state == TrialState.RUNNING:
        try:
            study.set_trial_attr(trial.number, "lost", reason)
            if retries > MAX_RETRIES:
                study.set_trial_attr(trial.number, FINAL_FAIL, f"its worker was lost {retries} times; last: {reason}")
            if not study.fail(trial.number):
                return None
        except UpdateFinishedTrialError:       # someone else finished or failed it first
            return None
    if retries > MAX_RETRIES:
        return None
    keep = ("grid", "tune", "grid_keys", "tune_keys", "sample", "grid_id", "point_id", "run_dir", "retrain_of",
            "retrain_reason")
    attrs = {k: trial.user_attrs[k] for k in keep if k in trial.user_attrs}
    attrs.update(retries=retries, retry_of=trial.number, retry_reason=reason)
    return study.add(create_trial(state=TrialState.WAITING, params=trial.params, distributions=trial.distributions,
                                  user_attrs=attrs))


def _requeue_stale(study, trial) -> None:       # RDBStorage's heartbeat-stale callback
    requeue(study, trial, f"no heartbeat from {trial.user_attrs.get('worker', 'its worker')}")


_unclaimed_seen: dict[int, float] = {}     # RUNNING trials with no worker yet (number) -> when this process saw it


def reap(study, heartbeat: bool, adopt_foreign: bool = False) -> list[str]:
    """Requeue RUNNING trials whose worker on this host is gone (and, with heartbeats,
    those of any machine that stopped beating). ``adopt_foreign`` (a launcher starting on a
    journal, which only one machine uses at a time): trials of workers on other hosts are
    lost too, e.g. a sweep directory copied from a machine that was taken away.

    A trial claimed but never given a worker is lost after REAP_GRACE_S; time during which
    this process could not reach the storage does not count (the grace restarts after an
    outage), nor, with a shared database, does time before this process first saw the trial
    (other machines' clocks may differ)."""

    notes = []
    if heartbeat:
        optuna.storages.fail_stale_trials(study)
    now = time.time()
    quiet_from = study.storage.recovered_at or 0.0
    unclaimed = {}
    for t in trials_in(study, (TrialState.RUNNING,)):
        worker = t.user_attrs.get("worker")
        if worker:
            host, pid, _ = worker.rsplit(":", 2)
            gone = not process_alive(int(pid), "sandbox.sweep.worker") if host == HOST else adopt_foreign and not heartbeat
            if not gone:
                continue
            stopped = _stopped_cleanly(study, t)
            reason = stopped or f"worker {worker} died"
            if requeue(study, t, reason, count=not stopped) is not None:
                notes.append(f"trial {t.number}: {reason}; requeued")
            continue
        if heartbeat:
            since = unclaimed[t.number] = _unclaimed_seen.get(t.number, now)
        else:
            since = t.datetime_start.timestamp() if t.datetime_start else now
        if now - max(since, quiet_from) > REAP_GRACE_S and requeue(study, t, "no worker claimed it") is not None:
            notes.append(f"trial {t.number}: never claimed; requeued")
    _unclaimed_seen.clear()
    _unclaimed_seen.update(unclaimed)
    return notes


def _stopped_cleanly(study, trial) -> str | None:
    """Did the trial's (now gone) worker stop its run in an orderly way, writing result.json
    during this try (e.g. interrupted, with a checkpoint, while the storage was unreachable, so
    it could not requeue the trial itself)? Then requeueing it is not a lost run: say why."""
    sweep_dir, run_dir = study.storage.sweep_dir, trial.user_attrs.get("run_dir")
    if sweep_dir is None or not run_dir or trial.datetime_start is None:
        return None
    path = Path(sweep_dir) / run_dir / "result.json"
    try:
        if path.stat().st_mtime < trial.datetime_start.timestamp():
            return None
        status = json.loads(path.read_text()).get("status")
    except (OSError, ValueError):
        return None
    return "interrupted" if status == "interrupted" else f"its worker stopped before recording the result ({status})"


def holds(trial) -> bool:
    """Does this trial settle its point (done, running, queued, or failed for a reason)?
    A lost trial does not; its retry (or, without one, a rerun of the sweep) does."""
    if trial.state == TrialState.FAIL:
        return FINAL_FAIL in trial.user_attrs and "duplicate_of" not in trial.user_attrs
    return True


def superseded(trials) -> dict[int, object]:
    """{number of a finished trial: the trial that trains its point again} (``--retrain``)."""
    return {t.user_attrs["retrain_of"]: t for t in trials
            if "retrain_of" in t.user_attrs and "duplicate_of" not in t.user_attrs}


def retrain_matcher(spec, where: list[str]):
    """``--retrain KEY=VALUE ...`` as a test on a point (every condition holds; KEY a grid or tuned key of the
    sweep, VALUE read as ``--set`` reads it, numbers compared as numbers: 5e-4 is 5.0e-4), or a one-line error
    naming the condition."""
    from sandbox.config import ConfigError, parse_override

    keys = [*spec.grid_keys, *spec.tune_keys]
    conds = []
    for cond in where:
        try:
            key, want = parse_override(cond)
        except ConfigError:
            raise ConfigError(spec.source, "--retrain", f"expected KEY=VALUE, got {cond!r}") from None
        if key not in keys:
            raise ConfigError(spec.source, "--retrain", f"{key!r} is not a grid or tuned key of this sweep "
                              f"({', '.join(keys)})")
        conds.append((key, want))
    match = lambda p: all(_same({**p.grid, **p.tune}.get(k), want) for k, want in conds)
    if not any(match(p) for p in spec.points()):
        raise ConfigError(spec.source, "--retrain", f"no trial has {' '.join(where)}")
    return match


def _same(value, want) -> bool:
    if value == want:
        return True
    if isinstance(value, bool) or isinstance(want, bool):
        return False
    try:                # YAML reads 5e-4 (no dot) as a string
        return float(value) == float(want)
    except (TypeError, ValueError):
        return False


def enqueue_points(study, spec, retry_failed: bool = False, retrain: list[str] = ()) -> int:
    """Queue every point no trial holds yet; ``retry_failed``: also those whose trials failed; ``retrain``
    (KEY=VALUE conditions): also the finished points that match, once for each set of conditions (e.g. after a
    fix to a kernel they trained on). A retrained point's earlier trial stays in the study as superseded.
    Each trial is queued with its values as params (``Point.params``) and their distributions."""
    trials = trials_in(study)
    gone = superseded(trials)
    held = {t.user_attrs.get("point_id") for t in trials
            if holds(t) and t.number not in gone and not (retry_failed and t.state == TrialState.FAIL)}
    failed = {t.user_attrs.get("point_id"): t.number for t in trials if t.state == TrialState.FAIL and holds(t)}
    finished = {t.user_attrs.get("point_id"): t for t in trials
                if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and t.number not in gone}
    match = retrain_matcher(spec, list(retrain)) if retrain else None
    reason = "--retrain " + " ".join(retrain)
    dists = spec.distributions()
    n = 0
    for p in spec.points():
        attrs = {"grid_keys": list(p.grid), "tune_keys": list(p.tune), "sample": p.sample, "grid_id": p.grid_id,
                 "point_id": p.point_id}
        done = finished.get(p.point_id)
        if match is not None and done is not None and match(p):
            if done.user_attrs.get("retrain_reason") == reason:
                continue           # retrained for these conditions already
            attrs.update(retrain_of=done.number, retrain_reason=reason)
        elif p.point_id in held:
            continue
        elif p.point_id in failed:   # the worker must not take the failed trial for a duplicate
            attrs.update(retry_of=failed[p.point_id], retry_reason="--retry-failed")
        params = p.params()
        study.add_trial(create_trial(state=TrialState.WAITING, params=params,
                                     distributions={k: dists[k] for k in params}, user_attrs=attrs))
        n += 1
    return n


def prepare_study(spec, storage) -> SweepStudy:
    """Create or load the sweep's study, refusing one that holds another sweep's base config."""
    from sandbox.config import ConfigError, flatten

    study = optuna.create_study(study_name=spec.name, storage=storage, load_if_exists=True,
                                direction=spec.objective.direction)
    fp = spec.fingerprint()
    old = study.user_attrs.get("spec")
    if old is None:
        study.set_user_attr("spec", fp)
        return load_study(storage, spec.name)
    # base keys only one side has are config fields added or removed by a newer sandbox: no change. A recipe's
    # values are compared as the recipe fills them at the base (as a sandbox before per-point recipes stored them)
    a, b = flatten({"base": old["base"]}), flatten({"base": _filled(fp["base"], spec.source)})
    a.update(objective=old.get("objective"), pruning=old.get("pruning"))
    b.update(objective=fp["objective"], pruning=fp["pruning"])
    for key in sorted(set(a) & set(b)):
        if a[key] != b[key]:
            raise ConfigError(spec.source, key, f"differs from the study {spec.name!r} already in this storage "
                              f"({a[key]!r} there, {b[key]!r} here); change `name` or the output directory")
    return load_study(storage, spec.name)


def _filled(base: dict, src) -> dict:
    """``base`` with what its recipe leaves for each point filled at the base's own values."""
    from sandbox.config import config_from_dict, to_dict

    filled = to_dict(config_from_dict({k: v for k, v in base.items() if k != "name"}, str(src)))
    return {**filled, "name": base.get("name")}


def adopt_base(study, spec) -> str | None:
    """Store this sandbox's base config in a study that ``prepare_study`` accepted, where the two differ only in
    keys one side has: the workers build every trial from the stored base, so the trials still waiting train as
    this sandbox resolves the sweep file (a recipe's values left for each point to fill, a field added or
    removed), not as the sandbox that created the study did. A note naming the keys, or None."""
    from sandbox.config import flatten

    old, fp = study.user_attrs["spec"], spec.fingerprint()
    a, b = flatten({"base": old["base"]}), flatten({"base": fp["base"]})
    if a == b:
        return None
    study.set_user_attr("spec", {**old, "base": fp["base"]})
    dropped, added = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    changes = "; ".join(f"{what}: {', '.join(k.removeprefix('base.') for k in keys)}"
                        for what, keys in (("no longer fixed there", dropped), ("new", added)) if keys)
    return (f"the study's base config is updated to how this sandbox reads {spec.source} ({changes}); waiting "
            f"trials train with it, finished ones keep the config in their result.json")


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

"""Riding through storage outages: every call to the sweep's Optuna storage, retried.

A database restarts (failover, upgrade, a full connection table), a disk fills up: the
sweep should wait for it, not die. Three pieces:

``StorageGuard``    runs a storage call; when it fails because the storage cannot be
                    reached (a lost or refused connection, a journal that cannot grow) it
                    retries with capped exponential backoff until the storage answers or
                    the outage has lasted ``timeout`` seconds. It prints one line when an
                    outage starts and one when it ends; past the timeout it raises
                    ``StorageUnavailable`` (and every later call does at once). One guard
                    serves a whole process, so its threads share one outage and one clock.
``GuardedStorage``  an Optuna storage that sends every method through the guard (what
                    ``open_storage`` in study.py returns), plus the heartbeat rule below.
``TrialReporter``   sends a trial's evaluations (and asks the pruner) from a background
                    thread, so training never waits for the storage; what it could not send
                    during an outage goes out once the storage is back.

This is the one module that reaches into Optuna's internals, each for a reason its public
API does not serve: the heartbeat storage's base class and its stale-trial query
(``BaseHeartbeat``, ``_get_stale_trial_ids``), to apply the rule below; the journal file's
lock and path (``get_lock_file``, ``_lock``, ``_file_path``), to append whole records only;
and the cache Optuna puts in front of an RDB storage (``_CachedStorage``, which
``optuna.storages.get_storage`` adds but is "only for internal usage"), which the guard
wraps instead of the bare RDB storage. The rest of the sweep uses Optuna's public API.

Heartbeat rule (lost-trial detection with a database): silence counts only while this
process can reach the storage. A trial is declared lost when its last heartbeat is older
than the grace period *and* this process has been connected for a whole grace period
(since it started, or since its last outage ended). After an outage every trial thus gets
a fresh grace period, in which its worker beats again.
"""
from __future__ import annotations

import abc
import collections
import errno
import json
import os
import random
import threading
import time

from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage, _CachedStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import get_lock_file

DEFAULT_TIMEOUT_S = 600.0   # longer than a database restart or a managed failover (seconds to minutes)
EXIT_STORAGE = 75           # sysexits' EX_TEMPFAIL: a temporary failure; run the command again later
MAX_BACKOFF_S = 10.0
FIRST_BACKOFF_S = 0.25

# OS errors that waiting cannot fix (a read-only or vanished directory); others (a full disk,
# a file-size limit, an I/O error on a network file system) may clear up and are retried
_PERMANENT_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR, errno.EISDIR,
                     errno.ENAMETOOLONG}


class StorageUnavailable(Exception):
    """The storage stayed unreachable for the whole timeout, or refused for good."""


def _hms(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def outage_kind(exc: BaseException) -> str | None:
    """'transient' for a lost connection or a journal that cannot be written for now,
    'permanent' for one that never will be (read-only), None for any other error (a
    real error of the call, raised at once)."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:
        if isinstance(e, OSError):
            return "permanent" if e.errno in _PERMANENT_ERRNOS else "transient"
        mod, name = type(e).__module__, type(e).__name__
        if mod.startswith("sqlalchemy"):
            import sqlalchemy.exc as sa
            if isinstance(e, (sa.OperationalError, sa.InterfaceError, sa.DisconnectionError, sa.TimeoutError,
                              sa.PendingRollbackError)):     # the last: a session a dropped connection left behind
                return "transient"
            if isinstance(e, sa.DBAPIError) and e.connection_invalidated:
                return "transient"
        elif mod.split(".")[0] in ("psycopg2", "psycopg", "pymysql", "MySQLdb") and \
                name in ("OperationalError", "InterfaceError"):
            return "transient"
        e = e.__cause__          # StorageInternalError wraps the SQLAlchemy error
        seen += 1
    return None


def _reason(exc: BaseException) -> str:
    """One short line saying why (the driver's message, without SQLAlchemy's decorations)."""
    e = exc
    while e.__cause__ is not None and not isinstance(e, OSError) and type(e).__module__.startswith("optuna"):
        e = e.__cause__
    orig = getattr(e, "orig", None)          # SQLAlchemy keeps the driver's exception here
    text = str(orig if orig is not None else e).strip()
    if isinstance(e, OSError) and e.strerror:
        text = f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    line = text.splitlines()[0] if text else type(e).__name__
    return line[:200]


class StorageGuard:
    """Retries storage calls through outages (see the module docstring). Thread-safe."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_S, max_backoff: float = MAX_BACKOFF_S, say=None):
        self.timeout = float(timeout)
        self.max_backoff = max_backoff
        self.say = say or (lambda line: print(line, flush=True))
        self.on_give_up = None            # called once (from the thread that gives up)
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._down_reason = ""
        self._dead: StorageUnavailable | None = None
        self._stop = threading.Event()
        self.reachable_since = time.monotonic()   # start of the current stretch of reachability
        self.recovered_at: float | None = None     # wall time the last outage ended

    @property
    def unreachable(self) -> bool:
        return self._down_since is not None or self._dead is not None

    def stop_retrying(self) -> None:
        """From now on a failing call gives up at once (the process is being stopped)."""
        self._stop.set()

    def connected_for(self) -> float:
        """Seconds this process has been able to reach the storage without an outage."""
        return 0.0 if self.unreachable else time.monotonic() - self.reachable_since

    def call(self, fn, *args, **kwargs):
        delay = FIRST_BACKOFF_S
        while True:
            if self._dead is not None:
                raise self._dead
            started = time.time()
            try:
                out = fn(*args, **kwargs)
            except Exception as e:   # noqa: BLE001 - classified; anything not an outage is re-raised as is
                kind = outage_kind(e)
                if kind is None:
                    raise
                left = self._failed(e, kind)
                self._stop.wait(min(delay * random.uniform(0.75, 1.25), left))
                delay = min(2 * delay, self.max_backoff)
                continue
            if self._down_since is not None:
                self._back(started)
            return out

    def _failed(self, exc: BaseException, kind: str) -> float:
        """Record a failed call; the seconds left to retry, or raise StorageUnavailable."""
        callback = None
        with self._lock:
            if self._dead is None:
                now = time.time()
                if self._down_since is None:
                    self._down_since, self._down_reason = now, _reason(exc)
                    if kind == "transient" and not self._stop.is_set():
                        self.say(f"storage unreachable since {_hms(now)}, retrying for up to "
                                 f"{self.timeout:g} s ({self._down_reason})")
                if kind == "permanent":
                    self._dead = StorageUnavailable(f"storage error: {_reason(exc)}")
                elif self._stop.is_set():
                    self._dead = StorageUnavailable(f"storage unreachable since {_hms(self._down_since)} "
                                                    f"({self._down_reason}); stopped")
                elif now - self._down_since >= self.timeout:
                    self._dead = StorageUnavailable(f"storage unreachable for {now - self._down_since:.0f} s "
                                                    f"since {_hms(self._down_since)} ({self._down_reason})")
                else:
                    return self._down_since + self.timeout - now
                callback = self.on_give_up
            dead = self._dead
        if callback is not None:
            callback()
        raise dead

    def _back(self, started: float) -> None:
        with self._lock:
            # a call that was under way when the outage began proves nothing about now
            if self._down_since is None or started < self._down_since:
                return
            now = time.time()
            self.say(f"storage reachable again at {_hms(now)}, after {now - self._down_since:.0f} s")
            self._down_since = None
            self.reachable_since, self.recovered_at = time.monotonic(), now


# ---- the storage proxy -------------------------------------------------------------------------

def cached(rdb) -> BaseStorage:
    """An RDB storage behind Optuna's own cache of the trials (as ``optuna.load_study(storage=url)`` has it)."""
    return _CachedStorage(rdb)


class GuardedStorage(BaseStorage):
    """An Optuna storage whose every call goes through a ``StorageGuard``."""

    def __init__(self, inner: BaseStorage, guard: StorageGuard, sweep_dir=None):
        self._inner, self.guard = inner, guard
        self.sweep_dir = sweep_dir          # where the sweep's run directories are (for the reaper)

    @property
    def recovered_at(self) -> float | None:
        return self.guard.recovered_at

    def stop_retrying(self) -> None:
        self.guard.stop_retrying()

    def set_trial_state_values(self, trial_id, state, values=None) -> bool:
        tries = []

        def once():
            tries.append(None)
            try:
                return self._inner.set_trial_state_values(trial_id, state=state, values=values)
            except UpdateFinishedTrialError:
                # a retry after a lost connection: our own first attempt may have been committed
                if len(tries) > 1 and state.is_finished() and self._inner.get_trial(trial_id).state == state:
                    return True
                raise
        return self.guard.call(once)


def _through_guard(name: str):
    def method(self, *args, **kwargs):
        return self.guard.call(getattr(self._inner, name), *args, **kwargs)
    method.__name__ = method.__qualname__ = name
    return method


for _name in sorted(BaseStorage.__abstractmethods__ | {
        "get_best_trial", "get_n_trials", "get_trial_id_from_study_id_trial_number", "get_trial_number_from_id",
        "get_trial_param", "get_trial_params", "get_trial_system_attrs", "get_trial_user_attrs"}):
    if _name not in GuardedStorage.__dict__:
        setattr(GuardedStorage, _name, _through_guard(_name))
abc.update_abstractmethods(GuardedStorage)


class GuardedHeartbeatStorage(GuardedStorage, BaseHeartbeat):
    """The same for an RDB storage with heartbeats, with the outage-aware staleness rule."""

    def __init__(self, inner, guard: StorageGuard, grace_period: float, sweep_dir=None):
        super().__init__(inner, guard, sweep_dir)
        self.grace_period = grace_period

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            self.guard.call(self._inner.record_heartbeat, trial_id)
        except StorageUnavailable:      # a beat that cannot be sent is skipped; the guard's owner stops
            pass

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        stale = self.guard.call(self._inner._get_stale_trial_ids, study_id)
        # silence only counts while we could have heard the beats (see the module docstring)
        return stale if self.guard.connected_for() > self.grace_period else []

    def get_heartbeat_interval(self) -> int | None:
        return self._inner.get_heartbeat_interval()

    def get_heartbeat_stale_trial_callback(self):
        return self._inner.get_heartbeat_stale_trial_callback()


# ---- the journal file ---------------------------------------------------------------------------

class CorruptJournal(ValueError):
    """A journal line in the middle of the file is not a whole JSON record."""


class SafeJournalFile(JournalFileBackend):
    """Optuna's journal file, appending whole records only. A write that fails part-way (a
    full disk, a file-size limit) is cut back to where it began, and a torn record left by a
    process killed while writing is cut off before the next one, so the journal always
    parses: a torn line followed by more records would make Optuna refuse the whole file.
    A line spoilt otherwise (an edit, a bad copy) is named with its number and what to do."""

    def read_logs(self, log_number_from: int):
        try:
            yield from super().read_logs(log_number_from)
        except ValueError as e:          # json's JSONDecodeError, or Optuna's "Invalid log format."
            n = _first_bad_line(self._file_path)
            where = f"line {n}" if n is not None else "a line"
            raise CorruptJournal(f"{self._file_path}: {where} is not a whole JSON record ({e}); remove or repair "
                                 f"{where} of {self._file_path}; the lines after it are kept") from None

    def append_logs(self, logs: list[dict]) -> None:
        data = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n").encode("utf-8")
        with get_lock_file(self._lock):
            fd = os.open(self._file_path, os.O_RDWR | os.O_APPEND)
            try:
                start = _cut_torn_tail(fd)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                except OSError as e:
                    os.ftruncate(fd, start)
                    raise OSError(e.errno, e.strerror, self._file_path) from None
            finally:
                os.close(fd)


def _first_bad_line(path: str) -> int | None:
    """The number (from 1) of the first line of the journal that does not parse, the last line left out (a
    record being written now)."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")[:-1]       # whole lines: each ends with a newline
    for n, line in enumerate(lines, start=1):
        try:
            json.loads(line)
        except ValueError:
            return n
    return None


def _cut_torn_tail(fd: int) -> int:
    """Truncate the file after its last newline; return its size."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    end = size
    while end > 0:
        chunk = os.pread(fd, min(end, 1 << 16), max(0, end - (1 << 16)))
        i = chunk.rfind(b"\n")
        if i >= 0:
            end = end - len(chunk) + i + 1
            break
        end -= len(chunk)
    os.ftruncate(fd, end)
    return end


# ---- reporting a trial without waiting for the storage -------------------------------------------

class TrialReporter:
    """Sends one trial's intermediate values from a background thread, in order, retrying
    through outages, so that the training loop never blocks on the storage.

    ``report`` queues a value. ``should_prune`` asks the pruner once the values before it
    are sent; while the storage is unreachable (or the answer takes longer than ``wait``) the
    answer is "go on". ``close`` sends what is left (raising ``StorageUnavailable`` past the
    guard's timeout). If the storage has meanwhile finished the trial elsewhere (declared it
    lost), ``report`` and ``close`` raise the ``UpdateFinishedTrialError`` as before."""

    def __init__(self, trial, guard: StorageGuard | None, wait: float = 60.0):
        self.trial, self.guard, self.wait = trial, guard, wait
        self._items: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._verdicts: dict[int, bool] = {}
        self._closed = False
        self.superseded: UpdateFinishedTrialError | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="trial-reporter", daemon=True)
        self._thread.start()

    def report(self, value: float, step: int) -> None:
        if self.superseded is not None:
            raise self.superseded
        with self._cond:
            self._items.append(("report", step, float(value)))
            self._cond.notify_all()

    def should_prune(self, step: int) -> bool:
        deadline = time.monotonic() + self.wait
        with self._cond:
            self._items.append(("prune", step, None))
            self._cond.notify_all()
            while step not in self._verdicts:
                if self.superseded or self.error or time.monotonic() > deadline or (
                        self.guard is not None and self.guard.unreachable):
                    return False
                self._cond.wait(0.05)
            return self._verdicts.pop(step)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        if self.superseded is not None:
            raise self.superseded
        if self.error is not None:
            raise self.error

    def abandon(self) -> None:
        """Drop what is not sent yet and let the thread end (the trial is being requeued)."""
        with self._cond:
            self._items.clear()
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    self._cond.wait()
                if not self._items:
                    return
                kind, step, value = self._items[0]
            verdict = None
            try:
                if kind == "report":
                    self.trial.report(value, step)
                else:
                    verdict = self.trial.should_prune()
            except UpdateFinishedTrialError as e:
                self.superseded = e
            except BaseException as e:     # noqa: BLE001 - StorageUnavailable or a bug: handed to close()
                self.error = e
            with self._cond:
                if self.superseded is not None or self.error is not None:
                    self._items.clear()
                    self._cond.notify_all()
                    return
                self._items.popleft()
                if verdict is not None:
                    self._verdicts[step] = verdict
                self._cond.notify_all()

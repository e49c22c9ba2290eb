"""`sandbox sweep` through storage outages: a PostgreSQL server stopped at once in the middle
of a sweep (and started again, or kept down past --storage-timeout), a journal file that
cannot grow, and the pieces underneath (the retry guard, the heartbeat rule, the journal's
whole-record writes).

The PostgreSQL tests stop and start the local server that .ci/postgres.sh runs
(pg_ctlcluster, as root). Outside CI they are skipped without one; in CI they must run.
Checked against what the run directories hold (checkpoints, result.json histories) and
against the study read back after the server is up again.
"""
from __future__ import annotations

import errno
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest

BASE = """\
base:
  task: {name: mqar, seq_len: 16, num_kv_pairs: 2, vocab_size: 16, test_examples: 32, val_examples: 32}
  model: {mixer: attention, d_model: 16, n_layers: 1, n_heads: 1, positions: learned, channel_mixer: none}
  train: {steps: 40, batch_size: 8, lr: 3e-3, eval_every: EVAL, eval_batch_size: 32, log_every: EVAL,
          early_stop: null}
"""
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
PG_URL = os.environ.get("SANDBOX_TEST_POSTGRES", "postgresql://sandbox:sandbox@127.0.0.1:5432/sandbox")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
OUTAGE_S = 22


def write(tmp_path: Path, body: str, eval_every: int = 10) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(BASE.replace("EVAL", str(eval_every)) + textwrap.dedent(body))
    return path


def sweep_cmd(path, out, *extra) -> list[str]:
    return [sys.executable, "-m", "sandbox.cli", "sweep", str(path), "--out", str(out), "--no-live", *extra]


def trials_of(out: Path, url: str | None = None):
    import optuna
    from sandbox.sweep.study import open_storage
    name = json.loads((out / "sweep.json").read_text())["study"]
    return optuna.load_study(study_name=name, storage=open_storage(out, url, timeout=30, say=lambda _: None)
                             ).get_trials(deepcopy=False)


def wait_for(pred, timeout=120, what="condition", proc=None):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the sweep ended ({proc.returncode}) while waiting for {what}:\n"
                                 + proc.stdout.read())
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def rerun_here(path, out, *extra, monkeypatch, capsys) -> tuple[int, str]:
    """The same command in this process (which has imported torch already: a faster start)."""
    from sandbox.cli import main
    for k in ("CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED", "OMP_NUM_THREADS"):
        monkeypatch.setenv(k, ENV[k])
    capsys.readouterr()
    code = main(["sweep", str(path), "--out", str(out), "--no-live", *extra])
    cap = capsys.readouterr()
    return code, cap.out + cap.err


def checkpoint_step(run_dir: Path) -> int | None:
    import torch
    try:
        return torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=False)["state"]["step"]
    except Exception:           # noqa: BLE001 - absent, or being written this instant
        return None


def all_output(out: Path, *texts: str) -> str:
    logs = "".join(p.read_text() for p in sorted((out / "logs").glob("*.log")))
    return "".join(texts) + logs


def completed_points(trials) -> list[str]:
    return [t.user_attrs["point_id"] for t in trials if t.state.name == "COMPLETE"]


# ---- the local PostgreSQL server ---------------------------------------------------------------

def _local_cluster() -> tuple[list[str], list[str]] | str:
    """The commands that stop (at once) and start the server behind PG_URL, or why there are none."""
    try:
        import psycopg2
        psycopg2.connect(PG_URL, connect_timeout=3).close()
    except Exception as e:               # noqa: BLE001 - any failure means no usable server
        return f"no PostgreSQL at {PG_URL} ({str(e).strip().splitlines()[0] if str(e).strip() else e!r}); " \
               f"run .ci/postgres.sh"
    u = urlparse(PG_URL)
    if u.hostname not in ("127.0.0.1", "localhost", "::1") or shutil.which("pg_lsclusters") is None \
            or os.geteuid() != 0:
        return f"{PG_URL} is not a local cluster this test may stop and start (needs root and pg_ctlcluster)"
    for line in subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout.splitlines():
        version, name, port = line.split()[:3]
        if int(port) == (u.port or 5432):
            return (["pg_ctlcluster", version, name, "stop", "-m", "immediate"],
                    ["pg_ctlcluster", version, name, "start"])
    return f"no local cluster listens on port {u.port or 5432}"


@pytest.fixture
def pg_server(postgres_alone):
    ctl = _local_cluster()
    if isinstance(ctl, str):
        if IN_CI:
            pytest.fail(f"CI must run the PostgreSQL outage tests: {ctl}")
        pytest.skip(ctl)
    stop, start = ctl

    class Server:
        down = False

        def stop(self):
            subprocess.run(stop, check=True, capture_output=True)
            self.down = True

        def start(self):
            subprocess.run(start, check=True, capture_output=True)
            self.down = False

    server = Server()
    try:
        yield server
    finally:
        if server.down:                   # never leave the server down for the next test
            server.start()


def _running_with_eval(out: Path, url: str, points: set[str], n: int):
    """The trials of ``points`` that run and have reported an evaluation, once there are n."""
    if not (out / "sweep.json").exists():
        return None
    try:
        trials = trials_of(out, url)
    except KeyError:                      # the study is not created yet
        return None
    found = [t for t in trials if t.state.name == "RUNNING" and t.user_attrs.get("point_id") in points
             and t.last_step is not None and "run_dir" in t.user_attrs]
    return found if len(found) >= n else None


# ---- PostgreSQL stopped at once for 22 s in the middle of a sweep ---------------------------------

@pytest.mark.slow                   # waits out a database outage: CI runs it with the slow set
def test_postgres_restart_mid_sweep_is_ridden_through(tmp_path, pg_server):
    from sandbox.sweep.spec import load_sweep
    # two long trials run through the outage (one may end during it and wait to send its
    # result), two short ones are claimed after it; heartbeats every second, so a trial
    # would count as lost after 6 s of silence were the outage not excused. The long ones
    # must still train when the server stops, a second or two after their first evaluation:
    # 20000 steps (20 s at the ~1000 steps/s of a CI core; 1500 could end first, and the
    # checkpoints then did not move during the outage)
    path = write(tmp_path, f"""\
        name: pg-outage-{uuid.uuid4().hex[:8]}
        grid:
          train.steps: [20000, 20001, 40, 41]
        """, eval_every=1000)
    points = load_sweep(path).points()
    long = {p.point_id for p in points if p.grid["train.steps"] > 1000}
    out = tmp_path / "out"
    p = subprocess.Popen(sweep_cmd(path, out, "--workers", "2", "--storage", PG_URL, "--heartbeat", "1",
                                   "--storage-timeout", "120"),
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        running = wait_for(lambda: _running_with_eval(out, PG_URL, long, 2), proc=p,
                           what="both long trials to report an evaluation")
        dirs = {t.number: out / t.user_attrs["run_dir"] for t in running}
        before = {n: checkpoint_step(d) for n, d in dirs.items()}
        pg_server.stop()
        time.sleep(OUTAGE_S)
        during = {n: checkpoint_step(d) for n, d in dirs.items()}
        pg_server.start()
        text, _ = p.communicate(timeout=150)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, text

    # training went on while the server was down
    assert all(during[n] > before[n] for n in dirs), (before, during)
    trials = trials_of(out, PG_URL)
    # every point complete exactly once, and nothing was declared lost or run twice
    assert sorted(completed_points(trials)) == sorted(p.point_id for p in points)
    assert [t.number for t in trials if t.state.name != "COMPLETE"] == []
    assert not any("retry_of" in t.user_attrs for t in trials)
    # the evaluations made during the outage reached the study afterwards, and no run restarted
    for t in trials:
        if t.user_attrs["point_id"] in long:
            steps = t.params["train.steps"]
            assert sorted(t.intermediate_values) == list(range(1000, steps, 1000)) + [steps]
            res = json.loads((out / t.user_attrs["run_dir"] / "result.json").read_text())
            assert [h["step"] for h in res["history"]] == sorted(t.intermediate_values)
    # one line when the outage began, one when it ended; no traceback anywhere
    assert len(re.findall(r"storage unreachable since \d\d:\d\d:\d\d, retrying for up to 120 s", text)) == 1, text
    assert len(re.findall(r"storage reachable again at", text)) == 1, text
    for log in (out / "logs").glob("*.log"):
        assert log.read_text().count("storage unreachable since") <= 1
    assert "Traceback" not in all_output(out, text)


# ---- PostgreSQL down past --storage-timeout ------------------------------------------------------------

@pytest.mark.slow                   # waits out a database outage: CI runs it with the slow set
def test_postgres_down_past_the_storage_timeout_stops_cleanly_and_a_rerun_resumes(tmp_path, pg_server, monkeypatch,
                                                                                  capsys):
    from sandbox.sweep.spec import load_sweep
    path = write(tmp_path, f"""\
        name: pg-timeout-{uuid.uuid4().hex[:8]}
        grid:
          train.steps: [5000, 5001, 40]   # long enough (5 s at ~1000 steps/s) to be caught mid-run
        """, eval_every=100)
    points = load_sweep(path).points()
    long = {p.point_id for p in points if p.grid["train.steps"] > 100}
    out = tmp_path / "out"
    args = ("--workers", "2", "--storage", PG_URL, "--heartbeat", "1", "--storage-timeout", "2")
    p = subprocess.Popen(sweep_cmd(path, out, *args), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        running = wait_for(lambda: _running_with_eval(out, PG_URL, long, 2), proc=p,
                           what="both long trials to report an evaluation")
        pg_server.stop()
        stdout, stderr = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 75, stdout + stderr
    # one line says what happened and how to resume; no traceback anywhere
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("sandbox: error: storage unreachable for ") and "rerun `sandbox sweep" in lines[0]
    assert "sandbox:***@" in lines[0] and "sandbox:sandbox@" not in lines[0]      # no password
    assert "Traceback" not in all_output(out, stdout, stderr)
    # the workers saved a checkpoint where they stopped
    stopped_at = {t.number: checkpoint_step(out / t.user_attrs["run_dir"]) for t in running}
    assert all(s is not None and s >= 100 for s in stopped_at.values()), stopped_at

    pg_server.start()
    code, text = rerun_here(path, out, *args[:-1], "60", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, text
    trials = trials_of(out, PG_URL)
    assert sorted(completed_points(trials)) == sorted(p.point_id for p in points)       # none lost, none twice
    for n, step in stopped_at.items():
        first = next(t for t in trials if t.number == n)
        assert first.state.name == "FAIL"
        redo = next(t for t in trials if t.user_attrs.get("retry_of") == n)
        steps = redo.params["train.steps"]
        # an outage is not the trial's fault: it does not count towards the point's retries. A
        # worker is stopped mid-run (interrupted), or, on a fast machine, may have finished
        # training and found no storage to record the result in
        assert redo.user_attrs["retry_reason"] == ("interrupted" if step < steps else
                                                   "its worker stopped before recording the result (completed)")
        assert redo.user_attrs["retries"] == 0 and redo.state.name == "COMPLETE"
        # resumed from the checkpoint, not from step 0: its first evaluation comes after it, or at it where the
        # stop fell between that step and its evaluation (the resumed run evaluates it first)
        first_eval = min(redo.intermediate_values, default=steps + 1)
        assert first_eval > step or (first_eval == step and step not in first.intermediate_values)
        res = json.loads((out / redo.user_attrs["run_dir"] / "result.json").read_text())
        assert res["steps"] == steps
        hist = [h["step"] for h in res["history"]]
        assert hist == sorted(set(hist)) and hist[0] == 100
    assert "Traceback" not in all_output(out, text)


# ---- the journal file on a full disk ---------------------------------------------------------------------

def _pad_journal(out: Path, size: int) -> None:
    """Another study in the same journal, so that the file is larger than any checkpoint."""
    import optuna
    from sandbox.sweep.study import open_storage
    out.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(study_name="padding", storage=open_storage(out, None))
    study.set_user_attr("padding", "x" * size)


def _journal_is_whole(path: Path) -> None:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    for line in data.splitlines():
        json.loads(line)


@pytest.mark.slow
def test_journal_that_cannot_grow_is_one_line_and_stays_readable(tmp_path, monkeypatch, capsys):
    from sandbox.sweep.spec import load_sweep
    path = write(tmp_path, """\
        name: full
        grid:
          seed: [0, 1, 2, 3]
        """, eval_every=5)
    points = load_sweep(path).points()
    out = tmp_path / "out"
    _pad_journal(out, 48_000)
    # a file-size limit on the launcher and its workers: writes past it fail with EFBIG, as
    # they would with ENOSPC on a full disk; checkpoints (~31 KB) stay below it
    limit = (out / "study.journal").stat().st_size + 6_000

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run(sweep_cmd(path, out, "--storage-timeout", "1", "--stack", "1"), env=ENV, capture_output=True,
                       text=True, timeout=120, preexec_fn=limited)      # one by one: some finish before the limit
    assert r.returncode == 75, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sandbox: error: storage unreachable for "), r.stderr
    assert "File too large" in lines[0] and "study.journal" in lines[0] and "rerun `sandbox sweep" in lines[0]
    assert re.search(r"storage unreachable since \d\d:\d\d:\d\d, retrying for up to 1 s \(File too large",
                     r.stdout), r.stdout
    assert "Traceback" not in all_output(out, r.stdout, r.stderr)
    # the journal parses: no torn record where a write was cut off
    _journal_is_whole(out / "study.journal")
    done_before = completed_points(trials_of(out))
    assert 0 < len(done_before) < len(points)

    # the space is back: the rerun finishes, nothing lost or run twice
    code, text = rerun_here(path, out, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, text
    trials = trials_of(out)
    assert sorted(completed_points(trials)) == sorted(p.point_id for p in points)
    assert set(done_before) <= set(completed_points(trials))
    _journal_is_whole(out / "study.journal")


def _mount_tmpfs(where: Path, size: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    where.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


def test_journal_on_a_full_disk_waits_for_space_and_goes_on(tmp_path):
    # a real full disk (a small tmpfs holding the journal): the sweep waits, and goes on by
    # itself once space is freed
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "512k"):
        pytest.skip("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)")
    try:
        from sandbox.sweep.spec import load_sweep
        path = write(tmp_path, """\
            name: fulldisk
            grid:
              seed: [0, 1, 2, 3]
            """, eval_every=5)
        out = tmp_path / "out"
        out.mkdir()
        (disk / "study.journal").touch()
        (out / "study.journal").symlink_to(disk / "study.journal")
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        filler = disk / "filler"
        filler.write_bytes(b"\0" * (free - 8 * 1024))        # room for the queue and a trial or two
        p = subprocess.Popen(sweep_cmd(path, out, "--workers", "1", "--storage-timeout", "60"), env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log = out / "logs" / "worker-0.log"
        try:
            wait_for(lambda: log.exists() and "storage unreachable since" in log.read_text(), timeout=60, proc=p,
                     what="the journal to fill up")
            filler.unlink()
            text = p.communicate(timeout=90)[0]
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 0, text
        worker = log.read_text()
        assert re.search(r"storage unreachable since \d\d:\d\d:\d\d, retrying for up to 60 s \(No space left on "
                         r"device: .*study.journal\)", worker), worker
        assert worker.count("storage unreachable since") == 1 and worker.count("storage reachable again") == 1
        assert "Traceback" not in all_output(out, text)
        _journal_is_whole(disk / "study.journal")
        assert sorted(completed_points(trials_of(out))) == sorted(p.point_id for p in load_sweep(path).points())
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_read_only_sweep_directory_is_one_line(tmp_path, capsys):
    from sandbox.cli import main
    ro = tmp_path / "ro"
    if not _mount_tmpfs(ro, "64k") or subprocess.run(["mount", "-o", "remount,ro", str(ro)]).returncode:
        pytest.skip("cannot mount a read-only tmpfs here (needs root and CAP_SYS_ADMIN)")
    try:
        path = write(tmp_path, "grid: {seed: [0]}\n")
        assert main(["sweep", str(path), "--out", str(ro / "out")]) == 1
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("sandbox: error: ") and "Read-only file system" in err, err
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)


# ---- the pieces: guard, heartbeat rule, journal writes --------------------------------------------------------

class _Flaky:
    """A storage call that fails like a dropped connection until ``up`` is set."""

    def __init__(self):
        self.up, self.calls = False, 0

    def __call__(self):
        import sqlalchemy.exc as sa
        from optuna.exceptions import StorageInternalError
        self.calls += 1
        if not self.up:
            try:
                raise sa.OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly"))
            except sa.OperationalError as e:
                raise StorageInternalError("An exception is raised during the commit.") from e
        return "ok"


def test_guard_retries_with_backoff_and_says_one_line_each_way():
    import threading
    from sandbox.sweep.storage import StorageGuard, StorageUnavailable
    said = []
    guard = StorageGuard(timeout=30, max_backoff=0.4, say=said.append)
    flaky = _Flaky()
    threading.Timer(1.5, lambda: setattr(flaky, "up", True)).start()
    t0 = time.time()
    assert guard.call(flaky) == "ok"
    assert 1.5 <= time.time() - t0 < 2.5
    assert 4 <= flaky.calls <= 8                     # backoff: 0.25 s, doubling, capped at 0.4 s
    assert len(said) == 2 and said[0].startswith("storage unreachable since ") and \
        said[0].endswith("retrying for up to 30 s (server closed the connection unexpectedly)")
    assert said[1].startswith("storage reachable again at ")
    assert not guard.unreachable and guard.recovered_at is not None

    # past the timeout: StorageUnavailable, at once for every later call too
    guard = StorageGuard(timeout=0.5, max_backoff=0.2, say=said.append)
    gave_up = []
    guard.on_give_up = lambda: gave_up.append(1)
    with pytest.raises(StorageUnavailable, match=r"storage unreachable for \d s since"):
        guard.call(_Flaky())
    t0 = time.time()
    with pytest.raises(StorageUnavailable):
        guard.call(lambda: "never called")
    assert time.time() - t0 < 0.1 and gave_up == [1]

    # an error of the call itself is not an outage; a read-only journal is not waited for
    guard = StorageGuard(timeout=30, say=said.append)
    with pytest.raises(KeyError):
        guard.call(lambda: {}["x"])
    with pytest.raises(StorageUnavailable, match="storage error: Read-only file system"):
        guard.call(lambda: (_ for _ in ()).throw(OSError(errno.EROFS, "Read-only file system")))


class _AllStale:
    """An RDB storage's heartbeat side in which every trial's last beat is old."""

    def __init__(self):
        self.flaky = _Flaky()
        self.flaky.up = True

    def _get_stale_trial_ids(self, study_id):
        self.flaky()
        return [7]


def test_heartbeat_silence_counts_only_while_the_storage_is_reachable():
    # a trial whose last beat is older than the grace period (Optuna's verdict, here always)
    # is lost only once this process has reached the storage for a whole grace period: since
    # it started, and again after each outage
    import threading
    from sandbox.sweep.storage import GuardedHeartbeatStorage, StorageGuard
    inner = _AllStale()
    storage = GuardedHeartbeatStorage(inner, StorageGuard(timeout=30, max_backoff=0.05, say=lambda _: None),
                                      grace_period=0.5)
    assert storage._get_stale_trial_ids(0) == []            # just started: it could not have heard them
    time.sleep(0.6)
    assert storage._get_stale_trial_ids(0) == [7]
    inner.flaky.up = False
    threading.Timer(0.3, lambda: setattr(inner.flaky, "up", True)).start()
    assert storage._get_stale_trial_ids(0) == []            # an outage just ended: a fresh grace period
    time.sleep(0.6)
    assert storage._get_stale_trial_ids(0) == [7]


def test_journal_write_cut_off_midway_leaves_whole_records(tmp_path):
    # a child process with a file-size limit writes to the journal until a record no longer
    # fits; the record is cut back, the journal parses, and a later writer appends cleanly
    from sandbox.sweep.storage import SafeJournalFile
    path = tmp_path / "j.journal"
    code = textwrap.dedent(f"""
        import errno, resource, sys
        from sandbox.sweep.storage import SafeJournalFile
        from optuna.storages.journal import JournalFileOpenLock
        resource.setrlimit(resource.RLIMIT_FSIZE, (5000, 5000))
        j = SafeJournalFile({str(path)!r}, lock_obj=JournalFileOpenLock({str(path)!r}))
        for i in range(1000):
            try:
                j.append_logs([{{"op": i, "pad": "x" * 300}}])
            except OSError as e:
                sys.exit(7 if e.errno == errno.EFBIG else 1)
        """)
    assert subprocess.run([sys.executable, "-c", code], env=ENV).returncode == 7
    records = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert path.stat().st_size <= 5000 and [r["op"] for r in records] == list(range(len(records)))
    # a record torn by a writer killed half-way is cut off by the next append
    with open(path, "ab") as f:
        f.write(b'{"op": "torn", "pa')
    SafeJournalFile(str(path)).append_logs([{"op": "next"}])
    assert [json.loads(line)["op"] for line in path.read_bytes().splitlines()][-2:] == [len(records) - 1, "next"]

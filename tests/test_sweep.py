"""`sandbox sweep` with real Optuna storages and real worker processes (CPU, tiny runs).

Checked against independent references: the Cartesian product of the grid written
out in the test, each trial's own result.json history (objective = best accuracy),
and the process ids seen on the trials (which workers ran what). The PostgreSQL test
needs a server on loopback (.ci/postgres.sh); it is skipped only outside CI.
"""
from __future__ import annotations

import collections
import csv
import gzip
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from sandbox.cli import main
from sandbox.sweep import report
from sandbox.sweep.study import open_storage
from sandbox.sweep.spec import load_sweep

BASE = """\
base:
  task: {name: mqar, seq_len: 16, num_kv_pairs: 2, vocab_size: 16, test_examples: 32, val_examples: 32}
  model: {mixer: attention, d_model: 16, n_layers: 1, n_heads: 1, positions: learned, channel_mixer: none}
  train: {steps: STEPS, batch_size: 8, lr: 3e-3, eval_every: 10, eval_batch_size: 32, log_every: 10,
          early_stop: null}
"""
# no GPU for the workers; one thread each (several workers share two cores)
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def write(tmp_path: Path, body: str, steps: int = 30, eval_every: int = 10) -> Path:
    path = tmp_path / "s.yaml"
    base = BASE.replace("STEPS", str(steps)).replace("eval_every: 10", f"eval_every: {eval_every}")
    path.write_text(base + textwrap.dedent(body))
    return path


def sweep_cmd(path, out, *extra) -> list[str]:
    return [sys.executable, "-m", "sandbox.cli", "sweep", str(path), "--out", str(out), "--no-live", *extra]


def run_sweep(path, out, *extra, env=ENV, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run(sweep_cmd(path, out, *extra), env=env, capture_output=True, text=True, timeout=timeout)


def trials_of(out: Path, url: str | None = None, name: str | None = None):
    import optuna
    storage = open_storage(out, url)
    name = name or json.loads((out / "sweep.json").read_text())["study"]
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


def completed_points(trials) -> list[str]:
    return [t.user_attrs["point_id"] for t in trials if t.state.name == "COMPLETE"]


def wait_for(pred, timeout=300, what="condition"):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def pid_of(trial) -> int:
    return int(trial.user_attrs["worker"].rsplit(":", 2)[1])


# ---- a grid with two workers --------------------------------------------------------------

def test_grid_two_workers_every_point_once_and_resume_is_a_no_op(tmp_path):
    path = write(tmp_path, """\
        name: grid2
        grid:
          model.d_model: [16, 32]
          seed: [0, 1]
        tune:
          train.lr: ["1e-3", 1.0e-2]
        """, steps=40)
    out = tmp_path / "out"
    r = run_sweep(path, out, "--workers", "2")
    assert r.returncode == 0, r.stdout + r.stderr

    expected = {(d, s, lr) for d, s, lr in itertools.product([16, 32], [0, 1], [1e-3, 1e-2])}
    rows = list(csv.DictReader(open(out / "results.csv")))
    got = [(int(r["model.d_model"]), int(r["seed"]), float(r["train.lr"])) for r in rows]
    assert sorted(got) == sorted(expected)                      # every point, exactly once
    assert all(r["status"] == "complete" for r in rows)
    assert len({r["worker"] for r in rows}) == 2                # both worker processes pulled trials

    trials = trials_of(out)
    assert sorted(completed_points(trials)) == sorted(p.point_id for p in load_sweep(path).points())
    for t in trials:                                            # objective = best val accuracy of the run
        res = json.loads((out / t.user_attrs["run_dir"] / "result.json").read_text())
        assert t.value == max(h["val/accuracy"] for h in res["history"])
        assert res["config"]["model"]["d_model"] == t.params["model.d_model"]
        assert res["config"]["train"]["lr"] == t.params["train.lr"]
        assert any(f.name.startswith("events.out.tfevents") for f in (out / t.user_attrs["run_dir"]).iterdir())

    # the summary keeps the best over the tuned lr per grid point
    summary = list(csv.DictReader(open(out / "summary.csv")))
    assert len(summary) == 4
    for s in summary:
        mine = [float(r["objective"]) for r in rows
                if r["model.d_model"] == s["model.d_model"] and r["seed"] == s["seed"]]
        assert float(s["best"]) == pytest.approx(max(mine), abs=1e-6)
    md = (out / "summary.md").read_text()
    assert "Mean ± std over seeds" in md and "stacks training at once" in md

    # rerunning the same file resumes: nothing is queued or run again (Python's bytecode cache set: no note on it)
    cached = {k: v for k, v in ENV.items() if k != "PYTHONDONTWRITEBYTECODE"}
    r2 = run_sweep(path, out, "--workers", "2", env={**cached, "PYTHONPYCACHEPREFIX": str(tmp_path / "pyc")})
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert "(0 newly queued)" in r2.stdout and "may not write bytecode" not in r2.stdout
    assert len(trials_of(out)) == len(trials)

    # a committed run keeps its journal gzipped (figures/README.md): resumed there, it queues nothing either
    committed = tmp_path / "committed"
    committed.mkdir()
    for name in ("results.csv", "summary.md", "summary.csv", "sweep.yaml"):
        shutil.copy(out / name, committed / name)
    (committed / "study.journal.gz").write_bytes(gzip.compress((out / "study.journal").read_bytes()))
    r3 = run_sweep(path, committed, "--workers", "1", env={**cached, "PYTHONDONTWRITEBYTECODE": "1"})
    assert r3.returncode == 0, r3.stdout + r3.stderr
    assert "(0 newly queued)" in r3.stdout and "study.journal.gz: unpacked" in r3.stdout
    assert "Python may not write bytecode here" in r3.stdout           # each worker would compile torch's source
    assert len(trials_of(committed)) == len(trials)

    # status of a finished sweep
    assert main(["sweep", "status", str(out)]) == 0

    # a changed base config is refused rather than mixed into the old study
    path.write_text(path.read_text().replace("lr: 3e-3", "lr: 5e-3"))
    assert main(["sweep", str(path), "--out", str(out)]) == 2


def test_a_file_trains_only_its_own_points_of_a_shared_study(tmp_path):
    """Two files of one name and base share a study (a figure's control and its rows). Launching one trains its
    points and leaves the other's waiting trials queued, so a part of a figure can run before the rest."""
    from sandbox.sweep.study import enqueue_points, prepare_study
    out = tmp_path / "out"
    out.mkdir()
    rows = write(tmp_path, "name: parts\ngrid:\n  model.d_model: [16, 32]\n", steps=10)
    rows = rows.rename(tmp_path / "rows.yaml")
    control = write(tmp_path, "name: parts\ngrid:\n  model.d_model: [16]\n", steps=10)
    study = prepare_study(load_sweep(rows), open_storage(out, None))
    assert enqueue_points(study, load_sweep(rows)) == 2             # both queued, neither trained
    r = run_sweep(control, out, "--workers", "1")
    assert r.returncode == 0, r.stdout + r.stderr                  # its own points done: nothing left of it
    state = {t.params["model.d_model"]: t.state.name for t in trials_of(out)}
    assert state == {16: "COMPLETE", 32: "WAITING"}


def test_a_sweep_directory_moved_from_another_machine_resumes_its_running_trials(tmp_path):
    # a journal holds a trial RUNNING on a machine that is gone (shut down or lost, its sweep
    # directory copied here): the launcher adopts it instead of waiting for it forever
    from sandbox.sweep.study import enqueue_points, load_study, prepare_study
    path = write(tmp_path, """\
        name: moved
        grid:
          seed: [0, 1, 2]
        """, steps=20)
    out = tmp_path / "out"
    out.mkdir()
    spec = load_sweep(path)
    storage = open_storage(out, None)
    prepare_study(spec, storage)
    study = load_study(storage, spec.name)
    enqueue_points(study, spec)
    orphan = study.ask()
    study.set_trial_attr(orphan.number, "worker", "gone-machine:4242:0")
    (out / "sweep.json").write_text(json.dumps({"study": spec.name}))

    r = run_sweep(path, out, "--workers", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gone-machine:4242:0 died; requeued" in r.stdout
    trials = trials_of(out)
    assert sorted(completed_points(trials)) == sorted(p.point_id for p in spec.points())
    assert [t.state.name for t in trials if t.number == orphan.number] == ["FAIL"]


# ---- failures are recorded, the sweep goes on ---------------------------------------------------

@pytest.mark.slow
def test_diverging_and_raising_trials_are_recorded_failed(tmp_path, capsys):
    # lr 1e30 makes the loss NaN (TrainingDiverged); train.device=cuda passes validation
    # but raises when the run starts on a machine without a visible GPU.
    path = write(tmp_path, """\
        name: failing
        grid:
          train.device: [cpu, cuda]
        tune:
          train.lr: [3e-3, 1e30]
        """)
    out = tmp_path / "out"
    r = run_sweep(path, out, "--workers", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {(r["train.device"], float(r["train.lr"])): r for r in csv.DictReader(open(out / "results.csv"))}
    assert len(rows) == 4
    assert rows[("cpu", 3e-3)]["status"] == "complete"
    assert rows[("cpu", 1e30)]["status"] == "failed"
    assert rows[("cpu", 1e30)]["note"].startswith("diverged: loss became nan")
    for lr in (3e-3, 1e30):
        assert rows[("cuda", lr)]["status"] == "failed"
        assert "CUDA is not available" in rows[("cuda", lr)]["note"]
    md = (out / "summary.md").read_text()
    assert md.count("CUDA is not available") == 2 and "diverged" in md
    # failed points are final: a rerun does not retry them
    r2 = run_sweep(path, out)
    assert "(0 newly queued)" in r2.stdout and len(trials_of(out)) == 4
    # ... unless asked to (after a fix): the three failed points run again, the complete one not
    r3 = run_sweep(path, out, "--retry-failed")
    assert r3.returncode == 0 and "(3 newly queued)" in r3.stdout, r3.stdout + r3.stderr
    assert len(trials_of(out)) == 7 and len(completed_points(trials_of(out))) == 1
    # the retries really ran (and failed again for their own reasons, not as duplicates)
    retries = [t for t in trials_of(out) if t.number >= 4]
    assert all("duplicate_of" not in t.user_attrs for t in retries), [t.user_attrs for t in retries]
    assert sorted(t.user_attrs["failure"].split(":")[0] for t in retries) == sorted(
        t.user_attrs["failure"].split(":")[0] for t in trials_of(out) if t.number < 4 and t.state.name == "FAIL")
    # each failed point counts once: the first try is "requeued", its retry "failed"
    status = collections.Counter(r["status"] for r in csv.DictReader(open(out / "results.csv")))
    assert status == {"complete": 1, "requeued": 3, "failed": 3}, status


def test_a_point_that_failed_then_succeeded_on_retry_trains_again_on_retrain(tmp_path):
    """Failed, retried with --retry-failed, then retrained (the laLTE rows' history): the retrain trains the point
    again. It had been dropped as a duplicate of the first, failed trial, which still counted as holding it."""
    path = write(tmp_path, "name: again\ngrid:\n  model.d_model: [16]\n", steps=10)
    out = tmp_path / "out"
    point = load_sweep(path).points()[0].point_id
    blocked = out / "trials" / f"0-{point[:8]}"
    blocked.parent.mkdir(parents=True)
    blocked.write_text("a file where the first trial's run directory goes: its training fails")
    run_sweep(path, out, "--workers", "1")
    assert [t.state.name for t in trials_of(out)] == ["FAIL"]
    blocked.unlink()
    assert run_sweep(path, out, "--workers", "1", "--retry-failed").returncode == 0
    r = run_sweep(path, out, "--workers", "1", "--retrain", "model.d_model=16")
    assert r.returncode == 0, r.stdout + r.stderr
    t = trials_of(out)
    assert [x.state.name for x in t] == ["FAIL", "COMPLETE", "COMPLETE"], [x.user_attrs for x in t]
    assert t[2].user_attrs["retrain_of"] == 1 and "duplicate_of" not in t[2].user_attrs


@pytest.mark.slow
def test_retrain_trains_the_matching_finished_points_again_and_supersedes_their_rows(tmp_path, capsys):
    """After a fix to what some trials trained on (sla_heads' 16-head kernel), `--retrain KEY=VALUE` trains the
    matching finished points again: new trials, the old ones superseded and out of results.csv's finished rows.
    In float64 on the CPU a retrained point repeats its first run's objective (the reference); the same
    conditions again queue nothing; a condition no point meets is a one-line error naming the flag."""
    from sandbox.analysis.plot_sweep import finished, load_rows

    path = write(tmp_path, """\
        name: retrain
        grid:
          model.d_model: [16, 32]
        tune:
          train.lr: [1.0e-3, 3.0e-3]
        """, steps=20)
    path.write_text(path.read_text().replace("early_stop: null}", "early_stop: null, precision: fp64}"))
    out = tmp_path / "out"
    assert run_sweep(path, out, "--workers", "1").returncode == 0
    first = {t.number: t for t in trials_of(out)}
    r = run_sweep(path, out, "--workers", "1", "--retrain", "model.d_model=16")
    assert r.returncode == 0 and "(2 newly queued)" in r.stdout, r.stdout + r.stderr
    trials = trials_of(out)
    again = [t for t in trials if t.number not in first]
    assert len(again) == 2 and all(t.state.name == "COMPLETE" for t in again)
    for t in again:
        old = first[t.user_attrs["retrain_of"]]
        assert {k: old.params[k] for k in old.user_attrs["grid_keys"]} == {"model.d_model": 16}
        assert old.user_attrs["point_id"] == t.user_attrs["point_id"]
        assert t.user_attrs["run_dir"] != old.user_attrs["run_dir"]
        assert t.value == pytest.approx(old.value, abs=1e-9)
    rows = {int(r["trial"]): r for r in csv.DictReader(open(out / "results.csv"))}
    assert [rows[n]["status"] for n in sorted(rows)] == ["superseded", "superseded", "complete", "complete",
                                                         "complete", "complete"]
    assert rows[0]["objective"] == "" and rows[0]["note"].startswith("trained again as trial ")
    kept, left = finished(load_rows(out)[0])
    assert sorted(int(r["trial"]) for r in kept) == [2, 3, 4, 5] and left == {"superseded": 2}
    # the same conditions again: nothing queued; no point at d_model 64: an error before anything runs
    r = run_sweep(path, out, "--workers", "1", "--retrain", "model.d_model=16")
    assert "(0 newly queued)" in r.stdout and len(trials_of(out)) == 6, r.stdout + r.stderr
    assert main(["sweep", str(path), "--out", str(out), "--retrain", "model.d_model=64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"sandbox: error: {path}: --retrain: no trial has model.d_model=64", err
    assert main(["sweep", str(path), "--out", str(out), "--retrain", "model.n_layers=1"]) == 2
    assert "'model.n_layers' is not a grid or tuned key of this sweep" in capsys.readouterr().err
    # a learning rate written without a dot (YAML reads 1e-3 as a string) still names the 1.0e-3 points
    from sandbox.sweep.study import retrain_matcher
    match = retrain_matcher(load_sweep(path), ["train.lr=1e-3", "model.d_model=32"])
    assert [(p.grid["model.d_model"], p.tune["train.lr"]) for p in load_sweep(path).points() if match(p)] == [
        (32, 1.0e-3)]


@pytest.mark.slow
def test_a_grid_points_trials_train_stacked_and_equal_one_by_one(tmp_path):
    """One worker takes a grid point's learning rates together (3 stacked replicas, one process) and records
    each as its own trial; in float64 their objectives equal those of the same sweep run one by one."""
    body = """\
        name: stacked
        grid:
          model.d_model: [16, 32]
        tune:
          train.lr: [1.0e-3, 3.0e-3, 1.0e-2]
        """
    path = write(tmp_path, body, steps=40)
    path.write_text(path.read_text().replace("early_stop: null}", "early_stop: null, precision: fp64}"))
    runs = {}
    for stack in ("3", "1"):
        out = tmp_path / f"out{stack}"
        r = run_sweep(path, out, "--workers", "1", "--stack", stack)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"up to {stack} trials of a grid point stacked" in r.stdout
        trials = trials_of(out)
        assert sorted(completed_points(trials)) == sorted(p.point_id for p in load_sweep(path).points())
        assert {t.user_attrs["result"]["replicas"] for t in trials} == {int(stack)}
        runs[stack] = {(t.params["model.d_model"], t.params["train.lr"]): t.value
                       for t in trials}
    assert runs["3"] == pytest.approx(runs["1"], abs=1e-9)
    assert len({pid_of(t) for t in trials_of(tmp_path / "out3")}) == 1
    # summary.md's stacks: one row per stack trained, one after another in the one worker
    for stack, expect in (("3", [3, 3]), ("1", [1] * 6)):
        rows = report.stack_rows(trials_of(tmp_path / f"out{stack}"))
        assert [r["trials"] for r in rows] == expect
        assert all(a["end s"] <= b["start s"] + 0.5 for a, b in zip(rows, rows[1:]))
        half = len(expect) // 2
        assert sorted(r["stack of"] for r in rows) == ["d_model=16"] * half + ["d_model=32"] * half
        assert "## Stacks" in (tmp_path / f"out{stack}" / "summary.md").read_text()
    log = (tmp_path / "out3" / "logs" / "worker-0.log").read_text()
    assert log.count("(stacked with 2 more)") == 6


@pytest.mark.slow
def test_an_interrupted_stack_resumes_first_and_as_a_stack(tmp_path):
    """Ctrl-C during a stack of 3, then a rerun: the requeued copies (at the end of the queue) are taken
    before the untouched grid point and go on stacked, from their checkpoints, to the end."""
    path = write(tmp_path, """\
        name: restack
        grid:
          model.d_model: [16, 32]
        tune:
          train.lr: [1.0e-3, 3.0e-3, 1.0e-2]
        """, steps=400, eval_every=20)
    out = tmp_path / "out"

    def stack_reported():
        if not (out / "sweep.json").exists():
            return None
        try:
            running = [t for t in trials_of(out) if t.state.name == "RUNNING" and t.last_step]
        except KeyError:
            return None
        return running if len(running) == 3 else None

    p = subprocess.Popen(sweep_cmd(path, out, "--workers", "1"), env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    first = wait_for(stack_reported, what="a stack of 3 to report")
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=90) == 130, p.stdout.read()
    dirs = {t.user_attrs["run_dir"] for t in first}
    missing = [d for d in dirs if not (out / d / "result.json").exists()]
    assert not missing, f"no result.json in {missing}; worker log:\n" + (out / "logs" / "worker-0.log").read_text()
    stopped_at = {json.loads((out / d / "result.json").read_text())["steps"] for d in dirs}
    assert len(stopped_at) == 1 and 0 < min(stopped_at) < 400

    r = run_sweep(path, out, "--workers", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    done = [t for t in trials_of(out) if t.state.name == "COMPLETE"]
    assert len(done) == 6
    resumed = [t for t in done if t.user_attrs["run_dir"] in dirs]
    assert len(resumed) == 3 and all("retry_of" in t.user_attrs for t in resumed)
    assert {t.user_attrs["result"]["replicas"] for t in resumed} == {3}           # stacked again
    assert max(t.datetime_start for t in resumed) < min(t.datetime_start for t in done if t not in resumed)
    for d in dirs:                                       # went on from the checkpoint: the early evaluations kept
        res = json.loads((out / d / "result.json").read_text())
        assert res["steps"] == 400 and res["history"][0]["step"] == 20


# ---- pruning ----------------------------------------------------------------------------------------

def test_median_pruning_stops_a_hopeless_lr_within_its_grid_point(tmp_path):
    # one worker runs the trials one by one in queue order: two good learning rates finish, then
    # the hopeless one (1e-7) falls below their median at its second evaluation and is stopped
    path = write(tmp_path, """\
        name: prune
        tune:
          train.lr: [1.0e-2, 3.0e-3, 1.0e-7]
        pruning: {median: true, warmup_evals: 1, min_trials: 2}
        """, steps=200, eval_every=50)
    out = tmp_path / "out"
    r = run_sweep(path, out, "--workers", "1", "--stack", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    trials = {t.params["train.lr"]: t for t in trials_of(out)}
    good = [trials[1e-2], trials[3e-3]]
    assert [t.state.name for t in good] == ["COMPLETE", "COMPLETE"]
    bad = trials[1e-7]
    assert bad.state.name == "PRUNED" and bad.user_attrs["pruned"].startswith("pruned at step")
    step = bad.last_step
    assert step == 100 and bad.user_attrs["result"]["steps"] == 100 < 200     # stopped early
    # reference: its best value so far is below the median (mean of two) of the others at that step
    others = [max(v for s, v in t.intermediate_values.items() if s <= step) for t in good]
    assert max(bad.intermediate_values.values()) < sum(others) / 2
    assert "pruned" in {row["status"] for row in csv.DictReader(open(out / "results.csv"))}


# ---- crash safety ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_interrupt_and_kill_minus_9_then_rerun_completes_every_point_once(tmp_path, capsys):
    path = write(tmp_path, """\
        name: crashy
        grid:
          train.steps: [20, 1000]
          seed: [0, 1]
        """, eval_every=50)
    out = tmp_path / "out"
    expected = sorted(p.point_id for p in load_sweep(path).points())
    slow = {p.point_id for p in load_sweep(path).points() if p.grid["train.steps"] == 1000}

    def running_slow(min_step=0):
        if not (out / "study.journal").exists() or not (out / "sweep.json").exists():
            return None
        try:
            trials = trials_of(out)
        except KeyError:                      # the journal exists, the study is not created yet
            return None
        for t in trials:
            if (t.state.name == "RUNNING" and t.user_attrs.get("point_id") in slow and "worker" in t.user_attrs
                    and t.last_step is not None and t.last_step > min_step):
                return t
        return None

    # 1. Ctrl-C: the launcher stops its workers; their trials are requeued, nothing is lost
    p = subprocess.Popen(sweep_cmd(path, out, "--workers", "2"), env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    first = wait_for(running_slow, what="a slow trial to report")
    # meanwhile `sweep status` shows each running trial with the step and value of its last evaluation
    capsys.readouterr()
    assert main(["sweep", "status", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "last evaluation" in shown and re.search(rf"│ {first.number} .*│ \d+/1000 +│ 0\.\d{{4}} +│", shown), shown
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=90) == 130, p.stdout.read()
    t = next(t for t in trials_of(out) if t.number == first.number)
    assert t.state.name == "FAIL" and t.user_attrs["lost"] == "interrupted"
    assert any(r.user_attrs.get("retry_of") == t.number for r in trials_of(out))
    assert (out / t.user_attrs["run_dir"] / "checkpoint.pt").exists()
    assert not [t for t in trials_of(out) if t.state.name == "RUNNING"]

    # 2. kill -9 a worker: the launcher requeues its trial and starts another worker
    p = subprocess.Popen(sweep_cmd(path, out, "--workers", "2"), env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    victim = wait_for(lambda: running_slow(first.last_step), what="a resumed slow trial to report")
    os.kill(pid_of(victim), signal.SIGKILL)
    wait_for(lambda: any(t.user_attrs.get("retry_of") == victim.number for t in trials_of(out)),
             what="the killed worker's trial to be requeued")

    # 3. kill -9 the launcher and every worker (a machine crash), then rerun the command
    again = wait_for(lambda: running_slow(), what="the requeued trial to run again")
    p.kill()
    for t in trials_of(out):
        if t.state.name == "RUNNING" and "worker" in t.user_attrs:
            try:
                os.kill(pid_of(t), signal.SIGKILL)
            except ProcessLookupError:
                pass
    p.wait()
    assert any(t.number == again.number and t.state.name == "RUNNING" for t in trials_of(out))
    r = run_sweep(path, out, "--workers", "2")
    assert r.returncode == 0, r.stdout + r.stderr

    trials = trials_of(out)
    assert sorted(completed_points(trials)) == expected        # no point missing, none twice
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
    reasons = [t.user_attrs["retry_reason"] for t in trials if "retry_of" in t.user_attrs]
    assert "interrupted" in reasons and f"worker {victim.user_attrs['worker']} died" in reasons
    # every retry resumed in its point's first run directory, and the run reached its end
    for point in slow:
        dirs = {t.user_attrs["run_dir"] for t in trials if t.user_attrs.get("point_id") == point}
        assert len(dirs) == 1
        assert json.loads((out / dirs.pop() / "result.json").read_text())["steps"] == 1000


def test_worker_slots_spread_workers_over_visible_gpus():
    from sandbox.sweep.runner import worker_slots
    assert worker_slots(["0", "1"], None, 3) == ["0", "1", "0", "1", "0", "1"]
    assert worker_slots(["2", "5"], None, None) == ["2", "5"]
    assert worker_slots(["0", "1"], 3, None) == ["0", "1", "0"]
    assert worker_slots([], 4, None) == [None] * 4
    assert worker_slots([], None, None) == [None]
    with pytest.raises(ValueError, match="--workers-per-gpu"):
        worker_slots([], None, 2)
    with pytest.raises(ValueError, match="give one of them"):
        worker_slots(["0"], 2, 2)


# ---- validation ------------------------------------------------------------------------------------

BAD = {
    "malformed": ("grid: {model.d_model: [16, 32\n", "malformed YAML"),
    "unknown_top": ("grdi: {seed: [0, 1]}\n", "grdi: unknown key"),
    "empty_axis": ("grid: {model.d_model: []}\n", "grid.model.d_model: empty axis"),
    "tuned_and_grid": ("grid: {train.lr: [1e-3]}\ntune: {train.lr: [1e-2]}\n", "tune.train.lr: is also a grid axis"),
    "zero_budget": ("tune: {train.lr: {low: 1e-4, high: 1e-2, log: true, trials: 0}}\n",
                    "tune.train.lr.trials: the trial budget must be >= 1"),
    "unknown_grid_key": ("grid: {model.d_modle: [16]}\n", "grid.model.d_modle: unknown key"),
    "unknown_tune_key": ("tune: {train.learning_rate: [1e-3]}\n", "tune.train.learning_rate: unknown key"),
    "bad_combination": ("grid: {model.d_model: [16, 24], model.n_heads: [2, 3]}\n",
                        "grid point model.d_model=16, model.n_heads=3: model.n_heads: 3 does not divide"),
    "bad_value": ("grid: {task.num_kv_pairs: [2, 9]}\n", "grid point task.num_kv_pairs=9: task.vocab_size"),
    "bad_metric": ("objective: {metric: test/acc}\n", "objective.metric: must be one of"),
    "range_order": ("tune: {train.lr: {low: 1e-2, high: 1e-4}}\n", "tune.train.lr.high: must be > low"),
    "zip_rows": ("grid: {'task.seq_len, task.num_kv_pairs': [[16, 2], [32]]}\n", "grid.task.seq_len, "
                 "task.num_kv_pairs[1]: a zipped axis of 2 keys needs rows of 2 values"),
    "pruning_key": ("pruning: {median: true, warmup: 2}\n", "pruning.warmup: unknown key"),
    "axis_not_list": ("grid: {seed: 3}\n", "grid.seed: expected a list"),
    "bad_base": ("", "base.model.d_model: expected an integer"),
    "gpu_pinned": ("grid: {train.device: ['cuda:1']}\n", "train.device: a sweep places trials on GPUs itself"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sweep_files_give_one_line_errors(tmp_path, capsys, case):
    body, expected = BAD[case]
    base = BASE.replace("STEPS", "10")
    if case == "bad_base":
        base = base.replace("d_model: 16", "d_model: sixteen")
    path = tmp_path / f"{case}.yaml"
    path.write_text(base + body)
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith(f"sandbox: error: {path}: "), err
    assert expected in err, err
    assert not (tmp_path / "out").exists()           # nothing ran


def test_points_zip_and_sampled_ranges(tmp_path):
    path = write(tmp_path, """\
        grid:
          task.seq_len, task.num_kv_pairs: [[16, 2], [32, 4]]
          seed: [0, 1]
        tune:
          train.lr: {low: 1.0e-4, high: 1.0e-2, log: true, trials: 3}
          train.weight_decay: [0.0, 0.1]
        """)
    spec = load_sweep(path)
    pts = spec.points()
    assert len(pts) == 2 * 2 * 2 * 3
    assert len({p.point_id for p in pts}) == len(pts)
    for (seq, kv), seed in itertools.product([(16, 2), (32, 4)], [0, 1]):
        mine = [p for p in pts if (p.grid["task.seq_len"], p.grid["task.num_kv_pairs"], p.grid["seed"]) == (seq, kv, seed)]
        assert len({p.grid_id for p in mine}) == 1
        for wd in (0.0, 0.1):
            lrs = sorted(p.tune["train.lr"] for p in mine if p.tune["train.weight_decay"] == wd)
            # one value in each third of [1e-4, 1e-2] on a log scale
            import math
            slots = sorted(int(3 * (math.log(lr) - math.log(1e-4)) / (math.log(1e-2) - math.log(1e-4))) for lr in lrs)
            assert slots == [0, 1, 2], lrs
    assert [p.point_id for p in load_sweep(path).points()] == [p.point_id for p in pts]   # deterministic


# ---- PostgreSQL: two launchers (two "machines") share one study ---------------------------------------

PG_URL = os.environ.get("SANDBOX_TEST_POSTGRES", "postgresql://sandbox:sandbox@127.0.0.1:5432/sandbox")


def _postgres_reachable() -> str | None:
    try:
        import psycopg2
    except ImportError:
        return "psycopg2 is not installed (pip install -e .[postgres])"
    try:
        psycopg2.connect(PG_URL.replace("postgresql://", "postgresql://", 1), connect_timeout=3).close()
    except Exception as e:                       # noqa: BLE001 - any connection failure means no server
        return f"no PostgreSQL at {PG_URL} ({str(e).strip().splitlines()[0]}); run .ci/postgres.sh"
    return None


def test_postgres_two_machines_share_one_study_and_heartbeat_retries(tmp_path, postgres_shared):
    why = _postgres_reachable()
    if why is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the PostgreSQL test: {why}")
        pytest.skip(why)
    name = f"pg-{uuid.uuid4().hex[:8]}"
    path = write(tmp_path, f"""\
        name: {name}
        grid:
          train.steps: [40, 41, 42, 43, 44, 45, 1000]
        """, eval_every=100)
    points = load_sweep(path).points()
    slow = next(p.point_id for p in points if p.grid["train.steps"] == 1000)
    out = tmp_path / "shared"                # one directory, as on a shared file system
    args = ("--workers", "1", "--storage", PG_URL, "--heartbeat", "1")
    procs = {m: subprocess.Popen(sweep_cmd(path, out, *args), env={**ENV, "SANDBOX_SWEEP_HOST": m},
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for m in ("machine-a", "machine-b")}

    def slow_reporting():
        try:
            trials = trials_of(out, PG_URL, name) if (out / "sweep.json").exists() else []
        except KeyError:                      # the study is not created yet
            return None
        for t in trials:
            if t.state.name == "RUNNING" and t.user_attrs.get("point_id") == slow and t.last_step is not None:
                return t
        return None

    try:
        # the machine that took the slow trial dies with it (launcher and worker killed -9); the
        # other one sees no more heartbeats, runs the trial again and finishes the sweep
        victim = wait_for(slow_reporting, what="the slow trial to report")
        dead = victim.user_attrs["worker"].split(":")[0]
        alive = next(m for m in procs if m != dead)
        os.kill(pid_of(victim), signal.SIGKILL)
        procs[dead].kill()
        procs[dead].wait()
        assert procs[alive].wait(timeout=150) == 0, procs[alive].stdout.read()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    trials = trials_of(out, PG_URL, name)
    assert sorted(completed_points(trials)) == sorted(p.point_id for p in points)
    hosts = {t.user_attrs["worker"].split(":")[0] for t in trials if t.state.name == "COMPLETE"}
    assert hosts == {"machine-a", "machine-b"}                 # both machines finished trials of the study
    lost = next(t for t in trials if t.number == victim.number)
    assert lost.state.name == "FAIL"
    redo = next(t for t in trials if t.user_attrs.get("retry_of") == victim.number)
    assert redo.user_attrs["retry_reason"] == f"no heartbeat from {victim.user_attrs['worker']}"
    assert redo.state.name == "COMPLETE" and redo.user_attrs["worker"].startswith(f"{alive}:")
    res = json.loads((out / redo.user_attrs["run_dir"] / "result.json").read_text())
    assert res["steps"] == 1000 and res["history"][0]["step"] == 100   # resumed the dead machine's run


def test_a_process_counts_as_alive_while_it_runs_the_named_module_and_not_once_it_exited():
    """``process_alive`` decides whether a worker's trials are orphaned and whether a helper still has a stack
    queued: a process running ``python -m timeit`` is alive as timeit (from the moment it is started, though
    its exec may not have finished) and not as another module; once killed it is not, zombie or reaped."""
    from sandbox.train.signals import process_alive

    p = subprocess.Popen([sys.executable, "-m", "timeit", "-n", "1", "-r", "1", "import time; time.sleep(60)"])
    try:
        assert process_alive(p.pid, "timeit")
        assert not process_alive(p.pid, "sandbox.sweep.worker")
    finally:
        p.send_signal(signal.SIGKILL)
    while Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)                # not reaped yet: a zombie
    assert not process_alive(p.pid, "timeit")
    p.wait()
    assert not process_alive(p.pid, "timeit")


def _trial(n, state, start=None, end=None, steps=None, at=None):
    """A FrozenTrial as a sweep's study holds one: started and ended ``start``/``end`` seconds after T0, with its
    ``steps`` and (running) a last evaluation at step ``at``."""
    import datetime

    from optuna.trial import FrozenTrial, TrialState
    when = lambda s: None if s is None else T0 + datetime.timedelta(seconds=s)
    return FrozenTrial(number=n, state=state, value=0.5 if state == TrialState.COMPLETE else None, values=None,
                       datetime_start=when(start), datetime_complete=when(end), params={}, distributions={},
                       user_attrs={} if steps is None else {"steps": steps}, system_attrs={},
                       intermediate_values={} if at is None else {at: 0.25}, trial_id=n)


T0 = __import__("datetime").datetime(2026, 11, 26, 3, 0, 0)


def test_the_eta_counts_the_trials_a_stack_trains_at_once():
    """3 workers, stacks of 9 trials: one stack done in 200 s, three running for 100 s (27 trials), eight waiting
    (72). Before an evaluation a running trial has left what the finished ones had after 100 s (100 s); the 27
    run at once: (72 x 200 + 27 x 100) / 27 = 633 s. Once they evaluated at step 250 of 1000 after 100 s, each
    has 300 s left: (72 x 200 + 27 x 300) / 27 = 833 s."""
    from optuna.trial import TrialState
    now = T0.timestamp() + 300

    def trials(at):
        return [_trial(n, TrialState.COMPLETE, 0, 200) if n < 9 else
                _trial(n, TrialState.RUNNING, 200, steps=1000, at=at) if n < 36 else _trial(n, TrialState.WAITING)
                for n in range(108)]
    line = report.progress_line(trials(None), "maximize", now=now)
    assert "9/108 trials finished" in line, line
    assert line.endswith("about 10m33s left"), line
    assert report.progress_line(trials(250), "maximize", now=now).endswith("about 13m53s left")


def test_the_eta_of_a_last_stack_follows_its_own_progress():
    """One worker, two stacks of two: the first (d_model 16) took 14 s; the second (a wider model) runs for 5 s
    and evaluated at step 50 of 500: 45 s are left. The mean of the finished trials alone said 7 s (half of
    14 s, whatever the second stack's progress), 45 s before the end."""
    from optuna.trial import TrialState
    trials = [_trial(0, TrialState.COMPLETE, 0, 14), _trial(1, TrialState.COMPLETE, 0, 14),
              _trial(2, TrialState.RUNNING, 15, steps=500, at=50), _trial(3, TrialState.RUNNING, 15, steps=500, at=50)]
    assert report.eta(trials, now=T0.timestamp() + 20) == pytest.approx(45.0)


def _recorded_sweep(tmp_path):
    """A recorded sweep: Figure 8's part 1 (108 trials in 12 stacks of 9, two workers on one H200, 2026-11-26),
    its journal as committed at b9bd818 (results/sweep_packing/fig8_part1_two_workers), loaded as the report
    loads any study."""
    import gzip
    import shutil

    from sandbox.sweep.study import load_study
    out = tmp_path / "recorded"
    out.mkdir()
    with gzip.open(DATA / "fig8_part1_two_workers.journal.gz") as src, open(out / "study.journal", "wb") as dst:
        shutil.copyfileobj(src, dst)
    return load_study(open_storage(out, None), "sse_fig8_topk").get_trials()


DATA = Path(__file__).parent / "data"


def test_the_summary_counts_each_stack_once_on_a_recorded_sweep(tmp_path):
    """Two workers trained the 12 stacks one after another each: at most 2 stacks trained at once. The sum of
    the trials' own times over the wall time had said 17.7 (a stack's 9 trials counted 9 times)."""
    trials = _recorded_sweep(tmp_path)
    start = min(t.datetime_start.timestamp() for t in trials)
    wall = max(t.datetime_complete.timestamp() for t in trials) - start
    tm = report.timing(trials, wall, None)
    # the reference: per worker, the union of its trials' intervals (its stacks never overlap)
    busy = 0.0
    for w in {t.user_attrs["worker"] for t in trials}:
        spans = sorted((t.datetime_start.timestamp(), t.datetime_complete.timestamp()) for t in trials
                       if t.user_attrs["worker"] == w)
        end = float("-inf")
        for a, b in spans:
            busy += max(0.0, b - max(a, end))
            end = max(end, b)
    assert (tm["trials run"], tm["stacks run"]) == (108, 12)
    assert tm["stacks training at once (mean)"] == pytest.approx(busy / wall, abs=0.01)
    assert 1.9 < tm["stacks training at once (mean)"] <= 2.0


def test_the_eta_tracks_a_recorded_sweep(tmp_path):
    """The recorded sweep replayed: at every tenth of its 923 s from the first finished stack on, the trials as
    they stood then (finished, running or waiting by their recorded times, no evaluation seen) give an ETA within
    half the time that was in fact left, or 45 s."""
    import copy

    from optuna.trial import TrialState
    trials = _recorded_sweep(tmp_path)
    start = min(t.datetime_start.timestamp() for t in trials)
    end = max(t.datetime_complete.timestamp() for t in trials)
    first_done = min(t.datetime_complete.timestamp() for t in trials)
    checked = 0
    for f in [i / 10 for i in range(1, 10)] + [0.95]:
        now = start + f * (end - start)
        if now < first_done:
            continue
        seen = []
        for t in trials:
            t = copy.copy(t)
            if t.datetime_start.timestamp() > now:
                t.state, t.datetime_start, t.datetime_complete = TrialState.WAITING, None, None
            elif t.datetime_complete.timestamp() > now:
                t.state, t.datetime_complete, t.intermediate_values = TrialState.RUNNING, None, {}
            seen.append(t)
        left = report.eta(seen, start, now)
        assert abs(left - (end - now)) <= max(0.5 * (end - now), 45), (f, left, end - now)
        checked += 1
    assert checked >= 8

"""How a sweep fills a GPU: the utilisation rule, the stack size, MPS where it cannot start, and what a
worker takes before a time limit."""
import math
import os
import subprocess
import sys
import textwrap
import time

from sandbox.sweep import packing
from sandbox.train.mps import MPS
from sandbox.sweep.spec import load_sweep


def test_a_gpu_counts_as_underfilled_from_a_minute_of_samples():
    now = 1000.0
    times = [now - 70 + 2 * i for i in range(36)]                  # every 2 s over the last 70 s
    busy = [{0: (95.0, 1.0), 1: (30.0, 1.0)} for _ in times]
    assert packing.underfilled(busy, times, 0, now) is False
    assert packing.underfilled(busy, times, 1, now) is True
    assert packing.underfilled(busy, times, 2, now) is None         # no samples of that GPU
    assert packing.underfilled(busy[:3], times[:3], 1, now) is None  # too old to count
    # only the window counts: an idle start-up long ago does not make a busy GPU underfilled
    mixed = [{0: (0.0, 1.0)} if t < now - 60 else {0: (90.0, 1.0)} for t in times]
    assert packing.underfilled(mixed, times, 0, now) is False


def test_a_gpu_idle_while_its_workers_set_up_is_not_underfilled(tmp_path):
    """The launcher judges a GPU's fill only over the samples taken since its last worker started training: a
    set-up's idle GPU (a cold stack compiles for 20-25 s) once drew a third worker that then slowed the two
    beside it. A worker says it trains by a marker file; one without a marker sets up."""
    now = 1000.0
    times = [now - 30 + 2 * i for i in range(16)]                   # every 2 s over the last 30 s
    samples = [{0: (0.0 if t < now - 12 else 95.0, 1.0)} for t in times]     # set-ups, then both training
    assert packing.underfilled(samples, times, 0, now) is True                 # the whole window: idle
    assert packing.underfilled(samples, times, 0, now, since=now - 12) is False
    assert packing.underfilled(samples, times, 0, now, since=now - 5) is None  # too few samples since
    # another worker process that trains, and this one, which sets up
    other = subprocess.run([sys.executable, "-c", "import os, sys; from sandbox.sweep import packing; "
                            "packing.mark_training(sys.argv[1], True); print(os.getpid())", str(tmp_path)],
                           capture_output=True, text=True, check=True)
    pids = [int(other.stdout), os.getpid()]
    assert packing.training_since(tmp_path, pids[:1]) is not None
    assert packing.training_since(tmp_path, pids) is None
    before = time.time()
    packing.mark_training(tmp_path, True)
    since = packing.training_since(tmp_path, pids)
    assert before - 0.01 <= since <= time.time() + 0.01             # the later of the two started training
    packing.mark_training(tmp_path, True)                           # each evaluation: the start stays
    assert packing.training_since(tmp_path, pids) == since
    packing.mark_training(tmp_path, False)                          # the group ended
    assert packing.training_since(tmp_path, pids) is None and packing.training_since(tmp_path, []) is None
    packing.clear_pace(tmp_path)                                    # a new launch forgets the other's marker
    assert packing.training_since(tmp_path, pids[:1]) is None


def test_a_worker_marks_itself_training_from_its_first_evaluation_to_its_group_s_end(tmp_path, monkeypatch):
    from sandbox.sweep.worker import _Worker
    study = _study(tmp_path)
    out = tmp_path / "out"
    w = _Worker(out, study, os.getpid(), None, stack=3)
    seen, mark = [], packing.mark_training

    def watched(sweep_dir, training):
        mark(sweep_dir, training)
        seen.append((training, packing.training_since(sweep_dir, [os.getpid()])))
    monkeypatch.setattr(packing, "mark_training", watched)
    assert w.run_group(w.claim()) is None
    # each replica's evaluation at steps 50 and 100 (3 replicas), then the group's end
    assert [t for t, _ in seen] == [True] * 6 + [False]
    assert seen[0][1] is not None and {s for _, s in seen[:-1]} == {seen[0][1]} and seen[-1][1] is None


def test_stack_size_counts_the_trials_that_share_every_shape(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""\
        name: s
        base:
          task: {name: mqar, seq_len: 16, num_kv_pairs: 2, vocab_size: 16}
          model: {mixer: attention, d_model: 16}
        grid:
          model.d_model: [16, 32]
        tune:
          train.lr: [1.0e-3, 3.0e-3, 1.0e-2]
        """))
    spec = load_sweep(path)
    assert packing.group_size(spec) == 3
    assert packing.group_size(spec, cap=2) == 2
    # seeds of a grid point stack with its learning rates: 2 seeds x 3 lrs
    path.write_text(path.read_text().replace("grid:\n", "grid:\n  seed: [0, 1]\n"))
    assert packing.group_size(load_sweep(path)) == 6


def test_mps_that_cannot_start_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))                      # no nvidia-cuda-mps-control on it
    mps = MPS(tmp_path)
    assert mps.start() is False and "not installed" in mps.reason
    mps.stop()                                                      # harmless when it never ran


# -- a time limit: take only what finishes before it --------------------------------------------------

LIMITED = """\
name: limited
base:
  task: {name: mqar, seq_len: 16, num_kv_pairs: 2, vocab_size: 16, test_examples: 32, val_examples: 32}
  model: {mixer: attention, d_model: 16, n_layers: 1, n_heads: 1, positions: learned, channel_mixer: none}
  train: {steps: 100, batch_size: 8, lr: 3e-3, eval_every: 50, eval_batch_size: 32, early_stop: null}
grid:
  model.d_model: [16, 32]
tune:
  train.lr: [1.0e-3, 3.0e-3, 1.0e-2]
"""


def _study(tmp_path, text=LIMITED):
    from sandbox.sweep.spec import load_sweep
    from sandbox.sweep.study import enqueue_points, load_study, open_storage, prepare_study
    path = tmp_path / "s.yaml"
    path.write_text(text)
    spec = load_sweep(path)
    (tmp_path / "out").mkdir()
    storage = open_storage(tmp_path / "out", None)
    prepare_study(spec, storage)
    study = load_study(storage, spec.name)
    enqueue_points(study, spec)
    return study


def test_near_a_time_limit_a_worker_stacks_only_what_finishes(tmp_path):
    """A stack of n trials of 100 steps is taken when 40 s of start-up + 1.2 x 100 n steps at the measured pace
    fit in the time left: at 10 trial-steps/s (measured on one trial) and 70 s left two of a grid point's three
    learning rates do (64 s), three (76 s) do not; with 20 s left, less than a start-up, nothing does."""
    from sandbox.sweep import packing
    from sandbox.sweep.worker import _Worker
    assert (packing.STARTUP_S, packing.SAFETY) == (40.0, 1.2)      # the numbers the counts below assume
    study = _study(tmp_path)
    w = _Worker(tmp_path / "out", study, os.getpid(), None, stack=3, until=time.time() + 70)
    first = study.get_trials()[0]                                   # the queue's head: grid point d_model 16
    key, family, _ = w._kind(first)
    w.paces = {key: (family, 10.0, 300, 1)}
    group = w.claim()
    trials = [study.trial_by_number(n) for n in group]
    assert len(group) == 2 and trials[0].params["model.d_model"] == trials[1].params["model.d_model"]
    w.until = time.time() + 20
    assert w.claim() == [] and w.out_of_time
    # without a measured pace (a fresh worker, no other worker's record) it takes a whole stack
    fresh = _Worker(tmp_path / "out", study, os.getpid(), None, stack=3, until=time.time() + 70)
    assert len(fresh.claim()) == 3
    # a later worker starts from the paces its peers recorded: the d_model 32 point has none of its own
    # nor of its family, so it takes d_model 16's over the ratio of widths, 5 trial-steps/s
    packing.record_pace(tmp_path / "out", {key: (family, 10.0, 300, 1)})
    late = _Worker(tmp_path / "out", study, os.getpid(), None, stack=3, until=time.time() + 70)
    assert len(late.claim()) == 1            # 40 + 1.2 x 100 / 5 = 64 s fits in 70; the one trial left


def test_a_pace_measured_on_a_stack_does_not_make_a_lone_trial_look_faster(tmp_path):
    """A stack of 3 that trained 30 trial-steps/s stepped 10 times a second. A lone trial of its kind is sized
    at those 10 steps/s, not at 30: 40 + 1.2 x 100 / 10 = 52 s, so with 50 s left it is not started (at 30 it
    would have looked like 44 s). A group larger than the measured one takes its 30 trial-steps/s."""
    from sandbox.sweep import packing
    assert packing.fits(100, 1, (30.0, 3), 52.0) and not packing.fits(100, 1, (30.0, 3), 51.0)
    assert packing.fits(300, 3, (30.0, 3), 52.0) and not packing.fits(600, 6, (30.0, 3), 63.0)
    assert packing.fits(600, 6, (30.0, 3), 64.0)
    from sandbox.sweep.worker import _Worker
    study = _study(tmp_path)
    w = _Worker(tmp_path / "out", study, os.getpid(), None, stack=3, until=time.time() + 50)
    w.paces = {k: (f, 30.0, 300, 3) for k, f, _ in map(w._kind, study.get_trials())}   # both grid points
    assert w.claim() == [] and w.out_of_time


def test_a_fresh_worker_sizes_its_claims_from_the_groups_the_sweep_finished_before(tmp_path):
    """A new launch (a fresh machine) has no records of its own: the completed trials' groups give the pace.
    The d_model 16 point's three trials finished as a stack of 3 x 100 steps in 45 s, 15 of them its start-up
    (so 10 trial-steps/s of training, 3.3 steps/s). Its kind is then known; the d_model 32 point's is not, so
    it is sized at half of that (d_model 16's pace over the ratio of widths): a group of up to three steps at
    1.7 steps/s, 40 + 1.2 x 100 / (5 / 3) = 112 s. With 130 s left a worker takes the whole point; with 70 s,
    less than a start-up and as long again, nothing."""
    from sandbox.sweep.worker import _Worker
    study = _study(tmp_path)
    w = _Worker(tmp_path / "out", study, os.getpid(), None, stack=3)
    for n in w.claim():
        study.set_trial_attr(n, "result", {"steps": 100, "replicas": 3, "wall_time_s": 45.0, "setup_s": 15.0})
        study.tell(n, 0.5)
    tight = _Worker(tmp_path / "out", study, os.getpid(), None, stack=3, until=time.time() + 70)
    done = study.get_trials()[0]
    assert tight._paces() == {tight._kind(done)[0]: (tight._kind(done)[1], 10.0, 3)}
    assert tight.claim() == [] and tight.out_of_time
    roomier = _Worker(tmp_path / "out", study, os.getpid(), None, stack=3, until=time.time() + 130)
    assert len(roomier.claim()) == 3


def test_the_longest_group_of_a_kind_gives_its_pace_the_latest_among_equals(tmp_path):
    """Groups of one kind finished one after the other. Of two equally long ones, at 2 and then 10
    trial-steps/s, the pace is the second's (the code and the runner change between launches), whichever is
    slower; a later, shorter group at 2 (most of it start-up) does not replace it, in the study or in this
    launch's records."""
    from sandbox.sweep.worker import _Worker
    study = _study(tmp_path)
    w = _Worker(tmp_path / "out", study, os.getpid(), None, stack=1)
    key, family, _ = w._kind(study.get_trials()[0])
    for (steps, wall), pace in zip([(100, 50.0), (100, 10.0), (40, 20.0)], [2.0, 10.0, 10.0]):
        (n,) = w.claim()
        study.set_trial_attr(n, "result", {"steps": steps, "replicas": 1, "wall_time_s": wall})
        study.tell(n, 0.5)
        time.sleep(0.01)
        assert w._paces() == {key: (family, pace, 1)}
    # this launch's records weigh the same way: a shorter group measured now does not replace it, an equal one does
    w.paces = {key: (family, 1.0, 40, 1)}
    assert w._paces() == {key: (family, 10.0, 1)}
    w.paces = {key: (family, 1.0, 100, 1)}
    assert w._paces() == {key: (family, 1.0, 1)}


def test_a_group_of_a_kind_the_worker_trained_is_charged_a_short_start_up(tmp_path):
    """A worker measures its group's training without the start-up: 100 steps in 25 s of which 15 set up is
    10 trial-steps/s. Its next group of the same kind starts in 20 s (the kind is compiled in the process),
    not 40: with 50 s left two trials fit (20 + 1.2 x 200 / 10 = 44 s) where a worker that never trained the
    kind takes none (40 + 1.2 x 100 / 10 = 52 s)."""
    from sandbox.sweep.spec import build_config
    from sandbox.sweep.worker import _Worker, _values
    study = _study(tmp_path)
    w = _Worker(tmp_path / "out", study, os.getpid(), None, stack=3)
    first = study.get_trials()[0]                                       # d_model 16
    w._measure_pace([build_config(w.spec["base"], _values(first))], [100], [{"steps": 100, "setup_s": 15.0}], 25.0)
    key, family, _ = w._kind(first)
    assert w.paces == {key: (family, 10.0, 100, 1)}
    key32, family32, _ = w._kind(study.get_trials()[3])                # d_model 32, measured at the same pace
    w.paces[key32] = (family32, 10.0, 100, 1)
    other = _Worker(tmp_path / "out", study, os.getpid(), None, stack=3, until=time.time() + 50)
    other.paces = dict(w.paces)
    assert other.claim() == [] and other.out_of_time
    w.until = time.time() + 50
    group = w.claim()
    assert len(group) == 2 and all(w._kind(study.trial_by_number(n))[0] == key for n in group)


def test_a_stopped_stack_records_the_replicas_that_had_ended_and_requeues_the_rest(tmp_path):
    """A stack stopped (a time limit, Ctrl-C) while one of its trials had already ended (an early stop inside the
    stack) tells the study that trial's result, read from its run directory, and requeues only the others: the
    finished result must not wait for a launch on a machine that may be gone."""
    import json

    from optuna.trial import TrialState

    from sandbox.sweep.spec import build_config
    from sandbox.sweep.worker import _values, _Worker
    from sandbox.train import train
    study = _study(tmp_path)
    w = _Worker(tmp_path / "out", study, os.getpid(), None, stack=3)
    group = w.claim()
    assert len(group) == 3
    first = study.trial_by_number(group[0])
    run_dir = tmp_path / "out" / f"trials/{first.number}-{first.user_attrs['point_id'][:8]}"
    ended = train(build_config(w.spec["base"], _values(first)), run_dir, progress=False)   # the trial that ended
    w.stop = True                                                   # the stop arrives before the rest trained
    assert w.run_group(group) == 130
    states = {t.number: t for t in study.get_trials()}
    assert states[group[0]].state == TrialState.COMPLETE
    assert states[group[0]].user_attrs["result"]["steps"] == ended["steps"] == 100
    assert math.isclose(states[group[0]].value, max(h["val/accuracy"] for h in ended["history"]))   # the objective
    assert all(states[n].state == TrialState.FAIL for n in group[1:])          # requeued: a waiting copy each
    copies = [t for t in states.values() if t.user_attrs.get("retry_of") in group]
    assert sorted(t.user_attrs["retry_of"] for t in copies) == sorted(group[1:])
    assert json.loads((run_dir / "result.json").read_text())["status"] == "completed"


def test_once_nothing_fits_what_waits_trains_to_the_limit_and_the_next_launch_resumes_it(tmp_path):
    """With 85 s left neither d_model 16's trials (100 steps at 1 trial-step/s: 40 + 1.2 x 100 = 160 s) nor d_model
    32's (at 2.5: 88 s) finish, so rather than idle the worker trains them anyway, stacked, in queue order, for the
    limit to stop with checkpoints; its next claim takes the other kind. With less than two start-ups left (70 s)
    nothing is taken. An interrupted run's training rate (its result.json) paces its kind in the next launch, which
    takes the run in hand first."""
    import json

    from sandbox.sweep.study import requeue
    from sandbox.sweep.worker import _Worker
    study = _study(tmp_path)
    trials = study.get_trials()
    (key16, fam16, _), (key32, fam32, _) = (_Worker(tmp_path / "out", study, os.getpid(), None)._kind(trials[i])
                                            for i in (0, 3))
    paces = {key16: (fam16, 1.0, 100, 1), key32: (fam32, 2.5, 100, 1)}
    late = _Worker(tmp_path / "out", study, os.getpid(), None, stack=3, until=time.time() + 70)
    late.paces = dict(paces)
    assert late.claim() == [] and late.out_of_time
    w = _Worker(tmp_path / "out", study, os.getpid(), None, stack=3, until=time.time() + 85)
    w.paces = dict(paces)
    group = w.claim()
    assert [w._kind(study.trial_by_number(n))[0] for n in group] == [key16] * 3
    assert [w._kind(study.trial_by_number(n))[0] for n in w.claim()] == [key32] * 3
    # the limit stopped the first of them at step 40 with a checkpoint, training at 0.5 steps/s
    run = tmp_path / "out" / "trials" / "t0"
    run.mkdir(parents=True)
    (run / "checkpoint.pt").write_bytes(b"")
    (run / "result.json").write_text(json.dumps({"status": "interrupted", "steps": 40, "steps_per_sec": 0.5,
                                                 "replicas": 1}))
    study.set_trial_attr(group[0], "run_dir", "trials/t0")
    again = requeue(study, study.trial_by_number(group[0]), "time limit", count=False)
    study.set_trial_attr(again, "run_dir", "trials/t0")
    for n in group[1:]:
        requeue(study, study.trial_by_number(n), "time limit", count=False)
    nxt = _Worker(tmp_path / "out", study, os.getpid(), None, stack=3, until=time.time() + 85)
    nxt.paces = {key32: paces[key32]}
    assert nxt._paces()[key16] == (fam16, 0.5, 1)
    assert nxt.claim() == [again]        # 60 steps left at 0.5: 40 + 1.2 x 120 = 184 s; in hand, and alone at its step


def test_an_unmeasured_kind_of_stack_takes_its_familys_slowest_pace():
    """Own pace first; else the slowest of the same mixer, width and length (GSA's two settings); else that
    mixer's at another width, scaled down where wider; else half the slowest of all; else unknown."""
    paces = {"gla-a": ("gla|128|320", 150.0, 9), "gsa-a": ("gsa|128|320", 60.0, 3),
             "gsa-b": ("gsa|128|320", 80.0, 3)}
    assert packing.pace_for("gla-a", "gla|128|320", paces) == (150.0, 9)
    assert packing.pace_for("gsa-c", "gsa|128|320", paces) == (60.0, 3)
    assert packing.pace_for("metala-a", "metala|128|320", paces) == (60.0 / packing.UNKNOWN_SLOWER, 3)
    # another width of a measured mixer: its slowest pace, over the ratio of widths where this one is wider
    assert packing.pace_for("gsa-w", "gsa|256|320", paces) == (30.0, 3)
    assert packing.pace_for("gsa-n", "gsa|64|320", paces) == (60.0, 3)
    # another length: the longest shorter one measured for that mixer, over the ratio of lengths (and widths)
    assert packing.pace_for("gsa-l", "gsa|256|640", paces) == (60.0 / 2 / 2, 3)
    paces["gsa-s"] = ("gsa|128|64", 500.0, 3)                               # shorter still: not the nearest
    assert packing.pace_for("gsa-l", "gsa|128|640", paces) == (30.0, 3)
    assert packing.pace_for("gsa-t", "gsa|128|32", paces) == (60.0 / packing.UNKNOWN_SLOWER, 3)  # only longer
    assert packing.pace_for("metala-a", "metala|128|320", {}) is None


def test_a_sweep_with_no_time_for_a_trial_leaves_the_queue_untouched(tmp_path):
    """With a limit shorter than a start-up no worker takes a trial: the launcher says so, starts no other
    worker, and a rerun without the limit trains every point."""
    path = tmp_path / "s.yaml"
    path.write_text(LIMITED)
    out = tmp_path / "out"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "sandbox.cli", "sweep", str(path), "--out", str(out), "--no-live", "--workers", "1"]
    r = subprocess.run(cmd + ["--time-limit", "25"], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "would not finish before it" in r.stdout and "6 trial(s) left" in r.stdout
    log = (out / "logs" / "worker-0.log").read_text()
    assert log.count("no waiting trial finishes before the time limit") == 1     # one worker, not respawned
    from sandbox.sweep.study import load_study, open_storage
    states = [t.state.name for t in load_study(open_storage(out, None), "limited").get_trials()]
    assert states == ["WAITING"] * 6
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    states = [t.state.name for t in load_study(open_storage(out, None), "limited").get_trials()]
    assert states == ["COMPLETE"] * 6


def test_another_worker_starts_only_where_its_memory_is_free():
    """HEADROOM (1.5) times the workers' average memory must be free: 3 workers holding 129 of 141 GB (the
    Figure 8 sweep that ran out) leave no room; 3 holding 30 GB do."""
    assert packing.HEADROOM == 1.5
    assert not packing.room_for_one_more(129_000, 141_000, 3)
    assert packing.room_for_one_more(30_000, 141_000, 3)
    assert not packing.room_for_one_more(90_000, 141_000, 2)      # 51 GB free < 1.5 x 45
    assert packing.room_for_one_more(0, 141_000, 0)


def test_a_stack_out_of_memory_beside_other_workers_is_requeued_not_failed(tmp_path, monkeypatch):
    """The out-of-memory error of a group while other processes hold the GPU's memory says nothing about the
    trials: they go back to the queue (as retries of themselves) and the worker exits with EXIT_MEMORY."""
    import torch

    import sandbox.train
    from sandbox.sweep.worker import _Worker
    study = _study(tmp_path)
    w = _Worker(tmp_path / "out", study, os.getpid(), None, stack=3)
    group = w.claim()
    numbers = set(group)

    def out_of_memory(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB")
    monkeypatch.setattr(sandbox.train, "train_replicas", out_of_memory)
    monkeypatch.setattr(packing, "gpu_shared", lambda: True)
    assert w.run_group(group) == packing.EXIT_MEMORY
    trials = study.get_trials()
    retries = [t for t in trials if t.user_attrs.get("retry_of") in numbers]
    assert len(retries) == 3 and all(t.state.name == "WAITING" for t in retries)
    assert all("out of GPU memory" in t.user_attrs["retry_reason"] for t in retries)
    # alone on the GPU, the same error is the trials' own: a stack of 3 is retried as 1 + 2, then fails
    monkeypatch.setattr(packing, "gpu_shared", lambda: False)
    group = w.claim()
    assert len(group) == 3 and w.run_group(group) is None
    failed = [t for t in study.get_trials() if t.number in group]
    assert [t.state.name for t in failed] == ["FAIL"] * 3 and w.stack == 1

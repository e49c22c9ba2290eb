"""A sweep is an Optuna study that Optuna's own tools read: its grid and tuned values are trial params with their
distributions. Also: studies written before that still load, ``--set`` on a sweep, a corrupt journal line named
by its number, worker errors routed by their type, and Optuna reached through its public API outside storage.py.
Real sweeps on the CPU (tiny runs) and real journals."""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandbox.cli import main

BASE = """\
base:
  task: {name: mqar, seq_len: 16, num_kv_pairs: 2, vocab_size: 16, test_examples: 32}
  model: {mixer: attention, d_model: 16, n_layers: 1, n_heads: 1, positions: learned, channel_mixer: none}
  train: {steps: 20, batch_size: 8, lr: 3e-3, eval_every: 10, eval_batch_size: 32, log_every: 10,
          early_stop: null}
"""
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(BASE + textwrap.dedent(body))
    return path


def study_of(out: Path, name: str):
    from sandbox.sweep.study import load_study, open_storage
    return load_study(open_storage(out, None), name)


def test_a_finished_sweep_is_a_study_optuna_s_tools_read(tmp_path):
    """Every trial's params are its grid and tuned values (a zipped axis gives a column per key; a layer pattern,
    a list, is its JSON text and trains as the list), with a categorical distribution per grid key and a log
    float range for the learning rate; trials_dataframe, plot_slice and the importances see them."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution
    path = write(tmp_path, """\
        name: native
        grid:
          model.mixer: [attention, [attention]]
          seed, task.num_kv_pairs: [[0, 2], [1, 3]]
        tune:
          train.lr: [1.0e-3, 1.0e-2]
        """)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "sandbox.cli", "sweep", str(path), "--out", str(out), "--no-live"],
                       env=ENV, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "8 trials over 4 grid points" in r.stdout

    study = study_of(out, "native")
    trials = study.get_trials()
    expected = {(m, s, n, lr) for m in ("attention", '["attention"]') for s, n in ((0, 2), (1, 3))
                for lr in (1e-3, 1e-2)}
    assert {(t.params["model.mixer"], t.params["seed"], t.params["task.num_kv_pairs"], t.params["train.lr"])
            for t in trials} == expected and len(trials) == 8
    for t in trials:
        assert t.state.name == "COMPLETE"
        d = t.distributions
        assert d["model.mixer"] == CategoricalDistribution(["attention", '["attention"]'])
        assert d["seed"] == CategoricalDistribution([0, 1]) and d["task.num_kv_pairs"] == CategoricalDistribution([2, 3])
        assert d["train.lr"] == FloatDistribution(1e-3, 1e-2, log=True)
        config = json.loads((out / t.user_attrs["run_dir"] / "result.json").read_text())["config"]
        assert config["model"]["mixer"] == {"attention": "attention", '["attention"]': ["attention"]}[
            t.params["model.mixer"]]
        assert (config["seed"], config["task"]["num_kv_pairs"], config["train"]["lr"]) == \
            (t.params["seed"], t.params["task.num_kv_pairs"], t.params["train.lr"])

    pd = pytest.importorskip("pandas")      # Optuna's dataframe needs pandas (the test extra installs it)
    df = study.trials_dataframe()
    assert isinstance(df, pd.DataFrame) and len(df) == 8
    for key in ("model.mixer", "seed", "task.num_kv_pairs", "train.lr"):
        assert f"params_{key}" in df.columns
    # Optuna's own slice plot (the matplotlib one: plotly is not a dependency) and importances
    import matplotlib
    matplotlib.use("Agg")
    axes = optuna.visualization.matplotlib.plot_slice(study)
    assert {ax.get_xlabel() for ax in axes.ravel()} == {"model.mixer", "seed", "task.num_kv_pairs", "train.lr"}
    assert set(optuna.importance.get_param_importances(study)) == {"model.mixer", "seed", "task.num_kv_pairs",
                                                                  "train.lr"}
    # results.csv reads the params back as the sweep file wrote them
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [r["model.mixer"] for r in rows] == ["attention"] * 8       # a list reads "a,b,...", as before


def test_a_study_written_before_params_held_the_values_still_reports(tmp_path, capsys):
    """A journal of an earlier sweep (grid and tuned values in the trials' attributes, params empty) gives the
    same rows and summary: Figure 8's part 1 as committed at b9bd818."""
    import gzip
    import shutil

    from sandbox.sweep import report
    out = tmp_path / "old"
    out.mkdir()
    with gzip.open(Path(__file__).parent / "data" / "fig8_part1_two_workers.journal.gz") as src, \
            open(out / "study.journal", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (out / "sweep.json").write_text(json.dumps({"study": "sse_fig8_topk", "source": "x.yaml", "storage": None}))
    trials = study_of(out, "sse_fig8_topk").get_trials()
    assert all(t.params == {} for t in trials)
    rows = report.trial_rows(trials)
    assert len(rows) == 108 and {r["model.mixer"] for r in rows} == {"gla", "metala", "gsa"}
    assert {r["train.lr"] for r in rows} == {5e-4, 2e-3, 8e-3} and {r["seed"] for r in rows} == {0, 1, 2}
    summary, grid_keys, tune_keys = report.grid_summary(trials, "maximize")
    assert len(summary) == 36 and tune_keys == ["train.lr"] and grid_keys[0] == "seed"
    for s in summary:     # the best over its learning rates, against the rows themselves
        mine = [r["objective"] for r in rows if all(r[k] == s[k] for k in grid_keys)]
        assert len(mine) == 3 and s["best"] == max(mine)
    assert main(["sweep", "status", str(out)]) == 0
    assert "108/108 trials finished" in capsys.readouterr().out


def test_set_overrides_the_base_in_a_study_of_its_own(tmp_path, capsys):
    path = write(tmp_path, """\
        name: variant
        grid:
          seed: [0]
        """)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--set", "train.steps=10", "--out", str(out), "--no-live", "--workers", "1"]) == 0
    text = capsys.readouterr().out
    study = json.loads((out / "sweep.json").read_text())
    assert study["overrides"] == ["train.steps=10"] and re.fullmatch(r"variant-set-[0-9a-f]{6}", study["study"])
    assert "with --set train.steps=10: 1 trials over 1 grid points" in text
    (t,) = study_of(out, study["study"]).get_trials()
    assert json.loads((out / t.user_attrs["run_dir"] / "result.json").read_text())["steps"] == 10
    # bad overrides: one line naming --set
    for bad, says in ((["--set", "train.stepz=3"], "--set: train.stepz=3: unknown key"),
                      (["--set", "train.steps=abc"], "--set: train.steps=abc: expected an integer"),
                      (["--set", "seed=3"], "--set: seed=3: seed is a grid or tuned key of"),
                      (["--set", "nokey"], "--set: nokey: expected KEY=VALUE")):
        assert main(["sweep", str(path), *bad, "--dry-run"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith(f"sandbox: error: {says}"), err


def test_a_corrupt_journal_line_is_named_with_what_to_do(tmp_path, capsys):
    """A line spoilt in the middle of the journal (here the second: the study's attributes): the sweep and its status stop with one line
    naming the file and the line; once it is repaired, the sweep goes on with the lines after it."""
    from sandbox.sweep.spec import load_sweep
    from sandbox.sweep.study import enqueue_points, open_storage, prepare_study
    path = write(tmp_path, """\
        name: corrupt
        grid:
          seed: [0, 1]
        """)
    out = tmp_path / "out"
    out.mkdir()
    spec = load_sweep(path)
    enqueue_points(prepare_study(spec, open_storage(out, None)), spec)
    (out / "sweep.json").write_text(json.dumps({"study": "corrupt", "source": str(path), "storage": None}))
    journal = out / "study.journal"
    lines = journal.read_text().splitlines(keepends=True)
    assert len(lines) == 4            # the study, its attributes, two trials
    good = lines[1]
    lines[1] = '{"op_code": 4, bad}\n'
    journal.write_text("".join(lines))
    for argv in (["sweep", str(path), "--out", str(out), "--no-live"], ["sweep", "status", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0, err
        assert err.startswith(f"sandbox: error: {journal}: line 2 is not a whole JSON record (Expecting property "
                              f"name enclosed in double quotes"), err
        assert err.endswith(f"remove or repair line 2 of {journal}; the lines after it are kept"), err
    lines[1] = good                      # repaired: the sweep runs
    journal.write_text("".join(lines))
    assert main(["sweep", str(path), "--out", str(out), "--no-live", "--set", "train.steps=10"]) == 0


def test_a_cuda_error_fails_the_trials_and_restarts_the_worker(tmp_path, monkeypatch):
    """A CUDA error (torch.AcceleratorError, by its type) may leave the CUDA context broken: the trials fail with
    its message and the worker asks the launcher for a fresh process (exit 3); another error fails them only."""
    import torch

    import sandbox.train
    from sandbox.sweep.spec import load_sweep
    from sandbox.sweep.study import enqueue_points, open_storage, prepare_study
    from sandbox.sweep.worker import _Worker
    path = write(tmp_path, """\
        name: errors
        grid:
          seed: [0, 1]
        """)
    (tmp_path / "out").mkdir()
    spec = load_sweep(path)
    study = prepare_study(spec, open_storage(tmp_path / "out", None))
    enqueue_points(study, spec)
    w = _Worker(tmp_path / "out", study, os.getpid(), None, stack=1)
    for error, code in ((torch.AcceleratorError("CUDA error: an illegal memory access was encountered"), 3),
                        (RuntimeError("shape mismatch"), None)):
        def fail(*a, error=error, **k):
            raise error
        monkeypatch.setattr(sandbox.train, "train_replicas", fail)
        (n,) = w.claim()
        assert w.run_group([n]) == code
        t = study.trial_by_number(n)
        assert t.state.name == "FAIL" and t.user_attrs["failure"] == f"{type(error).__name__}: {error}"


def test_optuna_internals_are_reached_from_storage_py_only():
    """The sweep uses Optuna's public API (and the storage's public methods) everywhere but storage.py, the one
    module that says which internals it needs and why."""
    private = re.compile(r"\._storage\b|\._trial_id\b|\._study_id\b|_cached_frozen_trial|optuna(\.\w+)*\._\w+|"
                         r"from optuna[\w.]* import _")
    root = Path(__file__).parent.parent / "sandbox"
    offenders = [f"{p.relative_to(root)}:{i}" for p in sorted(root.rglob("*.py")) if p.name != "storage.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if private.search(line.split("#")[0])]          # code, not a comment about Optuna
    assert offenders == []
    assert private.search((root / "sweep" / "storage.py").read_text())      # the pattern finds what it is for

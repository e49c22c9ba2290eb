"""The training-step yardstick's harness on the CPU: one worker process per version, side by side."""
import pytest

from sandbox.bench.runs import ROOT, loss_gap, ref_code, run_one
from sandbox.bench.train import summarise, table

TINY = {"task": {"name": "mqar", "seq_len": 32, "num_kv_pairs": 4, "vocab_size": 64, "test_examples": 32},
        "model": {"mixer": "gla", "d_model": 32, "n_layers": 2, "n_heads": 2, "channel_mixer": "none"},
        "train": {"steps": 150, "batch_size": 8, "lr": 3e-3, "eval_every": 150, "log_every": 25,
                  "early_stop": None, "device": "cpu", "eval_batch_size": 32}}


@pytest.mark.slow
def test_the_same_code_side_by_side_gives_the_same_losses(tmp_path):
    assert ref_code(str(ROOT)) == ROOT
    new = run_one(ROOT, "tiny", TINY, tmp_path / "new")
    old = run_one(ref_code(str(ROOT)), "tiny", TINY, tmp_path / "ref")
    assert "error" not in new, new
    assert new["steps_per_sec"] > 0 and new["generator_ms"] > 0
    assert [s for s, _ in new["loss"]] == [25, 50, 75, 100, 125, 150]
    assert loss_gap(new["loss"], old["loss"]) == 0.0          # CPU, same code, same seed: same bits
    row = summarise("tiny", TINY, new, old, None)
    assert row["speedup"] == pytest.approx(old["steps_per_sec"] and (1e3 / old["steps_per_sec"]) / row["ms"])
    assert "| tiny |" in table([row])


def test_a_bad_configuration_is_one_line_naming_it(tmp_path):
    bad = {**TINY, "model": {**TINY["model"], "mixer": "no_such_mixer"}}
    res = run_one(ROOT, "bad", bad, tmp_path)
    assert res["error"].startswith("bad: exit")


def test_loss_gap_is_relative_and_only_over_common_steps():
    assert loss_gap([(25, 2.0), (50, 1.0), (300, 9.0)], [(25, 2.0), (50, 0.5)]) == 1.0
    assert loss_gap([(25, 2.0)], [(50, 2.0)]) is None


def test_the_reference_is_compiled_too_when_its_config_has_the_key(tmp_path):
    """A reference run that leaves `train.compile` at auto never compiles in a 300-step bench (it ran 4.9 ms
    uncompiled against 2.0 compiled on the H200); fb670ab's config has no such key and would reject it."""
    from pathlib import Path

    from sandbox.bench.runs import knows_compile
    assert knows_compile(Path(__file__).resolve().parents[1])
    old = tmp_path / "sandbox"
    old.mkdir()
    (old / "config.py").write_text("class TrainConfig:\n    steps: int = 1000\n    cuda_graph: bool = True\n"
                                   "    # compile: not here yet\n")
    assert not knows_compile(tmp_path)


def test_the_generators_gpu_share_is_its_profile_block_over_the_step():
    """With --profile the worker lists the step's kernels, then a GENERATOR marker and the generator's own
    TOTAL per step: its share is that total over the step's time (0.02 ms of a 0.4 ms step: 5%)."""
    new = {"steps_per_sec": 2500.0, "generator_ms": 0.04, "wall_s": 1.0, "peak_gib": None,
           "profile": [{"kernel": "TOTAL", "ms_per_step": 0.38, "calls": 100},
                       {"kernel": "_bwd_chunk", "ms_per_step": 0.1, "calls": 2},
                       {"kernel": "GENERATOR (per step, drawn 64 steps at a time)", "ms_per_step": 0, "calls": 0},
                       {"kernel": "TOTAL", "ms_per_step": 0.02, "calls": 3},
                       {"kernel": "_below", "ms_per_step": 0.01, "calls": 1}]}
    row = summarise("tiny", TINY, new, None, None)
    assert row["generator_pct"] == pytest.approx(10.0) and row["generator_gpu_pct"] == pytest.approx(5.0)
    assert "gen GPU %" in table([row])
    assert "generator_gpu_pct" not in summarise("tiny", TINY, {**new, "profile": []}, None, None)


def test_a_sweeps_kinds_of_stack_and_their_counts_match_its_grid(tmp_path):
    """Figure 8 claim A: 2 mixers x dense/top-k x (20 zero-token + 8 noise-token seeds) x 4 learning rates = 448
    trials; zero and noise tokens cost the same and seeds and rates stack, so 4 kinds of 112 trials, in stacks of
    at most the runner's 12: 10 each. A sweep whose two points differ in width has two kinds."""
    from sandbox.bench.estimate import sweep_kinds
    kinds = sweep_kinds(str(ROOT / "figures" / "sse_fig8_topk" / "sse_fig8_topk.yaml"))
    assert [(k["trials"], k["stacks"], k["replicas"]) for k in kinds] == [(112, 10, 12)] * 4
    assert sorted(k["name"] for k in kinds)[0] == "gla_d128_T320_conv_size4"
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nbase: {task: {name: mqar, seq_len: 32, num_kv_pairs: 4, vocab_size: 64}, "
                 "model: {mixer: gla, d_model: 32}, train: {steps: 10}}\n"
                 "grid: {model.d_model: [32, 64]}\ntune: {train.lr: [1.0e-3, 3.0e-3, 1.0e-2]}\n"
                 "objective: {metric: test/accuracy, mode: best}\n")
    assert [(k["name"], k["trials"], k["stacks"], k["replicas"]) for k in sweep_kinds(str(f))] == \
        [("gla_d32_T32", 3, 1, 3), ("gla_d64_T32", 3, 1, 3)]


def test_kinds_that_differ_only_in_settings_their_name_leaves_out_are_named_apart(tmp_path):
    """Two widths x two head counts: the short name tells the widths apart but not the heads, so the kinds of
    equal width get their head counts appended (``--kinds`` and ``--timed`` find kinds by name); the
    learning rate, seed and task content (here the gap) stay out of a name, as out of a kind."""
    from sandbox.bench.estimate import sweep_kinds
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nbase: {task: {name: mqar, seq_len: 32, num_kv_pairs: 4, vocab_size: 64}, "
                 "model: {mixer: gla, d_model: 32}, train: {steps: 10}}\n"
                 "grid: {model.d_model: [32, 64], model.n_heads: [1, 2], task.gap: [0, 8], seed: [0, 1]}\n"
                 "tune: {train.lr: [1.0e-3, 3.0e-3]}\nobjective: {metric: test/accuracy, mode: best}\n")
    kinds = sweep_kinds(str(f))
    assert sorted((k["name"], k["trials"]) for k in kinds) == [
        ("gla_d32_T32_n_heads1", 8), ("gla_d32_T32_n_heads2", 8), ("gla_d64_T32_n_heads1", 8),
        ("gla_d64_T32_n_heads2", 8)]
    # six SSE variants and the attention control
    assert len({k["name"] for k in sweep_kinds(str(ROOT / "figures" / "sse_ablations" / "sse_ablations.yaml"))}) == 7


def test_an_unknown_kind_is_refused_with_the_sweeps_kinds_before_any_gpu_work(capsys):
    """``--kinds`` names kinds as estimate.md does; a name the sweep lacks stops the command (exit 2) with
    the kinds it has, on any machine, before anything trains."""
    from sandbox.bench.train import main_train
    f = str(ROOT / "figures" / "sse_fig8_topk" / "sse_fig8_topk.yaml")
    assert main_train(["--sweep", f, "--kinds", "gla_d128_T320_conv_size4,gla_d999"]) == 2
    err = capsys.readouterr().err
    assert "no kind gla_d999" in err and "metala_d128_T320_topk8_conv_size4" in err
    assert main_train(["--kinds", "gla_d128_T320_conv_size4"]) == 2
    assert "--kinds needs --sweep" in capsys.readouterr().err
    assert main_train(["--time-limit", "500"]) == 2
    assert "--time-limit needs --sweep" in capsys.readouterr().err
    assert main_train(["--sweep", f, "--steps", "60", "--profile"]) == 2   # no steady steps to time
    assert "--steps 60" in capsys.readouterr().err


def test_a_kinds_later_stacks_are_charged_the_set_up_from_warm_caches():
    """Two kinds: one stack of the first (10 s of start-up, 30 s of training), three of the second (12 s of start-up,
    9 of it set-up from cold caches, 2 from warm ones, 20 s of training). Only the second kind's later two stacks
    start warm: 40 + 3 x 32 - 2 x (9 - 2) seconds."""
    from sandbox.bench.estimate import minutes_with_warm_caches

    first = {"stacks": 1, "start_s": 10.0, "setup_s": 8.0, "warm_setup_s": 1.0, "train_s": 30.0, "evals_s": 0.0}
    second = {"stacks": 3, "start_s": 12.0, "setup_s": 9.0, "warm_setup_s": 2.0, "train_s": 20.0, "evals_s": 0.0}
    assert minutes_with_warm_caches([first, second]) * 60 == pytest.approx(40 + 3 * 32 - 2 * 7)


def test_an_estimate_from_earlier_calls_joins_their_rows_in_the_sweeps_order(tmp_path):
    """``--timed``: the kinds timed in separate calls (``--kinds`` parts) give one estimate, in the sweep's order
    of kinds, summing their GPU-minutes; a kind no file timed is named and the exit status says so; a kind in
    several files takes its row from the last."""
    import json

    from sandbox.bench.train import main_train
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nbase: {task: {name: mqar, seq_len: 32, num_kv_pairs: 4, vocab_size: 64}, "
                 "model: {mixer: gla, d_model: 32}, train: {steps: 10}}\n"
                 "grid: {model.d_model: [32, 64, 16]}\ntune: {train.lr: [1.0e-3, 3.0e-3]}\n")
    row = {"trials": 2, "stacks": 1, "replicas": 2, "ms_per_stack_step": 5.0, "trial_steps_per_s": 400.0,
           "start_s": 10.0, "setup_s": 9.0, "eval_s": 1.0, "warm_setup_s": 2.0, "import_s": 3.0, "train_s": 30.0,
           "evals_s": 0.0, "eval_rounds": 1}
    for name, kinds in (("a", ["gla_d64_T32"]), ("b", ["gla_d32_T32", "gla_d999_T32"])):
        rows = [{**row, "kind": k, "gpu_minutes": 1.0 + i} for i, k in enumerate(kinds)]
        (tmp_path / f"{name}.json").write_text(json.dumps({"gpu": "G", "torch": "t", "steps": 150, "rows": rows}))
    files = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    assert main_train(["--sweep", str(f), "--timed", *files, "--out", str(tmp_path / "out")]) == 1
    est = json.loads((tmp_path / "out" / "estimate.json").read_text())
    assert [r["kind"] for r in est["rows"]] == ["gla_d32_T32", "gla_d64_T32"] and est["gpu_minutes"] == 2.0
    assert est["kinds"] == "2 of 3" and est["torch"] == "t"
    # each kind one stack, none starting warm: start-up, training and evaluations, 10 + 30 + 0 s each
    assert est["gpu_minutes_warm_caches"] * 60 == pytest.approx(2 * 40)
    assert "Not timed: gla_d16_T32" in (tmp_path / "out" / "estimate.md").read_text()
    # a kind timed again in a later file: the later row counts (the kinds a change reaches, timed anew)
    again = [{**row, "kind": "gla_d64_T32", "gpu_minutes": 0.5}]
    (tmp_path / "c.json").write_text(json.dumps({"gpu": "G", "torch": "t", "steps": 150, "rows": again}))
    assert main_train(["--sweep", str(f), "--timed", *files, str(tmp_path / "c.json"), "--out", str(tmp_path / "o2")]) == 1
    assert json.loads((tmp_path / "o2" / "estimate.json").read_text())["gpu_minutes"] == 1.5


def test_an_estimate_counts_every_evaluation_of_the_run_also_from_rows_that_timed_one(tmp_path):
    """A stack is charged its run's evaluations: 3000 steps evaluated every 250 make 12 rounds. A row of this code
    timed three (the first 0.5 s, the other two 0.2 s each): 0.5 + 11 x 0.2 s. A row of the code before timed one
    within its start-up and counted no other: its start-up loses that second and the run's 12 are charged."""
    import json

    from sandbox.bench.estimate import every_evaluation, minutes_with_warm_caches
    from sandbox.bench.train import main_train
    f = tmp_path / "s.yaml"
    f.write_text("name: s\nbase: {task: {name: mqar, seq_len: 32, num_kv_pairs: 4, vocab_size: 64}, "
                 "model: {mixer: gla, d_model: 32}, train: {steps: 3000, eval_every: 250}}\n"
                 "grid: {model.d_model: [32, 64]}\ntune: {train.lr: [1.0e-3, 3.0e-3]}\n")
    old = {"kind": "gla_d32_T32", "trials": 2, "stacks": 1, "replicas": 2, "ms_per_stack_step": 5.0,
           "trial_steps_per_s": 400.0, "start_s": 10.0, "setup_s": 9.0, "eval_s": 1.0, "warm_setup_s": 2.0,
           "import_s": 3.0, "train_s": 15.0, "gpu_minutes": 25.0 / 60}
    new = {**old, "kind": "gla_d64_T32", "start_s": 9.0, "eval_s": 0.9, "first_eval_s": 0.5, "eval_rounds": 12,
           "evals_s": 0.5 + 11 * 0.2, "gpu_minutes": (9.0 + 15.0 + 2.7) / 60}
    (tmp_path / "t.json").write_text(json.dumps({"gpu": "G", "torch": "t", "steps": 150, "rows": [old, new]}))
    assert main_train(["--sweep", str(f), "--timed", str(tmp_path / "t.json"), "--out", str(tmp_path / "out")]) == 0
    est = json.loads((tmp_path / "out" / "estimate.json").read_text())
    a, b = est["rows"]
    assert (a["start_s"], a["evals_s"], a["eval_rounds"]) == (9.0, 12.0, 12)
    assert a == {**every_evaluation(old, {"steps": 3000, "eval_every": 250}), "gpu": "G", "steps": 150, "torch": "t"}
    assert b == {**new, "gpu": "G", "steps": 150, "torch": "t"}
    assert est["gpu_minutes"] == pytest.approx((9 + 15 + 12) / 60 + (9 + 15 + 2.7) / 60)
    assert est["gpu_minutes_warm_caches"] == pytest.approx(minutes_with_warm_caches(est["rows"]))
    assert "| 12.0 (12) |" in (tmp_path / "out" / "estimate.md").read_text()


def test_a_sweep_timed_against_other_code_lists_each_stacks_ratio(tmp_path):
    """``--sweep --ref``: each kind's row carries the other code's ms per stacked step; the estimate lists the
    ratio and loss gap per kind (or the other code's error), and stays this code's."""
    import json

    from sandbox.bench.estimate import _write_estimate
    base = {"trials": 9, "stacks": 1, "replicas": 9, "ms_per_stack_step": 24.0, "trial_steps_per_s": 375.0,
            "start_s": 30.0, "setup_s": 29.0, "eval_s": 1.0, "warm_setup_s": 3.0, "import_s": 3.0, "train_s": 72.0,
            "evals_s": 4.0, "eval_rounds": 12, "gpu_minutes": 1.7}
    rows = [{**base, "kind": "a", "ref_ms_per_stack_step": 26.4, "speedup": 26.4 / 24.0, "loss_gap": 2.5e-3},
            {**base, "kind": "b", "ref_error": "b: exit 1: ValueError: no"}]
    assert _write_estimate("s.yaml", rows, "G", "t", 150, 2, tmp_path) == 0
    md = (tmp_path / "estimate.md").read_text()
    assert "| a | 24.00 | 26.40 | 1.100 | 2.5e-03 | 1.00 | - |" in md
    assert "| b | 24.00 | b: exit 1: ValueError: no | - | - | - | - |" in md
    assert json.loads((tmp_path / "estimate.json").read_text())["gpu_minutes"] == 3.4


def test_the_time_to_result_benchmark_writes_constants_the_compile_rule_reads(tmp_path):
    """benchmarks/time_to_result.py turns its 2000-step runs into the rule's constants: per configuration the mean
    steps/s of the cold and warm runs, and compile_s, the set-up compiled less uncompiled from empty caches (warm kept
    beside it); the file it writes is what ``train.compile: auto`` reads, and the report lists the walls' ratios."""
    import importlib.util
    import json

    from sandbox.train import compile as compiling
    spec = importlib.util.spec_from_file_location("time_to_result", ROOT / "benchmarks" / "time_to_result.py")
    ttr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ttr)
    run = {"status": "completed", "phases": {"startup": 1.0, "compile": 2.0, "capture": 0.1, "train": 5.0, "eval": 1.0}}
    done = {}
    for name in ("zoology_attention_d64_t64", "gated_deltanet_d128_t256"):
        key = f"train/{name}/2000"
        done.update({f"{key}/eager/cold": {**run, "wall_s": 20.0, "setup_s": 9.0, "steps_per_sec": 100.0},
                     f"{key}/eager/warm": {**run, "wall_s": 12.0, "setup_s": 3.0, "steps_per_sec": 110.0},
                     f"{key}/compiled/cold": {**run, "wall_s": 40.0, "setup_s": 30.0, "steps_per_sec": 400.0},
                     f"{key}/compiled/warm": {**run, "wall_s": 10.0, "setup_s": 7.0, "steps_per_sec": 420.0},
                     f"{key}/ref/cold": {"wall_s": 25.0}, f"{key}/ref/warm": {"wall_s": 20.0}})
    meta = {"gpu": "G", "torch": "t", "commit": "abc1234", "ref": "fb670ab", "date": "2026-11-27"}
    ttr.write_rule(tmp_path, done, meta, current=tmp_path / "none.json")
    rows = json.loads((tmp_path / "compile_rule.json").read_text())["references"]
    assert [(r["compile_cold_s"], r["compile_warm_s"], r["compile_s"]) for r in rows] == [(21.0, 4.0, 21.0)] * 2
    assert rows[0]["measured"] == {"commit": "abc1234", "date": "2026-11-27", "gpu": "G", "torch": "t"}
    refs = compiling.references(tmp_path / "compile_rule.json")
    assert [r.name for r in refs] == ["zoology_attention_d64_t64", "gated_deltanet_d128_t256"]
    assert refs[0].eager_ms == pytest.approx(1e3 / 105) and refs[0].compiled_ms == pytest.approx(1e3 / 410)
    # timing one configuration against the committed file replaces its row and keeps the others, in their order
    committed = json.loads(compiling.RULE_FILE.read_text())["references"]
    one = {k: v for k, v in done.items() if "gated_deltanet" in k}
    (tmp_path / "one").mkdir()
    ttr.write_rule(tmp_path / "one", one, meta)
    merged = json.loads((tmp_path / "one" / "compile_rule.json").read_text())["references"]
    assert [r["name"] for r in merged] == [r["name"] for r in committed]
    for old, got in zip(committed, merged):
        assert got == (rows[1] if old["name"] == "gated_deltanet_d128_t256" else old)
    text = ttr.report(done, meta)
    assert "| gated_deltanet_d128_t256 | 2000 |" in text and "| 25.0 |" in text

"""The training-step yardstick's harness on the CPU: one worker process per version, side by side."""
import pytest

from sandbox.bench.train import ROOT, loss_gap, ref_code, run_one, summarise, table

TINY = {"task": {"name": "mqar", "seq_len": 32, "num_kv_pairs": 4, "vocab_size": 64, "test_examples": 32},
        "model": {"mixer": "gla", "d_model": 32, "n_layers": 2, "n_heads": 2, "channel_mixer": "none"},
        "train": {"steps": 150, "batch_size": 8, "lr": 3e-3, "eval_every": 150, "log_every": 25,
                  "early_stop": None, "device": "cpu", "eval_batch_size": 32}}


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

    from sandbox.bench.train import knows_compile
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

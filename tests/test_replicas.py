"""Stacked replicas: R runs trained as one vmapped model equal R runs trained alone (float64, CPU)."""
import copy
import json

import pytest
import torch

from sandbox.config import load_config
from sandbox.train import StopTraining, train, train_replicas

BASE = {"task": {"name": "mqar", "seq_len": 24, "num_kv_pairs": 3, "vocab_size": 32, "test_examples": 32,
                  "val_examples": 32},
        "model": {"mixer": "gla", "d_model": 32, "n_layers": 2, "n_heads": 2},
        "train": {"steps": 12, "batch_size": 8, "lr": 3e-3, "eval_every": 6, "log_every": 3,
                  "eval_batch_size": 32, "early_stop": None, "precision": "fp64", "device": "cpu"}}


def configs(model=None, lrs=(1e-3, 3e-3, 1e-2), seeds=(0, 0, 1), **train_kw):
    out = []
    for lr, seed in zip(lrs, seeds):
        data = copy.deepcopy(BASE)
        data["model"].update(model or {})
        data["train"].update(lr=lr, **train_kw)
        data["seed"] = seed
        out.append(load_config(data=data))
    return out


def weights(run_dir):
    return torch.load(run_dir / "checkpoint.pt", weights_only=False)["model"]


def assert_same_runs(stacked_dir, solo_dir, n, rtol=1e-9, atol=1e-11):
    for i in range(n):
        a, b = weights(stacked_dir / str(i)), weights(solo_dir / str(i))
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=f"replica {i}: {k}")
        ra = json.loads((stacked_dir / str(i) / "result.json").read_text())
        rb = json.loads((solo_dir / str(i) / "result.json").read_text())
        assert ra["status"] == rb["status"] and ra["steps"] == rb["steps"]
        assert [h["test/loss"] for h in ra["history"]] == pytest.approx([h["test/loss"] for h in rb["history"]],
                                                                         rel=1e-9)
        assert [h["test/accuracy"] for h in ra["history"]] == [h["test/accuracy"] for h in rb["history"]]


@pytest.mark.parametrize("model", [None, pytest.param({"gla": {"topk": 4, "conv_size": 4}}, marks=pytest.mark.slow),
                                   {"mixer": "attention", "positions": "learned"},
                                   pytest.param({"mixer": "gated_deltanet", "channel_mixer": "none"},
                                                marks=pytest.mark.slow),
                                   pytest.param({"mixer": "sse", "sse": {"n": 4, "k": 1, "conv_size": 4}},
                                                marks=pytest.mark.slow)],
                         ids=["gla", "gla_topk_conv", "attention", "gated_deltanet", "sse_n4k1_conv"])
def test_stacked_replicas_equal_solo_runs(tmp_path, model):
    """Learning rates 1e-3, 3e-3, 1e-2 and seeds 0, 0, 1 (so one replica has data of its own)."""
    cfgs = configs(model)
    res = train_replicas(cfgs, [tmp_path / "stacked" / str(i) for i in range(3)], progress=False)
    assert [r["replicas"] for r in res] == [3, 3, 3]
    for i, c in enumerate(cfgs):
        train(c, tmp_path / "solo" / str(i), progress=False)
    assert_same_runs(tmp_path / "stacked", tmp_path / "solo", 3)
    # a replica's checkpoint holds its own weights, not the stack's (its parameters are views of the stack's)
    size = [(tmp_path / d / "0" / "checkpoint.pt").stat().st_size for d in ("stacked", "solo")]
    assert size[0] < 1.1 * size[1], size
    # different learning rates really trained differently
    a, b = weights(tmp_path / "stacked" / "0"), weights(tmp_path / "stacked" / "1")
    assert not torch.equal(a["embed.weight"], b["embed.weight"])


def prune_at_6(step, metrics):
    if step == 6:
        raise StopTraining("pruned")


def test_a_replica_that_stops_or_diverges_leaves_the_others_alone(tmp_path):
    cfgs = configs(lrs=(1e-3, 3e-3, 1e30), seeds=(0, 0, 0), grad_clip=0.0, warmup_frac=0.0)
    res = train_replicas(cfgs, [tmp_path / "stacked" / str(i) for i in range(3)], progress=False,
                         on_eval=[None, prune_at_6, None])
    assert [r["status"] for r in res] == ["completed", "stopped", "diverged"]
    assert res[1]["steps"] == 6 and res[0]["steps"] == 12
    train(cfgs[0], tmp_path / "solo" / "0", progress=False)
    train(cfgs[1], tmp_path / "solo" / "1", progress=False, on_eval=prune_at_6)
    assert_same_runs(tmp_path / "stacked", tmp_path / "solo", 2)


@pytest.mark.slow
def test_interrupted_stack_resumes_to_the_weights_of_a_straight_one(tmp_path):
    cfgs = configs()
    straight = [tmp_path / "a" / str(i) for i in range(3)]
    train_replicas(cfgs, straight, progress=False)

    def stop_all_at_6(step, metrics):
        if step == 6:
            raise KeyboardInterrupt

    resumed = [tmp_path / "b" / str(i) for i in range(3)]
    with pytest.raises(KeyboardInterrupt):
        train_replicas(cfgs, resumed, progress=False, on_eval=[stop_all_at_6, None, None])
    assert all(json.loads((d / "result.json").read_text())["status"] == "interrupted" for d in resumed)
    res = train_replicas(cfgs, resumed, progress=False)
    assert [r["status"] for r in res] == ["completed"] * 3
    assert_same_runs(tmp_path / "b", tmp_path / "a", 3)
    again = train_replicas(cfgs, resumed, progress=False)         # finished directories: stored results
    assert [r["steps"] for r in again] == [12, 12, 12]


@pytest.mark.slow
def test_ctrl_c_inside_a_stacked_step_acts_after_the_step(tmp_path, monkeypatch):
    """SIGINT arriving while the stack's vmapped forward runs (step 5 here) is held until that step ends:
    raised inside it, it could leave functorch's layers broken and the replicas unsaved (seen with
    2 in 40 random interrupts on the CPU). All three replicas record step 5 and resume to the straight run."""
    import os
    import signal

    from sandbox.mixers.linear import LinearMixer
    cfgs = configs()
    straight = [tmp_path / "a" / str(i) for i in range(3)]
    train_replicas(cfgs, straight, progress=False)
    forward, calls = LinearMixer.forward_at, []

    def forward_sending_sigint(self, x, positions):     # 2 layers: call 9 is the first layer of step 5
        if torch.is_grad_enabled():
            calls.append(None)
            if len(calls) == 9:
                os.kill(os.getpid(), signal.SIGINT)
        return forward(self, x, positions)
    monkeypatch.setattr(LinearMixer, "forward_at", forward_sending_sigint)
    resumed = [tmp_path / "b" / str(i) for i in range(3)]
    with pytest.raises(KeyboardInterrupt):
        train_replicas(cfgs, resumed, progress=False)
    monkeypatch.undo()
    results = [json.loads((d / "result.json").read_text()) for d in resumed]
    assert [(r["status"], r["steps"]) for r in results] == [("interrupted", 5)] * 3
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler        # the handler is back
    res = train_replicas(cfgs, resumed, progress=False)
    assert [r["status"] for r in res] == ["completed"] * 3
    assert_same_runs(tmp_path / "b", tmp_path / "a", 3)


def test_runs_that_differ_in_more_than_lr_and_seed_are_refused(tmp_path):
    cfgs = configs()
    cfgs[1].train.batch_size = 4
    with pytest.raises(ValueError, match="differ only in"):
        train_replicas(cfgs, [tmp_path / str(i) for i in range(3)], progress=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16, CUDA graph and Triton kernels need a GPU")
@pytest.mark.parametrize("model", [{"mixer": "gla", "gla": {"topk": 8}},
                                   {"mixer": "sse", "sse": {"n": 4, "k": 1, "conv_size": 4}}],
                         ids=["gla_topk", "sse_n4k1_conv"])
def test_stacked_replicas_follow_solo_runs_on_the_gpu(tmp_path, model):
    """200 steps of the SSE Figure 8 shape (d_model 128, T 192) in bf16 with the CUDA graph: the logged
    training losses of stacked and solo runs agree within bf16 rounding (they use other matrix shapes)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = {"task": {"name": "mqar", "seq_len": 192, "num_kv_pairs": 16, "gap": 64, "vocab_size": 8192},
            "model": {"d_model": 128, "n_layers": 2, "n_heads": 2, **model},
            "train": {"steps": 200, "batch_size": 64, "eval_every": 100, "log_every": 25, "early_stop": None}}
    cfgs = []
    for lr in (5e-4, 1e-3, 2e-3):
        d = copy.deepcopy(data)
        d["train"]["lr"] = lr
        cfgs.append(load_config(data=d))
    train_replicas(cfgs, [tmp_path / "stacked" / str(i) for i in range(3)], progress=False)
    for i, c in enumerate(cfgs):
        train(c, tmp_path / "solo" / str(i), progress=False)

    def losses(d):
        acc = EventAccumulator(str(d))
        acc.Reload()
        return [e.value for e in acc.Scalars("train/loss")]

    for i in range(3):
        a, b = losses(tmp_path / "stacked" / str(i)), losses(tmp_path / "solo" / str(i))
        assert len(a) == len(b) == 8
        assert a == pytest.approx(b, rel=2e-2), (i, a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16, CUDA graph and Triton kernels need a GPU")
def test_a_stack_trains_the_same_bits_from_cold_or_warm_compile_caches_on_the_gpu(tmp_path, monkeypatch):
    """A compiled stack trains the same bits whatever the caches hold: from empty caches, again from torch's on-disk
    caches in a process that dropped its compilations, and again reusing this process's compilation."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = {"task": {"name": "mqar", "seq_len": 128, "num_kv_pairs": 8, "vocab_size": 8192},
            "model": {"mixer": "gla", "d_model": 64, "n_layers": 2, "n_heads": 2, "gla": {"conv_size": 4}},
            "train": {"steps": 100, "batch_size": 64, "eval_every": 50, "log_every": 25, "early_stop": None,
                      "compile": True}}

    def stack(out):
        cfgs = [load_config(data=copy.deepcopy(data), overrides=[f"train.lr={lr}"]) for lr in (1e-3, 3e-3)]
        res = train_replicas(cfgs, [tmp_path / out / str(i) for i in range(2)], progress=False)
        losses = []
        for i in range(2):
            acc = EventAccumulator(str(tmp_path / out / str(i)))
            acc.Reload()
            losses.append([e.value for e in acc.Scalars("train/loss")])
        return res, losses

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.compiler.reset()
    cold, a = stack("cold")
    torch.compiler.reset()
    warm, b = stack("warm")
    reused, c = stack("reused")
    assert [r["compiled_at"] for r in cold + warm + reused] == [0] * 6
    assert [r["compile_cache"] for r in cold + warm + reused] == ["cold"] * 2 + ["cached"] * 2 + ["reused"] * 2
    assert a == b == c and len(a[0]) == 4
    print("compile phase: " + ", ".join(f"{r['compile_cache']} {r['phases']['compile']:.1f} s"
                                        for r in (cold[0], warm[0], reused[0])))


def test_the_device_schedule_is_the_python_one():
    from sandbox.train.step import lr_factor, lr_lambda

    for steps, warm in ((100, 0.05), (37, 0.0), (10, 0.5)):
        f = lr_lambda(steps, warm)
        got = lr_factor(torch.arange(steps + 1, dtype=torch.float64), steps, warm)
        assert got.tolist() == pytest.approx([f(s) for s in range(steps + 1)], abs=1e-15)


def test_a_shrunken_group_regroups_and_trains_on_as_before(tmp_path, monkeypatch):
    """With regrouping forced at every chance, a group whose replicas stop or diverge is rebuilt with the
    running ones (from their checkpoints), and every run still ends with the weights of a solo run."""
    import sandbox.train.group as group

    monkeypatch.setattr(group, "REGROUP_FACTOR", 0.0)
    groups = []
    real = group.Group.__init__

    def counting(self, cfgs, *args):
        groups.append(len(cfgs))
        real(self, cfgs, *args)

    monkeypatch.setattr(group.Group, "__init__", counting)
    cfgs = configs(lrs=(1e-3, 3e-3, 1e30), seeds=(0, 1, 0), grad_clip=0.0, warmup_frac=0.0)
    res = train_replicas(cfgs, [tmp_path / "stacked" / str(i) for i in range(3)], progress=False,
                         on_eval=[None, prune_at_6, None])
    assert [r["status"] for r in res] == ["completed", "stopped", "diverged"]
    assert groups == [3, 1]      # diverged at step 3 (before a steady interval was measured), pruned at 6
    train(cfgs[0], tmp_path / "solo" / "0", progress=False)
    train(cfgs[1], tmp_path / "solo" / "1", progress=False, on_eval=prune_at_6)
    assert_same_runs(tmp_path / "stacked", tmp_path / "solo", 2)


def test_regrouping_pays_only_when_it_saves_more_than_a_start():
    from sandbox.train.group import worth_regrouping

    # 1 of 3 running, 2000 steps left at 15 ms: 20 s saved against a 10 s start -> yes; at 500 steps -> no
    assert worth_regrouping(1, 3, 2000, 0.015, 10.0) and not worth_regrouping(1, 3, 500, 0.015, 10.0)
    assert not worth_regrouping(3, 3, 10**6, 1.0, 0.0) and not worth_regrouping(0, 3, 10**6, 1.0, 0.0)


@pytest.mark.slow
def test_runs_resumed_at_different_steps_train_as_separate_stacks(tmp_path):
    """One run interrupted at step 6, one never started: train_replicas trains each from where it is (the
    earlier first) and both end with the weights of a straight run."""
    cfgs = configs(lrs=(1e-3, 3e-3), seeds=(0, 1))

    def stop_at_6(step, metrics):
        if step == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfgs[0], tmp_path / "b" / "0", progress=False, on_eval=stop_at_6)
    res = train_replicas(cfgs, [tmp_path / "b" / str(i) for i in range(2)], progress=False)
    assert [r["status"] for r in res] == ["completed"] * 2 and [r["replicas"] for r in res] == [1, 1]
    for i, c in enumerate(cfgs):
        train(c, tmp_path / "a" / str(i), progress=False)
    assert_same_runs(tmp_path / "b", tmp_path / "a", 2)


@pytest.mark.slow
def test_an_evaluation_in_slices_of_rows_equals_one_in_whole_batches(tmp_path, monkeypatch):
    """A stack's evaluation holds at most ``EVAL_LOGITS`` logits at once; at one row per slice it scores what the
    whole test batches score (seeds 0, 0, 1: shared and own test batches)."""
    import sandbox.train.evaluation as evaluation_mod
    cfgs = configs()
    whole = train_replicas(cfgs, [tmp_path / "whole" / str(i) for i in range(3)], progress=False)
    monkeypatch.setattr(evaluation_mod, "EVAL_LOGITS", 1)
    sliced = train_replicas(cfgs, [tmp_path / "sliced" / str(i) for i in range(3)], progress=False)
    for a, b in zip(whole, sliced):
        assert [h["test/accuracy"] for h in a["history"]] == [h["test/accuracy"] for h in b["history"]]
        assert [h["test/loss"] for h in a["history"]] == pytest.approx([h["test/loss"] for h in b["history"]],
                                                                       rel=1e-12)
    assert len({h["test/accuracy"] for r in whole for h in r["history"]}) > 1      # the scores differ somewhere


def test_compare_trains_each_variants_seeds_as_one_stack(tmp_path):
    """``sandbox compare``: a variant's seeds differ only in seed, so they train as one stack (each seed's result
    says how many replicas it had); a mixer that cannot stack (SSE's varlen partitions: data-dependent segment sizes)
    trains its seeds one after another. Each variant's line says where its time went. (Two seeds show both.)"""
    import yaml

    from sandbox.analysis.compare import compare
    (tmp_path / "task.yaml").write_text(yaml.safe_dump({**BASE, "train": {**BASE["train"], "steps": 6}}))
    lines = []
    res = compare("gla", "sse+impl=varlen", seeds=2, task=str(tmp_path / "task.yaml"), out=tmp_path / "cmp",
                  log=lines.append)
    stacked = [json.loads(p.read_text())["replicas"] for p in sorted((tmp_path / "cmp").glob("A-*/seed*/result.json"))]
    alone = [json.loads(p.read_text())["replicas"] for p in sorted((tmp_path / "cmp").glob("B-*/seed*/result.json"))]
    assert stacked == [2, 2] and alone == [1, 1]
    assert sum("start-up" in line and "training" in line and "evaluation" in line for line in lines) == 2
    a, b = res["variants"]
    assert set(a["phases"]) == {"startup", "compile", "capture", "train", "eval"} and len(b["values"]) == 2

"""Compiling the training step in the middle of a run (``train.compile: auto`` does it once a run is long
enough): the weights afterwards equal those of a run that stayed eager (float64, CPU)."""
import copy

import torch

from sandbox.config import load_config
from sandbox.train import Group

BASE = {"task": {"name": "mqar", "seq_len": 24, "num_kv_pairs": 3, "vocab_size": 32, "test_examples": 32},
        "model": {"mixer": "gla", "d_model": 16, "n_layers": 1, "n_heads": 1, "channel_mixer": "none"},
        "train": {"steps": 10, "batch_size": 8, "lr": 3e-3, "precision": "fp64", "device": "cpu"}}


def test_a_step_compiled_mid_run_trains_as_the_eager_one():
    groups = []
    for compile_at in (None, 4):
        data = copy.deepcopy(BASE)
        cfgs = [load_config(data=data)]
        g = Group(cfgs)
        for s in range(10):
            if s == compile_at:
                g.step.compile_now()
            g.step(*g.batch(s))
        groups.append(g)
    assert groups[1].step.compiled and not groups[0].step.compiled
    for a, b in zip(groups[0].models, groups[1].models):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            # fused float64 arithmetic rounds differently; Adam's normalisation lifts that to ~1e-8
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=name)


def test_compiling_pays_only_for_a_long_enough_rest_of_the_run():
    from sandbox.train.group import COMPILE_COST_S, COMPILE_SPEEDUP, worth_compiling

    # the Figure 8 GLA stacked 3 times, 17.6 ms uncompiled: 3000 steps left pay for it, alone (5.9 ms) not
    assert worth_compiling(3000, 17.6e-3) and not worth_compiling(3000, 5.9e-3)
    edge = COMPILE_COST_S / (1 - 1 / COMPILE_SPEEDUP)
    assert not worth_compiling(1000, edge / 1000 * 0.99) and worth_compiling(1000, edge / 1000 * 1.01)


def test_a_second_stack_of_the_same_shapes_reuses_the_compilation_from_the_cache():
    """A sweep worker compiles one stack after another (``compile_now`` drops Dynamo's own cache each time): a
    stack with the shapes of an earlier one must find its forward and backward in AOTAutograd's cache, not
    compile them again. Mixed precision and the attention-kernel choice traced inside the compiled function
    used to make AOTAutograd bypass its cache."""
    from torch._dynamo.utils import counters

    data = copy.deepcopy(BASE)
    data["train"].update(precision="bf16")
    for _ in range(2):
        counters.clear()
        g = Group([load_config(data=data, overrides=[f"train.lr={lr}"]) for lr in (1e-3, 3e-3)])
        g.step.compile_now()
        g.step(*g.batch(0))
    assert counters["aot_autograd"]["autograd_cache_hit"] == 1, dict(counters["aot_autograd"])
    assert counters["aot_autograd"]["autograd_cache_bypass"] == 0


def test_a_helper_process_compiles_the_step_so_the_stack_only_traces_it(tmp_path, monkeypatch):
    """``precompile.start`` compiles a stack's step in another process (the stack trains on meanwhile): with a
    fresh compile cache, the stack's own compilation afterwards finds its forward and backward there."""
    from torch._dynamo.utils import counters

    from sandbox.train import precompile

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    data = copy.deepcopy(BASE)
    data["model"]["d_model"] = 24                 # shapes no other test compiles
    cfgs = [load_config(data=data, overrides=[f"train.lr={lr}"]) for lr in (1e-3, 3e-3)]
    helper = precompile.start(cfgs)
    assert helper.wait(timeout=600) == 0
    assert any((tmp_path / "cache").rglob("*")), "the helper wrote nothing to the cache"
    counters.clear()
    g = Group(cfgs)
    g.step.compile_now()
    g.step(*g.batch(0))
    assert counters["aot_autograd"]["autograd_cache_hit"] == 1, dict(counters["aot_autograd"])
    assert counters["inductor"]["fxgraph_cache_miss"] == 0, dict(counters["inductor"])

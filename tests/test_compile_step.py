"""Compiling the training step: when (``train.compile``), what a compiled step trains against the eager one
(float64, CPU), and the helper processes that compile a sweep worker's next stacks."""
import copy
import json

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


def test_auto_compiles_on_a_gpu_every_graph_safe_run_whatever_its_length():
    """``train.compile: auto`` is a function of the configuration and the device alone: compiled from the first step
    on CUDA where every mixer is graph-safe, never on the CPU or with a mixer that is not. (It used to weigh the
    measured step time and the caches' state, which made the same run take another path in a rerun.)"""
    from sandbox.model import LanguageModel
    from sandbox.train.group import use_compile

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    gla = LanguageModel(load_config(data=copy.deepcopy(BASE)).model, 32, 24)
    data = copy.deepcopy(BASE)
    data["model"].update(mixer=["gla", "lte"], n_layers=2)
    lte = LanguageModel(load_config(data=data).model, 32, 24)
    assert use_compile("auto", cuda, gla) is True and use_compile("auto", cpu, gla) is False
    assert use_compile("auto", cuda, lte) is False                        # LTE reads the host: not graph-safe
    assert use_compile(True, cpu, lte) is True and use_compile(False, cuda, gla) is False


def test_only_a_single_run_launches_its_kernels_early():
    """Programmatic dependent launch made single steps faster and stacks of 9 slower on the H200
    (results/throughput/bench_pdl.json): a step of one run compiles with it, a stack's without, and the
    options otherwise agree."""
    from sandbox.train.step import compile_options

    single, stack = compile_options(1), compile_options(9)
    if "triton.enable_pdl" in single:                  # a torch that has the setting
        assert single.pop("triton.enable_pdl") is True
    assert "triton.enable_pdl" not in stack and single == stack


def test_a_second_stack_of_the_same_shapes_reuses_the_compilation_from_the_cache():
    """A process that compiles a stack (a sweep worker after dropping Dynamo's cache, the precompile helper) must
    find the forward and backward of a stack with the shapes of an earlier one in AOTAutograd's on-disk cache,
    not compile them again. Mixed precision and the attention-kernel choice traced inside the compiled function
    used to make AOTAutograd bypass its cache."""
    from torch._dynamo.utils import counters

    from sandbox.train.step import forget_compilations

    data = copy.deepcopy(BASE)
    data["train"].update(precision="bf16")
    for _ in range(2):
        forget_compilations()          # as a new process would: only the on-disk caches are left
        counters.clear()
        g = Group([load_config(data=data, overrides=[f"train.lr={lr}"]) for lr in (1e-3, 3e-3)])
        g.step.compile_now()
        g.step(*g.batch(0))
    # both compiled graphs, the forward with its backward and the optimizer's update, from the cache
    assert counters["aot_autograd"]["autograd_cache_hit"] == 2, dict(counters["aot_autograd"])
    assert counters["aot_autograd"]["autograd_cache_bypass"] == 0


def test_a_second_stack_of_a_kind_compiled_in_this_process_compiles_nothing_and_trains_its_own_weights():
    """A sweep worker's later stack of a kind it compiled before reuses that compilation: Dynamo's guards must
    pass for the new models (nothing compiled), and the reused code must train the new models' weights, as
    the eager step does (float64), not the first stack's. The first stack's models must not be kept alive."""
    import gc
    import weakref

    from torch._dynamo.utils import counters

    from sandbox.train.step import compiled_before, forget_compilations

    def group(seed):
        return Group([load_config(data=copy.deepcopy(BASE), overrides=[f"seed={seed}", f"train.lr={lr}"])
                      for lr in (1e-3, 3e-3)])

    forget_compilations()
    first = group(0)
    assert not compiled_before(first.step.kind)
    first.step.compile_now()
    for s in range(3):
        first.step(*first.batch(s))
    gone = weakref.ref(first.models[0])
    del first
    gc.collect()
    assert gone() is None, "the compilation keeps the first stack's model alive"

    counters.clear()
    second, eager = group(1), group(1)
    assert compiled_before(second.step.kind)
    second.step.compile_now()
    for s in range(6):
        second.step(*second.batch(s))
        eager.step(*eager.batch(s))
    assert counters["stats"]["unique_graphs"] == 0, dict(counters["stats"])
    for a, b in zip(eager.models, second.models):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7, msg=name)
    other = Group([load_config(data=copy.deepcopy(BASE), overrides=["model.d_model=8"])])
    assert not compiled_before(other.step.kind)


def test_a_helper_process_compiles_stacks_so_that_each_only_traces_its_step(tmp_path, monkeypatch, capfd):
    """``precompile.start`` compiles the steps of a list of stacks in other processes (the stack that trains now
    and those a sweep worker takes next), here two helpers side by side, one stack each: with a fresh compile
    cache, each stack's own compilation afterwards finds its forward and backward there, and ``cache_warm`` says
    so for exactly those kinds; a kind that is warm already is not queued again."""
    from torch._dynamo.utils import counters

    from sandbox.train import precompile
    from sandbox.train.group import group_kind
    from sandbox.train.step import cache_warm, compile_seconds, forget_compilations

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    stacks = []
    for d_model in (24, 20):                      # shapes no other test compiles
        data = copy.deepcopy(BASE)
        data["model"]["d_model"] = d_model
        stacks.append([load_config(data=data, overrides=[f"train.lr={lr}"]) for lr in (1e-3, 3e-3)])
    other = [load_config(data=copy.deepcopy(BASE), overrides=["model.d_model=12"])]
    assert not any(cache_warm(group_kind(c)) for c in stacks + [other])
    helpers = precompile.start(stacks, 2)
    assert len(helpers) == 2
    assert precompile.queued(group_kind(stacks[1])) and not precompile.queued(group_kind(other))   # while they work
    assert [h.wait(timeout=900) for h in helpers] == [0, 0]
    err = capfd.readouterr().err
    said = sorted(line.split(": ", 1)[1].split(" compiled")[0] for line in err.splitlines()
                  if line.startswith("precompile (helper"))
    assert said == ["gla d20 x2", "gla d24 x2"]          # each helper says when its kind got ready
    took = {line.split(": ", 1)[1].split(" compiled")[0]: float(line.split(" in ")[1].split(" s,")[0])
            for line in err.splitlines() if line.startswith("precompile (helper")}
    for cfgs in stacks:                                   # and its marker keeps how long that took
        assert compile_seconds(group_kind(cfgs)) == pytest.approx(took[f"gla d{cfgs[0].model.d_model} x2"], abs=0.051)
    assert compile_seconds(group_kind(other)) is None
    assert "Warning" not in err, err                      # and nothing else (a worker's log holds these lines)
    assert all(cache_warm(group_kind(c)) for c in stacks) and not cache_warm(group_kind(other))
    assert not precompile.queued(group_kind(stacks[0])) and not precompile.running()
    assert precompile.start(stacks, 2) == []       # nothing left to compile
    for cfgs in stacks:
        forget_compilations()
        counters.clear()
        g = Group(cfgs)
        g.step.compile_now()
        g.step(*g.batch(0))
        assert counters["aot_autograd"]["autograd_cache_hit"] == 2, dict(counters["aot_autograd"])
        assert counters["inductor"]["fxgraph_cache_miss"] == 0, dict(counters["inductor"])


def test_while_a_stack_trains_a_helper_compiles_the_stacks_named_next(tmp_path, monkeypatch):
    """``train_replicas(prefetch=...)`` (a sweep worker passes its queue's next stacks): once the stack is
    ready, a helper compiles the named stacks' steps, and outlives the stack's training to finish them."""
    from sandbox.train import precompile, train_replicas
    from sandbox.train.group import group_kind
    from sandbox.train.step import cache_warm

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(precompile, "room", lambda device: 1)        # the CPU has no GPU memory to weigh
    data = copy.deepcopy(BASE)
    data["train"].update(steps=3, eval_every=3)
    now = [load_config(data=data)]
    data["model"]["d_model"] = 28                 # shapes no other test compiles
    later = [load_config(data=data, overrides=[f"train.lr={lr}"]) for lr in (1e-3, 3e-3)]
    asked = []
    train_replicas(now, [tmp_path / "run"], progress=False, prefetch=lambda: asked.append(1) or [later])
    assert asked == [1] and precompile.queued(group_kind(later))
    assert precompile._helpers[-1].wait(timeout=900) == 0
    assert cache_warm(group_kind(later)) and not cache_warm(group_kind(now))


def test_a_kernel_warm_up_runs_one_small_eager_step_and_leaves_the_compiling_helpers_state_alone(tmp_path, monkeypatch,
                                                                                                  capfd):
    """``warm_kernels``' helper (a cold stack's Triton kernels, compiled beside its step's compilation) runs one eager
    step at a batch of ``KERNEL_BATCH`` and says so; it neither marks the kind compiled (only a compiled step's caches
    do) nor takes away another helper's queue file for the kind, which a stack waits on. On the CPU nothing starts."""
    import subprocess
    import sys

    from sandbox.config import to_dict
    from sandbox.train import precompile
    from sandbox.train.group import group_kind
    from sandbox.train.step import cache_warm

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    data = copy.deepcopy(BASE)
    data["train"]["batch_size"] = 2 * precompile.KERNEL_BATCH
    cfgs = [load_config(data=data, overrides=[f"train.lr={lr}"]) for lr in (1e-3, 3e-3)]
    kind = group_kind(cfgs)
    assert precompile.warm_kernels(cfgs) is None                      # a CPU run: no kernels to compile ahead
    queue = precompile._queue_file(kind)
    queue.parent.mkdir(parents=True)
    queue.write_text("12345")                                          # a compiling helper's
    p = subprocess.run([sys.executable, "-c", precompile._ENTRY_KERNELS], input=json.dumps([[to_dict(c) for c in cfgs]]),
                       text=True, capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "gla d16 x2 kernels compiled (eager step) in" in p.stderr, p.stderr
    assert queue.read_text() == "12345" and not cache_warm(kind)


def test_a_kernel_warm_up_leaves_a_cold_stack_no_project_kernel_to_compile_on_the_gpu(tmp_path):
    """On a GPU, a stack that compiles from cold caches finds every Triton kernel of the project that its compiled
    step launches already in Triton's cache when ``warm_kernels``' helper ran first: the eager step at a smaller batch
    specialises them alike. Without the helper the same step compiles those kernels itself (the check is not empty)."""
    import os
    import subprocess
    import sys

    from sandbox.train.precompile import KERNEL_BATCH

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU: Triton compiles kernels only there")
    code = (
        "import json, sys, torch\n"
        "from sandbox.config import load_config\n"
        "from sandbox.train import precompile\n"
        "from sandbox.train.group import Group\n"
        "cfgs = [load_config(data=json.loads(sys.argv[1]), overrides=[f'train.lr={lr}']) for lr in (1e-3, 3e-3)]\n"
        "if sys.argv[2] == 'warm':\n"
        "    sys.exit(precompile.warm_kernels(cfgs).wait(600))\n"
        "g = Group(cfgs)\n"
        "assert g.step.compiled\n"
        "g.step(*g.batch(0))\n"
        "torch.cuda.synchronize()\n")
    data = copy.deepcopy(BASE)
    data["model"].update(mixer="gsa", d_model=64, n_heads=2, channel_mixer="swiglu", gsa={"topk": 8, "conv_size": 4})
    data["task"].update(seq_len=128, vocab_size=256)
    data["train"].update(batch_size=4 * KERNEL_BATCH, precision="auto", device="cuda", compile="auto")

    def project_kernels(cache):             # Triton's cache: a directory per compiled kernel, named by its hash
        return {(d, f[:-5]) for d in os.listdir(cache) for f in os.listdir(os.path.join(cache, d))
                if f.endswith(".json") and not f.startswith("__grp__") and not f.startswith("triton_")}

    def run(cache, *phases):
        env = {**os.environ, "TRITON_CACHE_DIR": str(cache / "triton"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "ind")}
        seen = []
        for phase in phases:
            p = subprocess.run([sys.executable, "-c", code, json.dumps(data), phase], env=env, text=True,
                               capture_output=True, timeout=900)
            assert p.returncode == 0, p.stderr[-3000:]
            seen.append(project_kernels(cache / "triton"))
        return seen

    alone, = run(tmp_path / "alone", "step")
    warmed, after = run(tmp_path / "warmed", "warm", "step")
    assert {name for _, name in alone} >= {"_fwd_o", "_bwd_chunk"}, alone      # GSA's chunk kernels, compiled
    assert {name for _, name in alone} <= {name for _, name in warmed}, (alone, warmed)
    assert after == warmed, sorted(after - warmed)          # nothing the step launched was compiled again


import pytest  # noqa: E402


@pytest.mark.parametrize("mixer", ["sse", "sla", "gated_deltanet"])
def test_a_stack_compiled_mid_run_trains_as_the_eager_stack(mixer):
    """A stack of replicas runs its mixers under vmap, and under compile the whole stacked step goes through
    Inductor: an in-place op on a vmapped tensor (SSE's routing masks once used ``scatter_``) fails there with
    "Cannot access storage of BatchedTensorImpl" although the same stack trains eagerly. The mixers of the
    figure sweeps beyond GLA, MetaLA and GSA (compiled in stacks on the H200 already)."""
    groups = []
    for compile_at in (None, 2):
        data = copy.deepcopy(BASE)
        data["model"]["mixer"] = mixer
        if mixer == "sse":
            data["model"]["sse"] = {"n": 4, "k": 2}
        data["train"]["steps"] = 4
        g = Group([load_config(data=data, overrides=[f"train.lr={lr}"]) for lr in (1e-3, 3e-3)])
        for s in range(4):
            if s == compile_at:
                g.step.compile_now()
            g.step(*g.batch(s))
        groups.append(g)
    assert groups[1].step.compiled
    for a, b in zip(groups[0].models, groups[1].models):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=name)

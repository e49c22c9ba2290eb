"""Compiling the training step: when (``train.compile: auto``, a rule of the configuration), what a compiled step
trains against the eager one (float64, CPU), and what torch's caches give a later step of the same shapes."""
import copy
import json

import pytest
import torch

from sandbox.config import load_config
from sandbox.train import Group, train
from sandbox.train import compile as compiling

BASE = {"task": {"name": "mqar", "seq_len": 24, "num_kv_pairs": 3, "vocab_size": 32, "test_examples": 32},
        "model": {"mixer": "gla", "d_model": 16, "n_layers": 1, "n_heads": 1, "channel_mixer": "none"},
        "train": {"steps": 10, "batch_size": 8, "lr": 3e-3, "precision": "fp64", "device": "cpu", "eval_every": 5,
                  "log_every": 5, "early_stop": None}}
CUDA = torch.device("cuda")       # the rule is a function of the configuration: no GPU needed to ask it


def config(overrides=(), **model):
    data = copy.deepcopy(BASE)
    data["model"].update(model)
    return load_config(data=data, overrides=list(overrides))


@pytest.mark.slow
def test_a_compiled_run_trains_as_the_eager_one_and_its_result_splits_the_wall_time_by_phase(tmp_path):
    from torch._dynamo.utils import counters
    bypassed = counters["aot_autograd"]["autograd_cache_bypass"]
    runs = {c: train(config([f"train.compile={c}"]), tmp_path / c, progress=False) for c in ("false", "true")}
    # AOTAutograd's cache keeps the step (split_linear's autograd.Function in it), so a later process need not
    # trace and partition it again
    assert counters["aot_autograd"]["autograd_cache_bypass"] == bypassed
    eager, compiled = (torch.load(tmp_path / c / "checkpoint.pt", weights_only=False)["model"] for c in runs)
    for name in eager:
        # fused float64 arithmetic rounds differently; Adam's normalisation lifts that to ~1e-8
        torch.testing.assert_close(compiled[name], eager[name], rtol=1e-6, atol=1e-7, msg=name)
    res = runs["true"]
    assert res["compiled_at"] == 0 and runs["false"]["compiled_at"] is None
    assert res["compile_cache"] in ("cold", "cached", "partly cached", "reused")
    assert runs["false"]["compile_cache"] is None
    phases = res["phases"]
    assert list(phases) == ["startup", "compile", "capture", "train", "eval"]
    assert phases["startup"] > 0 and phases["compile"] > 0 and phases["train"] > 0 and phases["eval"] > 0
    assert phases["capture"] == 0                                   # no CUDA graph on the CPU
    assert sum(phases.values()) <= res["wall_time_s"]
    assert phases["startup"] + phases["compile"] == pytest.approx(res["setup_s"], abs=0.5)
    assert json.loads((tmp_path / "true" / "result.json").read_text())["phases"] == phases


def stack(seed, compile, steps=4, **model):
    return Group([config([f"seed={seed}", f"train.lr={lr}", f"train.compile={compile}", f"train.steps={steps}"],
                         **model) for lr in (1e-3 * (seed + 1), 3e-3)])


def train_alike(compiled, eager, steps=4) -> str:
    """Train both stacks ``steps`` steps; the same weights (float64); what torch's caches gave the compiled one."""
    before = compiling.cache_counts()
    for s in range(steps):
        compiled.step(*compiled.batch(s))
        eager.step(*eager.batch(s))
    assert compiled.step.compiled and not eager.step.compiled
    for a, b in zip(eager.models, compiled.models):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7, msg=name)
    return compiling.cache_outcome(before)


@pytest.mark.slow
def test_a_second_stack_of_the_same_shapes_reuses_the_compilation_and_trains_its_own_weights(tmp_path, monkeypatch):
    """A stack compiled into empty caches trains what the eager stack trains. A second stack of the same shapes in
    this process compiles nothing and trains its own weights, and the first one's models are freed; after
    ``torch.compiler.reset`` (as a new process) a third loads its forward, backward and update from torch's on-disk
    caches. The second and third have other seeds and learning rates: what a warm command on a machine changes."""
    import gc
    import weakref

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    torch.compiler.reset()
    first = stack(0, True)
    assert train_alike(first, stack(0, False)) == "cold"
    gone = weakref.ref(first.models[0])
    del first
    gc.collect()
    assert gone() is None, "the compilation keeps the first stack's model alive"
    assert train_alike(stack(1, True), stack(1, False)) == "reused"
    torch.compiler.reset()
    assert train_alike(stack(2, True), stack(2, False)) == "cached"


def test_the_figure_sweeps_mixers_trace_stacked_under_compile():
    """A stack runs its mixers under vmap, and compiled, the whole stacked step goes through Dynamo and AOTAutograd:
    an in-place op on a vmapped tensor (SSE's routing masks once used ``scatter_``) fails there although the same
    stack trains eagerly. The figure sweeps' mixers beyond GLA, one per layer, traced by AOTAutograd's eager backend
    (where that failure shows) rather than compiled by Inductor (the test above)."""
    model = dict(mixer=["sse", "sla", "gated_deltanet"], n_layers=3, sse={"n": 4, "k": 2})
    traced, eager = stack(0, False, steps=2, **model), stack(0, False, steps=2, **model)
    traced.step.forward = torch.compile(traced.step._losses, backend="aot_eager", dynamic=False)
    traced.step.compiled = True
    train_alike(traced, eager, steps=2)


def test_auto_compiles_when_the_time_saved_over_the_run_exceeds_the_cost_of_compiling():
    """Against one reference (a step of 2 ms eager, 1 ms compiled, 10 s to compile at its work W): a run of the
    same work breaks even at 10 s / 1 ms = 10,000 steps; of twice the work, or stacked twice, at 5,000."""
    cfg = config()
    ref = compiling.Reference("ref", compiling.features(cfg), compiling.work(cfg), 2.0, 1.0, 10.0)

    def pays(steps, replicas=1, **model):
        c = config([f"train.steps={steps}"], **model)
        return compiling.estimate(c, replicas, (ref,)).pays

    assert not pays(9_000) and pays(11_000)
    assert not pays(4_000, d_model=32) and pays(6_000, d_model=32)
    assert not pays(4_000, replicas=2) and pays(6_000, replicas=2)
    est = compiling.estimate(config(["train.steps=9000"]), 1, (ref,))
    assert est.saved_s == pytest.approx(9.0) and est.cost_s == 10.0


def test_the_reference_nearest_in_mixers_options_and_work_is_the_one_that_counts():
    gla, topk = config(), config(gla={"topk": 4, "conv_size": 4})
    attention = config(mixer="attention", positions="learned")
    refs = (compiling.Reference("gla_wide", compiling.features(gla), 16 * compiling.work(gla), 2.0, 1.0, 1.0),
            compiling.Reference("gla", compiling.features(gla), compiling.work(gla), 2.0, 1.0, 1.0),
            compiling.Reference("gla_topk", compiling.features(topk), compiling.work(topk), 2.0, 1.0, 1.0),
            compiling.Reference("attention", compiling.features(attention), compiling.work(attention), 3.0, 1.0, 1.0))
    assert compiling.estimate(gla, 1, refs).reference == "gla"
    assert compiling.estimate(config(["model.d_model=128"]), 1, refs).reference == "gla_wide"
    assert compiling.estimate(topk, 1, refs).reference == "gla_topk"
    assert compiling.estimate(attention, 1, refs).reference == "attention"
    # no reference of retnet: the one whose compiled step saves most for its work (attention's 2 ms per W against
    # gla's 1), whatever the work, so an unmeasured mixer compiles where any measured one would
    for d in (64, 128):
        assert compiling.estimate(config([f"model.d_model={d}"], mixer="retnet"), 1, refs).reference == "attention"


def test_the_same_configuration_always_takes_the_same_path_and_a_short_run_does_not_compile():
    """``auto`` with the measured constants (results/throughput/compile_rule.json): the quickstart never compiles on
    a GPU, the Figure 8 sweep's stacks of 9 do; seed and learning rate change nothing; on the CPU, or with a mixer
    that is not graph-safe, it never compiles; true and false force."""
    from sandbox.cli import quickstart_path

    fig8 = {"task": {"name": "mqar", "seq_len": 320, "num_kv_pairs": 16, "vocab_size": 8192, "gap": 192},
            "model": {"mixer": "gla", "d_model": 128, "n_layers": 2, "n_heads": 2, "gla": {"topk": 8, "conv_size": 4}},
            "train": {"steps": 3000, "batch_size": 256}}
    quick = load_config(quickstart_path())
    decisions = {(seed, lr): compiling.decide("auto", load_config(data=fig8, overrides=[f"seed={seed}",
                                                                                         f"train.lr={lr}"]),
                                              9, CUDA, True).compile
                 for seed in (0, 1) for lr in (5e-4, 8e-3)}
    assert set(decisions.values()) == {True}
    short = load_config(data=fig8, overrides=["train.steps=100"])
    assert not compiling.decide("auto", short, 1, CUDA, True) and not compiling.decide("auto", quick, 1, CUDA, True)
    assert not compiling.decide("auto", load_config(data=fig8), 9, torch.device("cpu"), True)
    assert not compiling.decide("auto", load_config(data=fig8), 9, CUDA, False)
    assert compiling.decide(True, short, 1, torch.device("cpu"), False)
    assert not compiling.decide(False, load_config(data=fig8), 9, CUDA, True)
    assert "saves about" in compiling.decide("auto", short, 1, CUDA, True).reason


def test_the_rules_constants_name_their_source_and_parse():
    data = json.loads(compiling.RULE_FILE.read_text())
    assert "command" in data
    assert all({"gpu", "torch", "commit", "date"} <= set(r["measured"]) for r in data["references"])
    refs = compiling.references()
    assert len(refs) == len(data["references"]) >= 3
    assert all(r.eager_ms > r.compiled_ms > 0 and r.compile_s > 0 for r in refs)


def test_a_missing_constants_file_is_one_line_naming_it(tmp_path):
    with pytest.raises(ValueError, match="compile_rule.json.*train.compile to true or false"):
        compiling.references(tmp_path / "compile_rule.json")

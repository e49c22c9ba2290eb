"""CUDA-graph training steps: who may use them, clear errors, and (on a GPU) the same weights as eager."""
import copy

import pytest
import torch

from sandbox.config import load_config
from sandbox.train import build, train, use_cuda_graph

from replay import replay_gap

BASE = {"task": {"name": "mqar", "seq_len": 32, "num_kv_pairs": 4, "vocab_size": 64, "test_examples": 64},
        "model": {"mixer": "gla", "d_model": 64, "n_layers": 2, "n_heads": 2},
        "train": {"steps": 30, "batch_size": 16, "lr": 3e-3, "eval_every": 15, "log_every": 5,
                  "eval_batch_size": 64, "early_stop": None, "compile": False}}   # the graph alone is under test


def model_for(**model):
    data = copy.deepcopy(BASE)
    data["model"].update(model)
    return build(load_config(data=data), torch.device("cpu"))[1]


@pytest.mark.parametrize("model, safe", [
    (dict(mixer="gla"), True),
    (dict(mixer="gated_deltanet"), True),
    (dict(mixer="attention"), True),
    (dict(mixer="sla", sla={"base": "gla"}), True),
    (dict(mixer="sse", sse={"n": 4, "k": 1, "impl": "masking"}), True),
    (dict(mixer="sse", sse={"n": 4, "k": 1, "impl": "varlen"}), False),   # sorts routed tokens
    (dict(mixer=["gla", "lte"]), True),
])
def test_graph_safety_follows_the_mixers(model, safe):
    m = model_for(**model)
    cuda = torch.device("cuda")
    assert use_cuda_graph("auto", cuda, m) is safe
    assert use_cuda_graph("auto", torch.device("cpu"), m) is False
    assert use_cuda_graph(False, cuda, m) is False
    if not safe:
        with pytest.raises(ValueError, match="not graph-safe"):
            use_cuda_graph(True, cuda, m)


def test_forcing_a_graph_on_cpu_is_a_clear_error(tmp_path):
    data = copy.deepcopy(BASE)
    data["train"].update(device="cpu", cuda_graph=True)
    with pytest.raises(ValueError, match="train.cuda_graph: true needs a CUDA device"):
        train(load_config(data=data), tmp_path, progress=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("model", [dict(mixer="gla"), dict(mixer="attention"), dict(mixer="deltanet"),
                                   dict(mixer="gated_deltanet", gated_deltanet={"topk": 8}), dict(mixer="gsa"),
                                   dict(mixer="sse", sse={"n": 4, "k": 1, "impl": "masking"})],
                         ids=["gla", "attention", "deltanet", "gdn_topk", "gsa", "sse"])
def test_graph_training_matches_eager(tmp_path, model):
    """The training loop with a graph: same seed, same batches, the test losses of eager runs, as close as a
    second eager run is to the first. The weights are printed, not compared: the embedding backward's atomic
    adds leave a last-bit difference (2e-9 relative after one step on the H200), and AdamW grows it to 1e-3
    to 1e-2 within 30 steps, graph or not (a GSA graph run at 2.7e-4 beside an eager pair at 1.4e-6 only
    drew a quiet eager pair). Whether a replay computes the right step is the one-step test below."""
    runs = []
    for name, graph in (("eager", False), ("eager_again", False), ("graph", True)):
        data = copy.deepcopy(BASE)
        data["model"].update(model)
        data["train"]["cuda_graph"] = graph
        res = train(load_config(data=data), tmp_path / name, progress=False)
        sd = torch.load(tmp_path / name / "checkpoint.pt", weights_only=False)["model"]
        runs.append((res, sd))
    (r0, a), (r1, a1), (r2, b) = runs

    def spread(x, y):   # the largest relative weight difference over the parameters
        return max(((x[k].double() - y[k].double()).norm() / y[k].double().norm().clamp_min(1e-12)).item()
                   for k in y if y[k].is_floating_point())

    print(f"weights: eager vs eager {spread(a1, a):.2e}, graph vs eager {spread(b, a):.2e}")
    losses = [[h["test/loss"] for h in r["history"]] for r in (r0, r1, r2)]
    loss_noise = max(abs(x - y) / abs(y) for x, y in zip(losses[1], losses[0]))
    loss_gap = max(abs(x - y) / abs(y) for x, y in zip(losses[2], losses[0]))
    assert loss_gap <= max(1e-3, 5 * loss_noise), (loss_gap, loss_noise)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton embedding backward runs on a GPU")
def test_embedding_backward_on_the_gpu_equals_a_float64_sum_and_repeats_bit_for_bit():
    """The compiled Triton kernel (not the interpreter): the weight gradient of an MQAR-like batch,
    80% filler 0, against index_add in float64; computed again, the same bits (no atomic adds)."""
    from sandbox.kernels.embedding import embedding
    g_ = torch.Generator(device="cuda").manual_seed(0)
    N, D, V = 256 * 192 + 5, 128, 8192
    ids = torch.randint(1, V, (N,), device="cuda", generator=g_)
    ids = torch.where(torch.rand(N, device="cuda", generator=g_) < 0.8, 0, ids)
    w = torch.randn(V, D, device="cuda", requires_grad=True)
    grad = torch.randn(N, D, device="cuda", generator=g_)
    embedding(w, ids).backward(grad)
    ref = torch.zeros(V, D, dtype=torch.float64, device="cuda").index_add_(0, ids, grad.double())
    torch.testing.assert_close(w.grad.double(), ref, rtol=1e-5, atol=1e-3)
    first = w.grad.clone()
    for _ in range(3):
        w.grad = None
        embedding(w, ids).backward(grad)
        assert torch.equal(w.grad, first)



def _state(step) -> list:
    """Every tensor a training step changes: weights, optimizer state, step counter, running losses."""
    opt = step.optimizer
    return [opt.flat, opt.exp_avg, opt.exp_avg_sq, step.counter, step.loss_sum, step.lr]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("model", [dict(mixer="gla"), dict(mixer="attention"), dict(mixer="deltanet"),
                                   dict(mixer="gated_deltanet", gated_deltanet={"topk": 8}), dict(mixer="gsa"),
                                   dict(mixer="sse", sse={"n": 4, "k": 1, "impl": "masking"})],
                         ids=["gla", "attention", "deltanet", "gdn_topk", "gsa", "sse"])
def test_a_replay_on_a_new_batch_is_the_eager_step_from_the_same_state(model):
    """One replayed step (a batch the capture never saw) against the eager step from the same weights and
    optimizer state on the same stream: equal up to the embedding backward's last-bit noise. A graph that
    kept a stale input, a value baked in at capture, or a buffer the eager step reallocates differs by the
    step's own size."""
    from sandbox.train.step import Step
    data = copy.deepcopy(BASE)
    data["model"].update(model)
    cfg = load_config(data=data)
    task, m = build(cfg, torch.device("cuda"))
    step = Step([m], [cfg.train], per_row=getattr(task, "max_targets", None), autocast_dtype=torch.bfloat16,
                capture_after=2)
    batches = [task.sample(16, index=i) for i in range(4)]
    for x, y in batches[:3]:          # two eager steps, then the capture and its first replay
        step(x, y)
    assert step.graph is not None
    state = _state(step)
    moved, gap = replay_gap(step, state, batches[3])
    print(f"one replayed step moved the weights {moved:.1e}; replay vs eager {gap:.1e}")
    assert moved > 1e-4          # the step did something
    assert gap <= 1e-6, f"replay vs eager step from the same state: {gap:.2e} (the step moved {moved:.2e})"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_a_step_captures_while_python_collects_an_earlier_steps_graph():
    """A finished step is garbage in a reference cycle that holds its CUDA graph, and the collector may run
    at any allocation; destroying a graph while another is captured invalidates that capture
    (pytorch/pytorch#161037: a sweep worker's stack failed so, now and then). Here a collection is forced in
    the middle of the next capture, from a forward hook."""
    import gc
    import weakref

    from sandbox.train.step import Step
    cfg = load_config(data=copy.deepcopy(BASE))
    task, _ = build(cfg, torch.device("cuda"))
    x, y = task.sample(16, index=0)

    def new_step():
        m = build(cfg, torch.device("cuda"))[1]
        return Step([m], [cfg.train], per_row=getattr(task, "max_targets", None),
                    autocast_dtype=torch.bfloat16, capture_after=1)

    def collect_while_capturing(module, args, out):
        if torch.cuda.is_current_stream_capturing():
            gc.collect()

    gc.disable()
    hook = None
    try:
        old = new_step()
        for _ in range(3):
            old(x, y)
        old_graph = weakref.ref(old.graph)
        del old
        assert old_graph() is not None, "the old step was freed at once: nothing left to collect"
        hook = torch.nn.modules.module.register_module_forward_hook(collect_while_capturing)
        step = new_step()
        for _ in range(3):
            step(x, y)
    finally:
        if hook is not None:
            hook.remove()
        gc.enable()
    assert step.graph is not None and old_graph() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Inductor lowers concatenations pointwise on a GPU only")
def test_the_compiled_step_writes_concatenated_pieces_in_place_not_through_one_masked_kernel():
    """A concatenation of two pointwise results feeding a product (the shape of a fused projection's backward):
    Inductor's default makes one masked kernel named after the cat; the step's settings (``compile_options`` and,
    under torch 2.11, ``concat_kernels``) make each piece its own kernel writing into the output."""
    from torch._inductor.utils import run_and_get_code

    from sandbox.train.compile import concat_kernels, options as compile_options

    def f(a, b, w):
        return torch.cat([torch.nn.functional.silu(a), torch.sigmoid(b) * a], -1) @ w

    g_ = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(512, 64, device="cuda", generator=g_) for _ in range(2))
    w = torch.randn(128, 32, device="cuda", generator=g_)
    torch._dynamo.reset()
    out, code = run_and_get_code(torch.compile(f, dynamic=False), a, b, w)
    assert "triton_poi_fused_cat" in "\n".join(code)          # the default: one masked kernel
    torch._dynamo.reset()
    with concat_kernels():
        out2, code2 = run_and_get_code(torch.compile(f, dynamic=False, options=compile_options()), a, b, w)
    torch._dynamo.reset()
    assert "triton_poi_fused_cat" not in "\n".join(code2)
    ref = f(a.double(), b.double(), w.double())
    torch.testing.assert_close(out2.double(), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out2, out, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="mixed-order reductions are Inductor's GPU lowering")
def test_a_compiled_layernorm_backward_finishes_its_weight_gradients_without_an_eager_sum():
    """A residual add and a LayerNorm, backward, at the Figure 8 step's rows (49,152 x 128): Inductor's mixed-order
    reduction left the weight and bias gradients as partial sums in a workspace, summed by an eager ``.sum``
    launch each; with the step's options they are Inductor reductions. The gradients equal a float64 LayerNorm's."""
    from torch._inductor.utils import run_and_get_code

    from sandbox.train.compile import options as compile_options

    g_ = torch.Generator(device="cuda").manual_seed(0)
    x, r, dy = (torch.randn(49152, 128, device="cuda", generator=g_) for _ in range(3))
    w = 1 + 0.1 * torch.randn(128, device="cuda", generator=g_)
    b = 0.1 * torch.randn(128, device="cuda", generator=g_)

    def loss(x, r, w, b):
        return (torch.nn.functional.layer_norm(x + r, (128,), w, b) * dy.to(x.dtype)).sum()

    def grads(fn, *inputs):
        inputs = [t.detach().requires_grad_() for t in inputs]
        return torch.autograd.grad(fn(*inputs), inputs[:1] + inputs[2:])      # x, w, b

    def compiled(options):
        torch._dynamo.reset()
        out, code = run_and_get_code(grads, torch.compile(loss, dynamic=False, options=options), x, r, w, b)
        torch._dynamo.reset()
        return out, "\n".join(code)

    _, before = compiled({"triton.mix_order_reduction": True})
    assert ".sum(dim=0)" in before                          # the eager finish of the workspace's partial sums
    out, code = compiled(compile_options())
    assert ".sum(dim=0)" not in code
    for got, want in zip(out, grads(loss, x.double(), r.double(), w.double(), b.double())):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-3)


_COMPILED_STEPS = """
import hashlib, sys
import torch
from sandbox.config import load_config
from sandbox.train import build
from sandbox.train import compile as compiling
from sandbox.train import step as step_module
if sys.argv[1] == "timed":                 # the code before: Inductor times the reductions' configs
    compiling.DETERMINISM = {}
if sys.argv[1] == "launch-early":          # Inductor's kernels launched early (programmatic dependent launch)
    compiling.REDUCTIONS = {**compiling.REDUCTIONS, "triton.enable_pdl": True}
data = {"task": {"name": "mqar", "seq_len": 64, "num_kv_pairs": 8, "vocab_size": 512, "test_examples": 64},
        "model": {"mixer": "gla", "d_model": 128, "n_layers": 2, "n_heads": 2, "channel_mixer": "swiglu"},
        "train": {"steps": 12, "batch_size": 128, "lr": 3e-3, "early_stop": None}}
cfg = load_config(data=data)
task, m = build(cfg, torch.device("cuda"))
step = step_module.Step([m], [cfg.train], per_row=getattr(task, "max_targets", None),
                        autocast_dtype=torch.bfloat16, capture_after=2, compile=sys.argv[1] != "eager")
for i in range(12):
    step(*task.sample(128, index=i))
torch.cuda.synchronize()
print(hashlib.sha1(step.optimizer.flat.detach().cpu().numpy().tobytes()).hexdigest())
"""


def _compiled_weights(cache, mode: str, distort: str = "") -> str:
    """The weights' sha1 after ``_COMPILED_STEPS`` in a process of its own, compiling into empty caches under
    ``cache``; ``distort``: how Inductor's timings of candidate kernel configs are distorted ("" for not)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"),
               TORCHINDUCTOR_DISTORT_BENCHMARKING_RESULT=distort)
    p = subprocess.run([sys.executable, "-c", _COMPILED_STEPS, mode], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.split()[-1]


@pytest.fixture(scope="module")
def fixed_step(tmp_path_factory):
    """The step as it compiles (the project's options, Inductor timing undistorted): its weights and caches,
    shared by the tests below (a cold compilation in a fresh process takes about half a minute)."""
    cache = tmp_path_factory.mktemp("fixed")
    return _compiled_weights(cache, "fixed"), cache


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Inductor times kernel configs on a GPU only")
def test_a_compiled_step_trains_the_same_bits_whatever_inductor_measures(tmp_path, fixed_step):
    """Two processes compile the same step from empty caches; in one, Inductor's timings of the candidate
    kernel configs are inverted (``TORCHINDUCTOR_DISTORT_BENCHMARKING_RESULT``: it picks the slowest), as a
    busy or another GPU might time them. With the step's options the weights after 12 steps are the same
    bits; with Inductor timing the reductions' configs (the code before), they are not."""
    assert fixed_step[0] == _compiled_weights(tmp_path / "fixed-inverse", "fixed", "inverse")
    assert _compiled_weights(tmp_path / "timed", "timed") != _compiled_weights(
        tmp_path / "timed-inverse", "timed", "inverse"), "the control drew no difference"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="Inductor's static launcher and programmatic dependent launch need a CUDA GPU (Hopper)")
def test_compiling_the_step_builds_no_launcher_beyond_those_of_the_projects_kernels(tmp_path, fixed_step):
    """Inductor launches its kernels through a launcher built into torch; a kernel it cannot launch that way gets a
    C launcher that Triton builds with the host compiler on a cold start (5-7 s of a step's compilation on
    the H200). Compiling the step builds the launchers the uncompiled step builds (those of the project's own
    kernels) and no more; with Inductor's kernels launched early, which its launcher does not do, it builds more."""
    def launchers(cache) -> int:
        return sum(1 for _ in (cache / "triton").rglob("*launcher*.so"))

    _compiled_weights(tmp_path / "eager", "eager")
    _compiled_weights(tmp_path / "launch-early", "launch-early")
    own = launchers(tmp_path / "eager")
    assert launchers(fixed_step[1]) == own
    assert launchers(tmp_path / "launch-early") > own, "the control built no launcher of its own"

"""CUDA-graph training steps: who may use them, clear errors, and (on a GPU) the same weights as eager."""
import copy

import pytest
import torch

from sandbox.config import load_config
from sandbox.train import build, train, use_cuda_graph

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
    (dict(mixer=["gla", "lte"]), False),                                   # unaudited: eager
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
    """Same seed, same batches: replayed steps give the weights and losses of eager steps, as close as a
    second eager run is to the first. (The embedding backward's atomic adds make a GPU run's sums
    order-dependent; bf16 and AdamW carry a last-bit difference on. A graph that replays a stale or
    wrong step lands far outside that spread.)"""
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

    noise, gap = spread(a1, a), spread(b, a)
    print(f"eager vs eager {noise:.2e}, graph vs eager {gap:.2e}")
    assert gap <= max(1e-4, 5 * noise), f"graph vs eager {gap:.2e} against eager vs eager {noise:.2e}"
    losses = [[h["test/loss"] for h in r["history"]] for r in (r0, r1, r2)]
    loss_noise = max(abs(x - y) / abs(y) for x, y in zip(losses[1], losses[0]))
    loss_gap = max(abs(x - y) / abs(y) for x, y in zip(losses[2], losses[0]))
    assert loss_gap <= max(1e-3, 5 * loss_noise), (loss_gap, loss_noise)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton embedding backward runs on a GPU")
def test_embedding_backward_on_the_gpu_equals_a_float64_sum():
    """The compiled Triton kernel (not the interpreter): the weight gradient of an MQAR-like batch,
    80% filler 0, against index_add in float64."""
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("mixer", ["gla", "deltanet"])
def test_a_replayed_step_equals_eager_steps_on_its_stream(mixer):
    """The graph's steps against eager steps on the graph's side stream, step by step, with the same
    model and batches: a replay of the same kernels must give the same weights (a stale input or a value
    baked in at capture would not). The default-stream eager run is printed beside it: cuBLAS may choose
    other kernels on another stream, which is rounding, not a defect."""
    from sandbox.train.step import Step
    data = copy.deepcopy(BASE)
    data["model"].update(mixer=mixer)
    cfg = load_config(data=data)
    task, model = build(cfg, torch.device("cuda"))
    batches = [task.sample(16, index=i) for i in range(6)]
    runs = {}
    for name, after in (("eager", None), ("stream", 10 ** 6), ("graph", 2)):
        m = copy.deepcopy(model)
        step = Step([m], [cfg.train], per_row=None, autocast_dtype=torch.bfloat16, capture_after=after)
        snaps = []
        for x, y in batches:
            step(x, y)
            torch.cuda.synchronize()
            snaps.append({k: v.detach().double().clone() for k, v in m.state_dict().items()})
        runs[name] = snaps

    def gap(a, b):
        return max(((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-12)).item() for k in b)

    graph = [gap(g, s) for g, s in zip(runs["graph"], runs["stream"])]
    default = [gap(e, s) for e, s in zip(runs["eager"], runs["stream"])]
    print(f"{mixer}: graph vs side-stream eager per step {['%.1e' % v for v in graph]}; "
          f"default-stream eager vs side-stream eager {['%.1e' % v for v in default]}")
    assert max(graph) <= 1e-6, f"graph vs eager on its stream: {graph}"

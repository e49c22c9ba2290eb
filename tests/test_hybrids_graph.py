"""Hybrid models (a Gated DeltaNet layer plus a windowed or sparse attention layer) as graph-safe steps: each
sparse pattern's FlexAttention form against its boolean mask, which hybrids may be captured, compiled and
stacked, a traced step against the eager one and stacked replicas against solo runs (float64, CPU), and on a
GPU the compiled FlexAttention path against SDPA and a replayed CUDA graph against the eager step."""
import copy
import json

import pytest
import torch
import torch.nn.functional as F

from sandbox.config import load_config
from sandbox.mixers import swa
from sandbox.mixers.block_sparse import topk_block_mask
from sandbox.mixers.swa import ChosenBlocks, Retained, SinkWindow, block_mask, flex_attend
from sandbox.train import Group, build, train, train_replicas, use_cuda_graph

from replay import replay_gap

OPTIONS = {"swa": {"window": 13, "sinks": 2},
           "lte": {"window": 13, "sinks": 2, "cap": 4, "lambda_every": 1, "dropout": 0.0},
           "moba": {"block_size": 8, "top_k": 2},
           "nsa": {"cmp_block": 8, "cmp_stride": 4, "slc_block": 8, "slc_count": 3, "window": 8}}
BASE = {"task": {"name": "mqar", "seq_len": 32, "num_kv_pairs": 3, "vocab_size": 32, "test_examples": 16,
                 "val_examples": 16},
        "model": {"d_model": 16, "n_layers": 2, "n_heads": 2, "channel_mixer": "none"},
        "train": {"steps": 4, "batch_size": 4, "lr": 3e-3, "eval_every": 2, "log_every": 2, "eval_batch_size": 16,
                  "early_stop": None, "precision": "fp64", "device": "cpu"}}


def hybrid(mixer: str, **train_kw) -> dict:
    """The config of a 2-layer [gated_deltanet, mixer] model."""
    data = copy.deepcopy(BASE)
    data["model"].update(mixer=["gated_deltanet", mixer], **{mixer: OPTIONS[mixer]})
    data["train"].update(train_kw)
    return data


# ---- the patterns: FlexAttention's form against the boolean mask ----------------------------------------

B, H, T = 2, 2, 300          # three tiles of 128 tokens, the last one partial


def chosen(block: int, k: int, seed: int, t: int = T, device="cpu") -> torch.Tensor:
    """A MoBA-like choice ``[B, H, t, n_blocks]``: the own block and the top k-1 earlier ones by random scores."""
    n = -(-t // block)
    score = torch.randn(B, H, t, n, generator=torch.Generator().manual_seed(seed)).to(device)
    own, blk = torch.arange(t, device=device)[:, None] // block, torch.arange(n, device=device)[None, :]
    return topk_block_mask(score.masked_fill(blk > own, -torch.inf).masked_fill(blk == own, torch.inf), k)


def make_pattern(name: str, t: int = T, device="cpu"):
    keep = torch.rand(B, H, t, generator=torch.Generator().manual_seed(0)).to(device) > 0.97
    return {"sink_window": lambda: SinkWindow(t, 70, 3, device),
            "causal": lambda: SinkWindow(t, None, 0, device),
            "retained": lambda: Retained(SinkWindow(t, 20, 2, device), keep),
            "chosen_small_blocks": lambda: ChosenBlocks(chosen(6, 3, 1, t, device), 6),    # blocks straddle tiles
            "chosen_large_blocks": lambda: ChosenBlocks(chosen(160, 2, 2, t, device), 160),  # blocks over a tile
            }[name]()


PATTERNS = ["sink_window", "causal", "retained", "chosen_small_blocks", "chosen_large_blocks"]


def tiles_of(mask: torch.Tensor):
    """Per 128 x 128 tile of a boolean ``[B, H, T, T]`` mask: any True, all True."""
    n = -(-T // swa.TILE)
    m = F.pad(mask, (0, n * swa.TILE - T, 0, n * swa.TILE - T)).view(B, H, n, swa.TILE, n, swa.TILE)
    return m.any(5).any(3), m.all(5).all(3)


def listed(num: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The tiles a block mask's (count, indices) lists, as a boolean ``[.., tiles, tiles]``."""
    valid = torch.arange(idx.shape[-1]) < num[..., None]
    return torch.zeros(idx.shape, dtype=torch.bool).scatter(-1, idx.long(), valid)


@pytest.mark.parametrize("name", PATTERNS)
def test_a_patterns_flex_form_is_its_boolean_mask(name):
    """The mask_mod, evaluated by FlexAttention's own ``create_mask``, is the boolean mask SDPA gets; the block
    mask lists exactly the tiles holding a visible pair, and as full only tiles visible whole; FlexAttention
    (eager on the CPU: its dense reference, which applies the mask_mod) equals SDPA with the boolean mask."""
    from torch.nn.attention.flex_attention import create_mask

    pattern = make_pattern(name)
    dense = pattern.dense().expand(B, H, T, T)
    assert 0 < dense.sum() <= B * H * T * (T + 1) // 2                    # nothing beyond causal
    assert torch.equal(create_mask(pattern.mask_mod, B, H, T, T, "cpu"), dense)
    some, every = tiles_of(dense)
    bm = block_mask(pattern, T)
    partial = listed(bm.kv_num_blocks, bm.kv_indices).expand_as(some)
    full = listed(bm.full_kv_num_blocks, bm.full_kv_indices).expand_as(some)
    assert not (partial & full).any()
    assert torch.equal(partial | full, some)
    assert not (full & ~every).any()
    if name in ("sink_window", "causal"):
        assert torch.equal(full, every)                         # a tile visible whole skips the mask_mod
    assert full.any() == (name == "causal")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, H, T, 8, dtype=torch.float64, generator=g) for _ in range(3))
    torch.testing.assert_close(flex_attend(q, k, v, pattern), F.scaled_dot_product_attention(q, k, v, attn_mask=dense))


# ---- which hybrids are graph-safe, and why others are not ---------------------------------------------

@pytest.mark.parametrize("mixer", OPTIONS)
def test_the_hybrids_are_graph_safe(mixer):
    model = build(load_config(data=hybrid(mixer)), torch.device("cpu"))[1]
    assert use_cuda_graph("auto", torch.device("cuda"), model) is True
    assert use_cuda_graph(True, torch.device("cuda"), model) is True


def test_a_mixer_that_stays_eager_says_why():
    data = copy.deepcopy(BASE)
    data["model"].update(mixer=["gated_deltanet", "sse"], sse={"n": 4, "k": 1, "impl": "varlen"})
    model = build(load_config(data=data), torch.device("cpu"))[1]
    with pytest.raises(ValueError, match="mixer sse is not graph-safe: impl varlen sorts the routed tokens"):
        use_cuda_graph(True, torch.device("cuda"), model)


# ---- graph equals eager, stacked equals solo (float64, CPU) ---------------------------------------------

@pytest.mark.parametrize("replicas", [1, 2])
def test_a_traced_hybrid_step_has_no_graph_break_and_trains_as_the_eager_one(replicas):
    """GDN + LTE, whose forward updates lambda on the device and whose scores learn through the value gate: the
    whole step (forward, backward, lambda, aux loss; one run or a stack of two) traced as one graph (``fullgraph``:
    a host read, a data-dependent shape or a graph break fails) trains the weights and buffers of the eager step.
    (Traced by AOTAutograd without Inductor, whose CPU code generation takes minutes here; the GPU tests below
    run the compiled step.)"""
    runs = []
    for traced in (False, True):
        g = Group([load_config(data=hybrid("lte"), overrides=[f"train.lr={lr}"]) for lr in (3e-3, 1e-2)[:replicas]])
        if traced:
            g.step.forward = torch.compile(g.step._losses, backend="aot_eager", fullgraph=True, dynamic=False)
        for s in range(4):
            g.step(*g.batch(s))
        runs.append(g.models)
    for eager, traced in zip(*runs):
        assert eager.mixers[1].lam_step.item() == 4 and (eager.mixers[1].lam > 1e-9).all()     # lambda moved
        for (name, a), b in zip(eager.state_dict().items(), traced.state_dict().values()):
            torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7, msg=name)


def _weights(run_dir):
    return torch.load(run_dir / "checkpoint.pt", weights_only=False)["model"]


def _stacked_and_solo(tmp_path, mixer: str, **train_kw):
    """Three [gated_deltanet, mixer] replicas (learning rates 1e-3, 3e-3, 1e-2; seeds 0, 0, 1) trained as one
    vmapped model and as three solo runs: (stacked, solo) run directories."""
    cfgs = []
    for lr, seed in ((1e-3, 0), (3e-3, 0), (1e-2, 1)):
        data = hybrid(mixer, lr=lr, **train_kw)
        data["seed"] = seed
        cfgs.append(load_config(data=data))
    res = train_replicas(cfgs, [tmp_path / "stacked" / str(i) for i in range(3)], progress=False)
    assert [r["replicas"] for r in res] == [3, 3, 3]
    for i, c in enumerate(cfgs):
        train(c, tmp_path / "solo" / str(i), progress=False)
    return [tmp_path / "stacked" / str(i) for i in range(3)], [tmp_path / "solo" / str(i) for i in range(3)]


@pytest.mark.parametrize("mixer", OPTIONS)
def test_stacked_hybrid_replicas_equal_solo_runs(tmp_path, mixer):
    """Stacked replicas (attention written out under vmap) end with the weights, buffers (LTE's lambda, its running
    count and step: updated in the forward) and test losses of solo runs (SDPA under the pattern's mask)."""
    stacked, solo = _stacked_and_solo(tmp_path, mixer)
    for i, (sd, od) in enumerate(zip(stacked, solo)):
        a, b = _weights(sd), _weights(od)
        for k in b:
            torch.testing.assert_close(a[k], b[k], rtol=1e-9, atol=1e-11, msg=f"replica {i}: {k}")
        ca, cb = (torch.load(d / "chosen.pt", weights_only=False) for d in (sd, od))   # the step chosen on val
        assert ca["step"] == cb["step"]
        for k in cb["model"]:
            torch.testing.assert_close(ca["model"][k], cb["model"][k], rtol=1e-9, atol=1e-11, msg=f"chosen {i}: {k}")
        ra, rb = (json.loads((d / "result.json").read_text()) for d in (sd, od))
        assert [h["test/loss"] for h in ra["history"]] == pytest.approx([h["test/loss"] for h in rb["history"]],
                                                                         rel=1e-9)
    if mixer == "lte":
        w = _weights(solo[2])
        assert w["blocks.1.mixer.lam_step"] == 4 and (w["blocks.1.mixer.lam"] > 1e-9).all()    # lambda moved


# ---- on a GPU: the compiled FlexAttention path, and a replayed CUDA graph -------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention compiles its backward on a GPU only")
@pytest.mark.parametrize("name", PATTERNS)
def test_compiled_flex_attention_equals_sdpa_on_the_gpu(name):
    """``attend`` compiled (FlexAttention with the block mask built inside the graph) against ``attend`` eager
    (SDPA with the boolean mask): outputs and the gradients of q, k, v, float32, T 700 (six tiles, the last
    partial), head dim 16. A tile left out or a wrong mask_mod would be off by O(1) in some rows."""
    t = 700
    pattern = make_pattern(name, t, "cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(B, t, H, 16, device="cuda", generator=g) for _ in range(4))
    dout = dout.transpose(1, 2)

    def run(f):
        inputs = [z.clone().requires_grad_() for z in (q, k, v)]
        out = f(*inputs, pattern)
        return [out, *torch.autograd.grad(out, inputs, dout)]

    compiled = run(torch.compile(swa.attend, fullgraph=True, dynamic=False))
    eager = run(swa.attend)
    for a, b in zip(compiled, eager):
        assert ((a - b).norm() / b.norm()).item() < 2e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA's fused attention kernels need a GPU")
@pytest.mark.parametrize("mixer", OPTIONS)
def test_stacked_hybrid_replicas_train_on_the_gpu_as_solo_runs(tmp_path, mixer):
    """On CUDA the one fused kernel that takes a mask (memory-efficient attention) fails on vmap's batched tensors;
    stacked replicas must train there, uncompiled, float32, to the weights of solo runs (which use that kernel):
    every tensor within 1e-3 of its largest entry (float32 rounding over 4 steps; NSA's largest gap on an H200 was
    3.9e-4, and 2e-14 in float64)."""
    stacked, solo = _stacked_and_solo(tmp_path, mixer, precision="fp32", device="cuda", compile=False,
                                      cuda_graph=False)
    for i, (sd, od) in enumerate(zip(stacked, solo)):
        a, b = _weights(sd), _weights(od)
        for k in b:
            if b[k].is_floating_point():
                gap = (a[k].double() - b[k].double()).abs().max() / b[k].double().abs().max().clamp(min=1e-12)
                assert gap.item() < 1e-3, f"replica {i}: {k}: stacked and solo differ by {gap.item():.1e}"
            else:
                assert torch.equal(a[k].cpu(), b[k].cpu()), f"replica {i}: {k}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("mixer", ["swa", "lte", "moba"])
def test_a_replayed_hybrid_step_is_the_compiled_step_from_the_same_state(mixer):
    """One replayed step of the compiled GDN + sparse-attention step (FlexAttention with block masks built on
    the device; a batch the capture never saw) against the same compiled step run outside the graph from the
    same weights, optimizer state and buffers (LTE's lambda), on the same stream. A block mask or a keep mask
    baked in at capture would differ by the step's own size."""
    from sandbox.train.step import Step

    data = hybrid(mixer, precision="bf16", device="cuda")
    data["model"].update(d_model=64)
    cfg = load_config(data=data)
    task, m = build(cfg, torch.device("cuda"))
    step = Step([m], [cfg.train], per_row=getattr(task, "max_targets", None), autocast_dtype=torch.bfloat16,
                capture_after=2, compile=True)
    batches = [task.sample(16, index=i) for i in range(4)]
    for x, y in batches[:3]:
        step(x, y)
    assert step.graph is not None
    opt = step.optimizer
    state = [opt.flat, opt.exp_avg, opt.exp_avg_sq, step.counter, step.loss_sum, step.lr, *m.buffers()]
    moved, gap = replay_gap(step, state, batches[3])
    print(f"one replayed step moved the weights {moved:.1e}; replay vs compiled step {gap:.1e}")
    assert moved > 1e-4
    assert gap <= 1e-6, f"replay vs compiled step from the same state: {gap:.2e} (the step moved {moved:.2e})"

"""Sparse-attention mixers (swa, lte, moba, nsa) against naive per-query references in float64
(outputs and gradients),
the LTE inference cache against the training mask and a plain-Python eviction reference, the
lambda feedback loop against a scalar transcription of algorithm 1, and hybrid layer patterns."""
from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

from sandbox.mixers import MixerContext, build_mixer
from sandbox.mixers.block_sparse import MoBAConfig, NSAConfig
from sandbox.mixers.lte import LTEConfig, use_cache, value_gate
from sandbox.mixers.swa import SWAConfig, rope

D, H = 16, 2
DH = D // H


def make(name, cfg, seed=0, d=D, h=H):
    torch.manual_seed(seed)
    m = build_mixer(name, MixerContext(d, h, 0, 256), cfg).double()
    for p in m.parameters():                    # larger than the model's 0.02 init: peaky attention
        if p.dim() >= 2:
            torch.nn.init.normal_(p, std=0.3)
    return m.eval()


def naive_attention(q, k, v, allowed):
    """q, k, v [b, t, h, dh]; allowed(b, h, i) -> list of visible key indices. Returns [b, h, t, dh]."""
    b, t, h, dh = q.shape
    out = torch.zeros(b, h, t, dh, dtype=q.dtype)
    for bi in range(b):
        for hi in range(h):
            for i in range(t):
                js = allowed(bi, hi, i)
                s = torch.stack([q[bi, i, hi] @ k[bi, j, hi] for j in js]) / math.sqrt(dh)
                p = torch.softmax(s, 0)
                out[bi, hi, i] = sum(p[n] * v[bi, j, hi] for n, j in enumerate(js))
    return out


def assert_same_and_same_grads(m, x, out, ref):
    """``out`` (the mixer) equals ``ref`` (a reference from the same ``x`` and parameters), and so do their
    gradients with respect to ``x`` and every parameter, for one random output gradient."""
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    inputs = [x, *m.parameters()]
    got = torch.autograd.grad(out, inputs, g, allow_unused=True)
    want = torch.autograd.grad(ref, inputs, g, allow_unused=True)
    for (name, _), a, b in zip([("x", x), *m.named_parameters()], got, want):
        if a is None or b is None:
            assert a is None and b is None, name
        else:
            torch.testing.assert_close(a, b, msg=name)


def qkv_of(m, x):
    q, k, v = m.project(x)
    qr, kr = m.positional(q, k)
    return q, k, v, qr, kr


# ---- swa ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("window,sinks,use_rope", [(5, 2, True), (1, 0, False), (7, 3, False)])
def test_swa_matches_naive_mask(window, sinks, use_rope):
    m = make("swa", SWAConfig(window=window, sinks=sinks, rope=use_rope))
    x = torch.randn(2, 19, D, dtype=torch.float64, requires_grad=True)
    _, _, v, qr, kr = qkv_of(m, x)
    ref = naive_attention(qr, kr, v, lambda b, h, i: [j for j in range(i + 1) if i - j < window or j < sinks])
    assert_same_and_same_grads(m, x, m(x), m.finish(ref))


def test_swa_with_large_window_is_attention():
    m = make("swa", SWAConfig(window=64, sinks=0, rope=False))
    a = build_mixer("attention", MixerContext(D, H, 0, 256)).double().eval()
    a.load_state_dict(m.state_dict())
    x = torch.randn(2, 23, D, dtype=torch.float64)
    torch.testing.assert_close(m(x), a(x))


def test_rope_preserves_relative_dot_products():
    x, y = torch.randn(2, 8, dtype=torch.float64)
    dot = lambda i, j: rope(x, torch.tensor(i)) @ rope(y, torch.tensor(j))
    assert dot(5, 2) == pytest.approx(float(dot(13, 10)))
    assert dot(0, 0) == pytest.approx(float(x @ y))


# ---- lte ----------------------------------------------------------------------------------------

def lte(seed=0, **kw):
    cfg = dict(window=13, sinks=2, cap=1000, dropout=0.0, rope=True)
    cfg.update(kw)
    return make("lte", LTEConfig(**cfg), seed)


def force_scores(m, logit):
    with torch.no_grad():
        m.cnn.head.weight.zero_()
        m.cnn.head.bias.fill_(logit)


def test_lte_scores_one_is_full_attention_and_zero_is_swa_sink():
    x = torch.randn(2, 40, D, dtype=torch.float64)
    m = lte()
    _, _, v, qr, kr = qkv_of(m, x)
    force_scores(m, 60.0)
    full = naive_attention(qr, kr, v, lambda b, h, i: list(range(i + 1)))
    torch.testing.assert_close(m(x), m.finish(full))
    force_scores(m, -60.0)
    swa = make("swa", SWAConfig(window=13, sinks=2, rope=True))
    swa.load_state_dict({k: t for k, t in m.state_dict().items() if k.startswith(("qkv", "out"))})
    torch.testing.assert_close(m(x), swa(x))


def mixed_lte(x, seed=0, **kw):
    """An LTE layer whose scores on ``x`` straddle 0.5 in every head (median logit at 0)."""
    m = lte(seed, **kw)
    with torch.no_grad():
        _, k, v = m.project(x)
        logits = m.cnn(torch.cat([k, v], -1))
        m.cnn.head.bias -= logits.flatten(0, 1).median(0).values
    return m


def test_lte_training_mask_matches_naive_eq5():
    x = torch.randn(2, 45, D, dtype=torch.float64)
    m = mixed_lte(x, window=14, sinks=3)
    _, k, v, qr, kr = qkv_of(m, x)
    r = m.retention(k, v)
    keep = r > 0.5
    assert 0 < keep.sum() < keep.numel()
    ref = naive_attention(qr, kr, v, lambda b, h, i: [j for j in range(i + 1)
                                                      if j < 3 or i - j < 14 or keep[b, j, h]])
    torch.testing.assert_close(m(x), m.finish(ref))


class _ValueGateBefore(torch.autograd.Function):
    """The straight-through gate as lte.py wrote it before ``value_gate``: forward ``v``, ``dL/dr = <v, dL/dv>``."""

    @staticmethod
    def forward(ctx, v, r):
        ctx.save_for_backward(v)
        return v.clone()

    @staticmethod
    def backward(ctx, grad):
        (v,) = ctx.saved_tensors
        return grad, (grad * v).sum(-1)


def test_lte_training_forward_and_backward_match_naive_eq5_with_the_straight_through_gate():
    """In training, the scores learn only through the value gate (eq. 6): outputs and the gradients of x and of
    every parameter (the CNN's included) equal a per-query reference whose values pass the gate as an
    ``autograd.Function``."""
    x = torch.randn(2, 45, D, dtype=torch.float64)
    m = mixed_lte(x, window=14, sinks=3).train()
    x.requires_grad_()
    _, k, v, qr, kr = qkv_of(m, x)
    r = m.retention(k, v)
    keep = (r > 0.5).detach()
    assert 0 < keep.sum() < keep.numel()
    ref = naive_attention(qr, kr, _ValueGateBefore.apply(v, r),
                          lambda b, h, i: [j for j in range(i + 1) if j < 3 or i - j < 14 or keep[b, j, h]])
    assert_same_and_same_grads(m, x, m(x), m.finish(ref))
    assert m.cnn.convs[0].weight.requires_grad


def test_lte_cache_equals_training_mask_below_cap():
    x = torch.randn(3, 60, D, dtype=torch.float64)
    m = mixed_lte(x, seed=1, window=13, sinks=2, cap=64)
    expect = m(x)
    m.capture = {}
    with use_cache(m):
        got = m(x)
    torch.testing.assert_close(got, expect)
    _, k, v = m.project(x)
    r = m.retention(k, v)
    kept = (r[:, 2:60 - 13] > 0.5).sum(1).double().mean(0)      # tokens out of the window at t=59
    assert 0 < kept.min() and kept.max() < 45
    torch.testing.assert_close(m.capture["retained_count"].double(), kept)


def test_lte_cache_cap_keeps_top_scores():
    """Over the cap, the cache follows the paper's policy; reference: a plain-Python simulation."""
    w, s, cap, T = 13, 2, 3, 50
    x = torch.randn(2, T, D, dtype=torch.float64)
    m = mixed_lte(x, seed=2, window=w, sinks=s, cap=cap)
    _, k, v, qr, kr = qkv_of(m, x)
    r = m.retention(k, v)

    def allowed(b, h, i):
        kept = []                                   # (score, pos) of the out-of-window segment
        for p in range(s, i - w + 1):               # tokens that left the window by step i, in order
            sc = float(r[b, p, h].detach())
            if sc <= 0.5:
                continue
            if len(kept) < cap:
                kept.append((sc, p))
            else:
                low = min(range(cap), key=lambda n: kept[n][0])
                if sc > kept[low][0]:
                    kept[low] = (sc, p)
        return sorted({p for _, p in kept} | {j for j in range(i + 1) if j < s or i - j < w})

    ref = naive_attention(qr, kr, v, allowed)
    with use_cache(m):
        got = m(x)
    torch.testing.assert_close(got, m.finish(ref))
    assert any(len(allowed(0, h, T - 1)) == cap + s + w for h in range(H))   # the cap was binding


def test_value_gate_gradient_is_value_dot_grad():
    v = torch.randn(2, 5, 3, 4, dtype=torch.float64, requires_grad=True)
    r = torch.rand(2, 5, 3, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 5, 3, 4, dtype=torch.float64)
    out = value_gate(v, r)
    torch.testing.assert_close(out, v)
    out.backward(g)
    torch.testing.assert_close(r.grad, (g * v).sum(-1).detach())
    torch.testing.assert_close(v.grad, g)


def test_lte_score_gradient_flows_only_in_training():
    x = torch.randn(2, 40, D, dtype=torch.float64)
    m = mixed_lte(x, window=13, sinks=2)
    m.train()
    (m(x) ** 2).sum().backward()
    assert m.cnn.convs[0].weight.grad.abs().sum() > 0
    m.zero_grad()
    m.eval()
    (m(x) ** 2).sum().backward()                    # hard threshold only: no path to the CNN
    assert m.cnn.convs[0].weight.grad is None or m.cnn.convs[0].weight.grad.abs().sum() == 0


def algorithm1(counts, cap, every, alpha, init):
    """Scalar transcription of appendix A, algorithm 1 (one head)."""
    lam, ema, out = init, None, []
    a = 2 / (1 + every / 2)
    for step, c in enumerate(counts):
        ema = c if ema is None else a * c + (1 - a) * ema
        if step % every == 0:
            s = (ema > cap) - (ema < 0.95 * cap)
            lam = min(lam * alpha ** s, 1.0)
            lam = 0.0 if lam < init else lam
            lam = init if (ema > cap and lam == 0) else lam
        out.append(lam)
    return out


def test_lambda_feedback_matches_algorithm1():
    m = lte(cap=10, lambda_every=2, lambda_alpha=4.0, lambda_init=1e-3).float()
    counts = [20.0] * 12 + [9.7] * 4 + [2.0] * 14 + [30.0] * 6
    other = [5.0] * len(counts)                     # head 1 stays under the cap
    got = []
    for c0, c1 in zip(counts, other):
        m._update_lambda(torch.tensor([c0, c1]))
        got.append(m.lam.tolist())
    for head, seq in enumerate((counts, other)):
        ref = algorithm1(seq, 10, 2, 4.0, 1e-3)
        assert [g[head] for g in got] == pytest.approx(ref, rel=1e-5, abs=1e-12)
    ref0 = algorithm1(counts, 10, 2, 4.0, 1e-3)
    assert max(ref0) == 1.0 and 0.0 in ref0 and ref0[-1] > 0   # up to the clamp, to 0, re-enabled


def test_lte_forward_updates_lambda_and_penalty_only_when_training():
    m = lte(window=13, sinks=2, cap=1, lambda_every=1)
    force_scores(m, 3.0)                                    # every token kept: over the cap
    x = torch.randn(2, 40, D, dtype=torch.float64)
    m.train()
    m(x)
    assert m.lam_step.item() == 1 and m.aux_loss() is not None
    lam0 = m.lam.clone()
    m(x)
    assert (m.lam > lam0).all()                            # over the cap: lambda grows
    torch.testing.assert_close(m.count_ema, torch.full((H,), 25.0, dtype=m.count_ema.dtype))
    m.eval()
    m(x)
    assert m.lam_step.item() == 2 and m.aux_loss() is None


def test_lte_dense_steps_keep_everything_while_training():
    x = torch.randn(2, 40, D, dtype=torch.float64)
    m = lte(dense_steps=2)
    _, _, v, qr, kr = qkv_of(m, x)
    force_scores(m, -60.0)                                  # the CNN evicts everything
    full = m.finish(naive_attention(qr, kr, v, lambda b, h, i: list(range(i + 1))))
    m.train()
    torch.testing.assert_close(m(x), full)
    torch.testing.assert_close(m(x), full)
    sparse = m(x)                                           # third training step: scores apply
    m.eval()
    torch.testing.assert_close(sparse, m(x))
    assert (sparse - full).abs().max() > 1e-3


def test_lte_config_errors_name_the_field():
    with pytest.raises(ValueError, match="window"):
        LTEConfig(window=12)
    with pytest.raises(ValueError, match="cap"):
        LTEConfig(cap=-1)


# ---- moba -----------------------------------------------------------------------------------------

def test_moba_all_blocks_is_full_attention():
    m = make("moba", MoBAConfig(block_size=6, top_k=8, rope=True))
    x = torch.randn(2, 41, D, dtype=torch.float64)
    _, _, v, qr, kr = qkv_of(m, x)
    ref = naive_attention(qr, kr, v, lambda b, h, i: list(range(i + 1)))
    torch.testing.assert_close(m(x), m.finish(ref))


def test_moba_topk_matches_naive():
    B, K, T = 5, 2, 33
    m = make("moba", MoBAConfig(block_size=B, top_k=K, rope=False))
    x = torch.randn(2, T, D, dtype=torch.float64, requires_grad=True)
    _, _, v, qr, kr = qkv_of(m, x)

    def allowed(b, h, i):
        own = i // B
        past = [(float((qr[b, i, h] @ kr[b, n * B:(n + 1) * B, h].mean(0)).detach()), n) for n in range(own)]
        chosen = {own} | {n for _, n in sorted(past, reverse=True)[:K - 1]}
        return [j for j in range(i + 1) if j // B in chosen]

    ref = naive_attention(qr, kr, v, allowed)
    assert_same_and_same_grads(m, x, m(x), m.finish(ref))


# ---- nsa ------------------------------------------------------------------------------------------

def test_nsa_matches_naive():
    l, d, L, n, w, T = 4, 2, 4, 4, 5, 26
    m = make("nsa", NSAConfig(cmp_block=l, cmp_stride=d, slc_block=L, slc_count=n, window=w, rope=True))
    x = torch.randn(2, T, D, dtype=torch.float64, requires_grad=True)
    q, kc, vc, ks, vs, kw, vw = m.qkv(x).view(2, T, 7, H, DH).unbind(2)
    pos = torch.arange(T)[:, None]
    qr, ks, kw = (rope(z, pos) for z in (q, ks, kw))
    g = torch.sigmoid(m.gate(x)).view(2, T, H, 3)
    out = torch.zeros(2, H, T, DH, dtype=torch.float64)
    nc = (T - l) // d + 1
    for b in range(2):
        for h in range(H):
            def block(z, c, which):
                return (z[b, c * d:c * d + l, h] + m.cmp_pos[which]).reshape(-1)
            kcmp = [m.cmp_k(block(kc, c, 0)) for c in range(nc)]
            vcmp = [m.cmp_v(block(vc, c, 1)) for c in range(nc)]
            for i in range(T):
                vis = [c for c in range(nc) if c * d + l - 1 <= i]
                o_c = torch.zeros(DH, dtype=torch.float64)
                imp = [0.0] * (i // L + 1)
                if vis:
                    p = torch.softmax(torch.stack([q[b, i, h] @ kcmp[c] for c in vis]) / math.sqrt(DH), 0)
                    o_c = sum(p[a] * vcmp[c] for a, c in enumerate(vis))
                    for a, c in enumerate(vis):            # compressed block c covers [c*d, c*d + l)
                        for jb in range(len(imp)):
                            if c * d < (jb + 1) * L and c * d + l > jb * L:
                                imp[jb] += float(p[a].detach())
                own = i // L
                forced = {0, own, own - 1} - {-1}
                rest = sorted((s, jb) for jb, s in enumerate(imp) if jb not in forced)[::-1]
                chosen = forced | {jb for _, jb in rest[:max(0, n - len(forced))]}

                def soft(keys, vals, js):
                    p = torch.softmax(torch.stack([qr[b, i, h] @ keys[b, j, h] for j in js]) / math.sqrt(DH), 0)
                    return sum(p[a] * vals[b, j, h] for a, j in enumerate(js))
                o_s = soft(ks, vs, [j for j in range(i + 1) if j // L in chosen])
                o_w = soft(kw, vw, [j for j in range(i + 1) if i - j < w])
                gi = g[b, i, h]
                out[b, h, i] = gi[0] * o_c + gi[1] * o_s + gi[2] * o_w
    assert_same_and_same_grads(m, x, m(x), m.finish(out))


def test_nsa_config_constraints():
    with pytest.raises(ValueError, match="cmp_stride"):
        NSAConfig(cmp_block=32, cmp_stride=12)
    with pytest.raises(ValueError, match="slc_block"):
        NSAConfig(cmp_block=32, cmp_stride=16, slc_block=40)
    with pytest.raises(ValueError, match="slc_count"):
        NSAConfig(slc_count=2)


# ---- layer patterns and example configs -----------------------------------------------------------

def test_hybrid_pattern_trains_a_step_with_lte_penalty():
    from sandbox.config import load_config
    from sandbox.train import build
    cfg = load_config(data={
        "task": {"name": "mqar", "seq_len": 64, "num_kv_pairs": 4, "vocab_size": 64, "noise": 16,
                 "test_examples": 8},
        "model": {"mixer": ["gated_deltanet", "lte"], "n_layers": 4, "d_model": 32, "n_heads": 2,
                  "lte": {"window": 16, "sinks": 2, "cap": 64}},
        "train": {"device": "cpu"}})
    task, model = build(cfg, torch.device("cpu"))
    assert [type(m).mixer_name for m in model.mixers] == ["gated_deltanet", "lte"] * 2
    x, y = task.sample(4, "train", 0)
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
    aux = model.aux_loss()
    assert aux is not None and aux.requires_grad
    (loss + aux).backward()
    assert model.mixers[1].cnn.head.weight.grad is not None
    model.eval()
    with torch.no_grad():
        expect = model(x)
        with use_cache(model):
            got = model(x)
    torch.testing.assert_close(got, expect)      # 46 out-of-window tokens at most: below the cap of 64


@pytest.mark.parametrize("path", sorted(Path(__file__).parents[1].glob("configs/hybrids/*.yaml")),
                         ids=lambda p: p.stem)
def test_example_configs_load_and_build(path):
    from sandbox.config import load_config
    from sandbox.model import LanguageModel
    cfg = load_config(path, ["task.seq_len=256", "task.noise=64", "task.num_kv_pairs=8"])
    model = LanguageModel(cfg.model, 600, 256)
    with torch.no_grad():
        assert model(torch.randint(0, 600, (1, 256))).shape == (1, 256, 600)


def test_lte_eval_cli_on_longer_sequences(tmp_path, capsys):
    from sandbox.cli import main
    from sandbox.config import load_config, to_dict
    from sandbox.train import build
    cfg = load_config(data={
        "task": {"name": "mqar", "seq_len": 48, "num_kv_pairs": 2, "vocab_size": 32, "test_examples": 4},
        "model": {"mixer": ["gla", "lte"], "d_model": 16, "n_layers": 2, "n_heads": 2,
                  "lte": {"window": 13, "sinks": 2, "cap": 3}},
        "train": {"device": "cpu"}})
    _, model = build(cfg, torch.device("cpu"))
    torch.save({"model": model.state_dict(), "config": to_dict(cfg)}, tmp_path / "checkpoint.pt")
    assert main(["lte-eval", str(tmp_path), "--device", "cpu", "--batch-size", "4",
                 "--set", "task.seq_len=80"]) == 0
    out = capsys.readouterr().out
    assert "seq_len 80" in out and "cap 3" in out
    occupancy = ast.literal_eval(out.split("cache occupancy ")[1].split(" (cap")[0])
    assert max(occupancy) <= 3
    assert main(["lte-eval", str(tmp_path), "--set", "model.d_model=8"]) == 2


def test_sse_h_pattern_builds_and_backprops():
    from sandbox.config import load_config
    from sandbox.model import LanguageModel
    cfg = load_config(data={
        "task": {"name": "mqar", "seq_len": 32, "num_kv_pairs": 2, "vocab_size": 32},
        "model": {"mixer": ["sse"] * 5 + ["attention"], "n_layers": 6, "d_model": 32, "n_heads": 2},
        "train": {"device": "cpu"}})
    model = LanguageModel(cfg.model, 32, 32)
    assert [type(m).mixer_name for m in model.mixers] == ["sse"] * 5 + ["attention"]
    logits = model(torch.randint(0, 32, (2, 32)))
    aux = model.aux_loss()
    (logits.logsumexp(-1).mean() + (aux if aux is not None else 0)).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.mixers[0].parameters())

"""Every registered linear-attention mixer: chunked (torch) vs per-step (naive) in float64,
row-sparse top-k leaves unchosen rows bit-identical, balance loss (state size: test_state_size.py)."""
import dataclasses
import math

import pytest
import torch

from sandbox.kernels import chunk_reference, recurrent_reference
from sandbox.kernels.slot_scores import LOG_GATE_MIN, slot_scores
from sandbox.mixers import MixerContext, build_mixer, mixer_config_class, mixer_names
from sandbox.mixers.base import _REGISTRY
from sandbox.kernels.topk_mask import topk_mask
from sandbox.mixers.feature_maps import balance_loss, chosen_indices
from sandbox.mixers.linear import LinearMixer

LINEAR = sorted(n for n in mixer_names() if issubclass(_REGISTRY[n][0], LinearMixer))
CTX = MixerContext(d_model=20, n_heads=2, layer_idx=0, max_seq_len=128)  # K = 10 (or 5), V = 10 / 20


def make(name, seed=0, **overrides):
    cls = mixer_config_class(name)
    if "num_slots" in {f.name for f in dataclasses.fields(cls)}:
        overrides.setdefault("num_slots", 6)
    torch.manual_seed(seed)
    return build_mixer(name, CTX, cls(**overrides)).double()


def test_all_family_members_registered():
    assert set(LINEAR) == {"linear_attention", "retnet", "gla", "mamba2", "hgrn2", "deltanet",
                           "gated_deltanet", "metala", "gsa"}


@pytest.mark.parametrize("topk", [None, 3])
@pytest.mark.parametrize("name", LINEAR)
def test_torch_matches_naive(name, topk):
    fast = make(name, topk=topk, impl="torch")
    slow = make(name, topk=topk, impl="naive")
    slow.load_state_dict(fast.state_dict())
    x = torch.randn(2, 70, CTX.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    w = torch.randn(2, 70, CTX.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    outs = []
    for m in (fast, slow):
        xi = x.clone().requires_grad_(True)
        y = m(xi)
        (y * w).sum().backward()
        outs.append((y.detach(), xi.grad, {n: p.grad for n, p in m.named_parameters()}))
    (y1, gx1, gp1), (y2, gx2, gp2) = outs
    torch.testing.assert_close(y1, y2, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(gx1, gx2, rtol=1e-8, atol=1e-9)
    for n in gp1:
        assert gp1[n] is not None, f"no gradient reaches {n}"
        torch.testing.assert_close(gp1[n], gp2[n], rtol=1e-8, atol=1e-9, msg=lambda s: f"{name}.{n}: {s}")


def one_step_keeps_unselected_rows(q, k, v, g, beta, mask, t):
    """Run the reference to step t-1, then one step; rows off the mask at t must be untouched."""
    sl = lambda z, a, b: None if z is None else z[:, a:b]  # noqa: E731
    _, S = recurrent_reference(sl(q, 0, t), sl(k, 0, t), sl(v, 0, t), sl(g, 0, t), sl(beta, 0, t),
                               output_final_state=True)
    _, S1 = recurrent_reference(sl(q, t, t + 1), sl(k, t, t + 1), sl(v, t, t + 1), sl(g, t, t + 1),
                                sl(beta, t, t + 1), initial_state=S, output_final_state=True)
    off = ~mask[:, t]  # [B, H, K]
    assert off.any() and (~off).any()
    assert torch.equal(S1[off], S[off]), "an unselected row changed"
    assert not torch.equal(S1[~off], S[~off]), "selected rows did not change"


@pytest.mark.parametrize("name", LINEAR)
def test_topk_leaves_unselected_rows_bit_identical(name):
    m = make(name, topk=3, impl="naive")
    m.capture = {}                                          # the chosen rows' indices are recorded only then
    x = torch.randn(2, 9, CTX.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        p = m.features(x)
    B, T, H, K = p["k"].shape
    mask = torch.zeros(B, T, H, K, dtype=torch.bool).scatter_(-1, p["routing"], True)
    assert (mask.sum(-1) == 3).all()
    # the kernel contract: zero keys and zero log-decay (gate 1) off the chosen rows
    assert torch.equal(p["k"][~mask], torch.zeros_like(p["k"][~mask]))
    assert (p["k"][mask] > 0).all()
    if p["g"] is not None:
        assert p["g"].shape == (B, T, H, K)
        assert torch.equal(p["g"][~mask], torch.zeros_like(p["g"][~mask]))
        assert (p["g"][mask] < 0).all()
    # and the recurrence itself across one step (write and decay)
    if name == "gsa":
        probs = torch.rand(B, T, H, K, dtype=torch.float64)
        one_step_keeps_unselected_rows(probs, p["k"], p["v"], p["g"], None, mask, 5)
        # pass 1: one [d_k, 1] state per (head, slot); unselected slots keep theirs
        dk = p["q"].shape[-1]
        rep = lambda z: z[:, :, :, None].expand(B, T, H, K, dk).reshape(B, T, H * K, dk)  # noqa: E731
        mask1 = mask.reshape(B, T, H * K, 1).expand(B, T, H * K, dk)
        one_step_keeps_unselected_rows(rep(p["q"]), rep(p["k1"]), p["k"].reshape(B, T, H * K, 1),
                                       p["g"].reshape(B, T, H * K), None, mask1, 5)
    else:
        one_step_keeps_unselected_rows(p["q"], p["k"], p["v"], p["g"], p["beta"], mask, 5)


@pytest.mark.parametrize("c,k", [(5, 1), (5, 3), (32, 8), (64, 16), (64, 64)])
def test_topk_mask_chooses_what_torch_topk_chooses(c, k):
    """Without ties (float64 normals) the pairwise-comparison mask is torch.topk's set, exactly k per row, and
    the recorded indices are topk's, largest first."""
    x = torch.randn(3, 7, 2, c, dtype=torch.float64, generator=torch.Generator().manual_seed(c + k))
    want = x.topk(k, dim=-1)
    mask = topk_mask(x, k)
    assert torch.equal(mask, torch.zeros_like(mask).scatter_(-1, want.indices, True))
    assert torch.equal(chosen_indices(x, mask, k), want.indices)


def test_topk_mask_gives_ties_to_the_earlier_entry():
    """Closed-form cases: exactly k chosen even when values tie across the cut."""
    x = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0], [0.0, -1.0, 5.0, -1.0, -1.0]])
    assert topk_mask(x, 2).tolist() == [[False, True, True, False, False], [True, True, False, False, False],
                                        [True, False, True, False, False]]
    assert topk_mask(x, 3)[2].tolist() == [True, True, True, False, False]
    with pytest.raises(ValueError, match="topk must be in"):
        topk_mask(x, 6)


def test_chunked_form_keeps_never_selected_rows_bit_identical():
    """A row with zero key and zero log-decay over a whole sequence keeps its initial state exactly."""
    gen = torch.Generator().manual_seed(4)
    B, T, H, K, V = 1, 40, 2, 6, 5
    keep = torch.rand(B, T, H, K, generator=gen) < 0.5
    keep[..., 2] = False
    k = torch.randn(B, T, H, K, generator=gen).softmax(-1) * keep
    g = (-torch.rand(B, T, H, K, generator=gen)) * keep
    q, v = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, V, generator=gen)
    S0 = torch.randn(B, H, K, V, generator=gen)
    for beta in (None, torch.rand(B, T, H, generator=gen)):
        _, S = chunk_reference(q, k, v, g, beta, initial_state=S0, output_final_state=True, chunk_size=16)
        assert torch.equal(S[:, :, 2], S0[:, :, 2])


def naive_slot_scores(q, k, s, g, scale):
    """GSA pass 1, one token at a time: K~_t = diag(exp(g_t)) K~_{t-1} + s_t^T k_t, o_t = scale K~_t q_t."""
    B, T, H, dk = q.shape
    S = q.new_zeros(B, H, s.shape[-1], dk)
    outs = []
    for t in range(T):
        S = g[:, t].exp()[..., None] * S + s[:, t, :, :, None] * k[:, t, :, None, :]
        outs.append(scale * torch.einsum("bhmd,bhd->bhm", S, q[:, t]))
    return torch.stack(outs, 1), S


@pytest.mark.parametrize("T", [5, 37])
def test_slot_scores_match_per_token_loop(T):
    """Outputs, final state and gradients in float64 with strong decay (alpha down to e^-7.9) and
    top-k-like slots (alpha = 1, s = 0); float32 stays finite and close where a chunk-start form
    would overflow (exp(16 * 7.9)); gates below the clamp keep at most e^-8 of the old state."""
    gen = torch.Generator().manual_seed(6)
    B, H, dk, m = 2, 2, 5, 7
    chosen = torch.rand(B, T, H, m, generator=gen) < 0.6
    q = torch.randn(B, T, H, dk, generator=gen, dtype=torch.float64)
    k = torch.randn(B, T, H, dk, generator=gen, dtype=torch.float64)
    chosen[..., 0] = True  # slot 0: alpha < e^-7 at every step, 16 steps decay by > e^-112
    g = torch.where(chosen, -7.9 * torch.rand(B, T, H, m, generator=gen, dtype=torch.float64), 0.0)
    g[..., 0] = -7.0 - 0.9 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    s = -torch.expm1(g) * torch.rand(B, T, H, m, generator=gen, dtype=torch.float64)
    w = torch.randn(B, T, H, m, generator=gen, dtype=torch.float64)
    results = []
    for fn in (slot_scores, lambda *a, **kw: naive_slot_scores(*a, 0.3)):
        xs = [x.clone().requires_grad_(True) for x in (q, k, s, g)]
        o, S = fn(*xs, scale=0.3, output_final_state=True)
        (o * w).sum().backward()
        results.append((o.detach(), S.detach(), [x.grad for x in xs]))
    (o1, S1, grads1), (o2, S2, grads2) = results
    torch.testing.assert_close(o1, o2, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(S1, S2, rtol=1e-10, atol=1e-12)
    for name, a, b in zip("qksg", grads1, grads2):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=lambda e: f"grad {name}: {e}")
    xs = [x.float().requires_grad_(True) for x in (q, k, s, g)]
    o3, S3 = slot_scores(*xs, scale=0.3, output_final_state=True)
    (o3 * w.float()).sum().backward()
    assert all(x.grad.isfinite().all() for x in xs)
    torch.testing.assert_close(o3.double(), o2, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(S3.double(), S2, rtol=1e-4, atol=1e-5)
    g_hard = torch.where(chosen, g - 40.0, 0.0)  # alpha ~ e^-40: clamped to e^-8 in the decay
    o4, _ = slot_scores(q, k, s, g_hard, scale=0.3)
    o5, _ = naive_slot_scores(q, k, s, g_hard, 0.3)
    torch.testing.assert_close(o4, o5, rtol=0, atol=2 * math.exp(LOG_GATE_MIN) * o5.abs().max().item())


@pytest.mark.parametrize("name", ["gla", "gsa"])
def test_balance_loss_matches_hand_computation(name):
    alpha, topk = 0.3, 3
    m = make(name, topk=topk, balance_alpha=alpha)
    m.capture = {}
    x = torch.randn(3, 11, CTX.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    m(x)
    loss = m.aux_loss()
    keys, idx = m.capture["keys"], m.capture["routing"]
    B, T, H, c = keys.shape
    per_head = []
    for h in range(H):
        total = 0.0
        for i in range(c):
            f_i = sum(int(i in idx[b, t, h].tolist()) for b in range(B) for t in range(T)) / (B * T)
            p_i = sum(keys[b, t, h, i].item() for b in range(B) for t in range(T)) / (B * T)
            total += f_i * p_i
        per_head.append(alpha * c / topk * total)
    assert loss.requires_grad
    assert abs(loss.item() - sum(per_head) / H) < 1e-12
    loss.backward()  # reaches the key projection through P_i
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


def test_balance_loss_is_alpha_under_uniform_usage():
    c, k = 8, 2
    idx = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]])  # every row chosen once
    mask = torch.zeros(4, c, dtype=torch.bool).scatter_(-1, idx, True)
    keys = mask.double() / k
    assert abs(balance_loss(keys[None, :, None], mask[None, :, None], k, 0.5).item() - 0.5) < 1e-12


def test_no_aux_loss_without_balance():
    m = make("gla", topk=3)
    m(torch.randn(1, 4, CTX.d_model, dtype=torch.float64))
    assert m.aux_loss() is None


def test_captures_have_documented_shapes():
    m = make("gla", topk=2)
    m.capture = {}
    m(torch.randn(2, 7, CTX.d_model, dtype=torch.float64))
    K, V = m.K, m.V
    assert m.capture["keys"].shape == (2, 7, 2, K)
    assert m.capture["values"].shape == (2, 7, 2, V)
    assert m.capture["queries"].shape == (2, 7, 2, K)
    assert m.capture["gates"].shape == (2, 7, 2, K)
    assert m.capture["routing"].shape == (2, 7, 2, 2)
    assert m.capture["final_state"].shape == (2, 2, K, V)


def test_short_conv_is_causal():
    m = make("deltanet", conv_size=4)
    x = torch.randn(1, 12, CTX.d_model, dtype=torch.float64)
    y = m(x)
    x2 = x.clone()
    x2[:, 8:] += 1.0
    y2 = m(x2)
    assert torch.equal(y[:, :8], y2[:, :8]) and not torch.equal(y[:, 8:], y2[:, 8:])


@pytest.mark.parametrize("T, w", [(1, 4), (3, 4), (12, 4), (9, 2), (5, 1)])
def test_short_conv_under_compile_equals_torchs_depthwise_conv1d(T, w):
    """The conv op as a compiled model runs it: values and gradients against ``conv1d`` with groups = channels
    on the left-padded input (float64; traced by Dynamo, run by AOTAutograd)."""
    from sandbox.kernels.short_conv import short_conv
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w: short_conv(x, w)[0], backend="aot_eager", fullgraph=True)
    g = torch.Generator().manual_seed(T * 10 + w)
    x = torch.randn(2, T, 6, dtype=torch.float64, generator=g, requires_grad=True)
    wt = torch.randn(6, w, dtype=torch.float64, generator=g, requires_grad=True)
    dy = torch.randn(2, T, 6, dtype=torch.float64, generator=g)
    ref = torch.nn.functional.silu(torch.nn.functional.conv1d(
        torch.nn.functional.pad(x.transpose(1, 2), (w - 1, 0)), wt[:, None, :], groups=6).transpose(1, 2))
    gref = torch.autograd.grad(ref, (x, wt), dy)
    y = compiled(x, wt)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(y, (x, wt), dy), gref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("field,value,match", [
    ("topk", 11, "topk"), ("topk", 0, "topk"), ("transition", "lstm", "transition"),
    ("feature_map", "tanh", "feature_map"), ("balance_alpha", 0.1, "balance_alpha"),
    ("impl", "cuda", "impl"), ("output_norm", "batch", "output_norm"),
])
def test_bad_config_is_a_clear_error(field, value, match):
    with pytest.raises(ValueError, match=match):
        make("gla" if field != "topk" else "deltanet", **{field: value})


@pytest.mark.parametrize("overrides", [{}, {"conv_size": 4, "topk": 3}], ids=["plain", "conv_topk"])
@pytest.mark.parametrize("name", LINEAR)
def test_one_product_for_the_input_projections_equals_one_per_module(name, overrides, monkeypatch):
    """``project`` multiplies x by the stacked bias-free weights once (and its backward concatenates the pieces'
    gradients with ``sandbox::cat_columns``); calling each projection module on x (what it replaced) must give
    the same output and gradients, in float64."""
    overrides = dict(overrides)
    if overrides.get("conv_size") and "conv_size" not in {f.name for f in dataclasses.fields(mixer_config_class(name))}:
        overrides.pop("conv_size")
    fused = make(name, **overrides, impl="torch")
    split = make(name, **overrides, impl="torch")
    split.load_state_dict(fused.state_dict())
    gate = split.gate_proj[0] if isinstance(split.gate_proj, torch.nn.Sequential) else split.gate_proj
    mods = {"q": split.q_proj, "k": split.k_proj, "v": split.v_proj,
            "gate": gate if gate is not None and gate.bias is None else None, "og": split.g_proj}
    def per_module(x):
        out = {n: m(x) for n, m in mods.items() if m is not None}
        if split.conv is not None:          # the convolution's input: q, k, v side by side
            out = {"qkv": torch.cat([out.pop(n) for n in ("q", "k", "v") if n in out], -1), **out}
        return out

    monkeypatch.setattr(split, "project", per_module)
    x = torch.randn(2, 40, CTX.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    outs = []
    for m in (fused, split):
        xi = x.clone().requires_grad_(True)
        m(xi).square().sum().backward()
        outs.append((m(xi).detach(), xi.grad, {n: p.grad for n, p in m.named_parameters()}))
    (y1, gx1, gp1), (y2, gx2, gp2) = outs
    torch.testing.assert_close(y1, y2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gx1, gx2, rtol=1e-10, atol=1e-12)
    for n in gp2:
        torch.testing.assert_close(gp1[n], gp2[n], rtol=1e-10, atol=1e-12, msg=lambda s: f"{name}.{n}: {s}")

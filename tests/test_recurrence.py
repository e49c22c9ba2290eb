"""The chunked torch form against the per-step reference (float64, outputs and gradients),
and the reference against closed forms."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from sandbox.kernels import chunk_reference, linear_recurrence, recurrent_reference

D = torch.float64


def make_inputs(B, T, H, K, V, gate, decay, delta, seed=0, n_state=None):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen, dtype=D)
    k = torch.randn(B, T, H, K, generator=gen, dtype=D)
    if delta:
        k = F.normalize(k, dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=D)
    strength = {"weak": 0.05, "strong": 20.0}[decay]
    g = None
    if gate == "scalar":
        g = -torch.rand(B, T, H, generator=gen, dtype=D) * strength
    elif gate == "diagonal":
        g = -torch.rand(B, T, H, K, generator=gen, dtype=D) * strength
    beta = torch.rand(B, T, H, generator=gen, dtype=D) if delta else None
    S0 = torch.randn(n_state or B, H, K, V, generator=gen, dtype=D)
    return q, k, v, g, beta, S0


def run_both(q, k, v, g, beta, S0, cu_seqlens=None, chunk_size=8):
    leaves = [x.clone().requires_grad_(True) if x is not None else None for x in (q, k, v, g, beta, S0)]
    results = []
    for fn, kw in ((recurrent_reference, {}), (chunk_reference, {"chunk_size": chunk_size})):
        xs = [x.detach().clone().requires_grad_(True) if x is not None else None for x in leaves]
        o, s = fn(*xs[:5], scale=0.7, initial_state=xs[5], output_final_state=True, cu_seqlens=cu_seqlens, **kw)
        gen = torch.Generator().manual_seed(123)
        loss = (o * torch.randn(o.shape, generator=gen, dtype=D)).sum() + (s * torch.randn(s.shape, generator=gen, dtype=D)).sum()
        loss.backward()
        results.append((o.detach(), s.detach(), [None if x is None else x.grad for x in xs]))
    return results


CASES = [
    (gate, decay, delta)
    for gate in ("none", "scalar", "diagonal")
    for decay in ("weak", "strong")
    for delta in (False, True)
    if not (gate == "none" and decay == "strong")
]


@pytest.mark.parametrize("gate,decay,delta", CASES)
def test_chunked_matches_recurrent(gate, decay, delta):
    # T = 21 is not a multiple of the chunk (8); K = 5, V = 3 are not powers of two.
    q, k, v, g, beta, S0 = make_inputs(2, 21, 2, 5, 3, gate, decay, delta)
    (o1, s1, g1), (o2, s2, g2) = run_both(q, k, v, g, beta, S0)
    torch.testing.assert_close(o2, o1, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(s2, s1, rtol=1e-9, atol=1e-10)
    for name, a, b in zip("q k v g beta initial_state".split(), g1, g2):
        if a is None:
            assert b is None
            continue
        torch.testing.assert_close(b, a, rtol=1e-8, atol=1e-9, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("decay,delta", [("weak", False), ("strong", False), ("weak", True), ("strong", True)])
def test_chunked_diagonal_sub_blocks_match_recurrent(decay, delta):
    # chunk 32 splits into two 16-step sub-blocks (the off-diagonal block uses a matmul); T = 45
    q, k, v, g, beta, S0 = make_inputs(1, 45, 2, 7, 3, "diagonal", decay, delta, seed=6)
    (o1, s1, g1), (o2, s2, g2) = run_both(q, k, v, g, beta, S0, chunk_size=32)
    torch.testing.assert_close(o2, o1, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(s2, s1, rtol=1e-9, atol=1e-10)
    for a, b in zip(g1, g2):
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("gate,delta", [("scalar", False), ("diagonal", False), ("scalar", True), ("none", True)])
def test_cu_seqlens_with_empty_segment(gate, delta):
    cu = torch.tensor([0, 7, 7, 18, 19], dtype=torch.int64)
    q, k, v, g, beta, S0 = make_inputs(1, 19, 2, 3, 6, gate, "weak", delta, seed=1, n_state=4)
    (o1, s1, g1), (o2, s2, g2) = run_both(q, k, v, g, beta, S0, cu_seqlens=cu, chunk_size=4)
    torch.testing.assert_close(o2, o1, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(s2, s1, rtol=1e-9, atol=1e-10)
    for a, b in zip(g1, g2):
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-8, atol=1e-9)
    # the empty segment passes its initial state through untouched
    assert torch.equal(s1[1], S0[1])
    # each segment equals an independent run of that segment alone
    c = cu.tolist()
    for n, (s, e) in enumerate(zip(c, c[1:])):
        if e == s:
            continue
        sl = lambda x: None if x is None else x[:, s:e]
        o, st = recurrent_reference(sl(q), sl(k), sl(v), sl(g), sl(beta), scale=0.7,
                                    initial_state=S0[n:n + 1], output_final_state=True)
        torch.testing.assert_close(o1[:, s:e], o, rtol=0, atol=1e-12)
        torch.testing.assert_close(s1[n:n + 1], st, rtol=0, atol=1e-12)


def test_reference_matches_closed_form_gated():
    """o_t = scale * sum_{s<=t} (q_t . (k_s * exp(G_t - G_s))) v_s  + q_t (exp(G_t) * S0), G = cumsum g."""
    q, k, v, g, _, S0 = make_inputs(1, 9, 1, 4, 2, "diagonal", "weak", False, seed=2)
    o, _ = recurrent_reference(q, k, v, g, scale=0.7, initial_state=S0)
    G = g[0, :, 0].cumsum(0)  # [T, K]
    for t in range(9):
        expect = (q[0, t, 0] * G[t].exp()) @ S0[0, 0]
        for s in range(t + 1):
            expect = expect + (q[0, t, 0] * k[0, s, 0] * (G[t] - G[s]).exp()).sum() * v[0, s, 0]
        torch.testing.assert_close(o[0, t, 0], 0.7 * expect, rtol=1e-12, atol=1e-12)


def test_reference_delta_one_step_by_hand():
    q, k, v, g, beta, S0 = make_inputs(1, 1, 1, 3, 2, "scalar", "weak", True, seed=3)
    o, s = recurrent_reference(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    S = S0[0, 0] * g[0, 0, 0].exp()
    kk, vv = k[0, 0, 0], v[0, 0, 0]
    S = S + beta[0, 0, 0] * torch.outer(kk, vv - kk @ S)
    torch.testing.assert_close(s[0, 0], S, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(o[0, 0, 0], q[0, 0, 0] @ S, rtol=1e-12, atol=1e-12)


def test_strong_decay_float32_is_finite():
    q, k, v, g, beta, S0 = make_inputs(2, 70, 2, 8, 8, "diagonal", "strong", False, seed=4)
    # per-step log-decay down to -20: exp(-cumsum) over a 64-step chunk would overflow float32
    args = [x.float() for x in (q, k, v, g)]
    o_c, s_c = chunk_reference(*args, output_final_state=True, chunk_size=64)
    o_r, s_r = recurrent_reference(*args, output_final_state=True)
    assert torch.isfinite(o_c).all() and torch.isfinite(s_c).all()
    torch.testing.assert_close(o_c, o_r, rtol=1e-4, atol=1e-4)
    assert o_c.dtype == torch.float32 and s_c.dtype == torch.float32


def test_rows_with_zero_key_and_zero_gate_are_bit_identical():
    q, k, v, g, beta, S0 = make_inputs(1, 1, 2, 6, 4, "diagonal", "weak", True, seed=5)
    keep = torch.tensor([True, False, True, False, False, True])
    k = k.masked_fill(~keep, 0.0)
    g = g.masked_fill(~keep, 0.0)
    for b in (None, beta):
        _, s = recurrent_reference(q, k, v, g, b, initial_state=S0, output_final_state=True)
        assert torch.equal(s[:, :, ~keep], S0[:, :, ~keep])
        assert not torch.equal(s[:, :, keep], S0[:, :, keep])


def test_dispatch_and_errors():
    q, k, v, g, beta, S0 = make_inputs(1, 5, 1, 3, 2, "scalar", "weak", False)
    o1, _ = linear_recurrence(q, k, v, g, impl="naive")
    o2, _ = linear_recurrence(q, k, v, g, impl="torch")
    torch.testing.assert_close(o1, o2)
    with pytest.raises(ValueError, match="impl"):
        linear_recurrence(q, k, v, impl="fast")
    with pytest.raises(ValueError, match="g must be"):
        linear_recurrence(q, k, v, g[..., None].expand(1, 5, 1, 2))
    with pytest.raises(ValueError, match="initial_state"):
        linear_recurrence(q, k, v, initial_state=S0[:, :, :2])
    with pytest.raises(ValueError, match="cu_seqlens"):
        linear_recurrence(q, k, v, cu_seqlens=torch.tensor([0, 3, 2, 5]))


def test_auto_on_the_cpu_takes_the_torch_form_without_a_warning(recwarn):
    q, k, v, g, beta, S0 = make_inputs(1, 12, 1, 4, 4, "diagonal", "weak", True)
    o, _ = linear_recurrence(q, k, v, g, beta)
    ref, _ = recurrent_reference(q, k, v, g, beta)
    assert torch.allclose(o, ref, atol=1e-10)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the slow-path warning is about CUDA tensors")
def test_auto_on_the_gpu_says_once_when_it_leaves_the_kernels(monkeypatch):
    pytest.importorskip("triton")
    import sandbox.kernels

    monkeypatch.setattr(sandbox.kernels, "_warned", set())   # a mixer test earlier in the process may have said it
    inputs = make_inputs(1, 64, 2, 16, 16, "diagonal", "weak", True, seed=1)
    q, k, v, g, beta, _ = (x.float().cuda() for x in inputs)
    with pytest.warns(RuntimeWarning, match="delta rule with a per-row gate"):
        linear_recurrence(q, k, v, g, beta)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        linear_recurrence(q, k, v, g, beta)   # said once per process

"""MoM: M=1 is its base mixer; masking vs varlen; a naive per-token loop over memories.
SLA: one head is its base; with several heads, head gates against a naive loop (float64)."""
import pytest
import torch
import torch.nn.functional as F

from sandbox.mixers import MixerContext, build_mixer, mixer_config_class
from sandbox.mixers.mom import MoM, MoMConfig
from sandbox.mixers.sla import SLA, SLAConfig
from grads import run

CTX = MixerContext(d_model=16, n_heads=2, layer_idx=0, max_seq_len=128)
CTX1 = MixerContext(d_model=16, n_heads=1, layer_idx=0, max_seq_len=128)
BASE_OF = {"gla": "gla", "gated_deltanet": "gated_deltanet"}


def inputs(B=2, T=40, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, T, CTX.d_model, dtype=torch.float64, generator=gen),
            torch.randn(B, T, CTX.d_model, dtype=torch.float64, generator=gen))


def base(name, ctx=CTX, seed=0, conv_size=0):
    torch.manual_seed(seed)
    cfg = mixer_config_class(name)()
    cfg.impl, cfg.conv_size = "torch", conv_size
    return build_mixer(name, ctx, cfg).double()


@pytest.mark.parametrize("transition", ["gla", "gated_deltanet"])
def test_mom_with_one_memory_is_its_base(transition):
    x, w = inputs()
    ref = base(transition)
    torch.manual_seed(1)
    mom = MoM(CTX, MoMConfig(n=1, k=1, transition=transition, kernel="torch")).double()
    mom.core.load_state_dict(ref.state_dict())
    ya, gxa, _ = run(ref, x, w)
    yb, gxb, _ = run(mom, x, w)
    torch.testing.assert_close(yb, ya, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gxb, gxa, rtol=1e-9, atol=1e-11)


def naive_mom(m: MoM, x):
    """Per token: router softmax, top-k memories written with weight 1 and read with renormalised weights."""
    cfg, core = m.cfg, m.core
    B, T, _ = x.shape
    H, K, V, N = m.H, m.K, m.V, cfg.n
    gdn = cfg.transition == "gated_deltanet"
    phi = (lambda z: F.normalize(F.silu(z), dim=-1)) if gdn else (lambda z: z)
    p = core.features(x)
    ks, vs = [p["k"]], [p["v"]]
    extra = (x @ m.mem_kv.weight.T).view(B, T, N - 1, H, K + V)
    for i in range(N - 1):
        ks.append(extra[:, :, i, :, :K])
        vs.append(extra[:, :, i, :, K:])
    sh = (x @ m.shared_kv.weight.T).view(B, T, H, K + V) if cfg.shared_memory else None

    def write(S, k, v, g, beta):
        S = S * (g.exp()[..., None] if g.ndim == 2 else g.exp()[:, None, None])
        if not gdn:
            return S + k[..., None] * v[:, None, :]
        err = v - torch.einsum("hk,hkv->hv", k, S)
        return S + beta[:, None, None] * k[..., None] * err[:, None, :]

    outs = []
    for b in range(B):
        S = [torch.zeros(H, K, V, dtype=x.dtype) for _ in range(N + 1)]
        for t in range(T):
            probs = (x[b, t] @ m.router.weight.T).softmax(0)
            top = torch.argsort(probs, descending=True)[: cfg.k]
            weights = probs[top] / probs[top].sum()
            g, beta = p["g"][b, t], None if p["beta"] is None else p["beta"][b, t]
            q = phi(p["q"][b, t])
            o = torch.zeros(H, V, dtype=x.dtype)
            for wgt, i in zip(weights, top.tolist()):
                S[i] = write(S[i], phi(ks[i][b, t]), vs[i][b, t], g, beta)
                o = o + wgt * torch.einsum("hk,hkv->hv", q, S[i])
            if sh is not None:
                S[N] = write(S[N], phi(sh[b, t, :, :K]), sh[b, t, :, K:], g, beta)
                o = o + torch.einsum("hk,hkv->hv", q, S[N])
            outs.append(core.scale * o)
    return core.finish(torch.stack(outs).view(B, T, H, V), x, p)


@pytest.mark.parametrize("transition,shared", [("gla", True), ("gated_deltanet", False)])
def test_mom_masking_varlen_and_naive_loop_agree(transition, shared):
    x, w = inputs(T=30)
    res = {}
    for impl in ("masking", "varlen"):
        torch.manual_seed(0)
        m = MoM(CTX, MoMConfig(n=3, k=2, shared_memory=shared, transition=transition, impl=impl,
                               kernel="torch", balance_alpha=0.0)).double()
        res[impl] = run(m, x, w)
    res["naive"] = run(m, x, w, naive_mom)
    for other in ("varlen", "naive"):
        (ya, gxa, gpa), (yb, gxb, gpb) = res["masking"], res[other]
        torch.testing.assert_close(yb, ya, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(gxb, gxa, rtol=1e-8, atol=1e-9)
        for n in gpa:
            torch.testing.assert_close(gpb[n], gpa[n], rtol=1e-8, atol=1e-9, msg=lambda s: f"{other} {n}: {s}")
    assert "router.weight" in res["masking"][2]


def test_mom_parameters_grow_with_memories_and_routing_is_captured():
    ctx = MixerContext(d_model=128, n_heads=2, layer_idx=0, max_seq_len=64)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    gla = build_mixer("gla", ctx)
    mom = MoM(ctx, MoMConfig(n=4, k=1))
    H, K, V = 2, 32, 64
    assert count(mom) - count(gla) == 128 * 4 + 3 * 128 * H * (K + V)  # router + 3 more k/v sets
    assert mom.state_size(64) == 4 * gla.state_size(64)
    mom.capture = {}
    mom(torch.randn(2, 8, 128))
    assert mom.capture["routing"].shape == (2, 8, 1, 1)
    aux = mom.aux_loss()
    assert aux is not None and aux > 0 and mom.aux_loss() is None   # handed over once


@pytest.mark.parametrize("name,conv_size", [("retnet", 0), ("gla", 0), ("gated_deltanet", 0), ("gla", 4)])
def test_sla_with_one_head_is_its_base(name, conv_size):
    """With conv_size 4 the base's short convolution is there (its weights load) and runs as the base's."""
    x, w = inputs()
    ref = base(name, CTX1, conv_size=conv_size)
    torch.manual_seed(1)
    sla = SLA(CTX1, SLAConfig(base=name, impl="torch", conv_size=conv_size)).double()
    sla.core.load_state_dict(ref.state_dict())
    ya, gxa, _ = run(ref, x, w)
    yb, gxb, _ = run(sla, x, w)
    torch.testing.assert_close(yb, ya, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gxb, gxa, rtol=1e-9, atol=1e-11)


def naive_sla(m: SLA, x):
    """Eqs. 10-16 per step: the key gate scales the write (the value inside the delta error), the
    query gate the read."""
    core = m.core
    B, T, _ = x.shape
    p = core.features(x)
    gq, gk = (x @ m.gate_q.weight.T).softmax(-1), (x @ m.gate_k.weight.T).softmax(-1)
    H, K, V = core.H, core.K, core.V
    outs = []
    for b in range(B):
        S = torch.zeros(H, K, V, dtype=x.dtype)
        for t in range(T):
            g = p["g"][b, t]
            S = S * (g.exp()[..., None] if g.ndim == 2 else g.exp()[:, None, None])
            k, v = p["k"][b, t], p["v"][b, t]
            if p["beta"] is None:
                S = S + (gk[b, t][:, None] * k)[..., None] * v[:, None, :]
            else:
                err = gk[b, t][:, None] * v - torch.einsum("hk,hkv->hv", k, S)
                S = S + p["beta"][b, t][:, None, None] * k[..., None] * err[:, None, :]
            outs.append(core.scale * torch.einsum("hk,hkv->hv", gq[b, t][:, None] * p["q"][b, t], S))
    return core.finish(torch.stack(outs).view(B, T, H, V), x, p)


@pytest.mark.parametrize("name", ["retnet", "gla", "gated_deltanet"])
def test_sla_head_gates_match_naive_loop(name):
    x, w = inputs(T=20)
    torch.manual_seed(0)
    m = SLA(CTX, SLAConfig(base=name, impl="torch")).double()
    (ya, gxa, gpa), (yb, gxb, gpb) = run(m, x, w), run(m, x, w, naive_sla)
    torch.testing.assert_close(ya, yb, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(gxa, gxb, rtol=1e-8, atol=1e-9)
    assert gpa["gate_q.weight"].abs().sum() > 0 and gpa["gate_k.weight"].abs().sum() > 0
    m.capture = {}
    with torch.no_grad():
        m(x)
    for key in ("routing", "routing_read"):
        r = m.capture[key]
        assert r.shape == (2, 20, 1, CTX.n_heads)
        torch.testing.assert_close(r.sum(-1), torch.ones(2, 20, 1, dtype=torch.float64))
    assert "final_state" in m.capture

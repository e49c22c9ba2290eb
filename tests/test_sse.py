"""SSE: masking and varlen against each other and against a naive per-token loop over partitions
(float64, outputs and gradients); reduction to row-sparse top-k GLA / Gated DeltaNet for N=1, k=1;
parameter counts and state sizes; balance loss; config errors through load_config."""
import pytest
import torch
import torch.nn.functional as F

from sandbox.config import ConfigError, load_config
from sandbox.mixers import MixerContext, build_mixer
from sandbox.mixers.linear_family import GatedDeltaNetConfig, GLAConfig
from sandbox.mixers.sse import SSE, SSEConfig
from sandbox.mixers.sse_impl import VARLEN_MIN_LEN, VARLEN_MIN_PARTITIONS, resolve_impl

from grads import run

CTX = MixerContext(d_model=16, n_heads=2, layer_idx=0, max_seq_len=128)  # gla: K=4, V=8; gdn: K=8, V=16

CASES = {
    "write_read": dict(n=3, k=2),
    "arxiv_form": dict(n=3, k=1, read_topk=2, gate="none", row_topk=2, key_map="silu"),
    "gdn_separate": dict(n=3, k=2, read_topk=1, gate="write", transition="gated_deltanet",
                         shared_params=False, shared_partition=False),
    "separate_conv": dict(n=3, k=1, shared_params=False, conv_size=3),
    "gdn_rows": dict(n=4, k=2, read_topk=3, gate="read", transition="gated_deltanet", row_topk=3),
}


def make_sse(seed=0, ctx=CTX, **kw):
    torch.manual_seed(seed)
    return SSE(ctx, SSEConfig(**kw)).double()


def naive_sse(m: SSE, x):
    """Per token, per partition: route, write the selected partitions, read the read set."""
    cfg, core = m.cfg, m.core
    B, T, _ = x.shape
    H, K, V, N = m.H, m.K, m.V, cfg.n
    gdn = cfg.transition == "gated_deltanet"
    p = core.features(x)  # raw q / key logits / v (identity maps), base log-decay and beta
    qs, ls, vs = [p["q"]] * N, [p["k"]] * N, [p["v"]] * N
    if not cfg.shared_params and N > 1:
        extra = x @ m.part_qkv.weight.T
        if cfg.conv_size:   # causal: y_t = silu(sum_j w_j x_{t-w+1+j}), zeros before the start
            w = m.part_conv
            extra = F.silu(sum(w[:, j] * F.pad(extra, (0, 0, w.shape[1] - 1 - j, 0))[:, :T]
                               for j in range(w.shape[1])))
        for i in range(1, N):
            chunk = extra[..., (i - 1) * H * (2 * K + V): i * H * (2 * K + V)].reshape(B, T, H, 2 * K + V)
            qs[i], ls[i], vs[i] = chunk[..., :K], chunk[..., K:2 * K], chunk[..., 2 * K:]
    shared = None
    if cfg.shared_partition:
        lq, lk = m.lora["q"], m.lora["k"]
        shared = (p["q"] + (x @ lq[0].weight.T @ lq[1].weight.T).view(B, T, H, K),
                  p["k"] + (x @ lk[0].weight.T @ lk[1].weight.T).view(B, T, H, K), p["v"])
    qmap = (lambda q: F.normalize(F.silu(q), dim=-1)) if gdn else (lambda q: q)

    def keymap(l):  # [H, K] -> keys, row mask
        mask = torch.ones_like(l, dtype=torch.bool)
        if cfg.row_topk is not None:
            mask = torch.zeros_like(mask)
            for h in range(H):
                mask[h, torch.argsort(l[h], descending=True)[: cfg.row_topk]] = True
        if cfg.key_map == "softmax":
            key = torch.where(mask, l, torch.tensor(float("-inf"), dtype=l.dtype)).softmax(-1)
        else:
            key = F.silu(l) * mask
        return (F.normalize(key, dim=-1) if gdn else key), mask

    def write(S, key, mask, v, g, beta, weight):  # S [H, K, V]
        decay = torch.ones(H, K, dtype=S.dtype)
        if g is not None:
            gd = g[:, None].expand(H, K) if g.ndim == 1 else g
            decay = torch.where(mask, gd.exp(), decay)
        S = S * decay[..., None]
        if not gdn:
            return S + weight * key[..., None] * v[:, None, :]
        err = v - torch.einsum("hk,hkv->hv", key, S)
        return S + (weight * beta)[:, None, None] * key[..., None] * err[:, None, :]

    k_read = cfg.read_topk or cfg.k
    outs = []
    for b in range(B):
        S = [torch.zeros(H, K, V, dtype=x.dtype) for _ in range(N)]
        Ss = torch.zeros(H, K, V, dtype=x.dtype)
        for t in range(T):
            e = x[b, t] @ m.router.weight.T
            order = torch.argsort(e, descending=True)
            wset, rset = order[: cfg.k].tolist(), order[:k_read].tolist()
            # the ICLR paper's gate: e_t = softmax(x_t W_e) over all N partitions, not renormalised
            ww = e.softmax(0)[wset] if cfg.gate in ("write", "write_read") else torch.full((cfg.k,), 1 / cfg.k)
            rw = e.softmax(0)[rset] if cfg.gate in ("read", "write_read") else torch.ones(k_read)
            g = None if p["g"] is None else p["g"][b, t]
            beta = None if p["beta"] is None else p["beta"][b, t]
            for j, i in enumerate(wset):
                key, mask = keymap(ls[i][b, t])
                S[i] = write(S[i], key, mask, vs[i][b, t], g, beta, ww[j])
            o = torch.zeros(H, V, dtype=x.dtype)
            for j, i in enumerate(rset):
                o = o + rw[j] * torch.einsum("hk,hkv->hv", qmap(qs[i][b, t]), S[i])
            if shared is not None:
                key, mask = keymap(shared[1][b, t])
                Ss = write(Ss, key, mask, shared[2][b, t], g, beta, torch.tensor(1.0, dtype=x.dtype))
                o = o + torch.einsum("hk,hkv->hv", qmap(shared[0][b, t]), Ss)
            outs.append(core.scale * o)
    o = torch.stack(outs).view(B, T, H, V)
    return core.finish(o, x, p)


def inputs(B=2, T=70, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, T, CTX.d_model, dtype=torch.float64, generator=gen),
            torch.randn(B, T, CTX.d_model, dtype=torch.float64, generator=gen))


def assert_same(a, b, what):
    (ya, gxa, gpa), (yb, gxb, gpb) = a, b
    torch.testing.assert_close(ya, yb, rtol=1e-9, atol=1e-10, msg=lambda s: f"{what} output: {s}")
    torch.testing.assert_close(gxa, gxb, rtol=1e-8, atol=1e-9, msg=lambda s: f"{what} grad x: {s}")
    assert gpa.keys() == gpb.keys()
    for n in gpa:
        torch.testing.assert_close(gpa[n], gpb[n], rtol=1e-8, atol=1e-9, msg=lambda s: f"{what} grad {n}: {s}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_masking_varlen_and_naive_loop_agree(case):
    x, w = inputs(T=40)
    results = {}
    for impl in ("masking", "varlen"):
        m = make_sse(**CASES[case], impl=impl, kernel="torch", balance_alpha=0.0)
        results[impl] = run(m, x, w)
    results["naive"] = run(m, x, w, naive_sse)
    assert_same(results["masking"], results["varlen"], f"{case} masking vs varlen")
    assert_same(results["masking"], results["naive"], f"{case} masking vs naive loop")
    # every parameter that should learn gets a gradient (the router only through a gate)
    names = set(results["masking"][2])
    assert ("router.weight" in names) == (CASES[case].get("gate", "write_read") != "none")
    assert all(n in names for n, _ in m.core.named_parameters(prefix="core"))


def test_with_one_partition_selected_each_gate_is_its_own_model_and_trains_the_router():
    """At k = 1 (the paper's n4k1 ablation) a gate that renormalised over the selected partitions would weigh
    every token 1: all four gates would be one model, and the router would learn from the balance loss alone."""
    x, w = inputs(B=2, T=12)
    outs = {}
    for gate in ("none", "write", "read", "write_read"):
        m = make_sse(n=4, k=1, gate=gate, kernel="torch", balance_alpha=0.0)
        y, _, grads = run(m, x, w)
        outs[gate] = y
        assert (gate == "none") == (grads.get("router.weight", torch.zeros(1)).abs().max() == 0), gate
    for a in outs:
        for b in outs:
            if a < b:
                assert (outs[a] - outs[b]).abs().max() > 1e-3, (a, b)


def test_long_sequence_varlen_uses_several_chunks():
    x, w = inputs(B=1, T=200, seed=4)
    res = [run(make_sse(n=2, k=1, impl=impl, kernel="torch"), x, w) for impl in ("masking", "varlen")]
    assert_same(res[0], res[1], "T=200 masking vs varlen")


def test_unselected_partitions_untouched_and_final_state_layout():
    m = make_sse(n=4, k=1, read_topk=1, impl="varlen", kernel="naive")
    x, _ = inputs(B=1, T=6)
    m.capture = {}
    with torch.no_grad():
        m(x)
    cap = m.capture
    chosen = set(cap["routing"].flatten().tolist())
    S = cap["final_state"]  # [B, H, (N+1)*K, V]
    assert S.shape == (1, m.H, 5 * m.K, m.V)
    for i in range(4):
        block = S[:, :, i * m.K:(i + 1) * m.K]
        assert (block.abs().sum() > 0) == (i in chosen), f"partition {i}"
    keys = cap["keys"]  # expanded keys: zero off the written partition, summing to its gate weight softmax(e_t)^i
    assert keys.shape == (1, 6, m.H, 5 * m.K)
    weight = (x @ m.router.weight.T).softmax(-1).max(-1).values  # k = 1 writes the top partition
    torch.testing.assert_close(keys[..., : 4 * m.K].sum(-1), weight[..., None].expand(1, 6, m.H))
    assert cap["partition_weights"].shape == (1, 6, 4)
    assert torch.equal(cap["gates"] != 0, keys != 0), "decay exactly where written (expanded rows)"


@pytest.mark.parametrize("row_topk,conv_size", [(None, 0), (2, 0), (2, 4)])
def test_n1_k1_without_shared_partition_is_topk_gla(row_topk, conv_size):
    x, w = inputs(T=30)
    torch.manual_seed(0)
    gla = build_mixer("gla", CTX, GLAConfig(topk=row_topk or 4, conv_size=conv_size, impl="torch")).double()
    sse = make_sse(n=1, k=1, shared_partition=False, row_topk=row_topk, conv_size=conv_size, kernel="torch")
    sse.core.load_state_dict(gla.state_dict())
    ya, gxa, _ = run(gla, x, w)
    yb, gxb, _ = run(sse, x, w)
    torch.testing.assert_close(yb, ya, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gxb, gxa, rtol=1e-9, atol=1e-11)


def test_n1_k1_gdn_is_topk_gated_deltanet():
    x, w = inputs(T=30)
    torch.manual_seed(0)
    gdn = build_mixer("gated_deltanet", CTX, GatedDeltaNetConfig(topk=3, impl="torch")).double()
    sse = make_sse(n=1, k=1, shared_partition=False, row_topk=3, transition="gated_deltanet", kernel="torch")
    sse.core.load_state_dict(gdn.state_dict())
    torch.testing.assert_close(run(sse, x, w)[0], run(gdn, x, w)[0], rtol=1e-10, atol=1e-12)


def test_parameters_stay_while_state_grows():
    ctx = MixerContext(d_model=128, n_heads=2, layer_idx=0, max_seq_len=512)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    gla = build_mixer("gla", ctx)
    for n in (4, 8):
        sse = SSE(ctx, SSEConfig(n=n, k=2))
        assert abs(count(sse) - count(gla)) / count(gla) < 0.10, (count(sse), count(gla))
        assert sse.state_size(512) == (n + 1) * gla.state_size(512)
        assert SSE(ctx, SSEConfig(n=n, k=2, shared_partition=False)).state_size(512) == n * gla.state_size(512)
    # closed form of the extra parameters: router d*N + LoRA 2*(d*r + r*H*K), r = min(64, d/16) = 8
    sse = SSE(ctx, SSEConfig(n=4, k=1))
    assert count(sse) - count(gla) == 128 * 4 + 2 * (128 * 8 + 8 * 64)
    separate = SSE(ctx, SSEConfig(n=4, k=1, shared_params=False))
    assert count(separate) - count(sse) == 3 * 128 * 2 * (32 + 32 + 64)  # 3 more q/k/v sets


def test_balance_loss_closed_form():
    m = make_sse(n=4, k=2, balance_alpha=0.5, kernel="naive")
    x, _ = inputs(B=2, T=5)
    m(x)
    e = x @ m.router.weight.T
    probs = e.softmax(-1)
    sel = torch.zeros_like(e).scatter_(-1, e.topk(2, -1).indices, 1.0)
    f, P = sel.mean((0, 1)), probs.mean((0, 1))
    torch.testing.assert_close(m.aux_loss(), 0.5 * 4 / 2 * (f * P).sum())


def test_auto_impl_by_length_and_partitions():
    n = VARLEN_MIN_PARTITIONS
    assert resolve_impl("auto", VARLEN_MIN_LEN - 1, n) == "masking"
    assert resolve_impl("auto", VARLEN_MIN_LEN, n) == "varlen"
    assert resolve_impl("auto", VARLEN_MIN_LEN, n - 1) == "masking"
    assert resolve_impl("masking", 10 ** 6, 64) == "masking"


def test_model_trains_a_step_with_aux_loss():
    from sandbox.model import LanguageModel
    cfg = load_config(data=BASE, overrides=[("model.sse", {"n": 4, "k": 2, "row_topk": 4})]).model
    model = LanguageModel(cfg, vocab_size=32, max_seq_len=32)
    tokens = torch.randint(0, 32, (2, 32))
    loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()) + model.aux_loss()
    loss.backward()
    assert torch.isfinite(loss)
    assert model.blocks[0].mixer.router.weight.grad.abs().sum() > 0


BASE = {"task": {"name": "mqar", "seq_len": 32, "num_kv_pairs": 2, "vocab_size": 32},
        "model": {"mixer": "sse", "d_model": 32, "n_layers": 2, "n_heads": 2}}


@pytest.mark.parametrize("section,key,overrides", [
    ("sse", "k", {"n": 2, "k": 3}),
    ("sse", "read_topk", {"n": 4, "read_topk": 5}),
    ("sse", "n", {"n": 0}),
    ("sse", "row_topk", {"row_topk": 9}),  # d_model 32, 2 heads, expand_k 0.5: 8 rows
    ("sse", "gate", {"gate": "both"}),
    ("sse", "transition", {"transition": "delta"}),
    ("sse", "impl", {"impl": "chunked"}),
    ("sse", "expand_k", {"expand_k": 0}),
    ("sse", "conv_size", {"conv_size": -1}),
    ("mom", "k", {"n": 2, "k": 4}),
    ("sla", "base", {"base": "mamba2"}),
])
def test_config_errors_name_the_field(section, key, overrides):
    with pytest.raises(ConfigError) as err:
        load_config(data=BASE, overrides=[("model.mixer", section), (f"model.{section}", overrides)])
    assert err.value.key == f"model.{section}.{key}", str(err.value)
    assert "\n" not in str(err.value)


TRITON_CHECK = r"""
import torch
from sandbox.mixers import MixerContext
from sandbox.mixers.sse import SSE, SSEConfig
ctx = MixerContext(16, 2, 0, 64)
x = torch.randn(2, 24, 16, generator=torch.Generator().manual_seed(0))
res = {}
for kernel, impl in (("torch", "masking"), ("triton", "masking"), ("triton", "varlen")):
    torch.manual_seed(0)
    m = SSE(ctx, SSEConfig(n=3, k=1, impl=impl, kernel=kernel))
    with torch.no_grad():  # partition 2 is never chosen: an empty varlen segment per sequence
        w = torch.randn(16, generator=torch.Generator().manual_seed(1))
        m.router.weight.copy_(torch.stack([w, -w, torch.zeros(16)]))
    xi = x.clone().requires_grad_(True)
    y = m(xi)
    y.square().sum().backward()
    res[impl, kernel] = (y.detach(), xi.grad)
ref = res["masking", "torch"]
print(max(max((a - b).abs().max().item() for a, b in zip(v, ref)) for v in res.values()))
"""


def test_triton_kernel_paths_with_an_empty_partition():
    """Masking and varlen through the Triton kernel (interpreter on CPU) match the torch form."""
    import os
    import subprocess
    import sys
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", TRITON_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip().splitlines()[-1]) < 1e-4

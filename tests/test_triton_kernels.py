"""Triton kernels (run through TRITON_INTERPRET=1 on the CPU) against the per-step float64 reference.

Shapes are tiny because the interpreter is slow; odd lengths, non-power-of-two head dims, several
K / V tiles, strong and weak decay, and packed segments (with empty ones) are all covered.
The same checks run on the GPU in ``sandbox bench kernels --check``.
"""
import functools
import json
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported (their @triton.jit reads it)

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

pytest.importorskip("triton")

from sandbox.bench.kernels import _parse_shapes, main_kernels  # noqa: E402
from sandbox.kernels import linear_recurrence  # noqa: E402
from sandbox.kernels.reference import recurrent_reference  # noqa: E402
from sandbox.kernels.triton_chunk import chunk_gla  # noqa: E402
from sandbox.kernels.triton_decode import decode_step  # noqa: E402
from sandbox.kernels.triton_delta import chunk_delta_rule  # noqa: E402
from sandbox.kernels.triton_slot_scores import slot_scores_triton  # noqa: E402
from test_linear_mixers import naive_slot_scores  # noqa: E402

TOL = 1e-4  # fp32 kernel (interpreter: numpy fp32 dots) against a float64 loop


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _inputs(B, T, H, K, V, gate, *, N=None, h0=True, decay=(2.0, 1.0), beta=False, seed=0):
    g_ = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=g_)
    k = torch.randn(B, T, H, K, generator=g_) / K ** 0.5
    if beta:
        k = F.normalize(k, dim=-1)
    v = torch.randn(B, T, H, V, generator=g_)
    shift, spread = decay
    g = None
    if gate == "scalar":
        g = F.logsigmoid(torch.randn(B, T, H, generator=g_) * spread + shift)
    elif gate == "diag":
        g = F.logsigmoid(torch.randn(B, T, H, K, generator=g_) * spread + shift)
    b = torch.rand(B, T, H, generator=g_) if beta else None
    h = torch.randn(N if N is not None else B, H, K, V, generator=g_) if h0 else None
    return dict(q=q, k=k, v=v, g=g, beta=b, initial_state=h)


def _compare(fn, inp, cu=None, scale=0.7):
    """Outputs, final state and all gradients of fn against recurrent_reference in float64."""
    names = [n for n in ("q", "k", "v", "g", "beta", "initial_state") if inp[n] is not None]
    mine = {n: inp[n].clone().requires_grad_() for n in names}
    ref = {n: inp[n].double().requires_grad_() for n in names}
    o, ht = fn(**{n: mine.get(n) for n in ("q", "k", "v", "g", "beta", "initial_state")}, scale=scale,
               output_final_state=True, cu_seqlens=cu)
    ro, rht = recurrent_reference(**{n: ref.get(n) for n in ("q", "k", "v", "g", "beta", "initial_state")},
                                  scale=scale, output_final_state=True, cu_seqlens=cu)
    do, dht = torch.randn_like(ro), torch.randn_like(rht)
    ((o * do.float()).sum() + (ht * dht.float()).sum()).backward()
    ((ro * do).sum() + (rht * dht).sum()).backward()
    errs = {"o": rel(o, ro), "final_state": rel(ht, rht)}
    errs.update({"d" + n: rel(mine[n].grad, ref[n].grad) for n in names})
    bad = {k: v for k, v in errs.items() if not v <= TOL}
    assert not bad, f"errors above {TOL}: {bad} (all: {errs})"


def gla(q, k, v, g=None, beta=None, **kw):
    return chunk_gla(q, k, v, g, **kw)


def delta(q, k, v, g=None, beta=None, **kw):
    return chunk_delta_rule(q, k, v, beta, g, **kw)


@pytest.mark.parametrize("T, dk, m, dtype", [(47, 20, 24, torch.float32), (19, 16, 80, torch.float32),
                                             (47, 20, 24, torch.float16)])
def test_slot_scores_kernel_matches_loop(T, dk, m, dtype):
    """GSA's pass 1 in Triton: scores, final state and the gradients of q, k, s and the log-gates against the
    per-token loop in float64; a partial chunk of 15 steps (decaying by up to e^-118: no exponential
    over it may start from outside it), head dims that are not powers of two, (m = 80) two slot tiles, and
    16-bit q, k, s. Gates from none (alpha = 1, s = 0: an unchosen top-k slot) down to e^-7.9 per step."""
    gen = torch.Generator().manual_seed(3)
    B, H = 2, 2
    q = torch.randn(B, T, H, dk, generator=gen)
    k = torch.randn(B, T, H, dk, generator=gen) / dk ** 0.5
    chosen = torch.rand(B, T, H, m, generator=gen) < 0.6
    g = torch.where(chosen, -7.9 * torch.rand(B, T, H, m, generator=gen) ** 2, 0.0)
    s = -torch.expm1(g) * torch.rand(B, T, H, m, generator=gen)
    w = torch.randn(B, T, H, m, generator=gen, dtype=torch.float64)
    q, k, s = q.to(dtype), k.to(dtype), s.to(dtype)       # the gate stays fp32, as GSA computes it
    mine = [x.clone().requires_grad_() for x in (q, k, s, g)]
    ref = [x.double().requires_grad_() for x in (q, k, s, g)]
    o, S = slot_scores_triton(*mine, scale=0.3, output_final_state=True)
    ro, rS = naive_slot_scores(*ref, 0.3)
    (o.float() * w.float()).sum().backward()
    (ro * w).sum().backward()
    assert o.dtype == torch.float32 and mine[0].grad.dtype == mine[2].grad.dtype == dtype   # scores in fp32, ds in s's
    errs = {"o": rel(o, ro), "final_state": rel(S, rS)}
    errs.update({"d" + n: rel(a.grad, b.grad) for n, a, b in zip("qksg", mine, ref)})
    tol = TOL if dtype == torch.float32 else 3e-3
    bad = {n: e for n, e in errs.items() if not e <= tol}
    assert not bad, f"errors above {tol}: {bad} (all: {errs})"


@pytest.mark.parametrize("topk", [None, 4])
def test_gsa_mixer_on_the_kernels_matches_its_naive_form(topk):
    """The GSA mixer with impl triton (both passes on the kernels, fp32) against impl naive (float64):
    output, the input's gradient and every parameter's."""
    from sandbox.mixers import MixerContext, build_mixer, mixer_config_class
    ctx = MixerContext(d_model=32, n_heads=2, layer_idx=0, max_seq_len=64)
    mods = []
    for impl in ("triton", "naive"):
        torch.manual_seed(0)
        mods.append(build_mixer("gsa", ctx, mixer_config_class("gsa")(num_slots=16, topk=topk, impl=impl)))
    fast, slow = mods[0], mods[1].double()
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 37, 32, generator=gen), torch.randn(2, 37, 32, generator=gen)
    outs = []
    for m, dt in ((fast, torch.float32), (slow, torch.float64)):
        xi = x.to(dt).detach().clone().requires_grad_()
        y = m(xi)
        (y * w.to(dt)).sum().backward()
        outs.append((y, xi.grad, {n: p.grad for n, p in m.named_parameters()}))
    (y1, gx1, gp1), (y2, gx2, gp2) = outs
    errs = {"y": rel(y1, y2), "dx": rel(gx1, gx2), **{n: rel(gp1[n], gp2[n]) for n in gp2 if gp2[n] is not None}}
    bad = {n: e for n, e in errs.items() if not e <= TOL}
    assert not bad, f"errors above {TOL}: {bad}"


@pytest.mark.parametrize("gate", ["none", "scalar", "diag"])
def test_chunk_gla_matches_loop(gate):
    _compare(gla, _inputs(2, 37, 2, 20, 24, gate))  # one partial chunk, K and V not powers of two


def test_chunk_gla_two_chunks_and_weak_decay():
    _compare(gla, _inputs(1, 100, 1, 16, 16, "diag", decay=(6.0, 1.0)))


def test_chunk_gla_strong_decay_stays_finite():
    # log-decays down to about -15 per step: any exp(+large) outside the masks would give inf / NaN
    _compare(gla, _inputs(1, 90, 1, 16, 16, "diag", decay=(-6.0, 4.0)))


def test_chunk_gla_blocks_on_both_sides_of_the_product_limit():
    # 16-row blocks that decay by less than 40 (log) go through the reference-row matrix product, the
    # others through the exact column sum: this input has both kinds in one call
    inp = _inputs(1, 128, 1, 16, 16, "diag", decay=(-1.5, 2.0))
    gc = inp["g"].view(1, 2, 64, 1, 16).cumsum(2)  # chunk-local cumulative decay
    blocks = gc.view(1, 2, 4, 16, 16)
    span = (blocks[:, :, :, 0] - blocks[:, :, :, -1]).amax(-1)  # per block: largest decay over its rows
    assert (span < 40).any() and (span >= 40).any(), span
    _compare(gla, inp)


def test_chunk_gla_chunks_and_tiles_on_both_sides_of_the_whole_chunk_limit(monkeypatch):
    # a chunk (per K tile in the backward) that decays by less than 40 (log) from its first row to its last
    # takes one product; the others fall back to 16-row blocks (fast or exact).  Three chunks, two K tiles:
    # chunk 0 weak everywhere, chunk 1 strong in the second tile only, chunk 2 very strong in the first
    monkeypatch.setenv("SANDBOX_TRITON_SEQ_BLOCK", "16")
    inp = _inputs(1, 192, 1, 32, 16, "diag", decay=(3.0, 1.0))
    g_ = torch.Generator().manual_seed(1)
    inp["g"][:, 64:128, :, 16:] = F.logsigmoid(torch.randn(1, 64, 1, 16, generator=g_) - 0.5)
    inp["g"][:, 128:, :, :16] = F.logsigmoid(torch.randn(1, 64, 1, 16, generator=g_) * 4.0 - 6.0)
    gc = inp["g"].view(3, 64, 2, 16).cumsum(1)
    span = (gc[:, 0] - gc[:, -1]).amax(-1)  # [chunk, K tile]
    assert (span < 40).tolist() == [[True, True], [True, False], [False, True]], span
    _compare(gla, inp)


def test_chunk_gla_varlen_with_empty_segments():
    cu = torch.tensor([0, 30, 30, 95, 95, 100])
    _compare(gla, _inputs(1, 100, 2, 20, 24, "diag", N=5), cu=cu)
    _compare(gla, _inputs(1, 100, 1, 16, 16, "scalar", N=5, h0=False), cu=cu)


@pytest.mark.parametrize("gate", ["none", "scalar", "diag"])
def test_chunk_gla_several_state_tiles(monkeypatch, gate):
    # 16 x 16 state tiles: K = 40 and V = 36 need partial sums over 3 K tiles and 3 V tiles
    # (the scalar gate's dg is summed over the K tiles on the host)
    monkeypatch.setenv("SANDBOX_TRITON_SEQ_BLOCK", "16")
    _compare(gla, _inputs(1, 70, 1, 40, 36, gate))


def test_chunk_gla_varlen_several_state_tiles(monkeypatch):
    monkeypatch.setenv("SANDBOX_TRITON_SEQ_BLOCK", "16")
    _compare(gla, _inputs(1, 100, 2, 20, 24, "diag", N=4), cu=torch.tensor([0, 0, 64, 65, 100]))


def gla_on_slices(q, k, v, g=None, beta=None, **kw):
    """chunk_gla fed q, k and v as column slices of one wider [B, T, W] tensor (as a split projection hands
    them over), with unused columns between them; the kernels must read them in place."""
    from sandbox.kernels.triton_chunk_common import as_rows
    B, T, H, K = q.shape
    V = v.shape[-1]
    gap = q.new_zeros(B, T, 3)
    wide = torch.cat([gap, v.flatten(2), q.flatten(2), gap, k.flatten(2), gap], -1)
    vs = wide[..., 3:3 + H * V].view(B, T, H, V)
    qs = wide[..., 3 + H * V:3 + H * (V + K)].view(B, T, H, K)
    ks = wide[..., 6 + H * (V + K):6 + H * (V + 2 * K)].view(B, T, H, K)
    assert all(as_rows(x) is x and not x.is_contiguous() for x in (qs, ks, vs))   # read in place, no copy
    return chunk_gla(qs, ks, vs, g, **kw)


@pytest.mark.parametrize("gate", ["none", "scalar", "diag"])
def test_chunk_gla_reads_column_slices_in_place(monkeypatch, gate):
    # every kernel that reads q, k or v (the gate prep, the intra-chunk products, the state passes, the
    # output, dA and the gradient kernel) at a row stride wider than H x K: 16 x 16 state tiles (3 K tiles,
    # so dA has its own kernel), two sequences, and strong decay (the exact diagonal sums read k too)
    monkeypatch.setenv("SANDBOX_TRITON_SEQ_BLOCK", "16")
    _compare(gla_on_slices, _inputs(2, 70, 2, 40, 36, gate, decay=(-1.5, 2.0)))


def test_chunk_gla_without_final_state():
    # no gradient of the final state: the reverse state sweep starts from zero
    inp = _inputs(1, 100, 2, 20, 24, "diag")
    mine = {n: inp[n].clone().requires_grad_() for n in ("q", "k", "v", "g", "initial_state")}
    ref = {n: inp[n].double().requires_grad_() for n in mine}
    o, ht = chunk_gla(mine["q"], mine["k"], mine["v"], mine["g"], scale=0.7, initial_state=mine["initial_state"])
    ro, _ = recurrent_reference(ref["q"], ref["k"], ref["v"], ref["g"], scale=0.7,
                                initial_state=ref["initial_state"])
    assert ht is None
    do = torch.randn_like(ro)
    (o * do.float()).sum().backward()
    (ro * do).sum().backward()
    errs = {"o": rel(o, ro), **{"d" + n: rel(mine[n].grad, ref[n].grad) for n in mine}}
    assert all(e <= TOL for e in errs.values()), errs


def test_chunk_gla_half_inputs():
    # 16-bit q, k, v: dq, dk, dv are written in the input dtype by the kernels (fp32 state, fp32 g, h0)
    inp = _inputs(1, 100, 2, 32, 32, "diag")
    mine = {n: (inp[n].half() if n in ("q", "k", "v") else inp[n].clone()).requires_grad_()
            for n in ("q", "k", "v", "g", "initial_state")}
    ref = {n: inp[n].double().requires_grad_() for n in mine}
    o, ht = chunk_gla(mine["q"], mine["k"], mine["v"], mine["g"], scale=0.7, initial_state=mine["initial_state"],
                      output_final_state=True)
    ro, rht = recurrent_reference(ref["q"], ref["k"], ref["v"], ref["g"], scale=0.7,
                                  initial_state=ref["initial_state"], output_final_state=True)
    do, dht = torch.randn_like(ro), torch.randn_like(rht)
    ((o.float() * do.float()).sum() + (ht * dht.float()).sum()).backward()
    ((ro * do).sum() + (rht * dht).sum()).backward()
    assert o.dtype == mine["q"].grad.dtype == torch.float16
    errs = {"o": rel(o, ro), **{"d" + n: rel(mine[n].grad, ref[n].grad) for n in mine}}
    assert all(e <= 3e-3 for e in errs.values()), errs


def test_chunk_gla_a_in_half_gives_the_bits_of_a_in_float32(monkeypatch):
    # A is stored in the value dtype where the backward's V tile is 32 or wider; every product that reads it
    # casts it to that dtype, so the outputs and gradients must equal those of A stored in float32, bit for bit
    from sandbox.kernels import triton_chunk
    inp = _inputs(1, 100, 2, 32, 32, "diag")
    do = torch.randn(1, 100, 2, 32).half()

    def run():
        x = {n: (inp[n].half() if n in ("q", "k", "v") else inp[n].clone()).requires_grad_() for n in "qkvg"}
        o, _ = chunk_gla(x["q"], x["k"], x["v"], x["g"], scale=0.7)
        o.backward(do)
        return [o.detach()] + [x[n].grad for n in "qkvg"]

    assert triton_chunk.a_dtype(inp["q"].half(), inp["v"].half()) == torch.float16
    half = run()
    monkeypatch.setattr(triton_chunk, "a_dtype", lambda q, v: torch.float32)
    full = run()
    assert all(torch.equal(a, b) for a, b in zip(half, full))
    assert triton_chunk._bwd_tiles(128, 16)[1] < 32     # the faulting shape keeps A in float32


def test_unselected_rows_stay_bit_identical():
    # row-sparse top-k: rows with k == 0 and g == 0 at every step keep the initial state exactly
    inp = _inputs(1, 80, 1, 16, 16, "diag")
    keep = torch.zeros(16, dtype=torch.bool)
    keep[[1, 5, 11]] = True
    inp["k"][..., keep] = 0.0
    inp["g"][..., keep] = 0.0
    _, ht = chunk_gla(inp["q"], inp["k"], inp["v"], inp["g"], initial_state=inp["initial_state"],
                      output_final_state=True)
    assert torch.equal(ht[0, 0, keep], inp["initial_state"][0, 0, keep])
    assert not torch.equal(ht[0, 0, ~keep], inp["initial_state"][0, 0, ~keep])


@pytest.mark.parametrize("gate", ["none", "scalar"])
@pytest.mark.parametrize("T", [70, 128])     # a partial last chunk (rows gathered), whole chunks (a view)
def test_delta_rule_matches_loop(gate, T):
    _compare(delta, _inputs(2, T, 2, 20, 24, gate, beta=True))


def test_delta_rule_value_dim_over_256():
    # Gated DeltaNet at d_model 256, 1 head: K = 256, V = 512; here V = 272 in five value tiles (last partial)
    _compare(delta, _inputs(1, 70, 1, 16, 272, "scalar", beta=True))


def test_delta_rule_varlen():
    cu = torch.tensor([0, 0, 64, 65, 90])
    _compare(delta, _inputs(1, 90, 1, 16, 20, "scalar", N=4, beta=True), cu=cu)


def test_dispatch_triton_matches_naive():
    inp = _inputs(1, 40, 2, 12, 10, "diag")
    o1, s1 = linear_recurrence(inp["q"], inp["k"], inp["v"], inp["g"], impl="triton",
                               initial_state=inp["initial_state"], output_final_state=True)
    o2, s2 = linear_recurrence(inp["q"].double(), inp["k"].double(), inp["v"].double(), inp["g"].double(),
                               impl="naive", initial_state=inp["initial_state"].double(), output_final_state=True)
    assert rel(o1, o2) < TOL and rel(s1, s2) < TOL


@pytest.mark.parametrize("K, V, gate, beta", [(8, 16, "diag", False), (8, 16, "scalar", False), (4, 1, "scalar", False),
                                              (8, 8, "scalar", True), (16, 4, "none", True)])
def test_head_dims_under_16_are_padded_exactly(K, V, gate, beta):
    """GLA with 16 heads at d_model 256 has 8 key rows; GSA's first pass 1-wide values: the dispatch pads them
    to 16 and cuts the outputs back, which must leave o, the final state and every gradient exact."""
    _compare(functools.partial(linear_recurrence, impl="triton"), _inputs(2, 40, 2, K, V, gate, beta=beta))


def _step_reference(q, k, v, S, g, beta, scale):
    S = S.double()
    if g is not None:
        d = g.double().exp()
        S = S * (d[..., None] if d.dim() == 3 else d[..., None, None])
    w = v.double()
    if beta is not None:
        w = beta.double()[..., None] * (w - torch.einsum("bhk,bhkv->bhv", k.double(), S))
    S = S + k.double()[..., None] * w[..., None, :]
    return scale * torch.einsum("bhk,bhkv->bhv", q.double(), S), S


@pytest.mark.parametrize("gate,use_beta", [("none", False), ("scalar", True), ("diag", False), ("diag", True)])
def test_decode_step(gate, use_beta):
    B, H, K, V = 2, 3, 40, 24
    q, k, v = torch.randn(B, H, K), torch.randn(B, H, K) / 6, torch.randn(B, H, V)
    g = None if gate == "none" else F.logsigmoid(torch.randn((B, H) if gate == "scalar" else (B, H, K)))
    beta = torch.rand(B, H) if use_beta else None
    S = torch.randn(B, H, K, V)
    ro, rS = _step_reference(q, k, v, S, g, beta, 0.5)
    o = decode_step(q, k, v, S, g, beta, scale=0.5)  # S updated in place
    assert rel(o, ro) < TOL and rel(S, rS) < TOL


def test_decode_step_selected_rows_only():
    B, H, K, V, R = 2, 2, 40, 24, 5
    q, v = torch.randn(B, H, K), torch.randn(B, H, V)
    rows = torch.stack([torch.randperm(K)[:R] for _ in range(B * H)]).view(B, H, R)
    sel = torch.zeros(B, H, K, dtype=torch.bool).scatter_(-1, rows, True)
    k = torch.randn(B, H, K) * sel
    g = F.logsigmoid(torch.randn(B, H, K)) * sel
    beta = torch.rand(B, H)
    S = torch.randn(B, H, K, V)
    S0 = S.clone()
    ro, rS = _step_reference(q, k, v, S, g, beta, 1.0)
    o = decode_step(q, k, v, S, g, beta, rows=rows)
    assert rel(o, ro) < TOL and rel(S, rS) < TOL
    assert torch.equal(S[~sel], S0[~sel])  # untouched rows: bit-identical


def test_bad_inputs_name_the_field():
    q = torch.randn(1, 8, 2, 4)
    with pytest.raises(ValueError, match="g:"):
        chunk_gla(q, q, q, torch.zeros(1, 8, 3))
    with pytest.raises(ValueError, match="cu_seqlens"):
        chunk_gla(torch.randn(2, 8, 2, 4), torch.randn(2, 8, 2, 4), torch.randn(2, 8, 2, 4),
                  cu_seqlens=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="state:"):
        decode_step(torch.randn(1, 2, 4), torch.randn(1, 2, 4), torch.randn(1, 2, 4), torch.zeros(1, 2, 4, 5))
    with pytest.raises(ValueError, match="g:"):
        chunk_delta_rule(q, q, q, torch.rand(1, 8, 2), torch.zeros(1, 8, 2, 4))


def test_bench_shapes_argument():
    assert _parse_shapes("64,512,2,64; 8,4096,4,128") == [(64, 512, 2, 64), (8, 4096, 4, 128)]
    with pytest.raises(ValueError, match="--shapes"):
        _parse_shapes("64,512,2")
    assert main_kernels(["--shapes", "1,2,x,4"]) == 2


def test_bench_check_refuses_wrong_or_nan_kernels():
    from sandbox.bench.kernels import check_recurrence, make_inputs
    from sandbox.kernels.chunked import chunk_reference

    def scaled(factor):
        def fn(**kw):
            o, s = chunk_reference(**kw)
            return o * factor, s
        return fn

    inp = make_inputs(1, 20, 1, 8, 8, "scalar", torch.float32, "cpu", h0=True)
    assert check_recurrence(scaled(1.0), inp, 0.5, 1e-5)["ok"]
    assert not check_recurrence(scaled(1.01), inp, 0.5, 1e-3)["ok"]
    assert not check_recurrence(scaled(float("nan")), inp, 0.5, 1e-3)["ok"]


def test_uniform_table_kernel_gives_the_torch_bits():
    """The task generator's Triton table of uniforms (used on GPUs) equals the torch form bit for bit."""
    from sandbox.tasks.rng import derive, row_key, uniform_torch
    from sandbox.tasks.rng_triton import uniform_triton

    ids = torch.arange(37, dtype=torch.int64) * 1000003 + 2 ** 33      # ids past 32 bits too
    base = row_key(ids, 5, 1)
    a, b = derive(base, 11), derive(base, 111)
    pos = torch.arange(300)
    want = uniform_torch(a, b, pos)
    assert torch.equal(uniform_triton(a, b, pos), want)
    assert 0 < want.min() and want.max() < 1 and want.unique().numel() == want.numel()


@pytest.mark.parametrize("n, k", [(300, 8), (4095, 16), (40, 40)])
def test_smallest_k_kernel_picks_what_topk_picks(n, k):
    """The generator's threshold kernel returns the same positions in the same order as topk over the
    whole table, including rows sent to the whole-table fallback."""
    from sandbox.tasks import rng_triton
    from sandbox.tasks.rng import derive, row_key, uniform_torch

    ids = torch.arange(48, dtype=torch.int64) * 7919
    base = row_key(ids, 3, 1)
    a, b = derive(base, 11), derive(base, 111)
    want = torch.topk(uniform_torch(a, b, torch.arange(n)), k, dim=1, largest=False).indices
    assert torch.equal(rng_triton.smallest_triton(a, b, n, k), want)


def test_smallest_k_kernel_falls_back_when_too_few_pass(monkeypatch):
    from sandbox.tasks import rng_triton
    from sandbox.tasks.rng import derive, row_key, uniform_torch

    base = row_key(torch.arange(16, dtype=torch.int64), 0, 1)
    a, b = derive(base, 1), derive(base, 2)
    want = torch.topk(uniform_torch(a, b, torch.arange(500)), 12, dim=1, largest=False).indices
    calls = []
    real = rng_triton.uniform_triton
    monkeypatch.setattr(rng_triton, "uniform_triton", lambda *x: calls.append(1) or real(*x))
    # a threshold so low that most rows keep fewer than k candidates
    assert torch.equal(rng_triton.smallest_triton(a, b, 500, 12, mean=4.0), want)
    assert calls, "the fallback did not run"


def test_the_triton_key_thread_fills_tritons_own_cache_with_its_own_key():
    """A process that starts ``compute_soon`` finds Triton's installation key already computed when it asks, and
    it is the key a process without the thread computes."""
    import subprocess
    import sys
    probe = ("import json; from triton.runtime.cache import triton_key as k; from sandbox.kernels import triton_key\n"
             "if {soon}: triton_key.compute_soon().join()\n"
             "before = k.cache_info().misses; key = k()\n"
             "print(json.dumps([key, k.cache_info().misses - before]))")
    runs = [json.loads(subprocess.run([sys.executable, "-c", probe.format(soon=soon)], capture_output=True, text=True,
                                      check=True).stdout) for soon in (True, False)]
    (key_soon, computed_soon), (key_plain, computed_plain) = runs
    assert key_soon == key_plain and len(key_plain) > 100
    assert (computed_soon, computed_plain) == (0, 1)

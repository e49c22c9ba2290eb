"""Correctness checks of the Triton kernels against the float64 torch reference.

Every kernel family (gate none / scalar / diagonal, with initial and final state, packed
variable-length segments with empty ones, delta rule, decode, GSA's slot scores, the short convolution)
runs on fresh random inputs and is compared with its torch form on the same inputs upcast to float64, by
``|out - ref| / |ref|`` for the output, the final state and every gradient; the top-k row mask, by the
entries where it differs from torch.topk's choice. ``sandbox bench kernels --check`` runs these on the
GPU before timing and refuses to time a kernel that fails (triton 3.4-3.7.0 is known to miscompile some
gated chunk backward kernels on Hopper).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

TOL = {torch.float32: 5e-3, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    den = ref.norm().item()
    num = (out - ref).norm().item()
    return num / den if den > 0 else num


def _gate(shape, kind, device, strength=1.0):
    B, T, H, K = shape
    if kind == "none":
        return None
    gs = (B, T, H) if kind == "scalar" else (B, T, H, K)
    if strength == "mixed":
        # weak decay, but strong in the upper half of the channels of every other 64-row chunk: chunks and
        # K tiles on both sides of the whole-chunk product limit in one call
        g = _gate(shape, kind, device)
        strong = _gate(shape, kind, device, 4.0)
        odd = (torch.arange(T, device=device) // 64 % 2 == 1).view(1, T, 1, *([1] * (len(gs) - 3)))
        upper = (torch.arange(gs[-1], device=device) >= gs[-1] // 2) if kind == "diag" else True
        return torch.where(odd & upper, strong, g)
    return F.logsigmoid(torch.randn(gs, device=device) * strength + (2.0 if strength <= 1 else -2.0)) / (
        16.0 if strength <= 1 else 1.0)


def make_inputs(B, T, H, K, V, gate, dtype, device, *, varlen=None, h0=False, strength=1.0, beta=False):
    """Fresh random inputs.  varlen: list of segment lengths (then B must be 1)."""
    q = torch.randn(B, T, H, K, device=device).to(dtype)
    k = (torch.randn(B, T, H, K, device=device) / math.sqrt(K)).to(dtype)
    if beta:
        k = F.normalize(k.float(), dim=-1).to(dtype)
    v = torch.randn(B, T, H, V, device=device).to(dtype)
    g = _gate((B, T, H, K), gate, device, strength)
    cu = None
    N = B
    if varlen is not None:
        cu = torch.tensor([0] + list(torch.tensor(varlen).cumsum(0).tolist()), device=device, dtype=torch.int32)
        N = len(varlen)
    init = torch.randn(N, H, K, V, device=device) if h0 else None
    b = torch.rand(B, T, H, device=device).to(dtype) if beta else None
    return dict(q=q, k=k, v=v, g=g, beta=b, initial_state=init, cu_seqlens=cu)


def check_recurrence(fn, inp, scale, tol) -> dict:
    """Compare fn (a linear_recurrence-like callable) with the float64 chunked reference, forward and backward."""
    from sandbox.kernels.chunked import chunk_reference

    names = [n for n in ("q", "k", "v", "g", "beta", "initial_state") if inp[n] is not None]
    mine = {n: inp[n].detach().clone().requires_grad_() for n in names}
    ref = {n: inp[n].detach().double().requires_grad_() for n in names}
    cu = inp["cu_seqlens"]
    o, ht = fn(**{n: mine.get(n) for n in ("q", "k", "v", "g", "beta", "initial_state")}, scale=scale,
               output_final_state=True, cu_seqlens=cu)
    ro, rht = chunk_reference(**{n: ref.get(n) for n in ("q", "k", "v", "g", "beta", "initial_state")},
                              scale=scale, output_final_state=True, cu_seqlens=cu)
    do = torch.randn_like(ro)
    dht = torch.randn_like(rht)
    (o.float() * do.to(o.device).float()).sum().add((ht * dht.float()).sum()).backward()
    (ro * do).sum().add((rht * dht).sum()).backward()
    errs = {"o": rel_err(o, ro), "final_state": rel_err(ht, rht)}
    for n in names:
        errs["d" + n] = rel_err(mine[n].grad, ref[n].grad) if mine[n].grad is not None else float("nan")
    ok = all(e <= tol for e in errs.values())  # NaN fails
    return {"errors": errs, "ok": ok, "tol": tol}


def check_decode(dtype, device, K=192, V=160, B=3, H=2) -> dict:
    """Single-step decode (dense and row-selected, gated and delta rule) against a float64 torch step."""
    from sandbox.kernels.triton_decode import decode_step

    res = {}
    for name, gate, beta, rows in [("decode_diag", "diag", False, False), ("decode_scalar_delta", "scalar", True, False),
                                   ("decode_rows", "diag", False, True)]:
        q = torch.randn(B, H, K, device=device).to(dtype)
        k = torch.randn(B, H, K, device=device).to(dtype) / math.sqrt(K)
        v = torch.randn(B, H, V, device=device).to(dtype)
        g = F.logsigmoid(torch.randn((B, H, K) if gate == "diag" else (B, H), device=device))
        b = torch.rand(B, H, device=device) if beta else None
        S = torch.randn(B, H, K, V, device=device)
        sel = None
        if rows:
            sel = torch.stack([torch.randperm(K, device=device)[:16] for _ in range(B * H)]).view(B, H, 16)
            mask = torch.zeros(B, H, K, device=device, dtype=torch.bool).scatter_(-1, sel, True)
            k = k * mask
            g = g * mask
        Sd = S.double()
        dec = g.double().exp()
        Sd = Sd * (dec[..., None] if dec.dim() == 3 else dec[..., None, None])
        if beta:
            u = v.double() - torch.einsum("bhk,bhkv->bhv", k.double(), Sd)
            Sd = Sd + b.double()[..., None, None] * k.double()[..., None] * u[..., None, :]
        else:
            Sd = Sd + k.double()[..., None] * v.double()[..., None, :]
        od = 0.5 * torch.einsum("bhk,bhkv->bhv", q.double(), Sd)
        S2 = S.clone()
        o = decode_step(q, k, v, S2, g=g, beta=b, scale=0.5, rows=sel)
        errs = {"o": rel_err(o, od), "state": rel_err(S2, Sd)}
        if rows:  # untouched rows must stay bit-identical
            untouched = ~torch.zeros(B, H, K, device=device, dtype=torch.bool).scatter_(-1, sel, True)
            errs["untouched_rows_changed"] = float((S2 != S)[untouched].any().item())
        ok = all(e <= TOL[dtype] for e in errs.values())
        res[f"{name}_{str(dtype)[6:]}"] = {"errors": errs, "ok": ok, "tol": TOL[dtype]}
    return res


def check_slot_scores(dtype, device, B=3, T=333, H=2, dk=64, m=64) -> dict:
    """GSA's first pass (``triton_slot_scores.py``) against its torch form in float64: scores, final state and
    the gradients of q, k, s and the log-gates; gates from none (an unchosen top-k slot) to strong decay."""
    from sandbox.kernels.slot_scores import slot_scores

    q = torch.randn(B, T, H, dk, device=device)
    k = torch.randn(B, T, H, dk, device=device) / math.sqrt(dk)
    chosen = torch.rand(B, T, H, m, device=device) < 0.5
    g = torch.where(chosen, F.logsigmoid(torch.randn(B, T, H, m, device=device) * 2), 0.0)
    s = -torch.expm1(g) * torch.rand(B, T, H, m, device=device)
    mine = [q.to(dtype), k.to(dtype), s.to(dtype), g]
    mine = [x.detach().clone().requires_grad_() for x in mine]
    ref = [x.detach().double().requires_grad_() for x in mine]
    o, S = slot_scores(*mine, scale=dk ** -0.5, output_final_state=True, impl="triton")
    ro, rS = slot_scores(*ref, scale=dk ** -0.5, output_final_state=True, impl="torch")
    w = torch.randn_like(ro)
    (o.float() * w.float()).sum().backward()
    (ro * w).sum().backward()
    errs = {"o": rel_err(o, ro), "final_state": rel_err(S, rS)}
    errs.update({"d" + n: rel_err(a.grad, b.grad) for n, a, b in zip("qksg", mine, ref)})
    return {"errors": errs, "ok": all(e <= TOL[dtype] for e in errs.values()), "tol": TOL[dtype]}


def check_short_conv(dtype, device, N=6, T=333, C=400, W=4, G=3) -> dict:
    """The convolution on q, k, v (``triton_short_conv.py``) against its float64 torch form: output and the
    gradients of x and w, x a column slice of a wider product (as the linear mixers pass it), the output as three
    pieces of columns (q, k, v) whose tile of columns straddles two, G weight groups."""
    from sandbox.kernels.short_conv import short_conv  # noqa: F401  (registers the ops)

    x = torch.randn(N, T, C + 144, device=device)[..., :C].to(dtype)
    w = (torch.randn(G, C, W, device=device) / math.sqrt(W)).requires_grad_()
    xs = x.detach().requires_grad_()
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    sizes = [C // 4 + 4, C // 4 - 4, C // 2]
    y = torch.cat(torch.ops.sandbox.short_conv(xs, w, sizes), -1)
    ry = torch.cat(torch.ops.sandbox.short_conv(xr, wr, [C]), -1)
    dy = torch.randn_like(ry)
    y.backward(dy.to(dtype))
    ry.backward(dy)
    errs = {"o": rel_err(y, ry), "dx": rel_err(xs.grad, xr.grad), "dw": rel_err(w.grad, wr.grad)}
    return {"errors": errs, "ok": all(e <= TOL[dtype] for e in errs.values()), "tol": TOL[dtype]}


def check_loss_and_lookup(dtype, device, N=3000, V=8192) -> dict:
    """The training loss (``triton_cross_entropy.py``) against float64 ``F.cross_entropy``: each row's loss and the
    logits' gradient, at V 8192 (one tile) and 12000 (a second tile, part masked), one row in 10 ignored; and the
    embedding lookup (``triton_embedding.py``) against indexing, which must be equal (the error is its count of
    differing entries)."""
    import torch.nn.functional as F

    from sandbox.kernels.cross_entropy import cross_entropy
    from sandbox.kernels.embedding import embedding

    errs = {}
    for v in (V, 12000):
        logits = (3 * torch.randn(N, v, device=device)).to(dtype).requires_grad_()
        y = torch.randint(0, v, (N,), device=device)
        y[::10] = -100
        w = torch.rand(N, device=device)
        ref_in = logits.detach().double().requires_grad_()
        ref = F.cross_entropy(ref_in, y, ignore_index=-100, reduction="none")
        (ref * w).sum().backward()
        out = cross_entropy(logits, y)
        (out * w).sum().backward()
        errs[f"loss_V{v}"], errs[f"dlogits_V{v}"] = rel_err(out, ref), rel_err(logits.grad, ref_in.grad)
    table = torch.randn(9 * 8192, 128, device=device)
    ids = torch.randint(0, 9 * 8192, (4096, 64), device=device)
    errs["lookup_differ"] = float((embedding(table, ids) != table[ids]).sum().item())
    return {"errors": errs, "ok": all(e <= TOL[dtype] for e in errs.values()), "tol": TOL[dtype]}


def check_topk_mask(dtype, device, rows=9 * 2048, c=64, k=16) -> dict:
    """The top-k row mask (``triton_topk_mask.py``) against torch.topk's set, on rows without ties (a permutation
    each, exact in 16-bit floats) of 64 and of 32 columns (GSA's slots, GLA's key rows at d_model 128): the count
    of entries where they differ, which must be 0."""
    from sandbox.kernels.topk_mask import topk_mask

    errs = {}
    for cc, kk in ((c, k), (c // 2, k // 2)):
        x = torch.rand(rows, cc, device=device).argsort(-1).to(dtype)
        want = torch.zeros_like(x, dtype=torch.bool).scatter_(-1, x.float().topk(kk, -1).indices, True)
        errs[f"differ_c{cc}_k{kk}"] = float((topk_mask(x, kk) != want).sum().item())
    return {"errors": errs, "ok": all(e == 0 for e in errs.values()), "tol": 0.0}


def _family_cases(dtype):
    """(name, kernel, make_inputs args, make_inputs kwargs, scale) of every family check at one dtype."""
    dn = str(dtype)[6:]
    cases = []
    sizes = ((128, 128), (512, 512)) if dtype == torch.bfloat16 else ((64, 64),)
    for gate in ("none", "scalar", "diag"):
        for K, V in sizes:
            cases.append((f"gla_{gate}_K{K}_V{V}_{dn}", chunk_gla_rec, (2, 333, 2, K, V, gate), dict(h0=True), K ** -0.5))
    cases += [
        (f"gla_diag_strong_decay_{dn}", chunk_gla_rec, (2, 200, 2, 64, 64, "diag"), dict(h0=True, strength=4.0), 0.125),
        (f"gla_diag_mixed_decay_{dn}", chunk_gla_rec, (2, 300, 2, 128, 64, "diag"), dict(h0=True, strength="mixed"),
         0.1),
        # the K tile wider than the V tile, where a fused output kernel (branch fused2) miscompiled on the H200 in bf16:
        # K 64 V 32 (GSA's second pass at d_model 64) faulted; at K 128 V 16 the backward read a bf16 A wrongly
        (f"gla_diag_K64_V32_{dn}", chunk_gla_rec, (2, 333, 2, 64, 32, "diag"), dict(h0=True), 0.125),
        (f"gla_diag_K128_V16_{dn}", chunk_gla_rec, (2, 192, 2, 128, 16, "diag"), dict(h0=True), 0.125),
        (f"gla_diag_varlen_{dn}", chunk_gla_rec, (1, 600, 2, 100, 72, "diag"),
         dict(h0=True, varlen=[130, 0, 64, 1, 0, 305, 100]), 0.1),
        (f"gla_scalar_varlen_{dn}", chunk_gla_rec, (1, 600, 3, 64, 64, "scalar"),
         dict(h0=False, varlen=[0, 300, 299, 1]), 0.1)]
    for gate, K in (("none", 64), ("scalar", 128), ("scalar", 256)):
        cases.append((f"delta_{gate}_K{K}_{dn}", delta_rec, (2, 333, 2, K, K, gate), dict(h0=True, beta=True), K ** -0.5))
    # Gated DeltaNet with 1 head at d_model 256 (Zoology Figure 2): value head twice the key head, two 256 tiles
    cases.append((f"delta_scalar_K256_V512_{dn}", delta_rec, (2, 333, 2, 256, 512, "scalar"), dict(h0=True, beta=True),
                  256 ** -0.5))
    cases.append((f"delta_scalar_varlen_{dn}", delta_rec, (1, 400, 2, 128, 128, "scalar"),
                  dict(h0=True, beta=True, varlen=[100, 0, 299, 1]), 0.1))
    # head dims under 16 go through the dispatch, which pads them (GLA at 16 heads of d_model 256; GSA's 1-wide pass)
    cases += [(f"padded_gla_diag_K8_V16_{dn}", dispatch_rec, (2, 333, 4, 8, 16, "diag"), dict(h0=True), 8 ** -0.5),
              (f"padded_gla_scalar_K4_V1_{dn}", dispatch_rec, (2, 333, 2, 4, 1, "scalar"), dict(h0=True), 0.5),
              (f"padded_delta_scalar_K8_V8_{dn}", dispatch_rec, (2, 333, 2, 8, 8, "scalar"), dict(h0=True, beta=True),
               8 ** -0.5)]
    return cases


def family_checks(device) -> dict:
    """Small-but-real cases for each kernel family, bf16 and fp32 inputs; a kernel that raises fails its check."""
    out = {}

    def run(name, dtype, check):
        try:
            out.update(check() if name is None else {name: check()})
        except Exception as e:
            out[name or f"decode_{str(dtype)[6:]}"] = {"errors": {"raised": float("nan")}, "ok": False,
                                                      "tol": TOL[dtype],
                                                      "exception": f"{type(e).__name__}: {str(e)[:300]}"}

    for dtype in (torch.bfloat16, torch.float32):
        for name, fn, args, kw, scale in _family_cases(dtype):
            run(name, dtype, lambda: check_recurrence(fn, make_inputs(*args, dtype, device, **kw), scale, TOL[dtype]))
        run(f"slot_scores_{str(dtype)[6:]}", dtype, lambda: check_slot_scores(dtype, device))
        run(f"short_conv_{str(dtype)[6:]}", dtype, lambda: check_short_conv(dtype, device))
        run(f"topk_mask_{str(dtype)[6:]}", dtype, lambda: check_topk_mask(dtype, device))
        run(f"loss_and_lookup_{str(dtype)[6:]}", dtype, lambda: check_loss_and_lookup(dtype, device))
        run(None, dtype, lambda: check_decode(dtype, device))          # several entries of its own
    return out


def chunk_gla_rec(q, k, v, g=None, beta=None, **kw):
    from sandbox.kernels.triton_chunk import chunk_gla
    return chunk_gla(q, k, v, g, **kw)


def dispatch_rec(q, k, v, g=None, beta=None, **kw):
    from sandbox.kernels import linear_recurrence
    return linear_recurrence(q, k, v, g, beta, impl="triton", **kw)


def delta_rec(q, k, v, g=None, beta=None, **kw):
    from sandbox.kernels.triton_delta import chunk_delta_rule
    return chunk_delta_rule(q, k, v, beta, g, **kw)

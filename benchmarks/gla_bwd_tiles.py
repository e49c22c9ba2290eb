"""The GLA gradient kernel's (K tile, V tile) choices on the GPU, bf16, against the float64 torch
chunked form, one case per process (a miscompiled case can fault with an illegal address, which ends the
CUDA context).  Triton 3.6 on Hopper miscompiled ``_bwd_chunk`` whenever BV > BK (4 warps): dq and dg wrong,
NaN or +-3e38, or an illegal address; ``_bwd_tiles`` now keeps BV <= BK.  Rerun this after a Triton upgrade
(a case that forces BV > BK shows whether the compiler still needs the rule).  Heads of at most 16 values
with one K tile read out of range at 4 warps once a chunk decays past exp(40) (8a0b280); ``_bwd_warps``
launches them with 2: the cases forced to 4 warps there show whether that rule is still needed.

    python benchmarks/gla_bwd_tiles.py                      # the matrix below, one line per case
    python benchmarks/gla_bwd_tiles.py 16 32 16 32 4 diag 8 320   # one case: K V BK BV WARPS GATE B T [STAGES]
    (BK = BV = 0: the tiles _bwd_tiles picks; WARPS = 0 (STAGES = 0 or none): the launch's own;
    GATE none|scalar|diag|weak|strong|vstrong|gsa)
    python benchmarks/gla_bwd_tiles.py --time "64 64 0 0 0 gsa 2304 320" "64 64 32 32 4 gsa 2304 320" ...
    (each case's backward timed instead of checked, median ms of triton's do_bench: the tiles' speed at a
    stack's shape, where the float64 reference would not fit; check the same tiles at a small B first)

Gate gsa is pass 2 of gated slot attention: queries are slot probabilities (a softmax over the K slots), keys
the slot writes 1 - alpha and log-gates log(alpha) = logsigmoid(x) / 8.
"""
import json
import subprocess
import sys

MATRIX = [
    # forced tiles with BV > BK: failed on an H100 before the fix (wrong dq, NaN, illegal address)
    "16 32 16 32 0 diag 8 320", "16 64 16 64 0 diag 8 320", "32 64 32 64 0 diag 8 320",
    # what _bwd_tiles picks now, every gate, weak and strong decay, GLA head shapes (K = V / 2) and K = V
    "16 32 0 0 0 diag 64 320", "16 32 0 0 0 scalar 8 320", "16 32 0 0 0 none 8 320", "16 32 0 0 0 strong 8 320",
    "16 32 0 0 0 vstrong 8 320", "16 64 0 0 0 diag 8 320", "32 64 0 0 0 diag 8 320", "32 64 0 0 0 vstrong 8 320",
    "64 128 0 0 0 strong 8 320", "128 256 0 0 0 diag 4 320", "128 128 0 0 0 vstrong 8 320", "20 40 0 0 0 strong 4 200",
    # heads of 16 values (sla_heads at 16 heads: K 8 padded to 16, V 16), launched with 2 warps: each decay path
    "8 16 0 0 0 weak 8 320", "8 16 0 0 0 strong 8 320", "16 16 0 0 0 vstrong 8 320", "64 16 0 0 0 strong 8 320",
    # forced to 4 warps: an out-of-range shared read on the H200 (Triton 3.6) with a decay past exp(40), before
    # 8a0b280 (2026-11-26; with one or three pipeline stages alike); K = V = 32 and 64 at 4 warps (one K and one V
    # tile, as GSA's)
    "8 16 0 0 4 strong 8 320", "16 16 0 0 4 vstrong 8 320", "32 32 0 0 0 vstrong 8 320", "64 64 0 0 0 vstrong 8 320",
]


def one(argv, time=False):
    import torch
    import torch.nn.functional as F

    import sandbox.kernels.triton_chunk_bwd as tcb
    from sandbox.kernels import linear_recurrence

    K, V, BK, BV, W = (int(x) for x in argv[:5])
    gate, B, T = argv[5], int(argv[6]), int(argv[7])
    stages = int(argv[8]) if len(argv) > 8 else 0
    H = 2
    if BK:
        tcb._bwd_tiles = lambda K_, V_: (BK, BV)
    if W or stages:
        fn = tcb._bwd_chunk
        launch_opts = {**({"num_warps": W} if W else {}), **({"num_stages": stages} if stages else {})}

        class Launch:
            def __getitem__(self, grid):
                launch = fn[grid]
                return lambda *x, **kw: launch(*x, **{**kw, **launch_opts})
        tcb._bwd_chunk = Launch()
    tiles = tcb._bwd_tiles(K, V)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen).softmax(-1)
    v = torch.randn(B, T, H, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, K, generator=gen)) / 16
    if gate == "gsa":
        q = torch.randn(B, T, H, K, generator=gen).softmax(-1)
        g = F.logsigmoid(torch.randn(B, T, H, K, generator=gen)) / 8
        k = 1 - g.exp()
    if gate == "weak":  # every chunk decays by less than exp(40): the one-product intra parts only
        g = F.logsigmoid(torch.randn(B, T, H, K, generator=gen) + 8)
    if gate in ("strong", "vstrong"):  # chunks past exp(40) (mixed paths), or 16-row blocks past it (exact path)
        g = F.logsigmoid(torch.randn(B, T, H, K, generator=gen) * 2 - (1 if gate == "strong" else 4))
    g = None if gate == "none" else (g[..., 0] if gate == "scalar" else g)
    do = torch.randn(B, T, H, V, generator=gen).cuda()
    res = {"case": " ".join(argv), "tiles": tiles}
    if time:
        import triton
        ins = [t.cuda().bfloat16().requires_grad_() for t in (q, k, v)]
        ins += [g.cuda().requires_grad_()] if g is not None else []
        o, _ = linear_recurrence(*ins[:3], g=ins[3] if g is not None else None, scale=1.0, impl="triton")
        res["bwd_ms"] = triton.testing.do_bench(lambda: torch.autograd.grad(o, ins, do, retain_graph=True),
                                                warmup=50, rep=300)
        print(json.dumps(res), flush=True)
        return
    for name, dO in (("rel_err", do), ("zero_dO_maxabs", torch.zeros_like(do))):
        ins = [t.cuda().bfloat16().requires_grad_() for t in (q, k, v)]
        ins += [g.cuda().requires_grad_()] if g is not None else []
        o, _ = linear_recurrence(*ins[:3], ins[3] if g is not None else None, scale=K ** -0.5, impl="triton")
        (o.float() * dO).sum().backward()
        ref = [t.detach().double().requires_grad_() for t in ins]
        ro, _ = linear_recurrence(*ref[:3], ref[3] if g is not None else None, scale=K ** -0.5, impl="torch")
        (ro * dO.double()).sum().backward()
        r = {}
        for n, a, b in zip("qkvg", ins, ref):
            bad = int((~torch.isfinite(a.grad)).sum())
            if name == "rel_err":
                err = float((a.grad.double() - b.grad).norm() / b.grad.norm().clamp_min(1e-30))
            else:
                err = float(a.grad.abs().max())
            r["d" + n] = f"{err:.2g}" + (f" ({bad} non-finite)" if bad else "")
        res[name] = r
    errs = [float(x.split()[0]) for x in res["rel_err"].values()]
    res["ok"] = all(e <= 3e-2 for e in errs) and all(float(x.split()[0]) == 0 for x in res["zero_dO_maxabs"].values())
    print(json.dumps(res), flush=True)


def main():
    if sys.argv[1:2] == ["--one-timed"]:
        return one(sys.argv[2:], time=True)
    time = sys.argv[1:2] == ["--time"]
    if len(sys.argv) > 1 and not time:
        return one(sys.argv[1:])
    for case in sys.argv[2:] if time else MATRIX:
        argv = ["--one-timed", *case.split()] if time else case.split()
        p = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, timeout=300)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        print(lines[-1] if lines else json.dumps({"case": case, "ok": False, "error": (p.stderr.strip().splitlines()
                                                                                      or ["?"])[-1][:200]}), flush=True)


if __name__ == "__main__":
    main()

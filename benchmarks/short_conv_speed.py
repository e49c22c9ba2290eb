"""The short convolution's kernels (``triton_short_conv.py``) at a stack of 9 Figure 8 GLA runs: x [9 * 256, 320, 256]
in bf16, the leading q, k, v columns of the 400-wide projection, with 4 taps and 9 weight groups (``--replicas R``
and ``--channels C``: a stack of R GLA runs at d_model C / 2, whose projection is C + C / 2 + 16 wide).

    python benchmarks/short_conv_speed.py [--replicas 9] [--channels 256] [--ref CHECKOUT] [--tiles BT,BC,WARPS ...]
        [--out FILE.json]

(through `benchmarks/device.sh script short_conv_speed`, or with ``export PYTHONPATH=$PWD``; ``--ref .ref/COMMIT``)

Times (median ms, triton's do_bench): the forward, the backward of this checkout (and of ``--ref``'s, a checkout
directory, loaded from its file in the same process), the backward at each ``--tiles`` setting, and a bf16 copy of
two such tensors (what reading x and dy and writing dx once costs, the backward's least traffic). Checks dx and dw
against a float64 torch form, and against ``--ref``'s. Needs a GPU.
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

import sandbox.kernels.triton_short_conv as sc


def reference(x, w, dy, per):
    """dx, dw of silu(causal depthwise conv) in float64 through autograd."""
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    W = w.shape[-1]
    wn = wd.repeat_interleave(per, 0)
    xp = F.pad(xd, (0, 0, W - 1, 0))
    y = F.silu(sum(xp[:, j:j + x.shape[1]] * wn[:, None, :, j] for j in range(W)))
    return torch.autograd.grad(y, (xd, wd), dy.double())


def rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=9)
    ap.add_argument("--channels", type=int, default=256, help="q, k and v columns (2 x d_model for a GLA)")
    ap.add_argument("--ref", help="another checkout whose sandbox/kernels/triton_short_conv.py to time beside")
    ap.add_argument("--tiles", nargs="*", default=[],
                    help="backward tiles BT,BC,WARPS to time beside the kept ones")
    ap.add_argument("--out")
    a = ap.parse_args()
    R, T, C, W = a.replicas, 320, a.channels, 4
    N = R * 256
    gen = torch.Generator(device="cuda").manual_seed(0)
    wide = torch.randn(N, T, C + C // 2 + 16, device="cuda", generator=gen).to(torch.bfloat16)
    x = wide[..., :C]
    w = torch.randn(R, C, W, device="cuda", generator=gen) / 2
    dy = torch.randn(N, T, C, device="cuda", generator=gen).to(torch.bfloat16)
    bench = lambda f: triton.testing.do_bench(f, warmup=25, rep=200)  # noqa: E731
    res = {"shape": [N, T, C], "taps": W, "groups": R, "ms": {}, "err": {}}
    ms, err = res["ms"], res["err"]
    qkv = [C // 4, C // 4, C // 2]                          # the q, k, v pieces of a GLA
    dys = [d.contiguous() for d in dy.split(qkv, -1)]
    ms["forward"] = bench(lambda: sc.short_conv_triton(x, w, [C]))
    ms["backward"] = bench(lambda: sc.short_conv_grad_triton([dy], x, w))
    ms["forward_qkv_pieces"] = bench(lambda: sc.short_conv_triton(x, w, qkv))
    ms["backward_qkv_pieces"] = bench(lambda: sc.short_conv_grad_triton(dys, x, w))
    ms["copy_two_bf16"] = bench(lambda: (x.clone(), dy.clone()))
    dx_ref, dw_ref = reference(x, w, dy, N // R)
    dx, dw = sc.short_conv_grad_triton([dy], x, w)
    err["dx"], err["dw"] = rel(dx, dx_ref), rel(dw, dw_ref)
    pdx, pdw = sc.short_conv_grad_triton(dys, x, w)
    res["pieces_equal_whole"] = bool(torch.equal(pdx, dx) and torch.equal(pdw, dw))
    if a.ref:
        spec = importlib.util.spec_from_file_location(
            "ref_short_conv", Path(a.ref) / "sandbox/kernels/triton_short_conv.py")
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        pieces = "dys" in inspect.signature(old.short_conv_grad_triton).parameters   # the API since 2d3b3a4
        ms["backward_ref"] = bench(lambda: old.short_conv_grad_triton([dy] if pieces else dy, x, w))
        odx, odw = old.short_conv_grad_triton([dy] if pieces else dy, x, w)
        err["dx_ref"], err["dw_ref"] = rel(odx, dx_ref), rel(odw, dw_ref)
        res["dx_equal_ref"] = bool(torch.equal(dx, odx))
        res["dw_vs_ref"] = rel(dw, odw.double())
    kept = (sc.BT_BWD, sc.BC_BWD, sc.WARPS_BWD)
    for t in a.tiles:
        sc.BT_BWD, sc.BC_BWD, sc.WARPS_BWD = (int(v) for v in t.split(","))
        ms[f"backward_{t}"] = bench(lambda: sc.short_conv_grad_triton([dy], x, w))
        tdx, tdw = sc.short_conv_grad_triton([dy], x, w)
        err[f"dx_{t}"], err[f"dw_{t}"] = rel(tdx, dx_ref), rel(tdw, dw_ref)
    sc.BT_BWD, sc.BC_BWD, sc.WARPS_BWD = kept
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

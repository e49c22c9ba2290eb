"""`sandbox bench kernels`: check the Triton kernels against a float64 reference, then time them.

Entry points: ``parser()`` and ``main_kernels(argv) -> int`` (the options, for the CLI) and
``run_kernel_bench(check, shapes, out_path, ...) -> dict`` (the work).

Check (``sandbox/bench/checks.py``): every kernel family against the float64 torch reference
on fresh random inputs, output, final state and every gradient. A kernel that fails (or gives
NaN) is not timed.

Timing: forward+backward median ms through ``triton.testing.do_bench``, in one process, for the
Triton kernels, flash-linear-attention's ``chunk_gla`` (when importable), torch SDPA (flash
backend, causal; head dims up to 256) and the torch chunked reference.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from sandbox.bench.checks import TOL, chunk_gla_rec, check_recurrence, family_checks, make_inputs

DEFAULT_SHAPES = [(64, 512, 2, 64), (64, 512, 2, 256), (16, 2048, 2, 256), (8, 4096, 4, 128), (8, 2048, 2, 512)]
H200_BW = 4.8e12       # bytes/s, datasheet
H200_BF16 = 990e12     # FLOP/s dense bf16, datasheet


def _fla():
    try:
        from fla.ops.gla import chunk_gla as fla_chunk_gla
        return fla_chunk_gla
    except Exception as e:  # not installed, or fails to import on this triton
        print(f"flash-linear-attention not usable: {type(e).__name__}: {str(e)[:200]}")
        return None


_WARM_ONLY = False  # compile / autotune only (run once, no timing): for parallel warm-up processes


def _time(fn, grads) -> float:
    import triton.testing
    if _WARM_ONLY:
        fn()
        torch.cuda.synchronize()
        return 0.0
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grads, return_mode="median"))


def profile_breakdown(shape, fla_fn, device, dtype=torch.bfloat16, iters=5) -> dict:
    """GPU time per kernel of one forward+backward (torch.profiler), ours and fla's, to tell launch-bound
    from kernel-bound: compare the summed kernel time with the do_bench wall time."""
    from torch.profiler import ProfilerActivity, profile
    from sandbox.kernels.triton_chunk import chunk_gla

    B, T, H, K = shape
    inp = make_inputs(B, T, H, K, K, "diag", dtype, device)
    ts = [inp[n].requires_grad_() for n in ("q", "k", "v", "g")]
    do = torch.randn(B, T, H, K, device=device, dtype=dtype)
    fns = {"triton_diag": lambda: chunk_gla(inp["q"], inp["k"], inp["v"], inp["g"], scale=K ** -0.5)[0]}
    if fla_fn is not None:
        fns["fla_chunk_gla"] = lambda: fla_fn(inp["q"], inp["k"], inp["v"], inp["g"], scale=K ** -0.5)[0]
    out = {}
    for name, f in fns.items():
        try:
            for _ in range(3):
                f().backward(do)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(iters):
                    f().backward(do)
                torch.cuda.synchronize()
            rows = []
            for e in prof.key_averages():
                dt = getattr(e, "self_device_time_total", None)
                if dt is None:
                    dt = getattr(e, "self_cuda_time_total", 0)
                if dt > 0:
                    rows.append((e.key, dt / iters / 1000.0, e.count / iters))
            rows.sort(key=lambda r: -r[1])
            out[name] = {"gpu_ms_total": sum(r[1] for r in rows), "launches": sum(r[2] for r in rows),
                         "kernels": [{"name": r[0][:80], "ms": r[1], "calls": r[2]} for r in rows[:14]]}
            print(f"profile {name} {shape}: kernels {out[name]['gpu_ms_total']:.3f} ms GPU in "
                  f"{out[name]['launches']:.0f} launches per fwd+bwd")
            for r in rows[:10]:
                print(f"   {r[1]:8.4f} ms  x{r[2]:.0f}  {r[0][:90]}")
        except Exception as e:
            print(f"profile {name} failed: {type(e).__name__}: {str(e)[:200]}")
    return out


def _fwd_bwd(call, tensors, do):
    def run():
        o = call()
        o.backward(do)
    return run


def flops_bytes(B, T, H, K, V, C=64, in_bytes=2, g_bytes=4):
    """Executed FLOPs of the Triton GLA forward+backward (diagonal gate) and the fewest bytes it must move."""
    tok = B * T * H
    flops = tok * (6 * C * K + 8 * C * V + 14 * K * V)
    fwd_bytes = tok * (in_bytes * (2 * K + V) + g_bytes * K + in_bytes * V)
    bwd_bytes = tok * (in_bytes * (2 * K + 2 * V) + g_bytes * K + in_bytes * (2 * K + V) + g_bytes * K)
    return flops, fwd_bytes + bwd_bytes


def bench_shape(shape, gates, seq_blocks, fla_fn, device, dtype=torch.bfloat16, do_check=True, torch_ref=True):
    B, T, H, K = shape
    V = K
    row = {"shape": list(shape), "ms": {}, "check": {}}
    scale = K ** -0.5
    for gate in gates:
        for sb in seq_blocks:
            if sb != seq_blocks[0] and (sb >= K or gate != "diag"):
                continue  # same kernels as the first block size, or not a case worth the compile time
            name = f"triton_{gate}" + ("" if sb == seq_blocks[0] else f"_blk{sb}")
            os.environ["SANDBOX_TRITON_SEQ_BLOCK"] = str(sb)
            try:
                _bench_ours(row, name, gate, shape, dtype, device, do_check, scale)
            except Exception as e:  # e.g. a tile that does not fit in shared memory
                print(f"  {name} failed at {shape}: {type(e).__name__}: {str(e)[:200]}")
                row["ms"][name] = None
        os.environ["SANDBOX_TRITON_SEQ_BLOCK"] = str(seq_blocks[0])
    _bench_others(row, shape, fla_fn, device, dtype, torch_ref, scale)
    fl, by = flops_bytes(B, T, H, K, V)
    row["flops"], row["bytes"] = fl, by
    return row


def _bench_ours(row, name, gate, shape, dtype, device, do_check, scale):
    from sandbox.kernels.triton_chunk import chunk_gla

    B, T, H, K = shape
    V = K
    if do_check:
        inp = make_inputs(min(B, 2), T, H, K, V, gate, dtype, device, h0=True)
        c = check_recurrence(chunk_gla_rec, inp, scale, TOL[dtype])
        row["check"][name] = c
        errs = " ".join(f"{k}={v:.1e}" for k, v in c["errors"].items())
        print(f"  check {'ok  ' if c['ok'] else 'FAIL'} {name} at {shape} (B={min(B, 2)}): {errs}", flush=True)
        if not c["ok"]:
            print(f"  {name}: FAILED check; not timed")
            row["ms"][name] = None
            return
    inp = make_inputs(B, T, H, K, V, gate, dtype, device)
    ts = [inp[n].requires_grad_() for n in ("q", "k", "v", "g") if inp[n] is not None]
    do = torch.randn(B, T, H, V, device=device, dtype=dtype)
    row["ms"][name] = _time(_fwd_bwd(lambda: chunk_gla(inp["q"], inp["k"], inp["v"], inp["g"], scale=scale)[0],
                                     ts, do), ts)
    if gate == "diag":
        with torch.no_grad():
            row["ms"][name + "_fwd_only"] = _time(
                lambda: chunk_gla(inp["q"], inp["k"], inp["v"], inp["g"], scale=scale), None)


def _bench_others(row, shape, fla_fn, device, dtype, torch_ref, scale):
    from sandbox.kernels.chunked import chunk_reference

    B, T, H, K = shape
    V = K
    inp = make_inputs(B, T, H, K, V, "diag", dtype, device)
    ts = [inp[n].requires_grad_() for n in ("q", "k", "v", "g")]
    do = torch.randn(B, T, H, V, device=device, dtype=dtype)
    if fla_fn is not None:
        try:
            row["ms"]["fla_chunk_gla"] = _time(_fwd_bwd(
                lambda: fla_fn(inp["q"], inp["k"], inp["v"], inp["g"], scale=scale)[0], ts, do), ts)
        except Exception as e:
            print(f"  fla chunk_gla failed at {shape}: {type(e).__name__}: {str(e)[:200]}")
            row["ms"]["fla_chunk_gla"] = None
    if K <= 256:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        qa, ka, va = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (inp["q"], inp["k"], inp["v"]))
        doa = do.transpose(1, 2).contiguous()

        def sdpa():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(qa, ka, va, is_causal=True)
        try:
            row["ms"]["sdpa_flash"] = _time(_fwd_bwd(sdpa, [qa, ka, va], doa), [qa, ka, va])
        except Exception as e:
            print(f"  sdpa flash failed at {shape}: {type(e).__name__}: {str(e)[:200]}")
            row["ms"]["sdpa_flash"] = None
    else:
        row["ms"]["sdpa_flash"] = None  # flash attention supports head dims up to 256
    if torch_ref and not _WARM_ONLY:
        try:
            row["ms"]["torch_chunk"] = _time(_fwd_bwd(
                lambda: chunk_reference(inp["q"], inp["k"], inp["v"], inp["g"], scale=scale)[0], ts, do), ts)
        except torch.OutOfMemoryError:
            row["ms"]["torch_chunk"] = None
        torch.cuda.empty_cache()


def bench_sse_varlen(fla_fn, device, dtype=torch.bfloat16, B=8, T=4096, H=2, K=64, parts=(1, 16), seed=0):
    """SSE varlen path at fixed k=1: every token goes to one of N partitions; each partition's tokens of a
    sequence form one packed segment, so the packed length stays B*T while the segment count is B*N."""
    from sandbox.kernels.triton_chunk import chunk_gla

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for N in parts:
        lens = []
        for _ in range(B):
            counts = torch.bincount(torch.randint(0, N, (T,), generator=gen), minlength=N)
            lens += counts.tolist()
        inp = make_inputs(1, B * T, H, K, K, "diag", dtype, device, varlen=lens)
        ts = [inp[n].requires_grad_() for n in ("q", "k", "v", "g")]
        do = torch.randn(1, B * T, H, K, device=device, dtype=dtype)
        cu = inp["cu_seqlens"]
        r = {"segments": len(lens), "ms": {}}
        r["ms"]["triton_diag"] = _time(_fwd_bwd(
            lambda: chunk_gla(inp["q"], inp["k"], inp["v"], inp["g"], scale=0.125, cu_seqlens=cu)[0], ts, do), ts)
        if fla_fn is not None:
            try:
                cu64 = cu.long()
                r["ms"]["fla_chunk_gla"] = _time(_fwd_bwd(
                    lambda: fla_fn(inp["q"], inp["k"], inp["v"], inp["g"], scale=0.125, cu_seqlens=cu64)[0],
                    ts, do), ts)
            except Exception as e:
                print(f"  fla varlen failed: {type(e).__name__}: {str(e)[:200]}")
        out[f"N{N}"] = r
    return out


def _fmt(x, w=9, p=3):
    return f"{x:{w}.{p}f}" if isinstance(x, (int, float)) and x is not None else f"{'-':>{w}}"


def run_kernel_bench(check: bool, shapes, out_path, *, gates=("diag", "scalar", "none"), seq_blocks=(64,),
                     sse=True, torch_ref=True, warm_only=False, profile=True, deadline_s=None, family=True,
                     no_fla=False) -> dict:
    """Check (optional), then time every shape; ``deadline_s``: skip what would start after that many seconds."""
    global _WARM_ONLY
    if not torch.cuda.is_available():
        raise RuntimeError("sandbox bench kernels needs a CUDA GPU")
    import triton

    _WARM_ONLY = warm_only
    start = time.time()

    def late(what):
        if deadline_s is not None and time.time() - start > deadline_s:
            print(f"deadline: skipping {what}")
            return True
        return False

    device = "cuda"
    torch.manual_seed(0)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "time": time.strftime("%Y-%m-%d %H:%M:%S"), "checks": {}, "shapes": [], "sse_varlen": None}
    fla_fn = None if no_fla else _fla()
    result["fla"] = fla_fn is not None
    failed = set()
    if check and family:
        t0 = time.time()
        result["checks"] = family_checks(device)
        for name, c in result["checks"].items():
            status = "ok  " if c["ok"] else "FAIL"
            errs = " ".join(f"{k}={v:.1e}" for k, v in c["errors"].items())
            print(f"check {status} {name:34s} {errs}")
            if not c["ok"]:
                failed.add(name)
        print(f"family checks: {len(result['checks']) - len(failed)}/{len(result['checks'])} passed "
              f"in {time.time() - t0:.0f} s")
    for shape in shapes:
        if late(f"shape {shape}"):
            continue
        t0 = time.time()
        row = bench_shape(tuple(shape), gates, seq_blocks, fla_fn, device, do_check=check, torch_ref=torch_ref)
        result["shapes"].append(row)
        print(f"shape {tuple(shape)}: {json.dumps(row['ms'])} ({time.time() - t0:.0f} s)", flush=True)
        if out_path:
            _write(out_path, result)
    if sse and not late("SSE varlen"):
        result["sse_varlen"] = bench_sse_varlen(fla_fn, device)
        if out_path:
            _write(out_path, result)
    if warm_only:
        return result
    if profile and result["shapes"] and not late("profile"):
        result["profile"] = {}
        for r in (result["shapes"][0], max(result["shapes"], key=lambda r: r["flops"])):
            result["profile"][str(tuple(r["shape"]))] = profile_breakdown(tuple(r["shape"]), fla_fn, device)
    # table
    print(f"\nGPU {result['gpu']}, torch {result['torch']}, triton {result['triton']}; ms fwd+bwd (median), bf16")
    names = sorted({n for r in result["shapes"] for n in r["ms"]}, key=lambda n: (not n.startswith("triton"), n))
    print(f"{'(B,T,H,K=V)':>20s} " + " ".join(f"{n[:14]:>14s}" for n in names) + "   fla/ours  sdpa/ours  torch/ours")
    for r in result["shapes"]:
        ms = r["ms"]
        ours = ms.get("triton_diag")
        rat = [ms.get(x) / ours if ms.get(x) and ours else None for x in ("fla_chunk_gla", "sdpa_flash", "torch_chunk")]
        r["ratios_vs_triton_diag"] = dict(zip(("fla", "sdpa", "torch"), rat))
        print(f"{str(tuple(r['shape'])):>20s} " + " ".join(f"{_fmt(ms.get(n), 14)}" for n in names)
              + "   " + "  ".join(_fmt(x, 8, 2) for x in rat))
    if result["shapes"]:
        big = max(result["shapes"], key=lambda r: r["flops"])
        ms = big["ms"].get("triton_diag")
        if ms:
            big["achieved"] = {"TFLOPs": big["flops"] / ms / 1e9, "TBps_min_bytes": big["bytes"] / ms / 1e9,
                               "frac_bf16_peak": big["flops"] / ms / 1e-3 / H200_BF16,
                               "frac_bw_peak": big["bytes"] / ms / 1e-3 / H200_BW}
            a = big["achieved"]
            print(f"largest shape {tuple(big['shape'])}: {a['TFLOPs']:.1f} TFLOP/s executed "
                  f"({100 * a['frac_bf16_peak']:.1f}% of 990), {a['TBps_min_bytes']:.2f} TB/s of the fewest bytes "
                  f"({100 * a['frac_bw_peak']:.1f}% of 4.8)")
    if result["sse_varlen"]:
        s = result["sse_varlen"]
        for key, r in s.items():
            print(f"SSE varlen {key} ({r['segments']} segments): " + ", ".join(f"{k} {v:.3f} ms" for k, v in r["ms"].items()))
        if "N1" in s and "N16" in s:
            print(f"SSE varlen N16/N1 (triton): {s['N16']['ms']['triton_diag'] / s['N1']['ms']['triton_diag']:.2f}")
    if failed:
        print(f"FAILED checks: {sorted(failed)}")
    result["failed_checks"] = sorted(failed)
    if out_path:
        _write(out_path, result)
    return result


def _write(path, result):
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(result, indent=1, default=str))


def _parse_shapes(text: str):
    shapes = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        try:
            vals = tuple(int(x) for x in part.replace("x", ",").split(","))
        except ValueError:
            raise ValueError(f"--shapes: cannot parse {part!r}; expected B,T,H,K[;B,T,H,K...]") from None
        if len(vals) != 4 or min(vals) < 1:
            raise ValueError(f"--shapes: {part!r} must be four positive integers B,T,H,K")
        shapes.append(vals)
    return shapes


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sandbox bench kernels",
                                description="Check the Triton kernels against a float64 reference and time them.")
    p.add_argument("--check", action="store_true", help="check every kernel on the GPU first; failing ones are not timed")
    p.add_argument("--shapes", default=None, help="B,T,H,K;... (V = K), or 'none'; default: the five issue shapes")
    p.add_argument("--no-family", action="store_true", help="with --check: only the per-shape checks")
    p.add_argument("--gates", default="diag,scalar,none", help="gate kinds to time for the Triton kernel")
    p.add_argument("--seq-blocks", default="64",
                   help="state tile sizes of the sequential kernels to compare (128 does not fit in shared memory "
                        "in the backward for K >= 256 on the H200)")
    p.add_argument("--no-sse", action="store_true", help="skip the SSE varlen case")
    p.add_argument("--no-torch", action="store_true", help="skip the torch chunked reference timing")
    p.add_argument("--no-fla", action="store_true",
                   help="skip flash-linear-attention (its autotuning takes minutes per new head dim on the H200)")
    p.add_argument("--out", default="runs/bench_kernels.json", help="JSON output path")
    p.add_argument("--warm-only", action="store_true",
                   help="compile and autotune only (run every kernel once, no timing), e.g. in parallel processes")
    p.add_argument("--no-profile", action="store_true", help="skip the per-kernel GPU time breakdown")
    p.add_argument("--deadline", type=float, default=None, help="seconds after which remaining parts are skipped")
    return p


def main_kernels(argv=None) -> int:
    """``argv``: the words after ``sandbox bench kernels``, or the options the CLI parsed with ``parser()``."""
    a = argv if isinstance(argv, argparse.Namespace) else parser().parse_args(argv)
    try:
        shapes = DEFAULT_SHAPES if not a.shapes else ([] if a.shapes == "none" else _parse_shapes(a.shapes))
        gates = tuple(x for x in a.gates.split(",") if x)
        bad = [x for x in gates if x not in ("diag", "scalar", "none")]
        if bad:
            raise ValueError(f"--gates: unknown gate kind(s) {bad}; use diag, scalar, none")
        blocks = tuple(int(x) for x in a.seq_blocks.split(","))
    except ValueError as e:
        print(f"sandbox bench kernels: error: {e}", file=sys.stderr)
        return 2
    try:
        res = run_kernel_bench(a.check, shapes, a.out, gates=gates, seq_blocks=blocks, sse=not a.no_sse,
                               torch_ref=not a.no_torch, warm_only=a.warm_only, profile=not a.no_profile,
                               deadline_s=a.deadline, family=not a.no_family, no_fla=a.no_fla)
    except RuntimeError as e:
        print(f"sandbox bench kernels: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    return 1 if res.get("failed_checks") else 0

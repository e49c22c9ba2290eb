"""The Triton kernels of the uncompiled step's fused ops compile for Hopper (sm_90), here, without a GPU: Triton
builds them ahead of time with the ptxas its wheel ships, so a kernel the interpreter runs but the compiler
rejects fails on the CPU rather than in a GPU run. Numerics are the other tests' (interpreter) and the GPU
checks' (``benchmarks/device.sh checks``).

The kernels compile in a process of their own: other test modules set TRITON_INTERPRET=1, under which
``triton.jit`` makes interpreted functions that cannot be compiled."""
import os
import subprocess
import sys
from pathlib import Path

import pytest


def compile_all() -> int:
    """Compile every case for sm_90; print each failure (or the count compiled) and return the exit code."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from sandbox.kernels import triton_cross_entropy, triton_norm, triton_rms_gate, triton_swiglu

    # (kernel, argument types, constexpr values) at the GLA d128 T320 step's shapes: bf16 activations, a float32
    # residual stream and statistics
    CASES = {
        "cross_entropy": (triton_cross_entropy._rows, dict(logits="*bf16", target="*i64", nll="*fp32", lse="*fp32",
                                                          V="i32", stride="i32", ignore="i32"), {"BV": 8192}),
        "cross_entropy_grad": (triton_cross_entropy._rows_grad,
                               dict(logits="*bf16", target="*i64", lse="*fp32", g="*fp32", grad="*bf16", V="i32",
                                   stride="i32", ignore="i32"), {"BV": 8192}),
        "swiglu": (triton_swiglu._forward, dict(u="*bf16", h="*bf16", N="i32", H="i32", su="i32"),
                   {"BR": 16, "BH": 256}),
        "swiglu_grad": (triton_swiglu._backward, dict(dh="*bf16", u="*bf16", du="*bf16", N="i32", H="i32", sd="i32",
                                                     su="i32"), {"BR": 16, "BH": 256}),
        **{f"norm_rms{rms}": (triton_norm._forward,
                              dict(x="*fp32", w="*fp32", b="*fp32", y="*bf16", mean="*fp32", rstd="*fp32", N="i32",
                                  D="i32", stride="i32", eps="fp32"),
                              {"RMS": rms, "HAS_BIAS": not rms, "BN": 32, "BD": 128}) for rms in (False, True)},
        **{f"norm_grad_rms{rms}": (triton_norm._backward,
                                   dict(dy="*bf16", x="*fp32", w="*fp32", mean="*fp32", rstd="*fp32", dx="*fp32",
                                       dwp="*fp32", dbp="*fp32", N="i32", D="i32", stride="i32"),
                                   {"RMS": rms, "HAS_BIAS": not rms, "BN": 16, "BD": 128}) for rms in (False, True)},
        **{f"rms_gate_gate{gate}": (triton_rms_gate._forward,
                                    dict(o="*bf16", w="*fp32", og="*bf16", y="*bf16", rstd="*fp32", N="i32", H="i32",
                                        V="i32", eps="fp32"), {"HAS_GATE": gate, "BR": 64, "BV": 64})
           for gate in (True, False)},
        **{f"rms_gate_grad_gate{gate}": (triton_rms_gate._backward,
                                         dict(dy="*bf16", o="*bf16", w="*fp32", og="*bf16", rstd="*fp32", do="*bf16",
                                             dog="*bf16", dwp="*fp32", N="i32", H="i32", V="i32"),
                                         {"HAS_GATE": gate, "BR": 32, "BV": 64}) for gate in (True, False)},
    }

    failed = []
    for name, (fn, types, consts) in sorted(CASES.items()):
        signature = {**types, **{k: "constexpr" for k in consts}}
        try:
            assert triton.compile(ASTSource(fn, signature, consts), target=GPUTarget("cuda", 90, 32)).asm["cubin"]
        except Exception as e:   # every kernel's outcome, not only the first failure's
            failed.append(f"{name}: {type(e).__name__}: {str(e)[:2000]}")
    print("\n".join(failed) or f"compiled {len(CASES)} kernels")
    return 1 if failed else 0


def test_the_fused_ops_kernels_compile_for_hopper():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, __file__], env={**env, "PYTHONPATH": str(root)}, cwd=root,
                         capture_output=True, text=True, timeout=600)
    if "ptxas" in run.stdout + run.stderr and "not found" in (run.stdout + run.stderr).lower():
        pytest.skip("this Triton has no ptxas")
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]


if __name__ == "__main__":
    sys.exit(compile_all())

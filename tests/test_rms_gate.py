"""The fused RMS norm and output gate of the linear mixers (``sandbox.kernels.rms_gate``) against a float64
reference of the expression it replaces, with autograd for the gradients: the Triton kernels under
TRITON_INTERPRET=1 on the CPU, and the operator's torch form."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported (their @triton.jit reads it)

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from sandbox.kernels.rms_gate import rms_gate  # noqa: E402

EPS = 1e-6
# relative error (norm): bf16 outputs carry one rounding each, which the interpreter does by truncation
# (up to 2^-7 relative, 3.4e-3 in norm seen); torch and the GPU round to nearest (half that)
TOL = {torch.float32: 1e-5, torch.bfloat16: 6e-3}


def reference(o, w, og, eps=EPS):
    """``LinearMixer.finish`` before its projection, as written there."""
    y = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * w
    y = y.reshape(*o.shape[:2], -1)
    return y * F.silu(og) if og is not None else y


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _inputs(B, T, H, V, dtype, gate, seed=0):
    g_ = torch.Generator().manual_seed(seed)
    o = (torch.randn(B, T, H, V, generator=g_) * torch.rand(B, T, H, 1, generator=g_) * 3).to(dtype)
    o[0, 0, 0] = 0.0                                   # a zero row: rstd is 1 / sqrt(eps)
    w = 1 + 0.5 * torch.randn(H, V, generator=g_)
    og = (2 * torch.randn(B, T, H * V, generator=g_)).to(dtype) if gate else None
    dy = torch.randn(B, T, H * V, generator=g_)
    return o, w, og, dy


def _expected(o, w, og, dy):
    """Output and gradients (o, w, og) of the reference in float64 for the upstream gradient dy."""
    ref = [t.double().requires_grad_() if t is not None else None for t in (o, w, og)]
    y = reference(*ref)
    grads = torch.autograd.grad(y, [t for t in ref if t is not None], dy.double())
    return y.detach(), grads


def _check(got, want, dtypes):
    """got, want: y, d_o, dw (and d_og), each got in its dtype of dtypes (dw: float32 in every case)."""
    errs = {n: rel(a, b) for n, a, b in zip(("y", "do", "dw", "dog"), got, want)}
    tols = {n: TOL[dt] for n, dt in zip(errs, dtypes)}
    bad = {n: e for n, e in errs.items() if not e <= tols[n]}
    assert not bad, f"errors above tolerance: {bad} (all: {errs})"


@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [64, 16, 48])
@pytest.mark.parametrize("H", [1, 2, 4])
def test_triton_kernels_match_float64_reference(H, V, dtype, gate):
    """Forward and backward kernels on CPU tensors under the interpreter; tiles of 4 tokens over 13 tokens
    (the last tile part empty) on 2 programs, so a program walks several tiles and dw sums across programs;
    V 16 and 48 under a 64-wide tile (48: masked columns); o a non-contiguous view, as a transpose leaves it."""
    pytest.importorskip("triton")
    from sandbox.kernels.triton_rms_gate import rms_gate_grad_triton, rms_gate_triton
    o, w, og, dy = _inputs(1, 13, H, V, dtype, gate, seed=H * V)
    o = o.transpose(1, 2).contiguous().transpose(1, 2)
    y, rstd = rms_gate_triton(o, w, og, EPS, dtype, br=4, programs=2 * H)
    dy = dy.to(dtype)
    do, dw, dog = rms_gate_grad_triton(dy, o, w, og, rstd, br=4, programs=2 * H)
    assert y.dtype == do.dtype == dtype and dw.dtype == torch.float32 and rstd.shape == (1, 13, H)
    assert (dog is None) == (og is None) and (dog is None or dog.dtype == dtype)
    want_y, want_g = _expected(o, w, og, dy)
    torch.testing.assert_close(rstd.double(), torch.rsqrt(o.double().pow(2).mean(-1) + EPS), rtol=1e-5, atol=0)
    _check([y, do, dw, dog], [want_y, *want_g], [dtype, dtype, torch.float32, dtype])


def test_triton_default_tiles_match_float64_reference():
    """The default tile (all 7 tokens in one) and grid, bf16 output from fp32 inputs."""
    pytest.importorskip("triton")
    from sandbox.kernels.triton_rms_gate import rms_gate_grad_triton, rms_gate_triton
    o, w, og, dy = _inputs(1, 7, 2, 48, torch.float32, True)
    y, rstd = rms_gate_triton(o, w, og, EPS, torch.bfloat16)
    do, dw, dog = rms_gate_grad_triton(dy.bfloat16(), o, w, og, rstd)
    want_y, want_g = _expected(o, w, og, dy.bfloat16())
    assert y.dtype == torch.bfloat16 and do.dtype == dog.dtype == torch.float32
    _check([y, do, dw, dog], [want_y, *want_g], [torch.bfloat16] + [torch.float32] * 3)


@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H, V", [(1, 64), (2, 16), (4, 48)])
def test_operator_matches_float64_reference(H, V, dtype, gate):
    """The operator on the CPU (its torch form) through autograd."""
    o, w, og, dy = _inputs(2, 5, H, V, dtype, gate, seed=V)
    mine = [t.clone().requires_grad_() if t is not None else None for t in (o, w, og)]
    y = rms_gate(*mine)
    assert y.dtype == torch.float32 and y.shape == (2, 5, H * V)   # a float32 weight promotes, as in the expression
    y.backward(dy)
    assert all(t.grad.dtype == t.dtype for t in mine if t is not None)
    want_y, want_g = _expected(o, w, og, dy)
    got = [y] + [t.grad for t in mine if t is not None]
    _check(got, [want_y, *want_g], [torch.float32, dtype, torch.float32, dtype])


def test_output_dtype_follows_expression_or_autocast():
    """Outside autocast the expression's dtype; under autocast the autocast dtype, which the projection reads."""
    o, w, og, _ = _inputs(1, 3, 2, 16, torch.bfloat16, True)
    assert rms_gate(o, w, og).dtype == reference(o, w, og).dtype == torch.float32
    assert rms_gate(o, w.bfloat16(), og).dtype == reference(o, w.bfloat16(), og).dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert reference(o, w, og).dtype == torch.float32
        y = rms_gate(o, w, og)
    assert y.dtype == torch.bfloat16
    assert rel(y, reference(o.double(), w.double(), og.double())) < TOL[torch.bfloat16]


def test_operator_registrations_pass_opcheck():
    o, w, og, _ = _inputs(1, 3, 2, 16, torch.float32, True)
    for g in (og, None):
        args = (o.requires_grad_(), w.requires_grad_(), g.requires_grad_() if g is not None else None, EPS,
                torch.float32)
        torch.library.opcheck(torch.ops.sandbox.rms_gate.default, args)

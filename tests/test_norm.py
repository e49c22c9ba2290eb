"""The fused residual-stream norm (``sandbox.kernels.norm``) against float64 references with autograd for the
gradients (``F.layer_norm``, and RMSNorm written out): the Triton kernels under TRITON_INTERPRET=1 on the CPU,
and the operator's torch form."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported (their @triton.jit reads it)

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from sandbox.kernels.norm import norm_cast  # noqa: E402

EPS = 1e-5
TOL = {torch.float32: 1e-5, torch.bfloat16: 4e-3}   # bf16: one rounding of each value (2^-9 at most)


def reference(x, w, b, rms, eps=EPS):
    if rms:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
        return y + b if b is not None else y
    return F.layer_norm(x, x.shape[-1:], w, b, eps)


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _inputs(N, D, dtype, rms, seed=0):
    """Rows with their own scale and offset (the mean matters for LayerNorm), one of them zero; a weight and,
    for LayerNorm, a bias away from 1 and 0."""
    g_ = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g_) * torch.rand(N, 1, generator=g_) * 3 + torch.randn(N, 1, generator=g_)
    x[N // 2] = 0.0                                    # rstd is 1 / sqrt(eps)
    w = 1 + 0.5 * torch.randn(D, generator=g_)
    b = None if rms else 0.5 * torch.randn(D, generator=g_)
    return x.to(dtype), w, b, torch.randn(N, D, generator=g_)


def _expected(x, w, b, dy, rms):
    """y, the statistics and the gradients (x, w[, b]) of the reference in float64."""
    ref = [t.double().requires_grad_() for t in (x, w, b) if t is not None]
    y = reference(ref[0], ref[1], ref[2] if b is not None else None, rms)
    x64 = ref[0].detach()
    mean = x64.mean(-1)
    var = x64.pow(2).mean(-1) if rms else x64.var(-1, unbiased=False)
    return y.detach(), mean, torch.rsqrt(var + EPS), torch.autograd.grad(y, ref, dy.double())


def _check(got, want, tols):
    errs = {n: rel(got[n], want[n]) for n in got}
    bad = {n: e for n, e in errs.items() if not e <= tols[n]}
    assert not bad, f"errors above tolerance: {bad} (all: {errs})"


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N", [1, 37, 300])
@pytest.mark.parametrize("D", [128, 48])
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_triton_kernels_match_float64_reference(rms, D, N, dtype, out_dtype):
    """Forward and backward kernels on CPU tensors under the interpreter. 8-row tiles, backward on 3 programs:
    several tiles per program (N 300), a part-empty last tile (37), one program with one row (1); D 48 is masked
    within a 64-wide tile."""
    pytest.importorskip("triton")
    from sandbox.kernels.triton_norm import norm_backward, norm_forward
    x, w, b, dy = _inputs(N, D, dtype, rms, seed=N * D)
    y, mean, rstd = norm_forward(x, w, b, EPS, rms, out_dtype, block_n=8)
    dy = dy.to(out_dtype)
    dx, dw, db = norm_backward(dy, x, w, mean, rstd, rms, b is not None, block_n=8, programs=3)
    assert y.dtype == dy.dtype == out_dtype and dx.dtype == dtype and dw.dtype == rstd.dtype == torch.float32
    assert (mean is None) == rms == (db is None)
    want_y, want_mean, want_rstd, grads = _expected(x, w, b, dy, rms)
    torch.testing.assert_close(rstd.double(), want_rstd, rtol=1e-5, atol=0)
    if not rms:
        torch.testing.assert_close(mean.double(), want_mean, rtol=1e-5, atol=1e-6)
    got = {"y": y, "dx": dx, "dw": dw, **({"db": db} if not rms else {})}
    want = {"y": want_y, "dx": grads[0], "dw": grads[1], **({"db": grads[2]} if not rms else {})}
    _check(got, want, {"y": TOL[out_dtype], "dx": TOL[dtype], "dw": 1e-5, "db": 1e-5})


def test_triton_default_blocks_and_strided_rows():
    """The default tiles and grid, on rows with a stride of their own (a column slice of a wider tensor), and
    RMSNorm with a bias (the kernels treat the two independently)."""
    pytest.importorskip("triton")
    from sandbox.kernels.triton_norm import norm_backward, norm_forward
    x, w, _, dy = _inputs(20, 48, torch.float32, False)
    b = torch.randn(48)
    x = torch.cat([x, torch.randn(20, 16)], 1)[:, :48]
    for rms in (False, True):
        y, mean, rstd = norm_forward(x, w, b, EPS, rms, torch.float32)
        dx, dw, db = norm_backward(dy, x, w, mean, rstd, rms, True)
        want_y, _, _, (gx, gw, gb) = _expected(x, w, b, dy, rms)
        _check({"y": y, "dx": dx, "dw": dw, "db": db}, {"y": want_y, "dx": gx, "dw": gw, "db": gb},
               dict.fromkeys(("y", "dx", "dw", "db"), 1e-5))


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_operator_matches_float64_reference(rms, dtype, out_dtype):
    """The operator on the CPU (its torch form) through autograd, x [2, 5, 48] entering as a non-contiguous
    view; gradients come back in the inputs' dtypes."""
    x, w, b, dy = _inputs(10, 48, dtype, rms, seed=3)
    x = x.view(2, 5, 48).transpose(0, 1).contiguous().transpose(0, 1)
    mine = [t.clone().requires_grad_() for t in (x, w, b) if t is not None]
    y = norm_cast(mine[0], mine[1], mine[2] if b is not None else None, EPS, rms, out_dtype)
    assert y.dtype == out_dtype and y.shape == (2, 5, 48)
    dy = dy.view(2, 5, 48).to(out_dtype)
    y.backward(dy)
    assert all(t.grad.dtype == t.dtype for t in mine)
    want_y, _, _, grads = _expected(x, w, b, dy, rms)
    names = ["y", "dx", "dw", "db"]
    _check(dict(zip(names, [y] + [t.grad for t in mine])), dict(zip(names, [want_y, *grads])),
           {"y": TOL[out_dtype], "dx": TOL[dtype], "dw": 1e-5, "db": 1e-5})


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_operator_gradcheck_in_float64(rms):
    """In float64 the torch form is float64 throughout, so finite differences check its backward formula."""
    x, w, b, _ = _inputs(4, 12, torch.float64, rms)
    args = [t.double().requires_grad_() for t in (x, w, b) if t is not None]
    fn = (lambda x, w: norm_cast(x, w, None, EPS, True, torch.float64)) if rms else \
        (lambda x, w, b: norm_cast(x, w, b, EPS, False, torch.float64))
    assert torch.autograd.gradcheck(fn, args)


def test_operator_registrations_pass_opcheck():
    x, w, b, _ = _inputs(6, 16, torch.float32, False)
    for bias, rms in ((b, False), (None, True)):
        args = (x.requires_grad_(), w.requires_grad_(), bias.requires_grad_() if bias is not None else None, EPS,
                rms, torch.bfloat16)
        torch.library.opcheck(torch.ops.sandbox.norm.default, args)

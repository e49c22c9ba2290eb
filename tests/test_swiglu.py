"""The SwiGLU activation: the Triton kernels (through TRITON_INTERPRET=1 on the CPU) and the op's torch path,
forward and gradients, against float64 autograd of ``F.silu(a) * b``."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported (their @triton.jit reads it)

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from sandbox.kernels.swiglu import swiglu  # noqa: E402

# float32 math against float64; bf16 results are float32 rounded once to 8 significant bits (<= 2^-8 relative)
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=2 ** -7, atol=1e-6)}


def _inputs(N, H, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = (torch.randn(N, 2 * H, generator=g) * 3).to(dtype)   # a spread that reaches silu's saturated ends
    dh = torch.randn(N, H, generator=g).to(dtype)
    return u, dh


def _reference(u, dh):
    """h and du of ``silu(a) * b`` in float64 autograd, from u's and dh's values as given."""
    u64 = u.detach().double().requires_grad_()
    a, b = u64.chunk(2, dim=-1)
    h = F.silu(a) * b
    (du,) = torch.autograd.grad(h, u64, dh.double())
    return h.detach(), du


def _close(got, want, dtype):
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), want, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H", [64, 48, 344])
@pytest.mark.parametrize("N", [1, 37, 300])
def test_triton_kernels_match_float64(N, H, dtype):
    pytest.importorskip("triton")
    from sandbox.kernels.triton_swiglu import swiglu_backward, swiglu_forward
    u, dh = _inputs(N, H, dtype, seed=N * 1000 + H)
    h_ref, du_ref = _reference(u, dh)
    _close(swiglu_forward(u), h_ref, dtype)
    _close(swiglu_backward(dh, u), du_ref, dtype)


def test_triton_kernels_read_strided_rows():
    """u and dh as column slices of wider rows (a row stride other than their width), as views of a bigger
    projection would be."""
    pytest.importorskip("triton")
    from sandbox.kernels.triton_swiglu import swiglu_backward, swiglu_forward
    wide_u, wide_dh = _inputs(37, 80, torch.float32, seed=7)
    u, dh = wide_u[:, :96], wide_dh[:, 3:51]
    h_ref, du_ref = _reference(u, dh)
    _close(swiglu_forward(u), h_ref, torch.float32)
    _close(swiglu_backward(dh, u), du_ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_op_on_cpu_matches_float64_with_autograd(dtype):
    u, dh = _inputs(2 * 13, 48, dtype, seed=3)
    u, dh = u.view(2, 13, 96), dh.view(2, 13, 48)
    h_ref, du_ref = _reference(u, dh)
    x = u.clone().requires_grad_()
    h = swiglu(x)
    assert h.shape == (2, 13, 48)
    _close(h.detach(), h_ref, dtype)
    h.backward(dh)
    _close(x.grad, du_ref, dtype)


def test_op_registrations_pass_opcheck():
    u, dh = _inputs(5, 8, torch.float32, seed=5)
    torch.library.opcheck(torch.ops.sandbox.swiglu.default, (u.requires_grad_(),))
    torch.library.opcheck(torch.ops.sandbox.swiglu_grad.default, (dh, u.detach()))

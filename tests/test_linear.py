"""``sandbox.kernels.linear``: stacked replicas' linear layers with the weight gradient summed over runs of tokens,
against sums written out token by token in float64: under vmap (eager and compiled), inside ``split_linear``, and a
single run's path left as ``F.linear``."""
import pytest
import torch
import torch.nn.functional as F

from sandbox.kernels.linear import SHORTEST_RUN, SPLITS, linear, splits
from sandbox.kernels.split_linear import split_linear

TOKENS = SPLITS * SHORTEST_RUN          # the fewest tokens whose weight gradient is split


def naive(x, w, b, g):
    """y = x W^T + b and its gradients, each entry a sum over tokens written out (float64)."""
    xs, gs = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    y = torch.stack([w @ row for row in xs]) + (0 if b is None else b)
    dw = sum(torch.outer(gs[t], xs[t]) for t in range(xs.shape[0]))
    dx = torch.stack([w.T @ row for row in gs])
    db = None if b is None else gs.sum(0)
    return y.view(*x.shape[:-1], -1), dx.view_as(x), dw, db


def stacked(R, shape, out, seed, bias=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(R, *shape, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(R, out, shape[-1], dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(R, out, dtype=torch.float64, generator=gen, requires_grad=True) if bias else None
    g = torch.randn(R, *shape[:-1], out, dtype=torch.float64, generator=gen)
    return x, w, b, g


def assert_replicas_match(x, w, b, g, y, grads):
    for r in range(x.shape[0]):
        ref = naive(x[r].detach(), w[r].detach(), None if b is None else b[r].detach(), g[r])
        got = (y[r], grads[0][r], grads[1][r], None if b is None else grads[2][r])
        for a, e in zip(got, ref):
            if e is not None:
                torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-10)


def test_splits_rule():
    assert splits(TOKENS, 64, 64) == SPLITS
    assert splits(TOKENS * 10, 512, 512) == SPLITS          # [512, 512]: the largest weight still split
    assert splits(TOKENS * 10, 512, 513) == 1
    assert splits(TOKENS - SPLITS, 64, 64) == 1              # too few tokens per run
    assert splits(TOKENS + 1, 64, 64) == 1                   # runs of unequal length


def test_stacked_replicas_under_vmap_are_each_replicas_token_sums():
    x, w, b, g = stacked(3, (2, TOKENS // 2, 6), 5, seed=0)
    y = torch.func.vmap(linear)(x, w, b)
    grads = torch.autograd.grad(y, (x, w, b), g)
    assert_replicas_match(x, w, b, g, y, grads)


def test_compiled_stack_keeps_the_split_backward():
    """Under torch.compile the op's own backward runs (not a derivative of its forward)."""
    x, w, _, g = stacked(2, (TOKENS, 4), 3, seed=1, bias=False)
    f = torch.compile(lambda x, w: torch.func.vmap(linear)(x, w), fullgraph=True)
    y = f(x, w)
    grads = torch.autograd.grad(y, (x, w), g)
    assert_replicas_match(x, w, None, g, y, grads)


def test_split_linear_under_vmap():
    x, w, _, g = stacked(2, (TOKENS, 8), 7, seed=2, bias=False)
    q, k = torch.func.vmap(lambda x, w: split_linear(x, w, [3, 4]))(x, w)
    grads = torch.autograd.grad((q, k), (x, w), (g[..., :3], g[..., 3:]))
    assert_replicas_match(x, w, None, g, torch.cat([q, k], -1), grads)


def test_a_single_run_is_f_linear_to_the_bit():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(TOKENS, 16, generator=gen, requires_grad=True)
    w = torch.randn(12, 16, generator=gen, requires_grad=True)
    g = torch.randn(TOKENS, 12, generator=gen)
    y = linear(x, w)
    assert torch.equal(y, F.linear(x, w))
    assert all(torch.equal(a, e) for a, e in zip(torch.autograd.grad(y, (x, w), g),
                                                 torch.autograd.grad(F.linear(x, w), (x, w), g)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuBLAS's bf16 products in float32 partial sums need a GPU")
def test_stacked_bf16_compiled_under_autocast_gpu():
    """The slice's d_model 128 up-projection, 3 replicas of 256 x 320 tokens, compiled under bf16 autocast: each
    replica's output and weight gradient against float64, within bf16 rounding of the inputs and the output."""
    R, N, I, O = 3, 256 * 320, 128, 512
    gen = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(R, N, I, device="cuda", generator=gen)
    w = (torch.randn(R, O, I, device="cuda", generator=gen) / I ** 0.5).requires_grad_()
    g = torch.randn(R, N, O, device="cuda", generator=gen).to(torch.bfloat16)
    f = torch.compile(lambda x, w: torch.func.vmap(linear)(x, w))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = f(x, w)
    dw, = torch.autograd.grad(y, w, g)
    xb, wb = x.to(torch.bfloat16).double(), w.detach().to(torch.bfloat16).double()
    ry = torch.einsum("rni,roi->rno", xb, wb)
    rdw = torch.einsum("rno,rni->roi", g.double(), xb)
    assert y.dtype == torch.bfloat16 and dw.dtype == torch.float32
    assert float((y.detach().double() - ry).abs().max() / ry.abs().max()) < 1e-2
    assert float((dw.double() - rdw).abs().max() / rdw.abs().max()) < 1e-2

"""Kernels launched over more than 65,535 sequence-heads (a GPU's limit on a grid's second axis): a stacked
evaluation of ``sla_heads`` (12 replicas x 512 sequences x 16 heads = 98,304) failed to launch with "invalid
argument". Each kernel that had its sequence-heads on that axis now takes them on the first
(``triton_chunk_common.tile_and_row``). Each test launches a kernel over 66,000 sequence-heads and checks three of
its rows, outputs and gradients, against the same rows launched alone (a grid far under the limit): a launch that
fails, or a program that reads another row's tile, fails here.

GPU only: the interpreter has no grid limit, and 66,000 programs would take it minutes; on the CPU the kernels'
index arithmetic is checked against float64 loops in ``test_triton_kernels.py``. Run on the GPU by the device
runner's ``checks`` recipe.
"""
import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU's grid limit (the interpreter has none)")

H = 16
N = 4125                      # N x H = 66,000 sequence-heads
T, K, V = 16, 16, 16
ROWS = [0, 2048, N - 1]


def _draw(*shapes, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(s, device="cuda", generator=g) for s in shapes]


def _rows_alone(fn, inputs, grads=True):
    """``fn``'s outputs at ROWS (and the inputs' gradients there under a fixed random loss on them), from one
    launch over all N sequences and from a launch over those rows alone."""
    out = []
    for xs in (inputs, [x[ROWS] for x in inputs]):
        xs = [x.detach().clone().requires_grad_(grads) for x in xs]
        at = (lambda y: y) if len(xs[0]) == len(ROWS) else (lambda y: y[ROWS])
        part = [at(y) for y in fn(*xs) if y is not None]
        if grads:
            gen = torch.Generator(device="cuda").manual_seed(1)
            loss = sum((y * torch.randn(y.shape, device="cuda", generator=gen)).sum() for y in part)
            part += [at(g) for g in torch.autograd.grad(loss, xs)]
        out.append([p.detach() for p in part])
    return out


def _same(big, alone):
    for a, b in zip(big, alone):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_chunked_recurrence_forward_and_backward_over_66000_sequence_heads():
    from sandbox.kernels.triton_chunk import chunk_gla
    q, k, v, g = _draw((N, T, H, K), (N, T, H, K), (N, T, H, V), (N, T, H, K))
    g = F.logsigmoid(g)

    def fn(q, k, v, g):
        return chunk_gla(q, k / K ** 0.5, v, g, output_final_state=True)
    _same(*_rows_alone(fn, [q, k, v, g]))


def test_the_delta_rule_forward_and_backward_over_66000_sequence_heads():
    from sandbox.kernels.triton_delta import chunk_delta_rule
    q, k, v, beta, g = _draw((N, T, H, K), (N, T, H, K), (N, T, H, V), (N, T, H), (N, T, H))

    def fn(q, k, v, beta, g):
        return chunk_delta_rule(q, F.normalize(k, dim=-1), v, torch.sigmoid(beta), F.logsigmoid(g),
                                output_final_state=True)
    _same(*_rows_alone(fn, [q, k, v, beta, g]))


def test_the_slot_scores_over_66000_sequence_heads():
    from sandbox.kernels.triton_slot_scores import slot_scores_triton
    q, k, s, g = _draw((N, T, H, K), (N, T, H, K), (N, T, H, 32), (N, T, H, 32))

    def fn(q, k, s, g):
        return slot_scores_triton(q, k, torch.softmax(s, -1), F.logsigmoid(g), output_final_state=True)
    _same(*_rows_alone(fn, [q, k, s, g]))


def test_a_decoding_step_over_66000_sequence_heads():
    from sandbox.kernels.triton_decode import decode_step
    q, k, v, state, g, beta = _draw((N, H, K), (N, H, K), (N, H, V), (N, H, K, V), (N, H, K), (N, H))

    def fn(q, k, v, state, g, beta):             # the step updates the state in place
        return [decode_step(q, F.normalize(k, dim=-1), v, state, F.logsigmoid(g), torch.sigmoid(beta)), state]
    _same(*_rows_alone(fn, [q, k, v, state, g, beta], grads=False))

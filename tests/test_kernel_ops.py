"""The Triton kernels as torch custom ops (run through TRITON_INTERPRET=1 on the CPU).

``torch.library.opcheck`` checks each registration (schema, fake tensors for torch.compile, autograd);
``vmap`` over stacked replicas must equal one call per replica, outputs and gradients."""
import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported (their @triton.jit reads it)

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

pytest.importorskip("triton")

from sandbox.kernels.triton_chunk import chunk_gla  # noqa: E402
import sandbox.kernels.triton_delta as td  # noqa: E402
from sandbox.kernels.triton_delta import chunk_delta_rule  # noqa: E402
from sandbox.kernels.triton_slot_scores import slot_scores_triton  # noqa: E402


def _qkv(R, B, T, H, K, V, seed=0):
    g_ = torch.Generator().manual_seed(seed)
    q = torch.randn(R, B, T, H, K, generator=g_)
    k = F.normalize(torch.randn(R, B, T, H, K, generator=g_), dim=-1)
    v = torch.randn(R, B, T, H, V, generator=g_)
    return q, k, v, g_


def test_chunk_gla_ops_pass_opcheck():
    q, k, v, g_ = _qkv(1, 1, 40, 1, 16, 16)
    g = F.logsigmoid(torch.randn(1, 40, 1, 16, generator=g_)) / 4
    h0 = torch.randn(1, 1, 16, 16, generator=g_)
    args = (q[0].requires_grad_(), k[0].requires_grad_(), v[0].requires_grad_(), g.requires_grad_(), h0, None,
            0.5, True)
    torch.library.opcheck(torch.ops.sandbox.chunk_gla_fwd.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_delta_scan_op_passes_opcheck():
    N, nt, H, K, V = 2, 2, 1, 16, 16                  # two sequences of two chunks each
    NC, C = N * nt, td.C
    g_ = torch.Generator().manual_seed(0)

    def r(*shape, s=1.0):
        return (s * torch.randn(*shape, generator=g_)).requires_grad_()

    tri = torch.ones(C, C).tril()
    args = (r(NC, H, C, K), r(NC, H, C, K, s=0.2), r(NC, H, C, K, s=0.2), r(NC, H, C, V),
            (0.1 * torch.randn(NC, H, C, C, generator=g_) * tri).requires_grad_(),
            torch.rand(NC, H, generator=g_).requires_grad_(), r(N, H, K, V),
            torch.arange(N + 1, dtype=torch.int32) * nt, N, True)
    torch.library.opcheck(torch.ops.sandbox.delta_scan_fwd.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_unit_lower_inverse_matches_a_float64_solve_and_passes_opcheck():
    """(I + A)^-1 of the WY representation (A strictly lower, entries as beta (k . k) with unit keys), value
    and gradient against float64 autograd through torch's triangular solve; vmap over a stack equals the
    stack's own call."""
    C = td.C
    g_ = torch.Generator().manual_seed(0)
    k = F.normalize(torch.randn(3, C, 16, generator=g_, dtype=torch.float64), dim=-1)
    a64 = (torch.rand(3, C, 1, generator=g_, dtype=torch.float64) * (k @ k.mT)).tril(-1).requires_grad_()
    eye = torch.eye(C, dtype=torch.float64)
    ref = torch.linalg.solve_triangular(eye + a64, eye.expand(3, C, C), upper=False, unitriangular=True)
    w = torch.randn(3, C, C, generator=g_, dtype=torch.float64)
    (da_ref,) = torch.autograd.grad((ref * w).sum(), a64)
    a = a64.detach().float().requires_grad_()
    t = td.unit_lower_inverse(a)
    (da,) = torch.autograd.grad((t * w.float()).sum(), a)
    assert (t.double() - ref).abs().max() < 1e-5 * ref.abs().max()
    assert (da.double() - da_ref).abs().max() < 1e-5 * da_ref.abs().max()
    assert torch.equal(torch.func.vmap(td.unit_lower_inverse, in_dims=1)(a.detach().movedim(0, 1)),
                       td.unit_lower_inverse(a.detach()))
    torch.library.opcheck(torch.ops.sandbox.unit_lower_inverse.default, (a.detach()[:1].requires_grad_(),),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def _slot_inputs(R, B, T, H, dk, m, seed=0):
    g_ = torch.Generator().manual_seed(seed)
    q, k = torch.randn(R, B, T, H, dk, generator=g_), torch.randn(R, B, T, H, dk, generator=g_) / dk ** 0.5
    g = -torch.rand(R, B, T, H, m, generator=g_)
    return q, k, -torch.expm1(g) * torch.rand(R, B, T, H, m, generator=g_), g, g_


def test_slot_scores_op_passes_opcheck():
    q, k, s, g, _ = _slot_inputs(1, 2, 21, 1, 16, 16)
    args = tuple(x[0].requires_grad_() for x in (q, k, s, g)) + (0.5, True)
    torch.library.opcheck(torch.ops.sandbox.slot_scores_fwd.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_vmap_of_the_slot_scores_equals_one_call_each():
    """Stacked GSA replicas (a grid point's learning rates) fold into the kernel's batch."""
    R, B, T, H, dk, m = 2, 2, 21, 2, 16, 24
    q, k, s, g, g_ = _slot_inputs(R, B, T, H, dk, m)
    do = torch.randn(R, B, T, H, m, generator=g_)
    leaves = [x.clone().requires_grad_() for x in (q, k, s, g)]
    o = torch.func.vmap(lambda *x: slot_scores_triton(*x, scale=0.5)[0])(*leaves)
    (o * do).sum().backward()
    for r in range(R):
        one = [x[r].clone().requires_grad_() for x in (q, k, s, g)]
        o_r = slot_scores_triton(*one, scale=0.5)[0]
        (o_r * do[r]).sum().backward()
        torch.testing.assert_close(o[r], o_r, atol=1e-5, rtol=1e-5)
        for a, b in zip(leaves, one):
            torch.testing.assert_close(a.grad[r], b.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("gate", ["diag", "scalar", "none"])
def test_vmap_over_replicas_equals_one_call_each(gate):
    R, B, T, H, K, V = 3, 2, 37, 2, 16, 32
    q, k, v, g_ = _qkv(R, B, T, H, K, V)
    g = {"diag": F.logsigmoid(torch.randn(R, B, T, H, K, generator=g_)) / 8,
         "scalar": F.logsigmoid(torch.randn(R, B, T, H, generator=g_)), "none": None}[gate]
    do = torch.randn(R, B, T, H, V, generator=g_)
    leaves = [x.clone().requires_grad_() for x in (q, k, v) + ((g,) if g is not None else ())]
    o = torch.func.vmap(lambda q, k, v, *g: chunk_gla(q, k, v, g[0] if g else None, scale=0.25)[0])(*leaves)
    (o * do).sum().backward()
    for r in range(R):
        one = [x[r].clone().requires_grad_() for x in (q, k, v) + ((g,) if g is not None else ())]
        o_r = chunk_gla(*one[:3], one[3] if g is not None else None, scale=0.25)[0]
        (o_r * do[r]).sum().backward()
        torch.testing.assert_close(o[r], o_r, atol=1e-5, rtol=1e-5)
        for a, b in zip(leaves, one):
            torch.testing.assert_close(a.grad[r], b.grad, atol=1e-5, rtol=1e-5)


def test_vmap_of_the_delta_rule_equals_one_call_each():
    R, B, T, H, K, V = 2, 2, 37, 1, 16, 16
    q, k, v, g_ = _qkv(R, B, T, H, K, V)
    beta = torch.rand(R, B, T, H, generator=g_)
    g = F.logsigmoid(torch.randn(R, B, T, H, generator=g_))
    do = torch.randn(R, B, T, H, V, generator=g_)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, beta, g)]
    o, ht = torch.func.vmap(lambda *a: chunk_delta_rule(*a[:4], a[4], output_final_state=True))(*leaves)
    assert ht.shape == (R, B, H, K, V)
    ((o * do).sum() + ht.sum()).backward()
    for r in range(R):
        one = [x[r].clone().requires_grad_() for x in (q, k, v, beta, g)]
        o_r, ht_r = chunk_delta_rule(*one[:4], one[4], output_final_state=True)
        ((o_r * do[r]).sum() + ht_r.sum()).backward()
        torch.testing.assert_close(o[r], o_r, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ht[r], ht_r, atol=1e-5, rtol=1e-5)
        for a, b in zip(leaves, one):
            torch.testing.assert_close(a.grad[r], b.grad, atol=1e-5, rtol=1e-5)



# -- the embedding lookup, whose backward sums repeated tokens per tile -------------------------------

def _mqar_like_ids(n, vocab, seed):
    """Token ids as MQAR has them: most positions the filler 0, the rest spread over the vocabulary."""
    g_ = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n,), generator=g_)
    return torch.where(torch.rand(n, generator=g_) < 0.8, 0, ids)


@pytest.mark.parametrize("dtype,N,V", [(torch.float32, 300, 50), (torch.bfloat16, 300, 50),
                                       pytest.param(torch.float32, 9000, 50, marks=pytest.mark.slow),
                                       pytest.param(torch.float32, 300, 40000, marks=pytest.mark.slow),
                                       (torch.float32, 300, 2)])
def test_embedding_grad_kernel_equals_a_float64_loop(dtype, N, V):
    """N 300: neither N nor D a multiple of the 64 x 64 tile, 0 in every tile. N 9000: the filler's
    run spans about 112 tiles, more than one block of 64 tile sums; some tokens do not occur. V 40000:
    a table too tall for int16 sort keys (stacked replicas' tables are R vocabularies tall). V 2: tokens 0
    and 1 only, so the last, partial tile holds one token. D 80 is a full and a part column block; the two large
    cases take one block, which halves the interpreter's programs."""
    from sandbox.kernels.triton_embedding import BD, embedding_grad_triton
    D = BD if N * V > 100_000 else 80
    ids = _mqar_like_ids(N, V, 0)
    if N > 1000:
        ids = torch.where((ids > 40) & (ids < 45), 40, ids)
    grad = torch.randn(N, D, generator=torch.Generator().manual_seed(1)).to(dtype)
    ref = torch.zeros(V, D, dtype=torch.float64)
    for n in range(N):
        ref[ids[n]] += grad[n].double()
    out = embedding_grad_triton(ids, grad, V)
    assert out.dtype == torch.float32
    # float32 sums: the rounding grows as the square root of a row's count (N 9000: about 7,200 fillers in row 0)
    atol = 1e-5 * max(1.0, (int((ids == 0).sum()) / 300) ** 0.5)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=atol)


def test_embedding_lookup_kernel_equals_indexing():
    """70 ids (two tiles of 32 and a part one) into a table of 150-column rows (a full and a part column block),
    in [7, 10] with MQAR's repeats: every row is the table's row, bit for bit."""
    from sandbox.kernels.triton_embedding import embedding_triton
    w = torch.randn(50, 150, generator=torch.Generator().manual_seed(7))
    ids = _mqar_like_ids(70, 50, 3).view(7, 10)
    assert torch.equal(embedding_triton(w, ids), w[ids])


def test_embedding_op_passes_opcheck():
    from sandbox.kernels.embedding import embedding  # noqa: F401  (registers the op)
    w = torch.randn(20, 16, requires_grad=True)
    ids = _mqar_like_ids(24, 20, 2).view(4, 6)
    torch.library.opcheck(torch.ops.sandbox.embedding.default, (w, ids),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.parametrize("shared_ids", [True, False])
def test_vmap_of_the_embedding_equals_one_lookup_each(shared_ids):
    """Stacked tables [R, V, D] fold into one [R * V, D] table: values and each table's gradient
    equal R separate nn.functional.embedding calls."""
    from sandbox.kernels.embedding import embedding
    R, V, D = 3, 30, 16
    W = torch.randn(R, V, D, generator=torch.Generator().manual_seed(3), requires_grad=True)
    ids = torch.stack([_mqar_like_ids(40, V, 10 + r).view(5, 8) for r in range(R)])
    w_out = torch.randn(R, 5, 8, D, generator=torch.Generator().manual_seed(4))
    if shared_ids:
        ids = ids[0]
    out = torch.func.vmap(embedding, in_dims=(0, None if shared_ids else 0))(W, ids)
    (out * w_out).sum().backward()
    Ws = W.detach().clone().requires_grad_()
    ref = torch.stack([F.embedding(ids if shared_ids else ids[r], Ws[r]) for r in range(R)])
    (ref * w_out).sum().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(W.grad, Ws.grad, rtol=1e-6, atol=1e-6)


# -- the short causal convolution (conv on q, k, v) with its silu ------------------------------------------

def _conv_loop(x, w, per):
    """silu of the causal depthwise convolution by a loop over positions and taps, in float64."""
    N, T, C = x.shape
    W = w.shape[-1]
    y = torch.zeros(N, T, C, dtype=torch.float64)
    for n in range(N):
        for t in range(T):
            for j in range(W):
                s = t + j - (W - 1)
                if s >= 0:
                    y[n, t] = y[n, t] + w[n // per, :, j] * x[n, s]
    return F.silu(y)


@pytest.mark.parametrize("T, W, G, sizes", [(5, 4, 1, [80]), (70, 4, 2, [20, 20, 40]), (66, 2, 1, [16, 64]),
                                            (9, 1, 2, [80]), (3, 4, 2, [3, 61, 16])])
def test_short_conv_kernels_equal_a_float64_loop(T, W, G, sizes):
    """Values and both gradients of the Triton kernels against autograd through a float64 loop: T 70 and 66
    cross several tiles (the backward's input gradient reads the next tile's first W - 1 positions of da
    from its ring), T 3 and 5 end inside the first tile, C 80 leaves a part
    column tile, the input is a column slice of a wider tensor (a projection's leading columns), G = 2
    weight groups (stacked replicas) each serve their own sequences, and the output and its gradient come as
    one to three pieces of columns (q, k, v), some inside one tile of columns, some across two."""
    from sandbox.kernels.triton_short_conv import short_conv_grad_triton, short_conv_triton
    N, C = 4, 80
    g_ = torch.Generator().manual_seed(T * 10 + W)
    wide = torch.randn(N, T, C + 7, generator=g_)
    x = wide[..., :C]
    w = torch.randn(G, C, W, generator=g_) / W ** 0.5
    dy = torch.randn(N, T, C, generator=g_)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    ref = _conv_loop(xd, wd, N // G)
    dx_ref, dw_ref = torch.autograd.grad(ref, (xd, wd), dy.double())
    ys = short_conv_triton(x, w, sizes)
    dx, dw = short_conv_grad_triton([d.contiguous() for d in dy.split(sizes, -1)], x, w)
    assert [tuple(y.shape) for y in ys] == [(N, T, n) for n in sizes] and all(y.is_contiguous() for y in ys)
    y = torch.cat(ys, -1)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx.double(), dx_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw.double(), dw_ref, rtol=1e-4, atol=1e-4)
    assert dw.dtype == torch.float32 and dx.dtype == x.dtype


def test_short_conv_op_passes_opcheck():
    import sandbox.kernels.short_conv  # noqa: F401  (registers the ops)
    x = torch.randn(3, 7, 10, dtype=torch.float64, requires_grad=True)
    w = torch.randn(1, 10, 4, dtype=torch.float64, requires_grad=True)
    for sizes in ([10], [3, 7], [2, 3, 5]):
        torch.library.opcheck(torch.ops.sandbox.short_conv.default, (x, w, sizes),
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
        torch.autograd.gradcheck(lambda a, b: torch.ops.sandbox.short_conv(a, b, sizes), (x, w))


def test_vmap_of_the_short_conv_equals_one_call_each_also_compiled():
    """Stacked replicas (inputs [R, B, T, C], weights [R, C, W]) fold into one call with R weight groups: values
    and every replica's gradients equal R separate calls and a float64 loop, eagerly and under torch.compile,
    with the output as three pieces of columns (q, k, v) of which one (k) is left unused."""
    from sandbox.kernels.short_conv import short_conv
    R, B, T, C, W = 3, 2, 9, 6, 4
    g_ = torch.Generator().manual_seed(5)
    x = torch.randn(R, B, T, C, dtype=torch.float64, generator=g_, requires_grad=True)
    w = torch.randn(R, C, W, dtype=torch.float64, generator=g_, requires_grad=True)
    dy = torch.randn(R, B, T, C, dtype=torch.float64, generator=g_)
    dy[..., 2] = 0.0                                  # what the unused piece's gradient amounts to
    ref = torch.stack([_conv_loop(x[r].detach(), w[r, None].detach(), B) for r in range(R)])
    xs, ws = x.detach().requires_grad_(), w.detach().requires_grad_()
    torch.stack([torch.cat(short_conv(xs[r], ws[r]), -1) for r in range(R)]).backward(dy)

    def pieces(x, w):
        q, k, v = short_conv(x, w, [2, 1, 3])
        return q, k, v

    for f in (torch.func.vmap(pieces), torch.compile(torch.func.vmap(pieces), backend="aot_eager")):
        x.grad = w.grad = None
        q, k, v = f(x, w)
        torch.autograd.backward([q, v], [dy[..., :2], dy[..., 3:]])
        torch.testing.assert_close(torch.cat([q, k, v], -1), ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(x.grad, xs.grad, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(w.grad, ws.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rows, c, k, dtype", [(1, 5, 2, torch.float32), (300, 32, 8, torch.bfloat16),
                                               (70, 64, 16, torch.float32), (9, 20, 20, torch.float16)])
def test_topk_mask_kernel_chooses_what_topk_and_the_pairwise_count_choose(rows, c, k, dtype):
    """The Triton kernel against the torch form and torch.topk: rows of a padded column count (5, 20), more
    rows than one program holds (300 x 32), and 16-bit inputs. Values drawn without ties (a permutation per
    row, exact in every dtype), so topk's set is the only answer; then rows of ties, to the earlier entries, against
    the pairwise count."""
    from sandbox.kernels.topk_mask import _pairwise
    from sandbox.kernels.triton_topk_mask import topk_mask_triton
    g_ = torch.Generator().manual_seed(rows + c)
    x = torch.stack([torch.randperm(c, generator=g_) for _ in range(rows)]).to(dtype).view(rows, 1, c)
    want = torch.zeros_like(x, dtype=torch.bool).scatter_(-1, x.float().topk(k, dim=-1).indices, True)
    got = topk_mask_triton(x, k)
    assert got.dtype == torch.bool and got.shape == x.shape
    assert torch.equal(got, want) and torch.equal(_pairwise(x, k), want)
    assert torch.equal(topk_mask_triton(x - c // 2, k), want)          # negative keys at the cut
    ties = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0], [2.0] * 5], dtype=dtype)
    assert topk_mask_triton(ties, 2).tolist() == [[False, True, True, False, False], [True, True, False, False, False]]
    many = torch.randint(-3, 4, (rows, c), generator=g_).to(dtype)    # ties everywhere, across the cut too
    many[0, :2], many[-1, 0] = -0.0, float("-inf")                   # -0.0 ties +0.0; -inf ranks last
    assert torch.equal(topk_mask_triton(many, k), _pairwise(many, k))


def test_topk_mask_kernel_reads_a_slice_of_a_wider_tensor_in_place_as_its_copy():
    """The kernel reads rows through two strides: the [B, T, H, c] columns of a fused projection's [B, T, width]
    output (no copy), a transposed stack whose rows need three strides (copied first), and the same rows
    contiguous all give one mask."""
    from sandbox.kernels.triton_topk_mask import _row_strides, topk_mask_triton
    g_ = torch.Generator().manual_seed(3)
    B, T, H, c, width = 3, 5, 2, 32, 100
    proj = torch.randn(B, T, width, generator=g_)
    x = proj[..., 7:7 + H * c].view(B, T, H, c)
    assert _row_strides(x) == (H, width, c)
    want = topk_mask_triton(x.contiguous(), 8)
    assert torch.equal(topk_mask_triton(x, 8), want)
    stacked = torch.randn(T, 4, B, H, c, generator=g_).transpose(0, 2)        # [B, 4, T, H, c], 3 strides
    assert _row_strides(stacked) is None
    assert torch.equal(topk_mask_triton(stacked, 8), topk_mask_triton(stacked.contiguous(), 8))
    assert torch.equal(want, torch.zeros_like(want).scatter_(-1, x.topk(8, dim=-1).indices, True))


def test_topk_mask_op_passes_opcheck_and_folds_replicas_under_vmap():
    from sandbox.kernels.topk_mask import topk_mask
    x = torch.randn(3, 4, 2, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    torch.library.opcheck(torch.ops.sandbox.topk_mask.default, (x, 3), test_utils=("test_schema", "test_faketensor"))
    want = torch.stack([topk_mask(x[r], 3) for r in range(3)])
    assert torch.equal(torch.func.vmap(topk_mask, in_dims=(1, None))(x.transpose(0, 1), 3), want)
    assert torch.equal(torch.compile(torch.func.vmap(lambda z: topk_mask(z, 3)), backend="aot_eager")(x), want)


# -- the training loss: cross-entropy per row ---------------------------------------------------------

def _loss_loop(logits, target):
    """Per-row negative log-likelihood by a plain float64 loop (0 at the ignore index)."""
    out = torch.zeros(len(target), dtype=torch.float64)
    for n, t in enumerate(target.tolist()):
        if t != -100:
            row = logits[n].double()
            out[n] = math.log(sum(math.exp(v - row.max().item()) for v in row.tolist())) + row.max().item() - row[t].item()
    return out


@pytest.mark.parametrize("dtype,V,bv", [(torch.float32, 300, 128), (torch.bfloat16, 512, 512), (torch.float32, 77, None)])
def test_cross_entropy_kernel_equals_a_float64_loop(dtype, V, bv):
    """V 300 over tiles of 128: the running maximum and sum rescale across three tiles, the last one part
    empty; rows with the ignore index give 0; a row whose largest logit comes last."""
    from sandbox.kernels.triton_cross_entropy import cross_entropy_rows_triton
    g_ = torch.Generator().manual_seed(V)
    logits = (3 * torch.randn(7, V, generator=g_)).to(dtype)
    logits[2, -1] = 40.0
    target = torch.randint(0, V, (7,), generator=g_)
    target[[1, 4]] = -100
    target[2] = V - 1
    nll, lse = cross_entropy_rows_triton(logits, target, -100, bv=bv, warps=4)
    want = _loss_loop(logits, target)
    assert nll.dtype == torch.float32
    torch.testing.assert_close(nll.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), torch.logsumexp(logits.double(), -1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,V,bv", [(torch.float32, 300, 128), (torch.bfloat16, 512, 512), (torch.float32, 77, None)])
def test_cross_entropy_gradient_kernel_equals_float64_autograd(dtype, V, bv):
    """The backward kernel against autograd of F.cross_entropy in float64, each row weighted by its own upstream
    gradient: tiles of 128 over V 300 (the last part empty), ignored rows all zero, a row whose target is last."""
    from sandbox.kernels.triton_cross_entropy import cross_entropy_grad_triton, cross_entropy_rows_triton
    g_ = torch.Generator().manual_seed(V + 1)
    logits = (3 * torch.randn(7, V, generator=g_)).to(dtype)
    target = torch.randint(0, V, (7,), generator=g_)
    target[[1, 4]] = -100
    target[2] = V - 1
    w = torch.rand(7, generator=g_)
    ref_in = logits.double().requires_grad_()
    (F.cross_entropy(ref_in, target, ignore_index=-100, reduction="none") * w.double()).sum().backward()
    _, lse = cross_entropy_rows_triton(logits, target, -100, bv=bv, warps=4)
    grad = cross_entropy_grad_triton(logits, target, lse, w, -100, bv=bv, warps=4)
    assert grad.dtype == dtype and grad.shape == logits.shape
    assert (grad[[1, 4]] == 0).all()
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(grad.double(), ref_in.grad, rtol=tol, atol=tol)


def test_cross_entropy_op_equals_torchs_loss_with_its_gradient_also_compiled():
    """Values and the logits' gradient against F.cross_entropy in float64, eagerly and through
    torch.compile (which traces the op's torch backward), with ignored rows and an upstream weight per row."""
    from sandbox.kernels.cross_entropy import cross_entropy
    g_ = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 4, 33, generator=g_, dtype=torch.float64)
    target = torch.randint(0, 33, (3, 4), generator=g_)
    target[0, 1] = target[2, 3] = -100
    w = torch.rand(3, 4, generator=g_, dtype=torch.float64)
    ref_in = logits.clone().requires_grad_()
    ref = F.cross_entropy(ref_in.flatten(0, 1), target.flatten(), ignore_index=-100, reduction="none").view(3, 4)
    (ref * w).sum().backward()
    for f in (cross_entropy, torch.compile(cross_entropy, backend="aot_eager")):
        x = logits.clone().requires_grad_()
        out = f(x, target)
        (out * w).sum().backward()
        torch.testing.assert_close(out, ref.detach())
        torch.testing.assert_close(x.grad, ref_in.grad)


def test_cross_entropy_op_passes_opcheck():
    import sandbox.kernels.cross_entropy  # noqa: F401  (registers the op)
    logits = torch.randn(6, 10, requires_grad=True)
    target = torch.tensor([1, -100, 3, 9, 0, 2])
    torch.library.opcheck(torch.ops.sandbox.cross_entropy.default, (logits, target),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    lse = torch.logsumexp(logits.detach(), -1)
    torch.library.opcheck(torch.ops.sandbox.cross_entropy_grad.default, (logits.detach(), target, lse, torch.rand(6)),
                          test_utils=("test_schema", "test_faketensor"))

"""Pieces shared by the chunked GLA kernels (``triton_chunk.py`` forward, ``triton_chunk_bwd.py``
backward): chunk and segment bounds, gate loads, the diagonal-block test, the host-side geometry
(chunk table for packed segments), the tile choices, and the sequential state pass ``_states``
that both directions run."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BT = 64  # chunk length
BC = 16  # sub-block rows for the diagonal gate


@triton.jit
def _chunk_bounds(i_c, cidx, T, IS_VARLEN: tl.constexpr, BT: tl.constexpr):
    if IS_VARLEN:
        t0 = tl.load(cidx + i_c * 2).to(tl.int32)
        t1 = tl.load(cidx + i_c * 2 + 1).to(tl.int32)
    else:
        nt = tl.cdiv(T, BT)
        b = i_c // nt
        t0 = b * T + (i_c % nt) * BT
        t1 = b * T + T
    t1 = tl.minimum(t1, t0 + BT)
    return t0, t1


@triton.jit
def _seq_bounds(i_n, cu, T, IS_VARLEN: tl.constexpr):
    if IS_VARLEN:
        bos = tl.load(cu + i_n).to(tl.int32)
        eos = tl.load(cu + i_n + 1).to(tl.int32)
    else:
        bos = i_n * T
        eos = bos + T
    return bos, eos


@triton.jit
def _block_decay(gc, t0, t1, i_h, o_k, m_k, H, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """[BT // BC]: the largest log-decay over the rows of each BC-row block of the chunk [t0, t1), over
    the channels o_k.  Below LIM, exp(gc_first - gc_j) stays below exp(LIM) inside the block, and its own
    pairs can go through the reference-row product; otherwise they are summed exactly."""
    o_b = tl.arange(0, BT // BC)
    first = tl.minimum(t0 + o_b * BC, t1 - 1)
    last = tl.minimum(t0 + o_b * BC + BC - 1, t1 - 1)
    r0 = tl.load(gc + (first[:, None] * H + i_h) * K + o_k[None, :], mask=m_k[None, :], other=0.)
    r1 = tl.load(gc + (last[:, None] * H + i_h) * K + o_k[None, :], mask=m_k[None, :], other=0.)
    return tl.max(r0 - r1, axis=1)


@triton.jit
def _diag_decay(gc, t0, t1, i_h, H, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr):
    """``_block_decay`` over all K channels."""
    d = tl.zeros([BT // BC], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        d = tl.maximum(d, _block_decay(gc, t0, t1, i_h, o_k, o_k < K, H, K, BT, BC))
    return d


@triton.jit
def _chunk_decay(gc, t0, t1, i_h, H, K: tl.constexpr, BK: tl.constexpr):
    """The largest log-decay from the first to the last row of the chunk [t0, t1), over all K channels.
    Below LIM the whole chunk's pairs fit one product with gc at its first row as the reference."""
    d = tl.zeros([BK], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        g0 = tl.load(gc + (t0 * H + i_h) * K + o_k, mask=m_k, other=0.)
        gl = tl.load(gc + ((t1 - 1) * H + i_h) * K + o_k, mask=m_k, other=0.)
        d = tl.maximum(d, g0 - gl)
    return tl.max(d, axis=0)


@triton.jit
def _pick(x, i):
    """Element i of the small vector x, as a scalar."""
    return tl.sum(tl.where(tl.arange(0, x.shape[0]) == i, x, 0), axis=0)


@triton.jit
def _total_decay(gc, t_last, i_h, o_k, m_k, H, K: tl.constexpr, GATE: tl.constexpr):
    """gl, the chunk's total log-decay (gc at its last row t_last): [BK] (diagonal) or [1] (scalar)."""
    if GATE == 2:
        return tl.load(gc + (t_last * H + i_h) * K + o_k, mask=m_k, other=0.)
    else:
        return tl.load(gc + t_last * H + i_h) + tl.zeros([1], dtype=tl.float32)


def _p2(n: int) -> int:
    return triton.next_power_of_2(int(n))


def _seq_block() -> int:
    """Tile of the state held by one sequential program (K and V each); 64 unless overridden for benchmarks."""
    return int(os.environ.get("SANDBOX_TRITON_SEQ_BLOCK", "64"))


def chunk_table(cu_seqlens: torch.Tensor, bt: int = BT) -> tuple[torch.Tensor, int]:
    """[n_chunks, 2] int32 (start, segment end) for every chunk of every segment; empty segments have none."""
    cu = cu_seqlens.to(torch.int64)
    lens = cu[1:] - cu[:-1]
    nch = (lens + bt - 1) // bt
    total = int(nch.sum())
    seg = torch.repeat_interleave(torch.arange(len(lens), device=cu.device), nch, output_size=total)
    first = torch.cumsum(nch, 0) - nch
    j = torch.arange(total, device=cu.device) - first[seg]
    table = torch.stack([cu[seg] + j * bt, cu[seg + 1]], 1)
    return table.to(torch.int32).contiguous(), total


def _gate_kind(g) -> int:
    return 0 if g is None else (1 if g.dim() == 3 else 2)


def _geometry(q, v, cu_seqlens):
    B, T, H, K = q.shape
    V = v.shape[-1]
    varlen = cu_seqlens is not None
    N = cu_seqlens.numel() - 1 if varlen else B
    if varlen:
        cidx, NC = chunk_table(cu_seqlens)
        cu = cu_seqlens.to(torch.int32).contiguous()
        nch = (cu[1:] - cu[:-1] + BT - 1) // BT
        coff = (torch.cumsum(nch, 0) - nch).to(torch.int32).contiguous()  # first chunk of each segment
    else:
        cidx, NC, cu, coff = q, B * triton.cdiv(T, BT), q, q  # dummies: unused when not varlen
    return B, T, H, K, V, N, varlen, cidx, NC, cu, coff


def row_stride(x: torch.Tensor) -> int:
    """Elements from row (b, t) of ``x`` [B, T, H, D] (or [B * T, H, D]) to the next, for a tensor that
    ``as_rows`` returned."""
    return x.stride(-3) if x.shape[-3] > 1 or x.dim() == 3 else x.stride(0)


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` [B, T, H, D] as the kernels read it: in place where row (b, t) starts ``b * T + t`` row strides in
    and holds its H x D values contiguously (a column slice of a [B, T, W] projection output, which a split
    projection hands the mixer), else a contiguous copy.  Reading the slice in place saves the copy of q, k
    and v that each call made before: 3 of the Figure 8 step's kernels per layer."""
    B, T, H, D = x.shape
    rs = row_stride(x)
    if ((x.stride(3) == 1 or D == 1) and (x.stride(2) == D or H == 1) and rs >= H * D
            and (B == 1 or x.stride(0) == T * rs) and B * T * rs < 2 ** 31):
        return x
    return x.contiguous()


def diag_block_limit(dtype) -> float:
    """Largest log-decay across a whole chunk (or, failing that, one 16-row block) for which its pairs use
    one reference-row product: the decayed keys then grow by at most exp(40) ~ 2e17, far inside the
    bf16 / fp32 range.  fp16 (largest value 65504) always takes the exact column-by-column sum."""
    return 0.0 if dtype == torch.float16 else 40.0


def _intra_bk(K: int) -> int:
    """K tile of the whole-chunk intra kernel of the forward."""
    return max(16, min(64, _p2(K)))


def _seq_cfg(K: int, V: int):
    sb = _seq_block()
    bk, bv = max(16, min(sb, _p2(K))), max(16, min(sb, _p2(V)))
    return bk, bv, triton.cdiv(K, bk), triton.cdiv(V, bv), 8


def _par_tiles(K: int, V: int):
    """K and V tiles of the chunk-parallel kernels: the state tiles, at most 64 (128 x 128 would need
    320 KB of shared memory in the backward)."""
    bk, bv = _seq_cfg(K, V)[:2]
    return min(bk, 64), min(bv, 64)


def _bwd_tiles(K: int, V: int):
    """K and V tiles of the backward gradient kernel (launched with ``_bwd_warps``): the state tiles, with the V
    tile never wider than the K tile.

    Issue 21: with bf16 inputs, Triton 3.6 on Hopper miscompiles ``_bwd_chunk`` with BV > BK: compute-sanitizer
    reports an out-of-range shared-memory address in the K-tile branch (the ``qe`` line of the one-product intra
    part), and dq and dg come out wrong, NaN, or the launch faults; dk, dv, fp32 inputs and the interpreter are
    right.  GLA's K is V / 2, so every GLA head with K < 64 had BV > BK and trained on a wrong dq, or diverged.
    Every tile pair with BV <= BK passed (docs/kernels.md; benchmarks/gla_bwd_tiles.py reruns the matrix after a
    Triton upgrade, tests/test_gla_small_heads.py checks the GLA head shapes on a GPU)."""
    bk, bv = _par_tiles(K, V)
    return bk, min(bv, bk)


def _bwd_warps(K: int, V: int) -> int:
    """Warps of the backward gradient kernel: 4 (the fastest, results/kernels/README.md), but 2 for heads of at
    most 16 values with one K tile (16-wide V tile, K <= 64).  With 4 warps there, bf16 inputs and the diagonal
    gate, Triton 3.6 on the H200 reads shared memory out of range whenever a chunk decays past exp(LIM) (the
    column-block intra part: compute-sanitizer names the ``ke`` line of ``_intra_dq``), as GLA at d_model 256
    with 16 heads does (SLA Figure 2).  2 and 8 warps are right there, and 2 is the faster of them
    (docs/kernels.md, results/throughput/v16_warps.txt)."""
    return 2 if V <= 16 and K <= 64 else 4


# ----------------------------------------------------------------------------- the sequential pass

@triton.jit
def tile_and_row(n_tiles):
    """A program of a flat grid as (tile, row), the ``n_tiles`` tiles of a row adjacent: the order of a
    ``(n_tiles, rows)`` grid. A grid's second and third axes hold at most 65,535 programs, and rows (sequences x
    heads) pass that in a stacked evaluation: 12 replicas x 512 sequences x 16 heads (SLA Figure 2) failed to
    launch with "invalid argument"; the first axis holds 2**31 - 1."""
    pid = tl.program_id(0)
    return pid % n_tiles, pid // n_tiles


@triton.jit
def _states(a, b, gc, s0, s_end, hs, cu, coff, T, scale, SA, SB,
            H, K: tl.constexpr, V: tl.constexpr, GATE: tl.constexpr, IS_VARLEN: tl.constexpr,
            REVERSE: tl.constexpr, HAS_S0: tl.constexpr, STORE_END: tl.constexpr,
            BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr):
    """The only sequential pass: X <- diag(exp(gl_c)) X + scale * a_c^T b_c over the chunks c of one
    segment, for one [BK, BV] tile.  Forward (a = kg, b = v): X is the state, stored into hs at every
    chunk start, the final one into s_end.  REVERSE (a = qg, b = dO): X is the gradient of the state
    from later chunks, stored at every chunk end, d(initial state) into s_end.  s0 starts X.  SA, SB: the
    row strides of a and b (``as_rows``)."""
    i_kv, i_nh = tile_and_row(tl.cdiv(K, BK) * NV)
    i_k = i_kv // NV
    i_v = i_kv % NV
    i_n = i_nh // H
    i_h = i_nh % H
    bos, eos = _seq_bounds(i_n, cu, T, IS_VARLEN)
    if IS_VARLEN:
        c0 = tl.load(coff + i_n).to(tl.int32)
    else:
        c0 = i_n * tl.cdiv(T, BT)
    nc = tl.cdiv(eos - bos, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    p_c = (i_h * K + o_k[:, None]) * V + o_v[None, :]  # inside one chunk's [H, K, V] block
    p_h = (i_nh * K + o_k[:, None]) * V + o_v[None, :]  # inside [N, H, K, V]
    if HAS_S0:
        X = tl.load(s0 + p_h, mask=m_h, other=0.).to(tl.float32)
    else:
        X = tl.zeros([BK, BV], dtype=tl.float32)
    for i in range(0, nc):
        if REVERSE:
            j = nc - 1 - i
        else:
            j = i
        tl.store(hs + (c0 + j).to(tl.int64) * H * K * V + p_c, X.to(hs.dtype.element_ty), mask=m_h)
        rows = bos + j * BT + o_t
        m = rows < eos
        b_a = tl.load(a + rows[:, None] * SA + i_h * K + o_k[None, :], mask=m[:, None] & m_k[None, :], other=0.)
        b_b = tl.load(b + rows[:, None] * SB + i_h * V + o_v[None, :], mask=m[:, None] & m_v[None, :], other=0.)
        if GATE > 0:
            gl = _total_decay(gc, tl.minimum(bos + j * BT + BT, eos) - 1, i_h, o_k, m_k, H, K, GATE)
            X = X * tl.exp(gl)[:, None]
        X += tl.dot(tl.trans(b_a), b_b) * scale
    if STORE_END:
        tl.store(s_end + p_h, X, mask=m_h)


def run_states(a, b, gc, gate, s0, store_end, geo, scale, reverse):
    """The sequential pass ``_states``: per-chunk states (forward: a = kg, b = v) or state gradients
    (reverse: a = qg, b = dO; each [B, T, H, *] as ``as_rows`` leaves it), kept in bf16 for bf16 inputs (they
    are dot operands in that dtype anyway) and in fp32 otherwise; and the end value in fp32 (final state, or
    d(initial state)) when asked."""
    B, T, H, K, V, N, varlen, cidx, NC, cu, coff = geo
    sdt = torch.bfloat16 if a.dtype == torch.bfloat16 else torch.float32
    hs = torch.empty(NC, H, K, V, device=a.device, dtype=sdt)
    end = torch.empty(N, H, K, V, device=a.device, dtype=torch.float32) if store_end else None
    bk, bv, NK, NV, nw = _seq_cfg(K, V)
    _states[(NK * NV * N * H,)](a, b, gc, s0 if s0 is not None else a, end if end is not None else a, hs, cu, coff,
                              T, scale, row_stride(a), row_stride(b), H, K=K, V=V, GATE=gate, IS_VARLEN=varlen,
                              REVERSE=reverse, HAS_S0=s0 is not None, STORE_END=store_end, BT=BT, BK=bk, BV=bv, NV=NV,
                              num_warps=nw)
    return hs, end


def fold_replicas(x, dim, R: int):
    """For a custom op's vmap rule: ``x`` with its replica axis ``dim`` (None: shared by all R replicas)
    folded into its first axis, ``[R, B, ...] -> [R * B, ...]``, contiguous. None stays None."""
    if x is None:
        return None
    x = x.movedim(dim, 0) if dim is not None else x.expand(R, *x.shape)
    return x.reshape(R * x.shape[1], *x.shape[2:]).contiguous()

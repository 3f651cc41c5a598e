"""The register GEMV tiles (``tiles.gemv_tile`` with BT 0: batch 1, and above it a loop over the
sequences): a tile holds R weight rows in registers, K-chunk by K-chunk, and reduces them against
the input row with ``tl.sum``; its first chunk is loaded before the wait on the input, the next
tile's while this one computes, and pools hand a worker further tiles (``common.claim``). FP8
weights (``models/qwen3/fp8.py``, the weight pointer's element type: a compile-time property) come
with their float32 block scales (``ws_ptr``: row r, column k has scale ``ws[r // SB, k // 128]``)
and are dequantized in registers; activations and accumulation are float32 either way.
"""

import triton
import triton.language as tl

from .common import (ARGMAX, KEY_EMPTY, RELAXED, RESIDUAL, T_COMPUTED, T_FIRST, T_INPUT, T_WAITED, W_CACHE,
                     W_EVICT, argmax_key, claim, next_tile, stamp, wait_counter)


@triton.jit
def rms_rstd(x_ptr, K: tl.constexpr, eps, BK: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) of a float32 row of K elements."""
    kk = tl.arange(0, BK)
    ss = tl.zeros([BK], dtype=tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(x_ptr + k0 + kk, mask=k0 + kk < K, other=0.0, cache_modifier=".cg")
        ss += x * x
    return 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)


@triton.jit
def load_w(w_ptr, row0, row_end, K: tl.constexpr, k0, R: tl.constexpr, BK: tl.constexpr):
    """Weight block rows [row0, min(row0+R, row_end)) x columns [k0, k0+BK) of a row-major
    [N, K] matrix. Weights are read once per step: evict them first so activations keep the
    cache."""
    r = row0 + tl.arange(0, R)
    k = k0 + tl.arange(0, BK)
    return tl.load(w_ptr + r[:, None] * K + k[None, :], mask=(r[:, None] < row_end) & (k[None, :] < K),
                   other=0.0, eviction_policy=W_EVICT, cache_modifier=W_CACHE)


@triton.jit
def load_s(w_ptr, ws_ptr, row0, row_end, K: tl.constexpr, k0, R: tl.constexpr, BK: tl.constexpr,
           SB: tl.constexpr):
    """The block scales of ``load_w``'s block where w_ptr is FP8: [R, NB], the scales of rows
    [row0, row0 + R) over the chunk's NB = max(1, BK / 128) 128-column blocks (a chunk narrower
    than 128 lies in one block, since chunks are powers of two from 0). Loaded with the weights,
    before the wait. A float32 1 for 16-bit weights, which nothing reads."""
    if w_ptr.dtype.element_ty == tl.float8e4nv:
        NB: tl.constexpr = BK // 128 if BK > 128 else 1
        KB: tl.constexpr = (K + 127) // 128
        r = row0 + tl.arange(0, R)
        j = k0 // 128 + tl.arange(0, NB)
        s = tl.load(ws_ptr + (r // SB)[:, None] * KB + j[None, :], mask=(r[:, None] < row_end) & (j[None, :] < KB),
                    other=0.0)
    else:
        s = tl.full([], 1.0, tl.float32)
    return s


@triton.jit
def wf32(w, s, R: tl.constexpr, BK: tl.constexpr):
    """A [R, BK] weight block in float32: 16-bit weights converted; FP8 ones times their block's
    scale (``load_s``), elementwise as ``models.qwen3.fp8`` dequantizes, so the product is the
    reference's weight exactly."""
    if w.dtype == tl.float8e4nv:
        if BK > 128:
            NB: tl.constexpr = BK // 128
            wf = tl.reshape(tl.reshape(w.to(tl.float32), (R, NB, 128)) * s[:, :, None], (R, BK))
        else:
            wf = w.to(tl.float32) * s
    else:
        wf = w.to(tl.float32)
    return wf


@triton.jit
def load_nw(nw_ptr, K: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr):
    """The first K-chunk of a norm weight as float32 (0 without NORM): a weight, so it is loaded
    before the wait on the input."""
    kk = tl.arange(0, BK)
    nw = tl.zeros([BK], dtype=tl.float32)
    if NORM:
        nw = tl.load(nw_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
    return nw


@triton.jit
def load_xn(x_ptr, nw_ptr, nw0, eps, K: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr):
    """(the first K-chunk of a float32 input row, RMS-normalised and scaled when NORM, and its
    1/rms). Computed once per instruction at batch 1 and reused by every tile; where the row fits
    one chunk the same load serves the statistics and the product. ``nw0`` is ``load_nw``'s chunk
    of the norm weight."""
    kk = tl.arange(0, BK)
    x = tl.load(x_ptr + kk, mask=kk < K, other=0.0, cache_modifier=".cg").to(tl.float32)
    rstd = 1.0
    if NORM:
        if K <= BK:
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / K + eps)
        else:
            rstd = rms_rstd(x_ptr, K, eps, BK)
        x = x * rstd * nw0
    return x, rstd


@triton.jit
def dot_rows(w_ptr, ws_ptr, w0, s0, xn0, row0, row_end, K: tl.constexpr, x_ptr, nw_ptr, rstd,
             NORM: tl.constexpr, R: tl.constexpr, BK: tl.constexpr, SB: tl.constexpr):
    """acc[r] = sum_k W[row0 + r, k] * v[k] for r < R, where v = x (float32, read through L2) or,
    with NORM, v = x * rstd * norm_weight. ``w0`` and ``xn0`` are the first K-chunk of the weights
    and of v, already loaded (``s0``: the chunk's FP8 scales, ``load_s``). Where K takes several
    chunks, each chunk's loads are issued before the previous chunk's product (two chunks in
    registers), so a tile waits on memory once, not once per chunk; the sums are added in the same
    order either way."""
    return dot_rows2(w_ptr, w_ptr, ws_ptr, ws_ptr, w0, w0, s0, s0, xn0, row0, row_end, K, x_ptr, nw_ptr, rstd,
                     NORM, R, BK, SB, False)[0]


@triton.jit
def dot_rows2(a_ptr, b_ptr, as_ptr, bs_ptr, a0, b0, sa0, sb0, xn0, row0, row_end, K: tl.constexpr, x_ptr, nw_ptr,
              rstd, NORM: tl.constexpr, R: tl.constexpr, BK: tl.constexpr, SB: tl.constexpr, TWO: tl.constexpr):
    """``dot_rows`` of the same rows of A and, with TWO, of B over one input v (gate and up): each
    K-chunk's loads of both matrices and of v go out together, before the previous chunk's
    products, so the second matrix's chunk is not a round trip of its own after the first's (a
    tile of 32b's gate/up, K 5120, is two chunks). Returns (acc_a, acc_b); acc_b is acc_a without
    TWO. Each sum is added in ``dot_rows``' order."""
    if K <= BK:
        acc_a = tl.sum(wf32(a0, sa0, R, BK) * xn0[None, :], axis=1)
        acc_b = acc_a
        if TWO:
            acc_b = tl.sum(wf32(b0, sb0, R, BK) * xn0[None, :], axis=1)
    else:
        a, sa, b, sb = _load_w2(a_ptr, b_ptr, as_ptr, bs_ptr, row0, row_end, K, BK, R, BK, SB, TWO)
        x = _load_xk(x_ptr, nw_ptr, rstd, BK, K, NORM, BK)
        acc_a = tl.sum(wf32(a0, sa0, R, BK) * xn0[None, :], axis=1)
        acc_b = acc_a
        if TWO:
            acc_b = tl.sum(wf32(b0, sb0, R, BK) * xn0[None, :], axis=1)
        for k0 in range(2 * BK, K, BK):
            a_next, sa_next, b_next, sb_next = _load_w2(a_ptr, b_ptr, as_ptr, bs_ptr, row0, row_end, K, k0, R, BK, SB,
                                                        TWO)
            x_next = _load_xk(x_ptr, nw_ptr, rstd, k0, K, NORM, BK)
            acc_a += tl.sum(wf32(a, sa, R, BK) * x[None, :], axis=1)
            if TWO:
                acc_b += tl.sum(wf32(b, sb, R, BK) * x[None, :], axis=1)
            a = a_next
            b = b_next
            sa = sa_next
            sb = sb_next
            x = x_next
        acc_a += tl.sum(wf32(a, sa, R, BK) * x[None, :], axis=1)
        if TWO:
            acc_b += tl.sum(wf32(b, sb, R, BK) * x[None, :], axis=1)
    return acc_a, acc_b


@triton.jit
def _load_w2(a_ptr, b_ptr, as_ptr, bs_ptr, row0, row_end, K: tl.constexpr, k0, R: tl.constexpr, BK: tl.constexpr,
             SB: tl.constexpr, TWO: tl.constexpr):
    """(A's chunk, its FP8 scales, B's chunk, its scales) at columns [k0, k0 + BK) of ``dot_rows2``'s
    rows (``load_w``, ``load_s``); without TWO, B's are A's (B is not read)."""
    a = load_w(a_ptr, row0, row_end, K, k0, R, BK)
    sa = load_s(a_ptr, as_ptr, row0, row_end, K, k0, R, BK, SB)
    b = a
    sb = sa
    if TWO:
        b = load_w(b_ptr, row0, row_end, K, k0, R, BK)
        sb = load_s(b_ptr, bs_ptr, row0, row_end, K, k0, R, BK, SB)
    return a, sa, b, sb


@triton.jit
def _load_xk(x_ptr, nw_ptr, rstd, k0, K: tl.constexpr, NORM: tl.constexpr, BK: tl.constexpr):
    """Columns [k0, k0 + BK) of the input row for ``dot_rows`` (times rstd and the norm weight with
    NORM), 0 past K."""
    kk = tl.arange(0, BK)
    x = tl.load(x_ptr + k0 + kk, mask=k0 + kk < K, other=0.0, cache_modifier=".cg").to(tl.float32)
    if NORM:
        x = x * rstd * tl.load(nw_ptr + k0 + kk, mask=k0 + kk < K, other=0.0).to(tl.float32)
    return x


@triton.jit
def gemv_rows(t, w0, s0, xn0, rstd, row_end, w_ptr, ws_ptr, in_ptr, nw_ptr, nw0, eps, out_ptr, aux_ptr,
              B: tl.constexpr, N: tl.constexpr, K: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
              SB: tl.constexpr, NORM: tl.constexpr, EPI: tl.constexpr, first, tr,
              TRACE: tl.constexpr):
    """Tile t of ``gemv_tile``: its R rows over each of the B input rows, from the tile's first
    weight chunk ``w0`` and its FP8 scales ``s0`` (and, at batch 1, the first chunk of the input ``xn0`` with its 1/rms).
    Returns the tile's ``argmax_key`` at batch 1 with EPI ARGMAX (the caller raises ``aux`` once
    per instruction; above batch 1 each row's key is raised here), else KEY_EMPTY."""
    rows = t * R + tl.arange(0, R)
    key = tl.full([], KEY_EMPTY, tl.int64)
    for b in range(B):
        if B > 1:
            xn0, rstd = load_xn(in_ptr + b * K, nw_ptr, nw0, eps, K, BK, NORM)
        if EPI == RESIDUAL:
            # the rows this tile adds to, asked for before its math so the two overlap
            res = tl.load(out_ptr + b * N + rows, mask=rows < row_end, other=0.0, cache_modifier=".cg")
        acc = dot_rows(w_ptr, ws_ptr, w0, s0, xn0, t * R, row_end, K, in_ptr + b * K, nw_ptr, rstd, NORM, R, BK, SB)
        if TRACE == 1:     # per tile: a CTA-wide reduction each (TRACE 2, the light trace, skips it)
            stamp(tr, T_COMPUTED, tl.sum(acc, axis=0), TRACE)
            if first:
                stamp(tr, T_FIRST, tl.sum(acc, axis=0), TRACE)
        if EPI == RESIDUAL:
            acc += res
        tl.store(out_ptr + b * N + rows, acc, mask=rows < row_end)
        if EPI == ARGMAX:
            acc = tl.where(rows < row_end, acc, float("-inf"))
            best = tl.max(acc, axis=0)
            idx = tl.min(tl.where(acc == best, rows, 2147483647), axis=0)   # first maximum, as torch
            key = argmax_key(best, idx)
            if B > 1:
                tl.atomic_max(aux_ptr + b, key, sem=RELAXED, scope="gpu")
    return key


@triton.jit
def gemv_rows_tiles(t0, t1, w_ptr, ws_ptr, in_ptr, nw_ptr, eps, out_ptr, aux_ptr, cnt_ptr, target,
                    B: tl.constexpr, N: tl.constexpr, K: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
                    SB: tl.constexpr, NORM: tl.constexpr, EPI: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr,
                    tr, TRACE: tl.constexpr, POOL: tl.constexpr, claims_ptr, claims_base):
    """``gemv_tile``'s tiles with their weights in registers, looping over the B input rows."""
    NT: tl.constexpr = (N + R - 1) // R
    if POOL > 0:
        c = claim(claims_ptr)           # the first pool tile: asked for now, read after tile t1 - 1
        row_end = N                     # the next tile can be any of the pool's
    else:
        row_end = tl.minimum(t1 * R, N)
    w0 = load_w(w_ptr, t0 * R, row_end, K, 0, R, BK)
    s0 = load_s(w_ptr, ws_ptr, t0 * R, row_end, K, 0, R, BK, SB)
    nw0 = load_nw(nw_ptr, K, BK, NORM)
    seen = target
    if WAIT:
        seen = wait_counter(cnt_ptr, target, SPIN)
    else:
        # per-op: without the wait's CTA barrier ptxas sinks the weight loads to their uses, one
        # round trip each; this barrier keeps them issued together
        tl.debug_barrier()
    stamp(tr, T_WAITED, seen, TRACE)
    xn0, rstd = load_xn(in_ptr, nw_ptr, nw0, eps, K, BK, NORM)
    stamp(tr, T_INPUT, tl.sum(xn0, axis=0), TRACE)
    kmax = tl.full([], KEY_EMPTY, tl.int64)
    if POOL > 0:
        t = t0
        while t < NT:
            nt, c = next_tile(t, t1, c, claims_ptr, claims_base, NT, POOL)
            w_next = load_w(w_ptr, nt * R, row_end, K, 0, R, BK)      # nothing past the last row
            s_next = load_s(w_ptr, ws_ptr, nt * R, row_end, K, 0, R, BK, SB)
            key = gemv_rows(t, w0, s0, xn0, rstd, row_end, w_ptr, ws_ptr, in_ptr, nw_ptr, nw0, eps, out_ptr, aux_ptr,
                            B, N, K, R, BK, SB, NORM, EPI, t == t0, tr, TRACE)
            kmax = tl.maximum(kmax, key)
            w0 = w_next
            s0 = s_next
            t = nt
    else:
        for t in range(t0, t1):
            w_next = load_w(w_ptr, (t + 1) * R, row_end, K, 0, R, BK)
            s_next = load_s(w_ptr, ws_ptr, (t + 1) * R, row_end, K, 0, R, BK, SB)
            key = gemv_rows(t, w0, s0, xn0, rstd, row_end, w_ptr, ws_ptr, in_ptr, nw_ptr, nw0, eps, out_ptr, aux_ptr,
                            B, N, K, R, BK, SB, NORM, EPI, t == t0, tr, TRACE)
            kmax = tl.maximum(kmax, key)
            w0 = w_next
            s0 = s_next
    if (EPI == ARGMAX) & (B == 1):
        tl.atomic_max(aux_ptr, kmax, sem=RELAXED, scope="gpu")     # one atomic per instruction
    return seen

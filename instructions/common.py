"""Device helpers every instruction kind shares: the bounded counter wait, RMSNorm statistics,
and the row-block GEMV core.

Memory ordering (DESIGN.md section 4): a consumer's poll is a scalar
``atomic_add(ptr, 0, sem="acquire")``, which Triton lowers to one ``ld.acquire.gpu`` on one
thread and broadcasts through shared memory with a CTA barrier; loads of activations written by
other programs in the same launch then use ``cache_modifier=".cg"`` (L2, never a stale L1 line).
"""

import importlib.util

import triton
import triton.language as tl

# triton-ascend (it replaces Triton's package) supports only acq_rel atomics on the NPU; elsewhere
# the weaker, cheaper orders are used: a consumer's poll acquires, a producer's signal releases.
ASCEND = importlib.util.find_spec("triton.backends.ascend") is not None
ACQUIRE: tl.constexpr = tl.constexpr("acq_rel" if ASCEND else "acquire")
RELEASE: tl.constexpr = tl.constexpr("acq_rel" if ASCEND else "release")
RELAXED: tl.constexpr = tl.constexpr("acq_rel" if ASCEND else "relaxed")


@triton.jit
def wait_counter(cnt_ptr, target, SPIN: tl.constexpr):
    """Spin until ``*cnt_ptr >= target`` or SPIN polls have passed; returns the last value seen
    (the caller reports a timeout when it is below target). Bounded so that a broken tape ends in
    an error, never a hung GPU."""
    seen = tl.atomic_add(cnt_ptr, 0, sem=ACQUIRE, scope="gpu")
    it = 0
    while (seen < target) & (it < SPIN):
        seen = tl.atomic_add(cnt_ptr, 0, sem=ACQUIRE, scope="gpu")
        it += 1
    return seen


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
                   other=0.0, eviction_policy="evict_first")


@triton.jit
def load_xn(x_ptr, nw_ptr, eps, K: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr):
    """(the first K-chunk of a float32 input row, RMS-normalised and scaled when NORM, and its
    1/rms). Computed once per instruction at batch 1 and reused by every tile; where the row fits
    one chunk the same load serves the statistics and the product."""
    kk = tl.arange(0, BK)
    x = tl.load(x_ptr + kk, mask=kk < K, other=0.0, cache_modifier=".cg")
    rstd = 1.0
    if NORM:
        if K <= BK:
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / K + eps)
        else:
            rstd = rms_rstd(x_ptr, K, eps, BK)
        x = x * rstd * tl.load(nw_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
    return x, rstd


@triton.jit
def dot_rows(w_ptr, w0, xn0, row0, row_end, K: tl.constexpr, x_ptr, nw_ptr, rstd,
             NORM: tl.constexpr, R: tl.constexpr, BK: tl.constexpr):
    """acc[r] = sum_k W[row0 + r, k] * v[k] for r < R, where v = x (float32, read through L2) or,
    with NORM, v = x * rstd * norm_weight. ``w0`` and ``xn0`` are the first K-chunk of the weights
    and of v, already loaded."""
    kk = tl.arange(0, BK)
    acc = tl.sum(w0.to(tl.float32) * xn0[None, :], axis=1)
    for k0 in range(BK, K, BK):
        w = load_w(w_ptr, row0, row_end, K, k0, R, BK)
        x = tl.load(x_ptr + k0 + kk, mask=k0 + kk < K, other=0.0, cache_modifier=".cg")
        if NORM:
            x = x * rstd * tl.load(nw_ptr + k0 + kk, mask=k0 + kk < K, other=0.0).to(tl.float32)
        acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    return acc


STORE: tl.constexpr = tl.constexpr(0)      # out[b, rows] = acc
RESIDUAL: tl.constexpr = tl.constexpr(1)   # out[b, rows] += acc
ARGMAX: tl.constexpr = tl.constexpr(2)     # out[b, rows] = acc; per tile (max, first argmax) into aux


@triton.jit
def gemv_tile(t0, t1, w_ptr, in_ptr, nw_ptr, eps, out_ptr, aux_v_ptr, aux_i_ptr, cnt_ptr, target,
              B: tl.constexpr, N: tl.constexpr, K: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
              NORM: tl.constexpr, EPI: tl.constexpr, NT: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr):
    """Tiles [t0, t1) of rows R of a row-major [N, K] GEMV over each of B input rows (RMS-normalised
    with weight ``nw`` when NORM), with the epilogue EPI. The first tile's weights are loaded before
    the wait (weights never depend on activations), each next tile's while this one computes."""
    row_end = tl.minimum(t1 * R, N)
    w0 = load_w(w_ptr, t0 * R, row_end, K, 0, R, BK)
    seen = target
    if WAIT:
        seen = wait_counter(cnt_ptr, target, SPIN)
    xn0, rstd = load_xn(in_ptr, nw_ptr, eps, K, BK, NORM)
    for t in range(t0, t1):
        w_next = load_w(w_ptr, (t + 1) * R, row_end, K, 0, R, BK)
        rows = t * R + tl.arange(0, R)
        for b in range(B):
            if B > 1:
                xn0, rstd = load_xn(in_ptr + b * K, nw_ptr, eps, K, BK, NORM)
            acc = dot_rows(w_ptr, w0, xn0, t * R, row_end, K, in_ptr + b * K, nw_ptr, rstd, NORM, R, BK)
            if EPI == RESIDUAL:
                acc += tl.load(out_ptr + b * N + rows, mask=rows < row_end, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + b * N + rows, acc, mask=rows < row_end)
            if EPI == ARGMAX:
                acc = tl.where(rows < row_end, acc, float("-inf"))
                best = tl.max(acc, axis=0)
                idx = tl.min(tl.where(acc == best, rows, 2147483647), axis=0)   # first maximum, as torch
                tl.store(aux_v_ptr + b * NT + t, best)
                tl.store(aux_i_ptr + b * NT + t, idx)
        w0 = w_next
    return seen

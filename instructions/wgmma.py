"""The batched GEMV tile with the weights on the MMA's M side (``BATCHED = 2`` plans).

out[B, N] = X[B, K] @ W[N, K]^T is computed transposed, out^T = W @ X^T: a tile holds BM = 64 or
128 weight rows and multiplies them by the batch's input as the dot's N side (padded to 8 or 16,
the plan's SWAP_MIN_N, then 32 or 64). Triton emits Hopper's wgmma only where the dot's M is a
multiple of 64 (and, under Triton 3.6, N at least 16); the batch on M (the older tile,
``batch_mma.batch_tiles``) left it on mma.sync. This is the operand swap of Mirage MPK's Hopper
linear task and of the small-M fused-MoE kernels in SGLang and vLLM.

A stage has cdiv(N, R) row blocks and SK K-splits each (plan fields ``R_*`` and ``SK_*``); tile t
is row block t // SK over K columns [(t % SK) K / SK, (t % SK + 1) K / SK), so a stage with fewer
row blocks than workers still keeps every worker streaming. Each split stores its partial sums in
``kpart`` and takes a ticket on its row block; the split that takes the last ticket adds the SK partials in split order
(so the sum does not depend on which split finished last) and runs the epilogue. The ticket words
only grow: a row block's tickets of one use are those past the last multiple of SK. With a pool
(the plan's ``POOL_*``, ``scheduler/ops.py``) the stage's last tiles belong to no instruction: each
claims them one at a time after its own, so the stage ends with the mean worker.

RMS-normalised inputs (QKV, gate/up, the LM head) are not normalised here. The stage that writes x
(EMBED, and the O and down tiles' residual epilogue, XOUT) also writes x times the next norm
weight as a bf16 head and a bf16 remainder (``xs``, [2, B, H]) and the sums of squares of x over
each SS_ROWS columns (``xss``, [cdiv(H, SS_ROWS), B]). The tile then loads its MMA operands
straight from memory, so Triton's pipeliner stages them into shared memory beside the weights and
the wgmma reads them there; and it scales each sequence's sums by its 1/rms in the epilogue.

Numerics: the input contract is the plan's BATCH_INPUT (``XIN`` here):
- split (0): as ``batch_mma.mac_dot``'s contract. The float32 input (times the norm weight) goes in as
  a bf16 head and a bf16 remainder, two MMAs sharing the weight operand, so the sums keep about 16
  bits of it (a 16-bit input, O's and down's, is exact in one);
- bf16 (1): only the head, one MMA;
- fp8 (2), FP8 weights only (w8a8, the scheme Qwen's FP8 checkpoints declare): each sequence's input
  is quantized to e4m3 per 128 columns, scale = amax / 448 (vLLM's per-token-group quantization),
  and multiplied by the e4m3 weights on the FP8 tensor cores, both block scales applied per 128-
  column chunk. A normalised input is quantized before its 1/rms, which scales every block alike
  and is applied in the epilogue. The quantization runs in the consuming tile, on the chunk it has
  just loaded, so no stage writes a second copy of its output.
Sums of squares are added by fixed pairwise trees (``tree_sum``), so the per-op kernels and the
persistent kernel agree bitwise.
"""

import triton
import triton.language as tl

from scheduler.ops import SWAP_SMEM_BASE, SWAP_SMEM_STEP

from .common import (ARGMAX, BT_N16, BT_PRE, BT_SMEM, BT_TMA, GATEUP, RELAXED, RESIDUAL, argmax_key, claim,
                     next_tile, round_bf16, sum_pairs, wait_counter)
from .fp8 import e4m3_bf16, quantize_e4m3

# the tile's input contracts (``XIN``; the plan's BATCH_INPUT, module doc)
XIN_SPLIT: tl.constexpr = tl.constexpr(0)
XIN_BF16: tl.constexpr = tl.constexpr(1)
XIN_FP8: tl.constexpr = tl.constexpr(2)

# A program's pipeline: its stages (each a chunk of weights and of input; Triton's pipeliner keeps
# up to num_stages buffers of each in shared memory) within the plan's SWAP_SMEM KB (the base, plus
# ``BT_SMEM`` steps of the tiles' kind), 2 to MAX_STAGES of them.
SMEM_BASE: tl.constexpr = tl.constexpr(SWAP_SMEM_BASE * 1024)
SMEM_STEP: tl.constexpr = tl.constexpr(SWAP_SMEM_STEP * 1024)
MAX_STAGES: tl.constexpr = tl.constexpr(5)
KC_SWAP: tl.constexpr = tl.constexpr(128)      # K columns a chunk: one FP8 scale block
SS_ROWS: tl.constexpr = tl.constexpr(64)       # x's columns a partial sum of squares covers (``xss``)


@triton.jit
def tree_sum(q):
    """The sums over the last axis of a 2-D block (a power of two wide) as [rows], by
    ``common.sum_pairs``' pairwise tree (the same bits in any register layout)."""
    return tl.reshape(sum_pairs(tl.reshape(q, [1, q.shape[0], q.shape[1]])), [q.shape[0]])


@triton.jit
def write_xs(v, cols, ok, b, nw_ptr, xs_ptr, xss_ptr, blk, B: tl.constexpr, H: tl.constexpr):
    """For x's values ``v`` [SS_ROWS, BP] at columns ``cols`` of sequences ``b`` (``ok``: which are
    real): x times the norm weight as a head and a remainder in xs's dtype, and the block's sums of
    squares into xss[blk, b]."""
    v = tl.where(ok, v, 0.0)
    y = v * tl.load(nw_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)[:, None]
    hi = y.to(xs_ptr.dtype.element_ty)
    lo = (y - hi.to(tl.float32)).to(xs_ptr.dtype.element_ty)
    offs = b[None, :] * H + cols[:, None]
    tl.store(xs_ptr + offs, hi, mask=ok)
    tl.store(xs_ptr + B * H + offs, lo, mask=ok)
    ss = tree_sum(tl.trans(v * v))
    tl.store(xss_ptr + blk * B + b, ss, mask=b < B)


@triton.jit
def _ss_tree(xss_ptr, j0, B: tl.constexpr, NSS: tl.constexpr, W: tl.constexpr, BP: tl.constexpr):
    """The tree sum (``tree_sum``) of blocks [j0, j0 + W) of each sequence's sums of squares [BP]."""
    j = j0 + tl.arange(0, W)
    b = tl.arange(0, BP)
    p = tl.load(xss_ptr + j[None, :] * B + b[:, None], mask=(j[None, :] < NSS) & (b[:, None] < B), other=0.0,
                cache_modifier=".cg")
    return tree_sum(p)


@triton.jit
def load_rstd(xss_ptr, eps, B: tl.constexpr, H: tl.constexpr, BP: tl.constexpr):
    """Each sequence's 1/rms of x [BP] from the blocks' sums of squares (``write_xs``), added by a tree."""
    NSS: tl.constexpr = (H + SS_ROWS - 1) // SS_ROWS
    NSS_PAD: tl.constexpr = 1 if NSS <= 1 else 2 if NSS <= 2 else 4 if NSS <= 4 else 8 if NSS <= 8 else \
        16 if NSS <= 16 else 32 if NSS <= 32 else 64 if NSS <= 64 else 128 if NSS <= 128 else 256 if NSS <= 256 else 512
    if BP * NSS_PAD > 2048:
        # the tree's four quarters, then its top two levels: the same sum as one tree over NSS_PAD,
        # a quarter of the values live. Compiled for sm_90 (Triton 3.6), the 32b batch-64
        # megakernel's spill loads went from 781 to 107; at 2048 values and under (8b batch 32) one
        # load spills less.
        CH: tl.constexpr = NSS_PAD // 4
        s = (_ss_tree(xss_ptr, 0, B, NSS, CH, BP) + _ss_tree(xss_ptr, CH, B, NSS, CH, BP)) + \
            (_ss_tree(xss_ptr, 2 * CH, B, NSS, CH, BP) + _ss_tree(xss_ptr, 3 * CH, B, NSS, CH, BP))
    else:
        s = _ss_tree(xss_ptr, 0, B, NSS, NSS_PAD, BP)
    return 1.0 / tl.sqrt(s / H + eps)


@triton.jit
def _load_w(w_ptr, row0, rows_ok, K: tl.constexpr, k0, BM: tl.constexpr, KC: tl.constexpr, RAW: tl.constexpr,
            TMA: tl.constexpr):
    """Weight rows [row0, row0 + BM) x columns [k0, k0 + KC) as [BM, KC] (masked rows and columns
    read as 0); FP8 weights as e4m3 with RAW (w8a8 on the GPU), else as [BM, KC / 4] int32 words of
    four e4m3 bytes (``fp8.e4m3_bf16``). Read once a step: evicted first, so the activations
    keep the cache. With TMA ``w_ptr`` is the weights' descriptor (``_weights_desc``): rows past the
    matrix and columns past K read as 0, rows of the next block as they are (the epilogue drops them)."""
    r = row0 + tl.arange(0, BM)
    if TMA:
        w = w_ptr.load([row0, k0])
    elif w_ptr.dtype.element_ty == tl.float8e4nv and not RAW:
        KW: tl.constexpr = K // 4
        i = k0 // 4 + tl.arange(0, KC // 4)
        w = tl.load(w_ptr.to(tl.pointer_type(tl.int32)) + r[:, None] * KW + i[None, :],
                    mask=rows_ok[:, None] & (i[None, :] < KW), other=0, eviction_policy="evict_first")
    else:
        k = k0 + tl.arange(0, KC)
        w = tl.load(w_ptr + r[:, None] * K + k[None, :], mask=rows_ok[:, None] & (k[None, :] < K), other=0.0,
                    eviction_policy="evict_first")
    return w


@triton.jit
def _weights_desc(w_ptr, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, KC: tl.constexpr, TMA: tl.constexpr):
    """A tensor descriptor of the [N, K] weights in chunks of [BM, KC] with TMA, else the pointer."""
    if TMA:
        return tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BM, KC])
    else:
        return w_ptr


@triton.jit
def _mac(acc, w, xh, xl, s, SPLIT: tl.constexpr, EXACT: tl.constexpr):
    """acc[BM, BP] += W[BM, KC] @ x^T, x^T given as its bf16 head ``xh`` [KC, BP] and (SPLIT) remainder
    ``xl``, or with EXACT (float32 weights or a float32 model's FP8 ones, the CPU) as float32 ``xh``.
    FP8 words are made bf16 exactly and each row's chunk sum is scaled by its block scale ``s``."""
    if w.dtype == tl.int32:
        wb = tl.reshape(e4m3_bf16(tl.reshape(w, [1, w.shape[0], w.shape[1]]), EXACT), [w.shape[0], 4 * w.shape[1]])
        if EXACT:
            part = tl.dot(wb, xh, input_precision="ieee")
        else:
            part = tl.dot(wb, xh)
            if SPLIT:
                part = tl.dot(wb, xl, part)
        acc += part * s[:, None]
    elif EXACT:
        acc = tl.dot(w.to(tl.float32), xh, acc, input_precision="ieee")
    else:
        acc = tl.dot(w, xh, acc)
        if SPLIT:
            acc = tl.dot(w, xl, acc)
    return acc


@triton.jit
def _mac_w8a8(acc, w, xq, sw, sx, EXACT: tl.constexpr):
    """acc[BM, BP] += (W[BM, 128] @ xq[128, BP]) * sw[:, None] * sx[None, :]: e4m3 weights times e4m3
    inputs on the FP8 tensor cores, each sum scaled by its weight row's and its sequence's block
    scale. With EXACT (the CPU) the weights come as int32 words (made float32 exactly) and xq as
    float32 values of e4m3, multiplied in float32."""
    if EXACT:
        wf = tl.reshape(e4m3_bf16(tl.reshape(w, [1, w.shape[0], w.shape[1]]), True), [w.shape[0], 4 * w.shape[1]])
        part = tl.dot(wf, xq, input_precision="ieee")
    else:
        part = tl.dot(w, xq)
    return acc + part * sw[:, None] * sx[None, :]


@triton.jit
def _load_x(in_ptr, bb, k0, k_lo, B: tl.constexpr, K: tl.constexpr, KSPAN: tl.constexpr, KC: tl.constexpr,
            SPLIT: tl.constexpr):
    """The input's columns [k0, k0 + KC) of the split from k_lo as [BP, KC]: its head, and with SPLIT
    its remainder (else the head again)."""
    k = k0 + tl.arange(0, KC)
    xm = (bb[:, None] < B) & (k < k_lo + KSPAN)[None, :]
    xh = tl.load(in_ptr + bb[:, None] * K + k[None, :], mask=xm, other=0.0, cache_modifier=".cg")
    xl = xh
    if SPLIT:
        xl = tl.load(in_ptr + B * K + bb[:, None] * K + k[None, :], mask=xm, other=0.0, cache_modifier=".cg")
    return xh, xl


@triton.jit
def _tile_rows(t, R: tl.constexpr, SK: tl.constexpr, N: tl.constexpr, BM: tl.constexpr):
    """Tile t's row block, K-split, rows [BM] and which of them are the block's."""
    rb = t // SK
    rr = tl.arange(0, BM)
    rows = rb * R + rr
    return rb, t - rb * SK, rows, (rr < R) & (rows < N)


@triton.jit
def _pre_w(w_ptr, w2_ptr, row0, rows_ok, K: tl.constexpr, k_lo, BM: tl.constexpr, KC: tl.constexpr,
           RAW: tl.constexpr, TWO: tl.constexpr, PRE: tl.constexpr):
    """A split's first PRE (1 or 2) chunks of weights from column k_lo by pointer loads (``_load_w``),
    and W2's with TWO: (w, w2) of the first, then of the second (the first's again where PRE is 1)."""
    pa = _load_w(w_ptr, row0, rows_ok, K, k_lo, BM, KC, RAW, False)
    p2a = pa
    if TWO:
        p2a = _load_w(w2_ptr, row0, rows_ok, K, k_lo, BM, KC, RAW, False)
    pb = pa
    p2b = p2a
    if PRE >= 2:
        pb = _load_w(w_ptr, row0, rows_ok, K, k_lo + KC, BM, KC, RAW, False)
        p2b = pb
        if TWO:
            p2b = _load_w(w2_ptr, row0, rows_ok, K, k_lo + KC, BM, KC, RAW, False)
    return pa, p2a, pb, p2b


@triton.jit
def _chunk(acc, acc2, w, w2, xh, xl, ws_ptr, ws2_ptr, rows, rows_ok, k0, K: tl.constexpr,
           SB: tl.constexpr, TWO: tl.constexpr, FP8: tl.constexpr,
           SPLIT: tl.constexpr, EXACT: tl.constexpr, XBF16: tl.constexpr, XT: tl.constexpr, W8A8: tl.constexpr):
    """``swap_tiles``' sums (acc, and acc2 with TWO) plus one chunk: the weights ``w`` (``w2``) times
    the input's columns [k0, k0 + KC) (``_load_x``), its head and with SPLIT remainder; with W8A8
    that input quantized to e4m3 (``quantize_e4m3``, one scale a sequence: KC is 128)."""
    if W8A8:
        y = xh.to(tl.float32)
        if SPLIT:
            y += xl.to(tl.float32)
        xq, sx = quantize_e4m3(y, EXACT)
    elif EXACT:
        if XBF16:
            xh = round_bf16(xh)
    elif xh.dtype != XT:
        xh = xh.to(XT)
        xl = xl.to(XT)
    s = tl.full([], 1.0, tl.float32)
    s2 = s
    if FP8:
        KB: tl.constexpr = (K + 127) // 128
        s = tl.load(ws_ptr + (rows // SB) * KB + k0 // 128, mask=rows_ok, other=0.0)
        if TWO:
            s2 = tl.load(ws2_ptr + (rows // SB) * KB + k0 // 128, mask=rows_ok, other=0.0)
    if W8A8:
        acc = _mac_w8a8(acc, w, tl.trans(xq), s, sx, EXACT)
        if TWO:
            acc2 = _mac_w8a8(acc2, w2, tl.trans(xq), s2, sx, EXACT)
    else:
        acc = _mac(acc, w, tl.trans(xh), tl.trans(xl), s, SPLIT, EXACT)
        if TWO:
            acc2 = _mac(acc2, w2, tl.trans(xh), tl.trans(xl), s2, SPLIT, EXACT)
    return acc, acc2


@triton.jit
def _epilogue(acc, acc2, rows, row_end, rb, out_ptr, aux_ptr, xss_ptr, eps, nw2_ptr, xs_ptr, B: tl.constexpr,
              N: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr, EPI: tl.constexpr, XOUT: tl.constexpr):
    """A row block's outputs from its sums acc[BM, BP] (acc2: up's, GATEUP), each column b scaled by
    its 1/rms with NORM (from ``xss``, over x's K columns): out[b, rows] = acc^T, or += (RESIDUAL), or
    silu(gate) * up (GATEUP); with ARGMAX each sequence's key raised in aux[b]. XOUT (after RESIDUAL,
    the block's SS_ROWS rows): the new x's rows also go to ``xs`` and ``xss`` for the next normalised
    stage (module doc), times the norm weight ``nw2``."""
    bb = tl.arange(0, acc.shape[1])
    if NORM:
        rstd = load_rstd(xss_ptr, eps, B, K, acc.shape[1])
        acc = acc * rstd[None, :]
    if EPI == GATEUP:
        if NORM:
            acc2 = acc2 * rstd[None, :]
        acc = acc / (1.0 + tl.exp(-acc)) * acc2
    ok = (rows[:, None] < row_end) & (bb[None, :] < B)
    offs = bb[None, :] * N + rows[:, None]
    if EPI == RESIDUAL:
        acc += tl.load(out_ptr + offs, mask=ok, other=0.0, cache_modifier=".cg")
    tl.store(out_ptr + offs, acc, mask=ok)
    if XOUT:
        tl.static_assert(acc.shape[0] == SS_ROWS, "a block of x's sums of squares is one 64-row tile")
        write_xs(acc, rows, ok, bb, nw2_ptr, xs_ptr, xss_ptr, rb, B, N)
    if EPI == ARGMAX:
        acc = tl.where(ok, acc, float("-inf"))
        best = tl.max(acc, axis=0)
        idx = tl.min(tl.where(acc == best[None, :], rows[:, None], 2147483647), axis=0)   # first maximum
        tl.atomic_max(aux_ptr + bb, argmax_key(best, idx), mask=bb < B, sem=RELAXED, scope="gpu")


@triton.jit
def _pipelined(acc, acc2, wd, wd2, in_ptr, ws_ptr, ws2_ptr, bb, row0, rows, rows_ok, k_from, k_lo, B: tl.constexpr,
               K: tl.constexpr, KSPAN: tl.constexpr, KC: tl.constexpr, BM: tl.constexpr, STAGES: tl.constexpr,
               SB: tl.constexpr, TWO: tl.constexpr, FP8: tl.constexpr, SPLIT: tl.constexpr, EXACT: tl.constexpr,
               XBF16: tl.constexpr, XT: tl.constexpr, W8A8: tl.constexpr, RAW: tl.constexpr, TMA: tl.constexpr):
    """The sums plus the split's chunks from column k_from to its end (the split from k_lo), in
    Triton's software pipeline of STAGES chunks of weights and input."""
    for k0 in tl.range(k_from, k_lo + KSPAN, KC, num_stages=STAGES):
        w = _load_w(wd, row0, rows_ok, K, k0, BM, KC, RAW, TMA)
        w2 = w
        if TWO:
            w2 = _load_w(wd2, row0, rows_ok, K, k0, BM, KC, RAW, TMA)
        xh, xl = _load_x(in_ptr, bb, k0, k_lo, B, K, KSPAN, KC, SPLIT)
        acc, acc2 = _chunk(acc, acc2, w, w2, xh, xl, ws_ptr, ws2_ptr, rows, rows_ok, k0,
                           K, SB, TWO, FP8, SPLIT, EXACT, XBF16, XT, W8A8)
    return acc, acc2


@triton.jit
def _finish(acc, acc2, rb, ks, rows, rows_ok, row_end, bb, out_ptr, aux_ptr, xss_ptr, eps, nw2_ptr, xs_ptr,
            kpart_ptr, tick_ptr, B: tl.constexpr, N: tl.constexpr, K: tl.constexpr, SK: tl.constexpr,
            NT: tl.constexpr, TWO: tl.constexpr, NORM: tl.constexpr, EPI: tl.constexpr, XOUT: tl.constexpr):
    """A tile's end: its row block's epilogue, or with SK > 1 its split's partial sums stored and a
    ticket taken, the last split adding the SK partials in split order and running the epilogue."""
    BM: tl.constexpr = acc.shape[0]
    BP: tl.constexpr = acc.shape[1]
    if SK == 1:
        _epilogue(acc, acc2, rows, row_end, rb, out_ptr, aux_ptr, xss_ptr, eps, nw2_ptr, xs_ptr, B, N, K, NORM,
                  EPI, XOUT)
    else:
        ok = rows_ok[:, None] & (bb[None, :] < B)
        po = kpart_ptr + ks * (B * NT) + bb[None, :] * NT + rows[:, None]
        tl.store(po, acc, mask=ok)
        if TWO:
            tl.store(po + N, acc2, mask=ok)
        tl.debug_barrier()     # every thread's partials stored before the ticket's release
        tick = tl.atomic_add(tick_ptr + rb, 1, sem="acq_rel", scope="gpu")
        if tick % SK == SK - 1:
            # the last split of this row block: add the SK partials in split order
            acc = tl.zeros([BM, BP], dtype=tl.float32)
            acc2 = tl.zeros([BM, BP], dtype=tl.float32)
            for j in tl.static_range(SK):
                pj = kpart_ptr + j * (B * NT) + bb[None, :] * NT + rows[:, None]
                acc += tl.load(pj, mask=ok, other=0.0, cache_modifier=".cg")
                if TWO:
                    acc2 += tl.load(pj + N, mask=ok, other=0.0, cache_modifier=".cg")
            _epilogue(acc, acc2, rows, row_end, rb, out_ptr, aux_ptr, xss_ptr, eps, nw2_ptr, xs_ptr, B, N, K,
                      NORM, EPI, XOUT)


@triton.jit
def swap_tiles(t0, t1, w_ptr, w2_ptr, ws_ptr, ws2_ptr, in_ptr, xss_ptr, eps, out_ptr, aux_ptr, kpart_ptr, tick_ptr,
               nw2_ptr, xs_ptr, cnt_ptr, target, B: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
               R: tl.constexpr, SK: tl.constexpr, SB: tl.constexpr, NORM: tl.constexpr, TWO: tl.constexpr,
               EPI: tl.constexpr, XOUT: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr, XIN: tl.constexpr,
               POOL: tl.constexpr, claims_ptr, claims_base):
    """Tiles [t0, t1) (module doc) of out[B, N] = X[B, K] @ W[N, K]^T with the epilogue EPI (STORE,
    RESIDUAL, ARGMAX, or GATEUP with W2 the up rows beside W's gate rows). With NORM, ``in_ptr`` is
    ``xs`` (x times the norm weight, a head and a remainder) and each sequence's sums are scaled by
    its 1/rms from ``xss``; else the input rows in_ptr[B, K]. XOUT: the epilogue also writes the new
    x's ``xs`` and ``xss`` (norm weight ``nw2``). FP8 weights come with their scales ``ws``
    (``ws2``: W2's), SB rows a scale row. ``kpart``: the split partials (``SK`` > 1), ``tick_ptr``:
    this stage's ticket word per row block. ``XIN``: the input contract (module doc; XIN_FP8 takes
    effect with FP8 weights, the others' inputs go in split), plus BT_TMA to take the weights by
    tensor descriptor (TMA; not FP8 weight-only's int32 words, nor K rows whose bytes are not a
    multiple of 16, which TMA cannot stride), BT_N16 to pad the batch to 16, BT_PRE times the
    chunks of each split taken into registers before its loop (the first tile's before the wait) and
    added after it, and BT_SMEM times the steps of pipeline above SMEM_BASE. Returns the wait's last
    counter value."""
    tl.static_assert(R <= 128, "a weights-on-M tile holds at most 128 rows")
    BM: tl.constexpr = 64 if R <= 64 else 128
    # the batch as the dot's N, from 16 with BT_N16: Triton 3.6 (the GPU machines') lowers an N of 8
    # to mma.sync and emits wgmma from 16 (3.9 from 8); the padding's columns are zeros
    N16: tl.constexpr = (XIN // BT_N16) % 2 == 1
    BP: tl.constexpr = 8 if B <= 8 and not N16 else 16 if B <= 16 else 32 if B <= 32 else 64 if B <= 64 else 128
    KSPAN: tl.constexpr = K // SK
    tl.static_assert(KSPAN * SK == K, "the K-splits must divide K")
    FP8: tl.constexpr = w_ptr.dtype.element_ty == tl.float8e4nv
    # a float32 model (the CPU's) multiplies in float32
    EXACT: tl.constexpr = in_ptr.dtype.element_ty == tl.float32
    CONTRACT: tl.constexpr = XIN % BT_TMA
    W8A8: tl.constexpr = FP8 and CONTRACT == XIN_FP8
    XBF16: tl.constexpr = CONTRACT == XIN_BF16
    # xs's remainder: a second MMA, unless XBF16 (a float32 model's xs is exact, its remainder 0)
    SPLIT: tl.constexpr = NORM and not XBF16 and not EXACT
    # the MMA's input type: the weights' (FP8 ones are made bf16)
    XT: tl.constexpr = tl.bfloat16 if FP8 else w_ptr.dtype.element_ty
    WBYTES: tl.constexpr = w_ptr.dtype.element_ty.primitive_bitwidth // 8
    XBYTES: tl.constexpr = in_ptr.dtype.element_ty.primitive_bitwidth // 8
    # a stage's bytes a column: the weight chunk(s) and the input's head (and remainder)
    COL_BYTES: tl.constexpr = (2 if TWO else 1) * BM * WBYTES + (2 if SPLIT else 1) * BP * XBYTES
    # chunks of 128 columns, or of 64 where two of 128 would not fit (large batches)
    # (w8a8: always 128, one scale block of the input as of the weights)
    SMEM: tl.constexpr = SMEM_BASE + (XIN // BT_SMEM) * SMEM_STEP
    KC: tl.constexpr = KC_SWAP if W8A8 or 2 * KC_SWAP * COL_BYTES <= SMEM else KC_SWAP // 2
    tl.static_assert(not W8A8 or SK == 1 or KSPAN % KC == 0, "w8a8 needs K-splits of whole 128-column blocks")
    STAGE_BYTES: tl.constexpr = KC * COL_BYTES
    FIT: tl.constexpr = SMEM // STAGE_BYTES
    STAGES: tl.constexpr = 2 if FIT < 2 else MAX_STAGES if FIT > MAX_STAGES else FIT
    NT: tl.constexpr = 2 * N if TWO else N          # a partial's row: gate's N sums, then up's
    RAW: tl.constexpr = W8A8 and not EXACT
    TMA: tl.constexpr = (XIN // BT_TMA) % 2 == 1 and (RAW or not FP8) and (K * WBYTES) % 16 == 0
    # a split's first PRE chunks (BT_PRE), taken into registers before the pipelined loop over the
    # rest and added after it: the first tile's before the wait, so those bytes move while it waits
    PRE0: tl.constexpr = (XIN // BT_PRE) % 4
    PRE: tl.constexpr = PRE0 if PRE0 * KC <= KSPAN else KSPAN // KC
    # (made before the wait: they depend on the weights' address alone)
    wd = _weights_desc(w_ptr, N, K, BM, KC, TMA)
    wd2 = wd
    if TWO:
        wd2 = _weights_desc(w2_ptr, N, K, BM, KC, TMA)
    bb = tl.arange(0, BP)
    pa = 0
    p2a = 0
    pb = 0
    p2b = 0
    if PRE >= 1:
        rb, ks, rows, rows_ok = _tile_rows(t0, R, SK, N, BM)
        rows_ok = rows_ok & (t0 + tl.zeros([BM], tl.int32) < t1)     # (no tile: nothing read)
        pa, p2a, pb, p2b = _pre_w(w_ptr, w2_ptr, rb * R, rows_ok, K, ks * KSPAN, BM, KC, RAW, TWO, PRE)
    c = 0
    if POOL > 0:
        c = claim(claims_ptr)       # the first pool tile: asked for now, read after the last own tile
    seen = target
    if WAIT:
        seen = wait_counter(cnt_ptr, target, SPIN)
    if POOL > 0:
        # the stage's last POOL tiles, claimed one at a time after this instruction's own (the
        # register tiles' pools, ``gemv.gemv_rows_tiles``): the stage ends with the mean worker
        tl.static_assert(PRE == 0, "a pooled weights-on-M stage takes no chunk before its wait")
        NTILES: tl.constexpr = (N + R - 1) // R * SK
        t = t0
        while t < NTILES:
            rb, ks, rows, rows_ok = _tile_rows(t, R, SK, N, BM)
            row_end = tl.minimum(rb * R + R, N)
            acc = tl.zeros([BM, BP], dtype=tl.float32)
            acc2 = tl.zeros([BM, BP], dtype=tl.float32)
            k_lo = ks * KSPAN
            acc, acc2 = _pipelined(acc, acc2, wd, wd2, in_ptr, ws_ptr, ws2_ptr, bb, rb * R, rows, rows_ok, k_lo,
                                   k_lo, B, K, KSPAN, KC, BM, STAGES, SB, TWO, FP8, SPLIT, EXACT, XBF16, XT, W8A8,
                                   RAW, TMA)
            _finish(acc, acc2, rb, ks, rows, rows_ok, row_end, bb, out_ptr, aux_ptr, xss_ptr, eps, nw2_ptr, xs_ptr,
                    kpart_ptr, tick_ptr, B, N, K, SK, NT, TWO, NORM, EPI, XOUT)
            t, c = next_tile(t, t1, c, claims_ptr, claims_base, NTILES, POOL)
    else:
        for t in range(t0, t1):
            rb, ks, rows, rows_ok = _tile_rows(t, R, SK, N, BM)
            row_end = tl.minimum(rb * R + R, N)
            acc = tl.zeros([BM, BP], dtype=tl.float32)
            acc2 = tl.zeros([BM, BP], dtype=tl.float32)
            k_lo = ks * KSPAN
            if PRE >= 1:
                if t > t0:
                    pa, p2a, pb, p2b = _pre_w(w_ptr, w2_ptr, rb * R, rows_ok, K, k_lo, BM, KC, RAW, TWO, PRE)
                xa, xla = _load_x(in_ptr, bb, k_lo, k_lo, B, K, KSPAN, KC, SPLIT)
                xb, xlb = xa, xla
                if PRE >= 2:
                    xb, xlb = _load_x(in_ptr, bb, k_lo + KC, k_lo, B, K, KSPAN, KC, SPLIT)
            acc, acc2 = _pipelined(acc, acc2, wd, wd2, in_ptr, ws_ptr, ws2_ptr, bb, rb * R, rows, rows_ok,
                                   k_lo + PRE * KC, k_lo, B, K, KSPAN, KC, BM, STAGES, SB, TWO, FP8, SPLIT, EXACT,
                                   XBF16, XT, W8A8, RAW, TMA)
            if PRE >= 1:
                acc, acc2 = _chunk(acc, acc2, pa, p2a, xa, xla, ws_ptr, ws2_ptr, rows, rows_ok, k_lo,
                                   K, SB, TWO, FP8, SPLIT, EXACT, XBF16, XT, W8A8)
                if PRE >= 2:
                    acc, acc2 = _chunk(acc, acc2, pb, p2b, xb, xlb, ws_ptr, ws2_ptr, rows, rows_ok, k_lo + KC,
                                       K, SB, TWO, FP8, SPLIT, EXACT, XBF16, XT, W8A8)
            _finish(acc, acc2, rb, ks, rows, rows_ok, row_end, bb, out_ptr, aux_ptr, xss_ptr, eps, nw2_ptr, xs_ptr,
                    kpart_ptr, tick_ptr, B, N, K, SK, NT, TWO, NORM, EPI, XOUT)
    return seen


# The same tile called as a function (the plan's SWAP_CALL, ``BT_CALL``): the persistent kernel then
# allocates its registers apart from the other tiles' (compiled for sm_90 under Triton 3.6, 0.6b's
# megakernel at batch 16 has 14 spill loads and stores instead of 70).
swap_tiles_called = triton.jit(swap_tiles.fn, noinline=True)


@triton.jit
def write_xs_seq(v, cols, b, blk, nw_ptr, xs_ptr, xss_ptr, B: tl.constexpr, H: tl.constexpr):
    """``write_xs`` for one sequence b: its x values ``v`` [SS_ROWS] at columns ``cols`` (block
    ``blk``)."""
    bb = b + tl.zeros([1], tl.int32)
    write_xs(v[:, None], cols, (cols < H)[:, None] & (bb < B)[None, :], bb, nw_ptr, xs_ptr, xss_ptr, blk, B, H)


@triton.jit
def embed_xs(b, embed_ptr, tok, nw_ptr, xs_ptr, xss_ptr, B: tl.constexpr, H: tl.constexpr):
    """EMBED's part for the weights-on-M tiles: sequence b's x (its token's embedding row) into
    ``xs`` and ``xss`` (``write_xs``) with the first layer's input norm weight ``nw``."""
    for c0 in range(0, H, SS_ROWS):
        cols = c0 + tl.arange(0, SS_ROWS)
        v = tl.load(embed_ptr + tok * H + cols, mask=cols < H, other=0.0).to(tl.float32)
        write_xs_seq(v, cols, b, c0 // SS_ROWS, nw_ptr, xs_ptr, xss_ptr, B, H)


def kpart_elems(plan) -> int:
    """Float32 words of ``kpart``: the largest split stage's SK partial rows of B."""
    need = 1
    for nt, sk in ((plan.QKV_ROWS, plan.SK_QKV), (plan.H, plan.SK_O), (2 * plan.I, plan.SK_GU), (plan.H, plan.SK_DOWN)):
        if sk > 1:
            need = max(need, sk * plan.B * nt)
    return need

"""The batch-on-M GEMV tile (``tiles.gemv_tile`` with BT_SPLIT or BT_BF16; mma.sync): above batch
one an instruction reads its weights once for all B sequences. Its tiles' rows and their K-chunks
are walked as one flat loop, so Triton's software pipeliner keeps chunks of weights and inputs in
flight through shared memory (cp.async; activations stay .cg) across the instruction's tile
boundaries, as many as fit SMEM_BYTES, at most MAX_AHEAD. The product runs on tensor cores (tl.dot;
the batch padded to 16 rows and a tile's rows to a power of two under masks, the M/N minimum of
older Triton). The plan (scheduler/ops.py) gives each worker about one tile of many rows, so each
worker reads the batch's input rows about once per stage; that L2 traffic, not the weights, is what
grows with the batch. A chunk holds about BW_ELEMS weights per matrix and at most BX_ELEMS inputs.
"""

import triton
import triton.language as tl

from .common import ARGMAX, GATEUP, RELAXED, RESIDUAL, argmax_key, round_bf16, sum_pairs, wait_counter
from .fp8 import e4m3_bf16

SMEM_BYTES: tl.constexpr = tl.constexpr(65536)
MAX_AHEAD: tl.constexpr = tl.constexpr(4)
BW_ELEMS: tl.constexpr = tl.constexpr(8192)
BX_ELEMS: tl.constexpr = tl.constexpr(2048)


@triton.jit
def load_wbs(w_ptr, row0, row_end, K: tl.constexpr, k0, R: tl.constexpr, R_PAD: tl.constexpr, S: tl.constexpr,
             KS: tl.constexpr):
    """Weight block rows [row0, min(row0+R, row_end)) x columns [k0, k0+S*KS) as [S, R_PAD, KS]
    (column k0 + s*KS + kk; rows from R up are not read, and zero: padding for tl.dot). FP8 weights
    come as [S, R_PAD, KS / 4] int32 words of four e4m3 bytes each (``e4m3_bf16``)."""
    r = tl.arange(0, R_PAD)[None, :, None]
    if w_ptr.dtype.element_ty == tl.float8e4nv:
        tl.static_assert(K % 4 == 0, "FP8 rows are read as 4-byte words: K must be a multiple of 4")
        KW: tl.constexpr = K // 4
        i = k0 // 4 + tl.arange(0, S)[:, None, None] * (KS // 4) + tl.arange(0, KS // 4)[None, None, :]
        w = tl.load(w_ptr.to(tl.pointer_type(tl.int32)) + (row0 + r) * KW + i,
                    mask=(r < R) & (row0 + r < row_end) & (i < KW), other=0, eviction_policy="evict_first")
    else:
        k = k0 + tl.arange(0, S)[:, None, None] * KS + tl.arange(0, KS)[None, None, :]
        w = tl.load(w_ptr + (row0 + r) * K + k, mask=(r < R) & (row0 + r < row_end) & (k < K), other=0.0,
                    eviction_policy="evict_first")
    return w


@triton.jit
def load_sbs(w_ptr, ws_ptr, row0, row_end, K: tl.constexpr, k0, R: tl.constexpr, R_PAD: tl.constexpr,
             S: tl.constexpr, KS: tl.constexpr, SB: tl.constexpr):
    """The FP8 scales of ``load_wbs``' block as [S, R_PAD]: slice s (columns k0 + s*KS, KS <= 128,
    so within one 128-column block) of row r has ws[(row0 + r) // SB, (k0 + s*KS) // 128]. A
    float32 1 for 16-bit weights, which nothing reads."""
    if w_ptr.dtype.element_ty == tl.float8e4nv:
        KB: tl.constexpr = (K + 127) // 128
        r = tl.arange(0, R_PAD)[None, :]
        j = (k0 + tl.arange(0, S)[:, None] * KS) // 128
        s = tl.load(ws_ptr + ((row0 + r) // SB) * KB + j, mask=(r < R) & (row0 + r < row_end) & (j < KB), other=0.0)
    else:
        s = tl.full([], 1.0, tl.float32)
    return s


@triton.jit
def sum_squares(acc, x3, IEEE: tl.constexpr):
    """acc + (x3 * x3) @ ones for a float32 [S, M, KS] block and a [S, M, 16] accumulator: every
    column of acc gains each row's sum of squares over KS. A matrix product, not a tl.sum: a
    tl.sum adds in the order of the register layout the compiler picks for x3, and that layout
    differs between the persistent kernel and a per-op kernel, so one tile's rows would be
    normalised by a 1/rms one float32 rounding apart; a dot adds in an order fixed by its shape.
    The square goes in as three bf16 terms that sum to it exactly (bf16 has float32's exponent),
    or as float32 with IEEE (float32 weights: the interpreter has no bf16 arithmetic)."""
    ones = tl.full([x3.shape[0], x3.shape[2], 16], 1.0, tl.float32)
    q = x3 * x3
    if IEEE:
        acc = tl.dot(q, ones, acc, input_precision="ieee")
    else:
        q1 = q.to(tl.bfloat16)
        r = q - q1.to(tl.float32)
        q2 = r.to(tl.bfloat16)
        q3 = (r - q2.to(tl.float32)).to(tl.bfloat16)
        ones = ones.to(tl.bfloat16)
        acc = tl.dot(q3, ones, acc)     # the small terms first
        acc = tl.dot(q2, ones, acc)
        acc = tl.dot(q1, ones, acc)
    return acc


@triton.jit
def sum_slices(a):
    """sum over axis 0 of a [S, M, N] block (S 1, 2 or 4) as [M, N], by halves: each step adds two
    slices, one addition per element, so the result is the same in any register layout (a tl.sum
    over 4 would add in the layout's order)."""
    for _ in tl.static_range(2):
        if a.shape[0] > 1:
            a = tl.sum(tl.reshape(a, [2, a.shape[0] // 2, a.shape[1], a.shape[2]]), axis=0)
    return tl.reshape(a, [a.shape[1], a.shape[2]])


@triton.jit
def load_xbs(x_ptr, nw_ptr, K: tl.constexpr, k0, NORM: tl.constexpr, B: tl.constexpr, B_PAD: tl.constexpr,
             S: tl.constexpr, KS: tl.constexpr, IEEE: tl.constexpr, XBF16: tl.constexpr, ss):
    """(columns [k0, k0+S*KS) of B float32 rows of K, read through L2 and times the norm weight
    when NORM, as [S, B_PAD, KS]; the accumulator ``ss`` plus, with NORM, their sums of squares
    over KS before the norm weight: [S, B_PAD, 16], every column the sum (``sum_squares``), or with
    XBF16 [S, B_PAD, 1] (``sum_pairs``))."""
    b = tl.arange(0, B_PAD)[None, :, None]
    k = k0 + tl.arange(0, S)[:, None, None] * KS + tl.arange(0, KS)[None, None, :]
    x = tl.load(x_ptr + b * K + k, mask=(b < B) & (k < K), other=0.0, cache_modifier=".cg").to(tl.float32)
    if NORM:
        if XBF16:
            # the first level of sum_pairs' tree by hand: a fused multiply-add in one stated order,
            # where the compiler could otherwise contract either product into the addition
            a, b = tl.split(tl.reshape(x, [S, B_PAD, KS // 2, 2]))
            ss += sum_pairs(tl.fma(a, a, b * b))
        else:
            ss = sum_squares(ss, x, IEEE)
        x = x * tl.load(nw_ptr + k, mask=k < K, other=0.0).to(tl.float32)
    return x, ss


@triton.jit
def mac_dot_fp8(acc3, x3, w3, s3, EXACT: tl.constexpr, XBF16: tl.constexpr):
    """``mac_dot`` of FP8 weights: acc3[s] += (x3[s] @ w3[s]^T) * scale[s] (per output row; a
    slice lies in one 128-column block). ``w3``: ``load_wbs``' words; e4m3 converts to bf16
    exactly (``e4m3_bf16``), so the MMAs see the stored weights and the scale is applied in
    float32 to each slice's partial sum; with 16-bit activations x is split into a bf16 head and
    remainder as in ``mac_dot``, or with XBF16 rounded to bf16. EXACT (a float32 model, the CPU's):
    the product in full float32 instead (of x rounded to bf16 with XBF16, the same rounding)."""
    wt = tl.permute(e4m3_bf16(w3, EXACT), (0, 2, 1))
    if EXACT:
        if XBF16:
            x3 = round_bf16(x3)
        part = tl.dot(x3, wt, input_precision="ieee")
    else:
        xh = x3.to(tl.bfloat16)
        part = tl.dot(xh, wt)
        if not XBF16:
            xl = (x3 - xh.to(tl.float32)).to(tl.bfloat16)
            part = tl.dot(xl, wt, part)
    return acc3 + part * s3[:, None, :]


@triton.jit
def mac_dot(acc3, x3, w3, XBF16: tl.constexpr):
    """acc3[s] += x3[s] @ w3[s]^T for each K-slice s, on tensor cores, accumulated in float32. Where
    the block is small the slices are a batched dot, so each warp multiplies its own slice of K (a
    single [16, 16] product would leave 4 warps computing copies of the same MMA tiles); the caller
    sums over s once per tile. bf16 weights stay bf16 (half the registers of a TF32 operand) and
    the float32 input is split into a bf16 head and a bf16 remainder, two MMAs: the product keeps
    16 of x's 24 bits, so a batch decodes as its sequences would alone to about 1e-5 (the MMAs are
    free: the tile waits on memory). With XBF16 the input is rounded to one bf16 operand instead
    (one MMA, half the input's registers; as transformers multiplies bf16 weights). Other 16-bit
    weights use TF32; float32 weights (the CPU) full float32, of x rounded to bf16 with XBF16 (so
    the CPU's tests see that rounding)."""
    wt = tl.permute(w3, (0, 2, 1))
    if w3.dtype == tl.float32:
        if XBF16:
            x3 = round_bf16(x3)
        acc3 = tl.dot(x3, wt, acc3, input_precision="ieee")
    elif w3.dtype == tl.bfloat16:
        xh = x3.to(tl.bfloat16)
        acc3 = tl.dot(xh, wt, acc3)
        if not XBF16:
            xl = (x3 - xh.to(tl.float32)).to(tl.bfloat16)
            acc3 = tl.dot(xl, wt, acc3)
    else:
        acc3 = tl.dot(x3, wt.to(tl.float32), acc3, input_precision="tf32")
    return acc3


@triton.jit
def batch_mask(acc, row0, row_end, B: tl.constexpr, R: tl.constexpr):
    """(rows [R_PAD], mask [B_PAD, R_PAD]) of a [B_PAD, R_PAD] block of a tile of R rows."""
    bb = tl.arange(0, acc.shape[0])
    rr = tl.arange(0, acc.shape[1])
    rows = row0 + rr
    return rows, (bb[:, None] < B) & ((rr < R) & (rows < row_end))[None, :]


@triton.jit
def _batch_epilogue(acc3, acc3_2, ss2, row0, row_end, out_ptr, aux_ptr, eps, B: tl.constexpr, N: tl.constexpr,
                    K: tl.constexpr, R: tl.constexpr, NORM: tl.constexpr, EPI: tl.constexpr):
    """A ``batch_tiles`` tile's outputs from its K-sliced accumulators (``mac_dot``)."""
    acc = sum_slices(acc3)
    if NORM:
        # each input row's 1/rms, [B_PAD, 1]: ss2's columns are equal, so their max is any one
        rstd = 1.0 / tl.sqrt(tl.max(sum_slices(ss2), axis=1, keep_dims=True) / K + eps)
        acc = acc * rstd
    rows, ok = batch_mask(acc, row0, row_end, B, R)
    bb = tl.arange(0, acc.shape[0])
    offs = bb[:, None] * N + rows[None, :]
    if EPI == GATEUP:
        up = sum_slices(acc3_2)
        if NORM:
            up = up * rstd
        acc = acc / (1.0 + tl.exp(-acc)) * up
    if EPI == RESIDUAL:
        acc += tl.load(out_ptr + offs, mask=ok, other=0.0, cache_modifier=".cg")
    tl.store(out_ptr + offs, acc, mask=ok)
    if EPI == ARGMAX:
        acc = tl.where(ok, acc, float("-inf"))
        best = tl.max(acc, axis=1)
        idx = tl.min(tl.where(acc == best[:, None], rows[None, :], 2147483647), axis=1)   # first maximum
        tl.atomic_max(aux_ptr + bb, argmax_key(best, idx), mask=bb < B, sem=RELAXED, scope="gpu")


@triton.jit
def batch_tiles(t0, t1, w_ptr, w2_ptr, ws_ptr, ws2_ptr, in_ptr, nw_ptr, eps, out_ptr, aux_ptr, cnt_ptr, target,
                B: tl.constexpr, N: tl.constexpr, K: tl.constexpr, R: tl.constexpr, SB: tl.constexpr,
                NORM: tl.constexpr, TWO: tl.constexpr, EPI: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr,
                XBF16: tl.constexpr):
    """Tiles [t0, t1) of R rows of out[B, N] = X[B, K] @ W[N, K]^T (each input row RMS-normalised
    with its own statistics and the norm weight when NORM), weights read once for all B rows, then
    the epilogue EPI (STORE, RESIDUAL, ARGMAX, or GATEUP with W2 the up rows beside W's gate rows).
    FP8 weights come with their scales ``ws`` (``ws2``: W2's), SB rows a scale row. XBF16: the
    input goes into the MMAs as one bf16 operand, not split in two (``mac_dot``).
    After the wait on the input, one flat pipelined loop over (tile, K-chunk), so the pipeline
    does not drain between tiles. (Asking for the first chunk before the wait, as the batch-1 tiles
    do, did not pay here: more spills; docs/performance.md.) Returns the wait's last counter value."""
    # (the plan refuses batches above 128 and cuts tiles at 128 rows: ops.MAX_BATCH, BATCH_MAX_ROWS)
    B_PAD: tl.constexpr = 16 if B <= 16 else 32 if B <= 32 else 64 if B <= 64 else 128
    R_PAD: tl.constexpr = 16 if R <= 16 else 32 if R <= 32 else 64 if R <= 64 else 128
    KP: tl.constexpr = 16 if K <= 16 else 32 if K <= 32 else 64 if K <= 64 else 128 if K <= 128 else \
        256 if K <= 256 else 512 if K <= 512 else 1024 if K <= 1024 else 2048 if K <= 2048 else 4096
    KC0: tl.constexpr = BW_ELEMS // R_PAD
    KC1: tl.constexpr = KC0 if KC0 * B_PAD <= BX_ELEMS else BX_ELEMS // B_PAD
    KC2: tl.constexpr = 16 if KC1 < 16 else KC1
    KC: tl.constexpr = KP if KC2 > KP else KC2
    NKC: tl.constexpr = (K + KC - 1) // KC
    # K-slices, one per warp, where the block has few MMA tiles; at least 16 columns each
    S0: tl.constexpr = 4 if B_PAD * R_PAD <= 256 else 2 if B_PAD * R_PAD <= 1024 else 1
    S: tl.constexpr = S0 if KC // S0 >= 16 else 1
    KS: tl.constexpr = KC // S
    FP8: tl.constexpr = w_ptr.dtype.element_ty == tl.float8e4nv
    # a float32 model (the CPU's) multiplies FP8 weights in float32; the norm weight is in the
    # model's dtype (O and down pass their input there, also in the model's dtype)
    EXACT: tl.constexpr = nw_ptr.dtype.element_ty == tl.float32
    IEEE: tl.constexpr = EXACT     # sums of squares as float32 products (the interpreter's bf16 dot is not exact)
    if FP8:
        tl.static_assert(KS <= 128, "an FP8 K-slice must lie in one 128-column scale block")
    # a stage's bytes: the weight chunk(s) at the weights' own width (float32 ones take twice a
    # 16-bit chunk's shared memory, FP8 ones half) and the float32 input chunk
    WBYTES: tl.constexpr = w_ptr.dtype.element_ty.primitive_bitwidth // 8
    CHUNK_BYTES: tl.constexpr = (2 if TWO else 1) * R_PAD * KC * WBYTES + B_PAD * KC * 4
    # float32 weights (the float32 test models) get half the budget: each batched kind's pipeline
    # takes its own shared memory, and at full budget they outgrow an SM
    AHEAD: tl.constexpr = (SMEM_BYTES // 2 if WBYTES > 2 else SMEM_BYTES) // CHUNK_BYTES
    STAGES: tl.constexpr = 2 if AHEAD < 1 else 1 + (MAX_AHEAD if AHEAD > MAX_AHEAD else AHEAD)
    row_end = tl.minimum(t1 * R, N)
    seen = target
    if WAIT:
        seen = wait_counter(cnt_ptr, target, SPIN)
    acc3 = tl.zeros([S, B_PAD, R_PAD], dtype=tl.float32)
    acc3_2 = tl.zeros([S, B_PAD, R_PAD], dtype=tl.float32)
    SSW: tl.constexpr = 1 if XBF16 else 16     # sums of squares (NORM): 16 equal columns of a dot, or a tree's one
    ss2 = tl.zeros([S, B_PAD, SSW], dtype=tl.float32)
    for it in tl.range(0, (t1 - t0) * NKC, num_stages=STAGES):
        q = it // NKC
        t = t0 + q
        k0 = (it - q * NKC) * KC     # (no int % constexpr in Triton's interpreter)
        w = load_wbs(w_ptr, t * R, row_end, K, k0, R, R_PAD, S, KS)
        if TWO:
            w2 = load_wbs(w2_ptr, t * R, row_end, K, k0, R, R_PAD, S, KS)
        x, ss2 = load_xbs(in_ptr, nw_ptr, K, k0, NORM, B, B_PAD, S, KS, IEEE, XBF16, ss2)
        if FP8:
            sw = load_sbs(w_ptr, ws_ptr, t * R, row_end, K, k0, R, R_PAD, S, KS, SB)
            acc3 = mac_dot_fp8(acc3, x, w, sw, EXACT, XBF16)
            if TWO:
                sw2 = load_sbs(w2_ptr, ws2_ptr, t * R, row_end, K, k0, R, R_PAD, S, KS, SB)
                acc3_2 = mac_dot_fp8(acc3_2, x, w2, sw2, EXACT, XBF16)
        else:
            acc3 = mac_dot(acc3, x, w, XBF16)
            if TWO:
                acc3_2 = mac_dot(acc3_2, x, w2, XBF16)
        if k0 + KC >= K:     # the tile's last chunk: its epilogue, then a fresh accumulator
            _batch_epilogue(acc3, acc3_2, ss2, t * R, row_end, out_ptr, aux_ptr, eps, B, N, K, R, NORM, EPI)
            acc3 = tl.zeros([S, B_PAD, R_PAD], dtype=tl.float32)
            acc3_2 = tl.zeros([S, B_PAD, R_PAD], dtype=tl.float32)
            ss2 = tl.zeros([S, B_PAD, SSW], dtype=tl.float32)
    return seen


@triton.jit
def gemv_batch(t0, t1, w_ptr, ws_ptr, in_ptr, nw_ptr, eps, out_ptr, aux_ptr, cnt_ptr, target,
               B: tl.constexpr, N: tl.constexpr, K: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
               SB: tl.constexpr, NORM: tl.constexpr, EPI: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr,
               XBF16: tl.constexpr):
    """``gemv_tile`` for batched plans (``batch_tiles``)."""
    return batch_tiles(t0, t1, w_ptr, w_ptr, ws_ptr, ws_ptr, in_ptr, nw_ptr, eps, out_ptr, aux_ptr, cnt_ptr, target,
                       B, N, K, R, SB, NORM, False, EPI, WAIT, SPIN, XBF16)

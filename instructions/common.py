"""What every instruction kind and tile family shares: the memory orders and the bounded counter
wait, the trace stamps, the epilogue kinds and the packed argmax key, the pool claims, the GEMV tile
kinds (``BT_*``, dispatched by ``instructions.tiles``), and two order-fixed float32 helpers both
batched tiles use (``sum_pairs``, ``round_bf16``). The tile families live in ``gemv`` (register
tiles), ``batch_mma`` (batch on M), ``wgmma`` (weights on M) and ``fp8`` (e4m3 arithmetic).
"""

import importlib.util
import os

import triton
import triton.language as tl

# Memory ordering (docs/design.md, "Memory ordering"): a consumer's poll is a scalar
# ``atomic_add(ptr, 0, sem="acquire")``, which Triton lowers to one ``ld.acquire.gpu`` on one
# thread and broadcasts through shared memory with a CTA barrier; loads of activations written by
# other programs in the same launch then use ``cache_modifier=".cg"`` (L2, never a stale L1 line).
#
# triton-ascend (it replaces Triton's package) supports only acq_rel atomics on the NPU; elsewhere
# the weaker, cheaper orders are used: a consumer's poll acquires, a producer's signal releases.
ASCEND = importlib.util.find_spec("triton.backends.ascend") is not None
ACQUIRE: tl.constexpr = tl.constexpr("acq_rel" if ASCEND else "acquire")
RELEASE: tl.constexpr = tl.constexpr("acq_rel" if ASCEND else "release")
RELAXED: tl.constexpr = tl.constexpr("acq_rel" if ASCEND else "relaxed")

# An experiment, read at import: MEGAKERNEL_WEIGHTS_CG=1 loads weights (and the cached KV blocks
# read before a wait) through L2 only, so no L1 fill is in flight when the poll's acquire
# invalidates L1. Off by default: not shown to pay at every size (see docs/performance.md).
W_CACHE: tl.constexpr = tl.constexpr(".cg" if os.environ.get("MEGAKERNEL_WEIGHTS_CG") == "1" else "")
W_EVICT: tl.constexpr = tl.constexpr("" if W_CACHE.value else "evict_first")    # an L1 policy: not with .cg


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


# Trace slots per instruction (``megakernel.kernel``, TRACE): the kernel stamps START and END
# around the instruction (END after its release); the tiles stamp their phases in between. TRACE 1
# stamps every GEMV tile's math (T_COMPUTED, T_FIRST: a CTA-wide reduction each, half a 14b step's
# time); TRACE 2, the light trace, only what happens once an instruction (start, wait, input, end).
TRACE_SLOTS: tl.constexpr = tl.constexpr(7)
T_WAITED: tl.constexpr = tl.constexpr(2)     # the wait returned
T_INPUT: tl.constexpr = tl.constexpr(3)      # the input (activations) arrived
T_COMPUTED: tl.constexpr = tl.constexpr(4)   # the last tile's result computed, before its stores
T_FIRST: tl.constexpr = tl.constexpr(5)      # the first tile's result computed (attention: ticket taken)
T_SM: tl.constexpr = tl.constexpr(6)         # not a time: the SM the worker runs on (``sm_id``)


@triton.jit
def warp_uniform(x, ON: tl.constexpr):
    """The int32 scalar x (the same in every thread) with ON made warp-uniform for ptxas: redux.sync's
    result lands in a uniform register, so what is derived from x (a tile's loop bounds, its pipeline
    slots, the wgmma descriptors) stays in the uniform datapath. A value loaded from memory never
    does: ptxas cannot prove it the same across the warp. Every thread of the warp must reach it."""
    if ON:
        return tl.inline_asm_elementwise("redux.sync.min.s32 $0, $1, 0xffffffff;", "=r,r", [x], dtype=tl.int32,
                                         is_pure=True, pack=1)
    else:
        return x


@triton.jit
def sm_id():
    """The SM this program runs on (``%smid``; NVIDIA only, for the trace)."""
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def stamp(tr, slot: tl.constexpr, dep, TRACE: tl.constexpr):
    """With TRACE, store the global timer into ``tr[slot]`` once the scalar ``dep`` is available:
    the timer read is predicated on a test of dep, so neither the compiler nor the warp can take it
    before dep's producer (a load, a reduction) has completed."""
    if TRACE:
        if dep.dtype == tl.float32:
            d = dep.to(tl.int32, bitcast=True)
        else:
            d = dep.to(tl.int32)
        t = tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $1, 0; @p mov.u64 $0, %globaltimer; @!p mov.u64 $0, %globaltimer; }",
            "=l,r", [d], dtype=tl.int64, is_pure=False, pack=1)
        tl.store(tr + slot, t)


STORE: tl.constexpr = tl.constexpr(0)      # out[b, rows] = acc
RESIDUAL: tl.constexpr = tl.constexpr(1)   # out[b, rows] += acc
ARGMAX: tl.constexpr = tl.constexpr(2)     # out[b, rows] = acc; aux[b] = max(aux[b], the tile's argmax_key)
GATEUP: tl.constexpr = tl.constexpr(3)     # out[b, rows] = silu(acc) * acc2 (gate and up)

# The argmax of the LM head's logits as one int64 per sequence that every tile raises with an
# atomic max: the value's bits, ordered as integers, above the index counted down from 2^32 - 1,
# so the largest key is the largest value's first index (torch.argmax; -0.0 ties with 0.0, NaN is
# above everything, as there). ARGMAX reads it back and resets it to KEY_EMPTY, below every key.
KEY_EMPTY: tl.constexpr = tl.constexpr(-(1 << 63))


@triton.jit
def argmax_key(v, idx):
    v = tl.where(v == 0.0, 0.0, v)
    bits = v.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (4294967295 - idx.to(tl.int64))


def argmax_key_ref(v, idx):
    """``argmax_key`` in torch (float32 values, integer indices, any shape)."""
    import torch
    v = torch.where(v == 0, torch.zeros_like(v), v)
    bits = v.contiguous().view(torch.int32).long()
    ordered = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return ordered * (1 << 32) + (4294967295 - idx.long())


# Lanes of a pool claim: one element per thread at 8 warps (two at 4), none replicated, so the
# atomic's reply stays in the register of the lane that asked and nothing waits for it until
# ``claimed`` reduces it (a scalar or replicated atomic is broadcast through shared memory behind a
# CTA barrier, which would wait for the reply at once).
CLAIM_LANES: tl.constexpr = tl.constexpr(256)


@triton.jit
def claim(claims_ptr):
    """Ask for the next tile of a pool (``scheduler/ops.py``): one lane adds 1 to ``*claims_ptr``."""
    lane = tl.arange(0, CLAIM_LANES)
    return tl.atomic_add(claims_ptr + lane * 0, 1, mask=lane == 0, sem=RELAXED, scope="gpu")


@triton.jit
def claimed(c, base, NT: tl.constexpr, POOL: tl.constexpr):
    """The tile ``claim`` got: the pool's (its last POOL of NT tiles) claim - base'th, or NT once
    the pool has run out. ``base``: the claims of the steps before this one."""
    lane = tl.arange(0, CLAIM_LANES)
    k = tl.sum(tl.where(lane == 0, c, 0), axis=0).to(tl.int32) - base
    return tl.where(k < POOL, NT - POOL + k, NT)


@triton.jit
def next_tile(t, t1, c, claims_ptr, claims_base, NT: tl.constexpr, POOL: tl.constexpr):
    """(the tile after t in a pooled loop, the pending claim): t + 1 within the instruction's own
    tiles [.., t1), then the pool tile ``claim`` got, whose successor is asked for at once; NT once
    the pool has run out."""
    nt = t + 1
    if nt >= t1:
        nt = claimed(c, claims_base, NT, POOL)
        if nt < NT:
            c = claim(claims_ptr)
    return nt, c


# The GEMV tiles' kind (``tiles.gemv_tile``'s BT, the plan's ``Plan.BT``): 0 the register tiles
# (``instructions.gemv``), BT_SPLIT or BT_BF16 the batch-on-M tile (``instructions.batch_mma``) with
# its input split or in bf16, and BT_SWAP, BT_SWAP_BF16 or BT_SWAP_FP8 the weights-on-M tile
# (``instructions.wgmma``; its input contract is BT - BT_SWAP, the plan's BATCH_INPUT), plus BT_TMA
# where that tile takes its weights by tensor descriptor (the plan's SWAP_TMA), BT_N16 where it
# pads the batch to 16 (SWAP_MIN_N), BT_CALL where it is called rather than inlined (SWAP_CALL), BT_PRE
# times the chunks it takes into registers before its wait (SWAP_PRE), BT_SMEM times the 16 KB its
# pipeline takes above 80 (SWAP_SMEM); 32
# marks a kernel compiled with every dot on mma.sync (the plan's MMA_V3 0): no tile reads it, it
# keeps that compiled code apart from wgmma's in Triton's cache.
BT_SPLIT: tl.constexpr = tl.constexpr(1)
BT_BF16: tl.constexpr = tl.constexpr(2)
BT_SWAP: tl.constexpr = tl.constexpr(3)
BT_SWAP_BF16: tl.constexpr = tl.constexpr(4)
BT_SWAP_FP8: tl.constexpr = tl.constexpr(5)
BT_TMA: tl.constexpr = tl.constexpr(8)
BT_N16: tl.constexpr = tl.constexpr(16)
BT_CALL: tl.constexpr = tl.constexpr(64)
BT_PRE: tl.constexpr = tl.constexpr(128)     # times the chunks the weights-on-M tile takes before its wait (SWAP_PRE)
BT_SMEM: tl.constexpr = tl.constexpr(512)    # times the 16 KB of pipeline the weights-on-M tile takes above 80 (SWAP_SMEM)


@triton.jit
def sum_pairs(q):
    """The sums over the last axis of a [S, M, KS] block (KS a power of two) as [S, M, 1], as a tree:
    columns 2i and 2i + 1 are added, then those sums in pairs, and so on. Each step is one addition
    of two numbers, so the result does not depend on the register layout, as
    ``batch_mma.sum_squares``' dot does not, for far fewer operations; a tl.sum over KS would add in
    the layout's order."""
    for _ in tl.static_range(12):
        if q.shape[2] > 1:
            a, b = tl.split(tl.reshape(q, [q.shape[0], q.shape[1], q.shape[2] // 2, 2]))
            q = a + b
    return q


@triton.jit
def round_bf16(x):
    """float32 x rounded to the nearest bf16 (ties to even, as the GPU's conversion), as float32, by
    integer ops: Triton's interpreter truncates in ``.to(tl.bfloat16)``. For finite x."""
    b = x.to(tl.int32, bitcast=True)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & -65536
    return b.to(tl.float32, bitcast=True)

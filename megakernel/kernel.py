"""The persistent megakernel: one program per worker walks its list of the tape.

Each program loads one instruction (eight int32 words, see ``scheduler/ops.py``), dispatches on
the opcode to the instruction kind's tile function (which loads its first weights, then waits on
its input counter, then computes), and after the tile's last store releases: ``tl.debug_barrier()``
so every thread's stores are issued, then one ``atomic_add(sem="release")`` on the signal counter.

Waits are bounded (``SPIN`` polls). A worker whose wait times out records (tape position, counter,
expected, seen) in its row of ``err``, raises ``err[0]`` and stops without signalling; whatever
depends on it times out in turn, so a broken tape ends the launch in an error rather than a hung
GPU, and the host names the root cause (``backends.PersistentBackend.raise_error``).

Counter targets grow with the step (``wait_per_step * (epoch + 1)``); each program keeps its own
epoch in ``epoch[pid]``, so no counter is reset between steps.

One launch runs ``steps`` decode steps (megakernel mode): the tape once per step, the token of
step s going from ARGMAX to the next step's EMBED on the device. Every program starts step s > 0
by waiting for step s - 1's ARGMAX (counter ``argmax_c``, ``argmax_n`` signals a step), the boundary
a kernel launch gives one step per launch: every read and write of a step then follows every one
of the step before. ``lengths`` stay those of the launch's first step until the last step's ARGMAX
adds ``steps``; attention takes step s's position as ``lengths[b] + s``; ARGMAX writes step s's
token to ``hist[s * B + b]`` as well as ``tokens[b]``. A plan with SAMPLE (sampling on the device)
has three sampling stages before ARGMAX, the last of which replaces a sampled sequence's argmax by
its drawn token (``instructions/sample.py``); their branches are compiled only into such plans'
binaries.

With SM_PAIRS (the tape's ``sm_mates``: it assumes tape rows w and w + workers / 2 share an SM),
each program first takes the tape row that makes that true whatever the driver's placement
(``_paired_row``): the two programs on an SM take rows r and r + SM_PAIRS. The error table and the
epochs stay indexed by program id; ``pairs[1 + 2 * MAX_SMS + pid]`` records the row taken.

A pooled stage's instructions (``scheduler/ops.py``) claim its pool's tiles from their claims
counter after their own; the claims of step s are those past ``pool_claims * epoch``.
"""

import triton
import triton.language as tl

from instructions.common import BT_SWAP, RELAXED, RELEASE, T_SM, TRACE_SLOTS, sm_id, wait_counter, warp_uniform
from instructions.attention import attn_tile_called     # the plan's ATTN_CALL
from instructions.registry import DEVICE_KINDS
from instructions.matvec import next_norm
from instructions.tiles import TICK_DOWN, TICK_O, TICK_STRIDE
from scheduler.ops import POOL_SHIFT as TAPE_POOL_SHIFT, WORDS as TAPE_WORDS, Op

from .buffers import MAX_SMS as BUF_MAX_SMS

# The dispatch chain in ``megakernel`` names each kind's opcode and tile function (Triton needs
# them as globals); both come from the registry, and tests/test_registry.py checks that the chain
# covers exactly its kinds.
embed_tile = DEVICE_KINDS[Op.EMBED].tile
qkv_tile = DEVICE_KINDS[Op.QKV].tile
attn_tile = DEVICE_KINDS[Op.ATTN].tile
oproj_tile = DEVICE_KINDS[Op.OPROJ].tile
gateup_tile = DEVICE_KINDS[Op.GATEUP].tile
down_tile = DEVICE_KINDS[Op.DOWN].tile
lmhead_tile = DEVICE_KINDS[Op.LMHEAD].tile
argmax_tile = DEVICE_KINDS[Op.ARGMAX].tile
sample_tile = DEVICE_KINDS[Op.SAMPLE].tile
sstats_tile = DEVICE_KINDS[Op.SSTATS].tile
spick_tile = DEVICE_KINDS[Op.SPICK].tile
opart_tile = DEVICE_KINDS[Op.OPART].tile
dpart_tile = DEVICE_KINDS[Op.DPART].tile
reduce_tile = DEVICE_KINDS[Op.REDUCE].tile
OP_EMBED: tl.constexpr = tl.constexpr(int(Op.EMBED))
OP_QKV: tl.constexpr = tl.constexpr(int(Op.QKV))
OP_ATTN: tl.constexpr = tl.constexpr(int(Op.ATTN))
OP_OPROJ: tl.constexpr = tl.constexpr(int(Op.OPROJ))
OP_GATEUP: tl.constexpr = tl.constexpr(int(Op.GATEUP))
OP_DOWN: tl.constexpr = tl.constexpr(int(Op.DOWN))
OP_LMHEAD: tl.constexpr = tl.constexpr(int(Op.LMHEAD))
OP_ARGMAX: tl.constexpr = tl.constexpr(int(Op.ARGMAX))
OP_SAMPLE: tl.constexpr = tl.constexpr(int(Op.SAMPLE))
OP_SSTATS: tl.constexpr = tl.constexpr(int(Op.SSTATS))
OP_SPICK: tl.constexpr = tl.constexpr(int(Op.SPICK))
OP_OPART: tl.constexpr = tl.constexpr(int(Op.OPART))
OP_DPART: tl.constexpr = tl.constexpr(int(Op.DPART))
OP_REDUCE: tl.constexpr = tl.constexpr(int(Op.REDUCE))
OP_BARRIER: tl.constexpr = tl.constexpr(int(Op.BARRIER))
WORDS: tl.constexpr = tl.constexpr(TAPE_WORDS)
POOL_SHIFT: tl.constexpr = tl.constexpr(TAPE_POOL_SHIFT)
POOL_MASK: tl.constexpr = tl.constexpr((1 << TAPE_POOL_SHIFT) - 1)
MAX_SMS: tl.constexpr = tl.constexpr(BUF_MAX_SMS)     # SM ids (``%smid``) below this (``_paired_row``)
GEN: tl.constexpr = tl.constexpr(4096)         # a published rank: launch * GEN + rank


@triton.jit
def _timed_out(err_ptr, pid, pos1, counter, target, seen):
    """Record where program pid stopped (tape position + 1, -1 at a step boundary, -2 taking its tape
    row, ``_paired_row``) and on what wait, raise the error flag; returns the failure flag (1)."""
    tl.store(err_ptr + 1 + pid * 4, pos1)
    tl.store(err_ptr + 2 + pid * 4, counter)
    tl.store(err_ptr + 3 + pid * 4, target)
    tl.store(err_ptr + 4 + pid * 4, seen)
    tl.atomic_xchg(err_ptr, 1, sem=RELEASE, scope="gpu")
    return 1


@triton.jit
def _paired_row(pid, pairs_ptr, err_ptr, NSM: tl.constexpr, SPIN: tl.constexpr):
    """The tape row of program pid when the tape assumes rows r and r + NSM share an SM and exactly
    two programs run on each of NSM SMs: the first program of a launch on an SM takes the next rank
    r of the launch and row r, and publishes r for the second, which takes row r + NSM. Counts
    never reset between launches (each launch adds two per SM and NSM ranks), so a launch's own are
    its counts modulo 2 and NSM. pairs: [0] ranks taken, [1 + s] programs begun on SM s,
    [1 + MAX_SMS + s] SM s's rank as launch * GEN + rank, [1 + 2 * MAX_SMS + pid] the row taken.
    Returns (row, failed): a second program whose first never publishes stops like a timed-out
    wait (position -2, counter = its SM, target = the launch, seen = what it read)."""
    sm = sm_id()
    failed = 0
    row = pid
    if sm >= MAX_SMS:     # no room for its counts: stop rather than share another SM's
        failed = _timed_out(err_ptr, pid, -2, sm, MAX_SMS, -1)
    else:
        begun = tl.atomic_add(pairs_ptr + 1 + sm, 1, sem=RELAXED, scope="gpu")
        gen = begun // 2 + 1
        pub = pairs_ptr + 1 + MAX_SMS + sm
        if begun % 2 == 0:
            row = tl.atomic_add(pairs_ptr, 1, sem=RELAXED, scope="gpu") % NSM
            tl.atomic_xchg(pub, gen * GEN + row, sem=RELEASE, scope="gpu")
        else:
            # the published word only grows: the last launch's is below gen * GEN, and the next
            # launch's cannot come before this one ends
            seen = wait_counter(pub, gen * GEN, SPIN)
            if seen >= gen * GEN:
                row = seen % GEN + NSM
            else:
                failed = _timed_out(err_ptr, pid, -2, sm, gen, seen)
    tl.store(pairs_ptr + 1 + 2 * MAX_SMS + pid, row)
    return row, failed


@triton.jit(do_not_specialize=["steps"])     # one binary for any number of steps per launch
def megakernel(tape_ptr, tape_len_ptr, counters_ptr, epoch_ptr, err_ptr, trace_ptr,
               tokens_ptr, lengths_ptr, x_ptr, qkv_ptr, opart_ptr, ml_ptr, tickets_ptr, attn_ptr, act_ptr, logits_ptr,
               amax_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr, sstats_ptr, cand_ptr, cand_idx_ptr, inv_freq_ptr, pairs_ptr, part_ptr, peers_ptr, flags_ptr, kpart_ptr, kticks_ptr, xs_ptr, xss_ptr,
               embed_ptr, lm_head_ptr, final_norm_ptr, input_norm_ptr, post_norm_ptr, q_norm_ptr, k_norm_ptr,
               wqkv_ptr, wo_ptr, wgate_up_ptr, wdown_ptr, wqkv_scale_ptr, wo_scale_ptr, wgate_up_scale_ptr,
               wdown_scale_ptr, k_cache_ptr, v_cache_ptr, eps, max_len, hist_ptr, steps,
               argmax_c, argmax_n,
               B: tl.constexpr, H: tl.constexpr, D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
               I: tl.constexpr, V: tl.constexpr, L: tl.constexpr, S: tl.constexpr,
               R_QKV: tl.constexpr, R_O: tl.constexpr, R_GU: tl.constexpr, R_DOWN: tl.constexpr,
               R_LM: tl.constexpr, BK_H: tl.constexpr, BK_Q: tl.constexpr, BK_I: tl.constexpr, SCALE_ROWS: tl.constexpr,
               NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr, D_PAD: tl.constexpr, G_PAD: tl.constexpr,
               NSPLIT_PAD: tl.constexpr, KV_STAGES: tl.constexpr, ATTN_NEW: tl.constexpr, ATTN_PAIR: tl.constexpr,
               BATCHED: tl.constexpr,
               POOL_O: tl.constexpr, POOL_GU: tl.constexpr, POOL_DOWN: tl.constexpr, POOL_LM: tl.constexpr,
               TP: tl.constexpr, R_AR: tl.constexpr, FP8: tl.constexpr, BATCH_INPUT: tl.constexpr, BT: tl.constexpr, SK_QKV: tl.constexpr,
               SK_O: tl.constexpr, SK_GU: tl.constexpr, SK_DOWN: tl.constexpr, SAMPLE: tl.constexpr,
               SAMPLE_CHUNK: tl.constexpr,
               KV_B: tl.constexpr, SWAP_TMA: tl.constexpr, SWAP_MIN_N: tl.constexpr, MMA_V3: tl.constexpr,
               SWAP_CALL: tl.constexpr, SWAP_PRE: tl.constexpr, SWAP_SMEM: tl.constexpr, ATTN_CALL: tl.constexpr,
               SPIN: tl.constexpr, TRACE: tl.constexpr, PREFETCH_TAPE: tl.constexpr, SM_PAIRS: tl.constexpr,
               UNIFORM_TAPE: tl.constexpr):
    pid = tl.program_id(0)
    epoch = warp_uniform(tl.load(epoch_ptr + pid), UNIFORM_TAPE)
    QKV_N: tl.constexpr = (HQ + 2 * HKV) * D
    # REDUCE writes xs and xss under TP on the weights-on-M tile (the other plans' REDUCE is as it was)
    XS_AR: tl.constexpr = TP > 1 and BT >= BT_SWAP
    failed = tl.atomic_add(err_ptr, 0, sem=RELAXED, scope="gpu")   # a failed earlier step stays failed
    me = pid                  # this program's tape row
    if SM_PAIRS > 0:
        me, bad = _paired_row(pid, pairs_ptr, err_ptr, SM_PAIRS, SPIN)
        failed = failed | bad
    n = warp_uniform(tl.load(tape_len_ptr + me), UNIFORM_TAPE)
    ar = tl.arange(0, WORDS)
    row = tape_ptr + me * max_len * WORDS
    for s in range(steps):    # step s of the launch: this program's list of the tape, once
        i = 0
        if (s > 0) & (failed == 0):
            # the step boundary: everything of the previous step has happened once its ARGMAX has
            target = argmax_n * epoch
            seen = wait_counter(counters_ptr + argmax_c, target, SPIN)
            if seen < target:
                failed = _timed_out(err_ptr, pid, -1, argmax_c, target, seen)   # -1: not at a tape position
        if PREFETCH_TAPE:
            nxt = tl.load(row + ar)
        while (i < n) & (failed == 0):
            if PREFETCH_TAPE:
                cur = nxt
                # fetch the next instruction now: its load overlaps this one's work
                nxt = tl.load(row + (i + 1) * WORDS + ar, mask=(i + 1) * WORDS + ar < max_len * WORDS, other=0)
                op = warp_uniform(tl.sum(tl.where(ar == 0, cur, 0), axis=0), UNIFORM_TAPE)
                layer = warp_uniform(tl.sum(tl.where(ar == 1, cur, 0), axis=0), UNIFORM_TAPE)
                t0 = warp_uniform(tl.sum(tl.where(ar == 2, cur, 0), axis=0), UNIFORM_TAPE)
                t1 = warp_uniform(tl.sum(tl.where(ar == 3, cur, 0), axis=0), UNIFORM_TAPE)
                wc = warp_uniform(tl.sum(tl.where(ar == 4, cur, 0), axis=0), UNIFORM_TAPE)
                target = warp_uniform(tl.sum(tl.where(ar == 5, cur, 0), axis=0), UNIFORM_TAPE) * (epoch + 1)
                sc = warp_uniform(tl.sum(tl.where(ar == 6, cur, 0), axis=0), UNIFORM_TAPE)
                pw = warp_uniform(tl.sum(tl.where(ar == 7, cur, 0), axis=0), UNIFORM_TAPE)
            else:
                # scalar fetch: triton-ascend's adapter cannot lower the loop-carried row above
                op = warp_uniform(tl.load(row + i * WORDS), UNIFORM_TAPE)
                layer = warp_uniform(tl.load(row + i * WORDS + 1), UNIFORM_TAPE)
                t0 = warp_uniform(tl.load(row + i * WORDS + 2), UNIFORM_TAPE)
                t1 = warp_uniform(tl.load(row + i * WORDS + 3), UNIFORM_TAPE)
                wc = warp_uniform(tl.load(row + i * WORDS + 4), UNIFORM_TAPE)
                target = warp_uniform(tl.load(row + i * WORDS + 5), UNIFORM_TAPE) * (epoch + 1)
                sc = warp_uniform(tl.load(row + i * WORDS + 6), UNIFORM_TAPE)
                pw = warp_uniform(tl.load(row + i * WORDS + 7), UNIFORM_TAPE)
            cnt = counters_ptr + wc
            # a pooled stage's claims counter, and the claims of this program's earlier steps
            claims = counters_ptr + (pw & POOL_MASK)
            claims_base = (pw >> POOL_SHIFT) * epoch
            tr = trace_ptr + (me * max_len + i) * TRACE_SLOTS     # this instruction's trace slots
            if TRACE:
                tl.store(tr, tl.extra.cuda.globaltimer())
                tl.store(tr + T_SM, sm_id().to(tl.int64))
            seen = target
            if op == OP_QKV:
                seen = qkv_tile(t0, t1, layer, x_ptr, wqkv_ptr, wqkv_scale_ptr, input_norm_ptr, qkv_ptr, eps, cnt,
                                target, B, H, QKV_N, R_QKV, BK_H, SCALE_ROWS, True, SPIN, BT, tr, TRACE, kpart_ptr,
                                kticks_ptr, SK_QKV, xs_ptr, xss_ptr)
            elif op == OP_ATTN:
                seen = (attn_tile_called if ATTN_CALL else attn_tile)(
                    t0, t1, layer, qkv_ptr, q_norm_ptr, k_norm_ptr, inv_freq_ptr, lengths_ptr, s, k_cache_ptr,
                    v_cache_ptr, opart_ptr, ml_ptr, tickets_ptr, attn_ptr, eps, cnt, target, KV_B, D, HQ, HKV, S,
                    NSPLIT, BLOCK_S, D_PAD, G_PAD, NSPLIT_PAD, KV_STAGES, ATTN_NEW, True, SPIN, tr, TRACE, ATTN_PAIR)
            elif op == OP_OPROJ:
                seen = oproj_tile(t0, t1, layer, attn_ptr, wo_ptr, wo_scale_ptr, x_ptr, cnt, target, B, H, HQ * D, R_O,
                                  BK_Q, SCALE_ROWS, True, SPIN, BT, tr, TRACE, POOL_O, claims, claims_base, kpart_ptr,
                                  kticks_ptr + TICK_O * TICK_STRIDE, SK_O, xs_ptr, xss_ptr, post_norm_ptr + layer * H)
            elif op == OP_GATEUP:
                seen = gateup_tile(t0, t1, layer, x_ptr, wgate_up_ptr, wgate_up_scale_ptr, post_norm_ptr, act_ptr, eps,
                                   cnt, target, B, H, I, R_GU, BK_H, SCALE_ROWS, True, SPIN, BT, tr, TRACE,
                                   POOL_GU, claims, claims_base, kpart_ptr, kticks_ptr, SK_GU, xs_ptr, xss_ptr)
            elif op == OP_DOWN:
                seen = down_tile(t0, t1, layer, act_ptr, wdown_ptr, wdown_scale_ptr, x_ptr, cnt, target, B, H, I, R_DOWN,
                                 BK_I, SCALE_ROWS, True, SPIN, BT, tr, TRACE, POOL_DOWN, claims, claims_base, kpart_ptr,
                                 kticks_ptr + TICK_DOWN * TICK_STRIDE, SK_DOWN, xs_ptr, xss_ptr,
                                 next_norm(layer, input_norm_ptr, final_norm_ptr, H, L))
            elif op == OP_LMHEAD:
                seen = lmhead_tile(t0, t1, x_ptr, lm_head_ptr, final_norm_ptr, logits_ptr, amax_ptr, eps,
                                   cnt, target, B, H, V, R_LM, BK_H, True, SPIN, BT, tr, TRACE,
                                   POOL_LM, claims, claims_base, xs_ptr, xss_ptr)
            elif op == OP_ARGMAX:
                seen = argmax_tile(t0, t1, amax_ptr, tokens_ptr, lengths_ptr, hist_ptr, s, steps, cnt, target, B,
                                   True, SPIN)
            elif op == OP_SSTATS:
                if SAMPLE:    # only plans that sample compile the tiles: greedy binaries stay as they were
                    seen = sstats_tile(t0, t1, logits_ptr, amax_ptr, lengths_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr,
                                       seed_ptr, sstats_ptr, s, cnt, target, V, SAMPLE_CHUNK, True, SPIN)
            elif op == OP_SPICK:
                if SAMPLE:
                    seen = spick_tile(t0, t1, logits_ptr, amax_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr, sstats_ptr,
                                      cand_ptr, cand_idx_ptr, cnt, target, V, SAMPLE_CHUNK, True, SPIN)
            elif op == OP_SAMPLE:
                if SAMPLE:
                    seen = sample_tile(t0, t1, logits_ptr, amax_ptr, lengths_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr,
                                       seed_ptr, sstats_ptr, cand_ptr, cand_idx_ptr, s, cnt, target, V, SAMPLE_CHUNK,
                                       True, SPIN)
            elif op == OP_OPART:
                seen = opart_tile(t0, t1, layer, 2 * layer, attn_ptr, wo_ptr, wo_scale_ptr, part_ptr, cnt, target, B, H,
                                  HQ * D, R_O, BK_Q, SCALE_ROWS, True, SPIN, BT, tr, TRACE, POOL_O, claims,
                                  claims_base, kpart_ptr, kticks_ptr + TICK_O * TICK_STRIDE, SK_O)
            elif op == OP_DPART:
                seen = dpart_tile(t0, t1, layer, 2 * layer + 1, act_ptr, wdown_ptr, wdown_scale_ptr, part_ptr, cnt,
                                  target, B, H, I, R_DOWN, BK_I, SCALE_ROWS, True, SPIN, BT, tr, TRACE, POOL_DOWN,
                                  claims, claims_base, kpart_ptr, kticks_ptr + TICK_DOWN * TICK_STRIDE, SK_DOWN)
            elif op == OP_REDUCE:
                # (layer: the partial's slot)
                # (on the weights-on-M tile it also writes xs and xss, which O's and down's partials do not)
                seen = reduce_tile(t0, t1, layer, part_ptr, x_ptr, peers_ptr, flags_ptr, cnt, target, epoch + 1,
                                   B, H, R_AR, TP, True, SPIN, input_norm_ptr, post_norm_ptr, final_norm_ptr, xs_ptr,
                                   xss_ptr, L, XS_AR)
            elif op == OP_EMBED:
                embed_tile(t0, t1, tokens_ptr, embed_ptr, x_ptr, input_norm_ptr, xs_ptr, xss_ptr, B, H, BK_H, BT)
            elif op == OP_BARRIER:
                # superkernel: arrive, then wait for every worker (a grid-wide barrier)
                tl.debug_barrier()
                tl.atomic_add(cnt, 1, sem=RELEASE, scope="gpu")
                seen = wait_counter(cnt, target, SPIN)
            tl.debug_barrier()    # every thread's stores issued before the release below
            if seen < target:
                # timed out: this worker stops without signalling, so what depends on it stalls too;
                # the host finds the root cause
                failed = _timed_out(err_ptr, pid, i + 1, wc, target, seen)
            elif (sc >= 0) & (op != OP_BARRIER):    # a barrier has already arrived on its counter
                tl.atomic_add(counters_ptr + sc, 1, sem=RELEASE, scope="gpu")
            if TRACE:
                tl.store(tr + 1, tl.extra.cuda.globaltimer())
            i += 1
        epoch += 1
    tl.store(epoch_ptr + pid, epoch)



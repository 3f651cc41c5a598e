"""Tensor parallelism's instructions: O and down as partial sums, and the all-reduce into x.

With the model split over TP ranks (``models/qwen3/tp.py``), each rank's O and down projections
give a partial sum of x's update. ``OPART`` and ``DPART`` are ``matvec``'s O and down tiles with
the STORE epilogue into this rank's ``part[slot]`` (slot 2 l after O, 2 l + 1 after down) instead
of adding into x. ``REDUCE`` tiles then add every rank's partial into x:

1. wait for this rank's producer stage (the counter, as every tile does);
2. publish: raise ``flags[1 + slot]`` to this step's number (``epoch + 1``) with a release at
   system scope, so the stores of this rank's partial that the wait acquired are visible to the
   other GPUs before the flag is (release is cumulative);
3. wait until every rank's ``flags[1 + slot]`` has this step's number (an acquire at system
   scope, through the peer pointers of symmetric memory), bounded like every wait, and giving
   up at once where ``flags[0]`` (this rank's abort word, which a failing rank writes on every
   rank) is set;
4. sum the tile's rows of the partials in rank order 0, 1, ... (every rank adds the same numbers
   in the same order, so x stays bit-identical on every rank, and so do the logits and the token)
   and add the sum into x;
5. on the weights-on-M tile (plans of ``BATCHED`` 2, ``XS``): write the new x's ``xs`` and ``xss``
   (``wgmma.write_xs``, a 64-column block at a time, with the norm weight of the stage that reads
   x next: ``slot_norm``), which O's and down's residual epilogue writes at TP 1 and which the
   normalised stages (QKV, gate/up, the LM head) read instead of x.

Why a rank never overwrites a partial a peer still reads: a rank writes slot k again only in the
next step, after its own REDUCE of slot k + 1 (cyclically, through the step boundary) has seen
every peer's flag k + 1 for this step. A peer raises flag k + 1 only once its producer of slot
k + 1 is done, and that producer (gate/up and down, or the next layer's QKV, attention and O)
starts only after every tile of the peer's REDUCE of slot k has added into x (the stage waits on
REDUCE's counter), i.e. after the peer has read slot k. Per-slot buffers (2 L of them) keep the
argument to that one step; flags only grow (a step number), so nothing is reset between steps.

Pointers: ``peers[r]`` is the address of rank r's ``part`` and ``peers[TP + r]`` of its ``flags``,
in this process's address space (symmetric memory's ``buffer_ptrs``; on the CPU the shared
files that stand in for it, ``megakernel/tp.py``), cast with ``tl.pointer_type``.

A REDUCE that gives up returns a negative ``seen`` that names why (``PEER_TIMEOUT - r``: rank r's
flag never came; ``ABORTED - r``: rank r aborted the run), which the kernel records like any
timed-out wait and the host reports (``megakernel.tp.RankError``).

The per-op backends run REDUCE as torch.distributed's all-reduce between launches (``reduce_host``,
the ``host`` of its kind, then ``xs_kernel`` for xs and xss); the VM runs ``reduce_ref``, an
all-gather summed in rank order (no xs: the VM's references normalise x themselves).
"""

import triton
import triton.language as tl

from scheduler.kinds import Op

from .common import ACQUIRE, RELAXED, RELEASE, STORE, wait_counter
from .kind import DeviceKind, split_rows, weight_rows
from .matvec import next_norm
from .tiles import TICK_DOWN, TICK_O, TICK_STRIDE, gemv_tile
from .wgmma import SS_ROWS, write_xs, write_xs_seq

# ``seen`` codes of a REDUCE that gave up (below every legal count, which is >= 0)
PEER_TIMEOUT: tl.constexpr = tl.constexpr(-16)          # - r: rank r's flag never reached this step
ABORTED: tl.constexpr = tl.constexpr(-(1 << 20))        # - r: rank r wrote the abort word
# sequences a REDUCE tile adds at once (their loads in flight together; more would only cost registers)
RED_BB: tl.constexpr = tl.constexpr(8)


@triton.jit
def partial_tile(t0, t1, layer, slot, in_ptr, w_base, ws_base, part_ptr, cnt_ptr, target,
                 B: tl.constexpr, N: tl.constexpr, K: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
                 SB: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr, BT: tl.constexpr, tr, TRACE: tl.constexpr,
                 POOL: tl.constexpr, claims_ptr, claims_base, kpart_ptr, tick_ptr, SK: tl.constexpr):
    """part[slot, b, rows] = W[layer, rows] @ in[b]: this rank's partial sum of O (in = attn) or
    down (in = act); FP8 weights with their scale grid at ``ws_base`` (``matvec.residual_tile``)."""
    return gemv_tile(t0, t1, w_base + tl.cast(layer, tl.int64) * (N * K),
                     ws_base + layer * ((N + SB - 1) // SB * ((K + 127) // 128)), in_ptr, in_ptr, 0.0,
                     part_ptr + tl.cast(slot, tl.int64) * (B * N), part_ptr, cnt_ptr, target, B, N, K, R, BK, SB,
                     False, STORE, WAIT, SPIN, BT, tr, TRACE, POOL, claims_ptr, claims_base, kpart_ptr, tick_ptr, SK,
                     part_ptr, part_ptr, part_ptr)     # (no xs here: the REDUCE after it writes x's)


@triton.jit
def wait_peer(flag_ptr, want, abort_ptr, SPIN: tl.constexpr):
    """Spin until ``*flag_ptr >= want`` (a peer's flag: acquire at system scope), SPIN polls at most,
    or until this rank's abort word is set; returns (last value seen, abort word)."""
    seen = tl.atomic_add(flag_ptr, 0, sem=ACQUIRE, scope="sys")
    ab = tl.atomic_add(abort_ptr, 0, sem=RELAXED, scope="sys")
    it = 0
    while (seen < want) & (it < SPIN) & (ab == 0):
        seen = tl.atomic_add(flag_ptr, 0, sem=ACQUIRE, scope="sys")
        ab = tl.atomic_add(abort_ptr, 0, sem=RELAXED, scope="sys")
        it += 1
    return seen, ab


@triton.jit
def reduce_tile(t0, t1, slot, part_ptr, x_ptr, peers_ptr, flags_ptr, cnt_ptr, target, step1,
                B: tl.constexpr, H: tl.constexpr, R: tl.constexpr, TP: tl.constexpr, WAIT: tl.constexpr,
                SPIN: tl.constexpr, input_norm_ptr, post_norm_ptr, final_norm_ptr, xs_ptr, xss_ptr,
                L: tl.constexpr, XS: tl.constexpr):
    """x[b, rows] += sum over ranks r (in order) of part_r[slot, b, rows], for tiles [t0, t1) of R
    rows, once every rank has published its partial of this step (``step1``: epoch + 1). Module doc.
    XS (plans on the weights-on-M tile): the new x's rows also go to ``xs`` and ``xss`` times the
    norm weight of the stage after the slot (``slot_norm``), as O's and down's XOUT epilogue
    writes them at TP 1 (``wgmma.write_xs``, the same bits for the same x)."""
    seen = target
    if WAIT:
        seen = wait_counter(cnt_ptr, target, SPIN)
    if seen >= target:
        tl.atomic_max(flags_ptr + 1 + slot, step1, sem=RELEASE, scope="sys")
        for r in tl.static_range(TP):
            if seen >= 0:
                peer_flags = tl.load(peers_ptr + TP + r).to(tl.pointer_type(tl.int32))
                got, ab = wait_peer(peer_flags + 1 + slot, step1, flags_ptr, SPIN)
                if ab != 0:
                    seen = ABORTED - (ab - 1)
                elif got < step1:
                    seen = PEER_TIMEOUT - r
        if seen >= 0:
            off = tl.cast(slot, tl.int64) * (B * H)
            # at least 2 (batch 1 pads a masked column): a one-column block is loaded whole by every
            # thread (``_add_partials``), 64 loads each where two columns take one
            BB: tl.constexpr = 2 if B <= 2 else 4 if B <= 4 else RED_BB
            if XS:
                _reduce_xs(t0, t1, slot, off, x_ptr, peers_ptr, input_norm_ptr, post_norm_ptr, final_norm_ptr,
                           xs_ptr, xss_ptr, B, H, R, TP, L, BB)
            else:
                for t in range(t0, t1):
                    rows = t * R + tl.arange(0, R)
                    for b0 in range(0, B, BB):
                        bb = b0 + tl.arange(0, BB)
                        x = _add_partials(rows, bb, off, x_ptr, peers_ptr, B, H, TP)
                        tl.store(x_ptr + bb[None, :] * H + rows[:, None], x, mask=_rows_ok(rows, bb, B, H))
    return seen


@triton.jit
def _rows_ok(rows, bb, B: tl.constexpr, H: tl.constexpr):
    return (rows < H)[:, None] & (bb < B)[None, :]


@triton.jit
def _add_partials(rows, bb, off, x_ptr, peers_ptr, B: tl.constexpr, H: tl.constexpr, TP: tl.constexpr):
    """x[bb, rows] plus the ranks' partials of those rows, summed in rank order, as [rows, bb]: every
    sequence's loads of a tile in flight at once (one a sequence paid a round trip to the peers
    each). The caller stores it: triton-ascend cannot lower a call whose returned value is dropped.

    It returns after a barrier, so every thread has loaded x before any thread stores the sum: where
    the block's layout holds an element in several threads (Triton replicates small blocks; a
    one-column block was loaded whole by every thread), a warp that stored its rows of the new x
    before another warp loaded them gave that warp x plus the sum twice, and the xs and xss it wrote
    from them. On two H200s the weights-on-M plans' REDUCE at batch 1 so parted between launches of
    one and of many steps."""
    m = _rows_ok(rows, bb, B, H)
    offs = bb[None, :] * H + rows[:, None]
    acc = tl.zeros([rows.shape[0], bb.shape[0]], dtype=tl.float32)
    for r in tl.static_range(TP):
        part = tl.load(peers_ptr + r).to(tl.pointer_type(tl.float32))
        acc += tl.load(part + off + offs, mask=m, other=0.0, cache_modifier=".cv")
    x = tl.load(x_ptr + offs, mask=m, other=0.0, cache_modifier=".cg") + acc
    tl.debug_barrier()
    return x


@triton.jit
def slot_norm(slot, input_norm_ptr, post_norm_ptr, final_norm_ptr, H: tl.constexpr, L: tl.constexpr):
    """The norm weight of the stage that reads x after REDUCE of ``slot``: after O (slot 2 l) the
    post-attention norm of layer l; after down (2 l + 1) the next layer's input norm, or the final
    norm after the last layer (``matvec.next_norm``)."""
    layer = slot // 2
    if slot % 2 == 0:
        p = post_norm_ptr + layer * H
    else:
        p = next_norm(layer, input_norm_ptr, final_norm_ptr, H, L)
    return p


@triton.jit
def _reduce_xs(t0, t1, slot, off, x_ptr, peers_ptr, input_norm_ptr, post_norm_ptr, final_norm_ptr, xs_ptr, xss_ptr,
               B: tl.constexpr, H: tl.constexpr, R: tl.constexpr, TP: tl.constexpr, L: tl.constexpr,
               BB: tl.constexpr):
    """``reduce_tile``'s sums a block of SS_ROWS rows (and BB sequences) at a time, each block's new x
    also written to xs and xss (``wgmma.write_xs``) with the norm weight of ``slot_norm``."""
    tl.static_assert((R // SS_ROWS) * SS_ROWS == R, "a REDUCE tile of the weights-on-M plans is whole 64-column blocks")
    nw_ptr = slot_norm(slot, input_norm_ptr, post_norm_ptr, final_norm_ptr, H, L)
    for t in range(t0, t1):
        for c in tl.static_range(R // SS_ROWS):
            rows = t * R + c * SS_ROWS + tl.arange(0, SS_ROWS)
            for b0 in range(0, B, BB):
                bb = b0 + tl.arange(0, BB)
                x = _add_partials(rows, bb, off, x_ptr, peers_ptr, B, H, TP)
                ok = _rows_ok(rows, bb, B, H)
                tl.store(x_ptr + bb[None, :] * H + rows[:, None], x, mask=ok)
                write_xs(x, rows, ok, bb, nw_ptr, xs_ptr, xss_ptr, (t * R) // SS_ROWS + c, B, H)


# The per-op kernels: a program per tile, no wait, no pool.
@triton.jit
def opart_kernel(layer, attn_ptr, wo_ptr, wo_scale_ptr, part_ptr, B: tl.constexpr, H: tl.constexpr,
                 HQ: tl.constexpr, D: tl.constexpr, R_O: tl.constexpr, BK_Q: tl.constexpr, SCALE_ROWS: tl.constexpr,
                 BT: tl.constexpr, kpart_ptr, kticks_ptr, SK_O: tl.constexpr):
    pid = tl.program_id(0)
    partial_tile(pid, pid + 1, layer, 2 * layer, attn_ptr, wo_ptr, wo_scale_ptr, part_ptr, cnt_ptr=attn_ptr, target=0,
                 B=B, N=H, K=HQ * D, R=R_O, BK=BK_Q, SB=SCALE_ROWS, WAIT=False, SPIN=0, BT=BT, tr=part_ptr,
                 TRACE=False, POOL=0, claims_ptr=part_ptr, claims_base=0, kpart_ptr=kpart_ptr,
                 tick_ptr=kticks_ptr + TICK_O * TICK_STRIDE, SK=SK_O)


@triton.jit
def dpart_kernel(layer, act_ptr, wdown_ptr, wdown_scale_ptr, part_ptr, B: tl.constexpr, H: tl.constexpr,
                 I: tl.constexpr, R_DOWN: tl.constexpr, BK_I: tl.constexpr, SCALE_ROWS: tl.constexpr,
                 BT: tl.constexpr, kpart_ptr, kticks_ptr, SK_DOWN: tl.constexpr):
    pid = tl.program_id(0)
    partial_tile(pid, pid + 1, layer, 2 * layer + 1, act_ptr, wdown_ptr, wdown_scale_ptr, part_ptr, cnt_ptr=act_ptr,
                 target=0, B=B, N=H, K=I, R=R_DOWN, BK=BK_I, SB=SCALE_ROWS, WAIT=False, SPIN=0, BT=BT,
                 tr=part_ptr, TRACE=False, POOL=0, claims_ptr=part_ptr, claims_base=0, kpart_ptr=kpart_ptr,
                 tick_ptr=kticks_ptr + TICK_DOWN * TICK_STRIDE, SK=SK_DOWN)


@triton.jit
def xs_kernel(slot, x_ptr, xs_ptr, xss_ptr, input_norm_ptr, post_norm_ptr, final_norm_ptr, B: tl.constexpr,
              H: tl.constexpr, L: tl.constexpr):
    """After a host REDUCE of ``slot`` (``reduce_host``): x's xs and xss for the next normalised
    stage, a program per SS_ROWS columns, as ``reduce_tile`` writes them with XS."""
    blk = tl.program_id(0)
    nw_ptr = slot_norm(slot, input_norm_ptr, post_norm_ptr, final_norm_ptr, H, L)
    cols = blk * SS_ROWS + tl.arange(0, SS_ROWS)
    for b in range(B):
        x = tl.load(x_ptr + b * H + cols, mask=cols < H, other=0.0)
        write_xs_seq(x, cols, b, blk, nw_ptr, xs_ptr, xss_ptr, B, H)


def _rows(t0, t1, R, N):
    return slice(t0 * R, min(t1 * R, N))


def opart_ref(st, p, layer, t0, t1):
    r = split_rows(t0, t1, p.R_O, p.SK_O, p.H)
    if r is not None:
        st.part[2 * layer][:, r] = st.attn.float() @ weight_rows(st, p, "wo", layer, r).T


def dpart_ref(st, p, layer, t0, t1):
    r = split_rows(t0, t1, p.R_DOWN, p.SK_DOWN, p.H)
    if r is not None:
        st.part[2 * layer + 1][:, r] = st.act.float() @ weight_rows(st, p, "wdown", layer, r).T


def reduce_ref(st, p, slot, t0, t1):
    """REDUCE's tiles on the host: every rank's partial rows gathered (torch.distributed; every rank
    runs the same tape in the same order, so the collectives pair up) and summed in rank order."""
    import torch
    import torch.distributed as dist
    r = _rows(t0, t1, p.R_AR, p.H)
    mine = st.part[slot][:, r].contiguous()
    parts = [torch.empty_like(mine) for _ in range(p.TP)]
    dist.all_gather(parts, mine)
    acc = torch.zeros_like(mine)
    for q in parts:
        acc += q
    st.x[:, r] += acc


def reduce_host(st, plan, layer):
    """The per-op and cuda-graph backends' REDUCE stage of slot ``layer``: one all-reduce of the
    partial (NCCL on the GPU, gloo on the CPU) between launches, then the residual add; on the
    weights-on-M tile then ``xs_kernel`` writes the new x's xs and xss, the bits ``reduce_tile``
    writes (at TP 2 the all-reduce's sum is the tile's rank-order sum: one addition)."""
    import torch.distributed as dist
    part = st.part[layer]
    dist.all_reduce(part)
    st.x.add_(part)
    if plan.BATCHED == 2:
        xs_kernel[(triton.cdiv(plan.H, SS_ROWS.value),)](layer, st.x, st.xs, st.xss, st.input_norm, st.post_norm,
                                                          st.final_norm, B=plan.B, H=plan.H, L=plan.L)


KINDS = (
    DeviceKind(Op.OPART, partial_tile, opart_kernel, opart_ref, reads=("attn", "wo", "wo_scale"),
               writes=("part", "kpart", "kticks")),
    DeviceKind(Op.DPART, partial_tile, dpart_kernel, dpart_ref, reads=("act", "wdown", "wdown_scale"),
               writes=("part", "kpart", "kticks")),
    DeviceKind(Op.REDUCE, reduce_tile, None, reduce_ref,
               reads=("part", "peers", "flags", "x", "input_norm", "post_norm", "final_norm"),
               writes=("x", "xs", "xss", "flags"), host=reduce_host),
)

"""ATTN: q/k RMSNorm, RoPE, KV-cache append and split-KV attention partials, fused.

Tile (b, g, s) takes sequence b's raw q rows of kv group g (G = Hq/Hkv heads) and its k and v
head from the QKV scratch, applies q_norm/k_norm per head and RoPE in Qwen's half-split form at
position p = lengths[b], and attends over split s of positions [0, p]. The splits are sized from
the current length at run time (``chunk = ceil(ceil((p+1)/NSPLIT)/BLOCK_S)*BLOCK_S``), so the
tape never changes while short contexts use few splits and long ones spread over every worker.
The split holding p appends the new k and v to the cache and attends to them from registers;
every other position comes from the cache, whose first block is loaded before the wait. With the
plan's ATTN_NEW, split 0 holds p alone and splits 1.. cut the cached positions [0, p) (``chunk``
from p over NSPLIT - 1): at a short context each cached split is one block loaded before the wait,
and the new token's norm, RoPE, append and score no longer run after a block's math in the same
split, which would make that split its group's last to finish (``make_plan`` sets it where the
layers are short and the context too).
Outputs per head: the unnormalised o [D], the running max m and sum l; the last split of
(b, g) to finish combines them into ``attn`` (``reduce.py``). With one split (NSPLIT 1: a short
max_seq_len, or a batch of more than workers / kv heads / 2 sequences) the tile writes o / l into
``attn`` itself and takes no ticket: there is nothing to combine.

A split is walked in blocks of BLOCK_S positions with flash-decoding block math: scores =
q [QM, D] @ K^T [D, BLOCK_S] and o += p [QM, BLOCK_S] @ V [BLOCK_S, D] as ``tl.dot`` on the cache's
dtype (bf16 on a GPU: tensor cores) with fp32 accumulation and an fp32 online softmax. tl.dot
needs 16 rows, so the G heads' q rows are repeated to QM = 16 rows (norm and RoPE run on the G
rows only). The blocks after the first are loaded through the compiler's software pipeline
(``tl.range(num_stages=NSTAGE)``: cp.async into shared memory on NVIDIA), which keeps the next
NSTAGE - 1 blocks in flight during each block's math without holding them in registers. (On
Ascend the products stay on the vector unit: see ``DOT``.)

Qwen3-0.6B: 8 kv heads x NSPLIT tiles per sequence; reads 2*chunk*128*2 bytes of cache per tile.
Matches ``Qwen3Attention`` (q_norm/k_norm, ``apply_rotary_pos_emb``, eager softmax in fp32).
"""

import triton
import triton.language as tl

from scheduler.kinds import Op

from .common import ASCEND, T_COMPUTED, T_FIRST, T_INPUT, T_WAITED, W_CACHE, stamp, wait_counter
from .kind import DeviceKind
from .reduce import reduce_group, reduce_ref

# KV blocks per split in the software pipeline: NSTAGE (the plan's KV_STAGES) - 1 in flight while
# one is attended; each takes its K and V block of shared memory.
# The block math on tensor cores. Not on Ascend: tl.dot makes a kernel cube + vector ("mix"),
# launched on AI cores, while the persistent grid is sized for the vector cores; there the
# products stay on the vector unit, in blocks small enough for its buffer.
DOT: tl.constexpr = tl.constexpr(not ASCEND)
VEC_ELEMS: tl.constexpr = tl.constexpr(8192)     # [G, block, D] elements of one vector-unit product


@triton.jit
def _kv_block(kc_ptr, vc_ptr, coff, start, kv_end, dd, dmask, D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Cached keys and values of positions [start, start + BLOCK_S) below kv_end: [BLOCK_S, D_PAD]
    each, in the cache's dtype (zeros elsewhere)."""
    kpos = start + tl.arange(0, BLOCK_S)
    mask = (kpos < kv_end)[:, None] & dmask[None, :]
    off = coff + kpos[:, None] * D + dd[None, :]
    return (tl.load(kc_ptr + off, mask=mask, other=0.0, cache_modifier=W_CACHE),
            tl.load(vc_ptr + off, mask=mask, other=0.0, cache_modifier=W_CACHE))


@triton.jit
def _split_range(t, layer, lengths_ptr, step, KV_B: tl.constexpr, D: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr,
                 NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr, NEW: tl.constexpr, P: tl.constexpr):
    """Tile t's split: where it starts, where its cached positions end (the new one is not
    cached yet), the cache offset of its (b, g), the new position (the split is empty this step
    when it starts after it; with NEW, split 0 starts at it) and the split length this step.
    ``step``: the step within the launch (lengths advance only at the launch's end); ``KV_B``: the
    cache's allocated batch (the plan's), its layer stride in sequences. With P (ATTN_PAIR) 2 the
    tile's g is the first of its two kv heads."""
    g = ((t // NSPLIT) % (HKV // P)) * P
    b = t // (NSPLIT * (HKV // P))
    pos = tl.load(lengths_ptr + b) + step
    if NEW:
        # split 0: the new position alone; splits 1..: the cached positions [0, pos) (at least a
        # block each, so that pos 0 divides by nothing)
        chunk = tl.maximum(tl.cdiv(tl.cdiv(pos, NSPLIT - 1), BLOCK_S) * BLOCK_S, BLOCK_S)
        s = t % NSPLIT
        lo = tl.where(s == 0, pos, (s - 1) * chunk)
        kv_end = tl.where(s == 0, pos, tl.minimum(lo + chunk, pos))
    else:
        chunk = tl.cdiv(tl.cdiv(pos + 1, NSPLIT), BLOCK_S) * BLOCK_S
        lo = (t % NSPLIT) * chunk
        kv_end = tl.minimum(lo + chunk, pos)
    coff = ((layer * KV_B + b) * HKV + g).to(tl.int64) * (S * D)
    return lo, kv_end, coff, pos, chunk


@triton.jit
def _active(t, lo, pos, NSPLIT: tl.constexpr, NEW: tl.constexpr):
    """Whether split t holds a position this step (an empty one only takes its ticket)."""
    if NEW:
        return (lo < pos) | (t % NSPLIT == 0)
    else:
        return lo <= pos


@triton.jit
def _n_active(pos, chunk, NSPLIT: tl.constexpr, NEW: tl.constexpr):
    """The splits holding positions this step: the first n_act."""
    if NEW:
        return 1 + tl.cdiv(pos, chunk)
    else:
        return tl.cdiv(pos + 1, chunk)


@triton.jit
def _attend(qd, kt, vt, valid, m, l, acc, scale, DOT: tl.constexpr):
    """Online-softmax update of (max m, sum l, output acc) [QM] with one block of keys and values
    (``valid``: which scores count, [1 or QM, block]):
    scores = q K^T and acc += p V are ``tl.dot`` on the cache's dtype (else fp32 products), the
    softmax is fp32. A block with no valid position leaves (m, l, acc) as they were (m may stay
    -inf)."""
    if DOT:
        sc = tl.dot(qd, tl.trans(kt), input_precision="ieee") * scale    # [QM, BLOCK_S]
    else:
        sc = tl.sum(qd[:, None, :] * kt.to(tl.float32)[None, :, :], axis=2) * scale
    sc = tl.where(valid, sc, float("-inf"))
    m_new = tl.maximum(m, tl.max(sc, axis=1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - m_ref)
    pr = tl.exp(sc - m_ref[:, None])
    l = l * alpha + tl.sum(pr, axis=1)
    if DOT:
        acc = tl.dot(pr.to(vt.dtype), vt, acc * alpha[:, None], input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.sum(pr[:, :, None] * vt.to(tl.float32)[None, :, :], axis=1)
    return m_new, l, acc


@triton.jit
def _new_key(k, kp, kn, kn_p, cos, sin, sign, eps, D: tl.constexpr):
    """The new key: k_norm (RMS over the head) and RoPE; ``kp`` is k's rotate_half partner."""
    kr = 1.0 / tl.sqrt(tl.sum(k * k, axis=0) / D + eps)
    return (k * kr * kn) * cos + sign * (kp * kr * kn_p) * sin


@triton.jit
def _q_rows(qkv_ptr, b, qoff, pos, inv_freq, dd, pd, gmask, N: tl.constexpr):
    """Sequence b's q rows at ``qoff`` in its QKV row, their rotate_half partners, RoPE's cos and
    sin at position pos, and the row's base."""
    ang = pos.to(tl.float32) * inv_freq
    cos = tl.cos(ang)
    sin = tl.sin(ang)
    base = qkv_ptr + b * N
    q = tl.load(base + qoff + dd[None, :], mask=gmask, other=0.0, cache_modifier=".cg").to(tl.float32)
    qp = tl.load(base + qoff + pd[None, :], mask=gmask, other=0.0, cache_modifier=".cg").to(tl.float32)
    return q, qp, cos, sin, base


@triton.jit
def _split(t, kt, vt, lo, kv_end, coff, pos, chunk, qkv_ptr, kc_ptr, vc_ptr, opart_ptr, ml_ptr, tickets_ptr,
           attn_ptr, eps, inv_freq, qn, qn_p, kn, kn_p, D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
           NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr, W: tl.constexpr, D_PAD: tl.constexpr,
           G_PAD: tl.constexpr, NSPLIT_PAD: tl.constexpr, NSTAGE: tl.constexpr, NEW: tl.constexpr, tr,
           TRACE: tl.constexpr, P: tl.constexpr, S: tl.constexpr):
    """Tile t = split s of (b, g), given the first block (kt, vt) of its cached positions
    [lo, kv_end) (all masked when the split has none), walked in blocks of W positions. A split
    past the current length has no positions this step: it only takes its ticket (and combines if
    it is the last). (lo, kv_end, coff, pos, chunk) come from ``_split_range``. With P 2 the tile
    is kv heads g and g + 1 of one split (``_attend_pair``)."""
    if P == 2:
        _attend_pair(t, kt, vt, kv_end, coff, pos, qkv_ptr, kc_ptr, vc_ptr, attn_ptr, eps, inv_freq, qn, qn_p, kn,
                     kn_p, D, HQ, HKV, S, W, D_PAD, G_PAD, NSTAGE, tr, TRACE)
    else:
        g = (t // NSPLIT) % HKV
        b = t // (NSPLIT * HKV)
        n_act = _n_active(pos, chunk, NSPLIT, NEW)    # splits holding positions this step: s < n_act
        if _active(t, lo, pos, NSPLIT, NEW):
            _attend_split(t, kt, vt, lo, kv_end, coff, pos, chunk, qkv_ptr, kc_ptr, vc_ptr, opart_ptr, ml_ptr, eps,
                          inv_freq, qn, qn_p, kn, kn_p, D, HQ, HKV, NSPLIT, BLOCK_S, W, D_PAD, G_PAD, NSTAGE,
                          NEW, tr, TRACE, attn_ptr)
        if NSPLIT > 1:
            # publish the partial (an empty split has none), take a ticket; the last split of this
            # step combines the active ones (one split holds every position and wrote its output itself)
            tl.debug_barrier()
            ticket = tl.atomic_add(tickets_ptr + b * HKV + g, 1, sem="acq_rel", scope="gpu")
            stamp(tr, T_FIRST, ticket, TRACE)
            if ticket % NSPLIT == NSPLIT - 1:
                reduce_group(b, g, n_act, opart_ptr, ml_ptr, attn_ptr, D, HQ, HKV, NSPLIT, D_PAD, G_PAD, NSPLIT_PAD)


@triton.jit
def _attend_split(t, kt, vt, lo, kv_end, coff, pos, chunk, qkv_ptr, kc_ptr, vc_ptr, opart_ptr, ml_ptr, eps,
                  inv_freq, qn, qn_p, kn, kn_p, D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                  NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr, W: tl.constexpr, D_PAD: tl.constexpr,
                  G_PAD: tl.constexpr, NSTAGE: tl.constexpr, NEW: tl.constexpr, tr, TRACE: tl.constexpr, attn_ptr):
    """The partial (o, m, l) of active split t: norm and RoPE of its q (and of k for the split
    holding the new position, which appends k and v to the cache), then its positions
    [lo, min(lo + chunk, pos + 1)). With one split, the normalised output o / l into ``attn``."""
    G: tl.constexpr = HQ // HKV
    N: tl.constexpr = (HQ + 2 * HKV) * D
    HALF: tl.constexpr = D // 2
    QM: tl.constexpr = G_PAD if (G_PAD > 16 or not DOT) else 16   # tl.dot needs 16 rows
    R: tl.constexpr = QM // G_PAD                     # so each head's q fills R rows of the operand
    dd = tl.arange(0, D_PAD)
    dmask = dd < D
    pd = (dd + HALF) % D                              # rotate_half partner of each element
    sign = tl.where(dd < HALF, -1.0, 1.0)
    hg = tl.arange(0, G_PAD)
    gmask = (hg < G)[:, None] & dmask[None, :]
    hh = tl.arange(0, QM)
    hmask = (hh % R == 0) & (hh // R < G)             # one row per head is stored
    scale = 1.0 / tl.sqrt(D * 1.0)
    s = t % NSPLIT
    g = (t // NSPLIT) % HKV
    b = t // (NSPLIT * HKV)
    hi = tl.minimum(lo + chunk, pos + 1)
    q, qp, cos, sin, base = _q_rows(qkv_ptr, b, (g * G + hg)[:, None] * D, pos, inv_freq, dd, pd, gmask, N)
    # the new key and value: loaded with q so that all of this tile's reads are in flight at once
    kb = base + HQ * D + g * D
    k = tl.load(kb + dd, mask=dmask, other=0.0, cache_modifier=".cg").to(tl.float32)
    kp = tl.load(kb + pd, mask=dmask, other=0.0, cache_modifier=".cg").to(tl.float32)
    v = tl.load(base + (HQ + HKV) * D + g * D + dd, mask=dmask, other=0.0, cache_modifier=".cg").to(tl.float32)
    qr = 1.0 / tl.sqrt(tl.sum(q * q, axis=1) / D + eps)
    stamp(tr, T_INPUT, tl.sum(qr, axis=0), TRACE)
    q = (q * qr[:, None] * qn[None, :]) * cos[None, :] + \
        sign[None, :] * (qp * qr[:, None] * qn_p[None, :]) * sin[None, :]
    if DOT:
        # norm and RoPE work on the G heads; the dot operand repeats each head's row R times
        qd = tl.reshape(tl.broadcast_to(q.to(kc_ptr.dtype.element_ty)[:, None, :], [G_PAD, R, D_PAD]),
                        [QM, D_PAD])
    else:
        qd = q
    m = tl.full([QM], float("-inf"), tl.float32)
    l = tl.zeros([QM], tl.float32)
    acc = tl.zeros([QM, D_PAD], tl.float32)
    if NEW:
        newtok = s == 0
        if lo < kv_end:     # split 0 has no cached positions: no block math at all
            m, l, acc = _attend(qd, kt, vt, (lo + tl.arange(0, W) < kv_end)[None, :], m, l, acc, scale, DOT)
    else:
        newtok = (pos >= lo) & (pos < hi)
        m, l, acc = _attend(qd, kt, vt, (lo + tl.arange(0, W) < kv_end)[None, :], m, l, acc, scale, DOT)
    # the rest of the split: the software pipeline issues the loads of the next NSTAGE - 1
    # blocks before this block's math (double buffering, in shared memory)
    for start in tl.range(lo + W, kv_end, W, num_stages=NSTAGE):
        kb_s, vb_s = _kv_block(kc_ptr, vc_ptr, coff, start, kv_end, dd, dmask, D, W)
        m, l, acc = _attend(qd, kb_s, vb_s, (start + tl.arange(0, W) < kv_end)[None, :], m, l, acc, scale, DOT)
    if newtok:
        # the new token: append its key and value, and attend to it from registers
        k_new = _new_key(k, kp, kn, kn_p, cos, sin, sign, eps, D).to(kc_ptr.dtype.element_ty)
        v_new = v.to(vc_ptr.dtype.element_ty)
        tl.store(kc_ptr + coff + pos * D + dd, k_new, mask=dmask)
        tl.store(vc_ptr + coff + pos * D + dd, v_new, mask=dmask)
        sc = tl.sum(qd.to(tl.float32) * k_new.to(tl.float32)[None, :], axis=1) * scale   # [QM]
        m_new = tl.maximum(m, sc)
        alpha = tl.exp(m - m_new)
        pr = tl.exp(sc - m_new)
        l = l * alpha + pr
        acc = acc * alpha[:, None] + pr[:, None] * v_new.to(tl.float32)[None, :]
        m = m_new
    stamp(tr, T_COMPUTED, tl.sum(l, axis=0), TRACE)
    if NSPLIT == 1:
        out = acc / l[:, None]      # l >= 1: the best-scoring position contributes exp(0)
        tl.store(attn_ptr + b * (HQ * D) + (g * G + hh // R)[:, None] * D + dd[None, :], out,
                 mask=hmask[:, None] & dmask[None, :])
        stamp(tr, T_FIRST, tl.sum(l, axis=0), TRACE)
    else:
        row = (b * HQ + g * G + hh // R) * NSPLIT + s
        tl.store(opart_ptr + row[:, None] * D + dd[None, :], acc, mask=hmask[:, None] & dmask[None, :])
        tl.store(ml_ptr + row * 2, m, mask=hmask)
        tl.store(ml_ptr + row * 2 + 1, l, mask=hmask)


@triton.jit
def _kv_pair_block(kc_ptr, vc_ptr, coff, start, kv_end, dd, dmask, D: tl.constexpr, S: tl.constexpr,
                   W: tl.constexpr):
    """Two kv heads' cached keys and values of positions [start, start + W) below kv_end, stacked:
    rows [0, W) head g's (at coff), rows [W, 2 W) head g + 1's (S * D further on); zeros elsewhere."""
    r = tl.arange(0, 2 * W)
    kpos = start + r % W
    mask = (kpos < kv_end)[:, None] & dmask[None, :]
    off = coff + (r // W).to(tl.int64)[:, None] * (S * D) + kpos[:, None] * D + dd[None, :]
    return (tl.load(kc_ptr + off, mask=mask, other=0.0, cache_modifier=W_CACHE),
            tl.load(vc_ptr + off, mask=mask, other=0.0, cache_modifier=W_CACHE))


@triton.jit
def _tile_block(kc_ptr, vc_ptr, coff, start, kv_end, dd, dmask, D: tl.constexpr, S: tl.constexpr, W: tl.constexpr,
                P: tl.constexpr):
    """A tile's first block of cached keys and values: one head's (``_kv_block``), or with P 2 its
    two heads' stacked (``_kv_pair_block``)."""
    if P == 2:
        kt, vt = _kv_pair_block(kc_ptr, vc_ptr, coff, start, kv_end, dd, dmask, D, S, W)
    else:
        kt, vt = _kv_block(kc_ptr, vc_ptr, coff, start, kv_end, dd, dmask, D, W)
    return kt, vt


@triton.jit
def _attend_pair(t, kt, vt, kv_end, coff, pos, qkv_ptr, kc_ptr, vc_ptr, attn_ptr, eps, inv_freq, qn, qn_p, kn, kn_p,
                 D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr, W: tl.constexpr,
                 D_PAD: tl.constexpr, G_PAD: tl.constexpr, NSTAGE: tl.constexpr, tr, TRACE: tl.constexpr):
    """Tile t of ATTN_PAIR 2 (one split): kv heads g and g + 1 of sequence b over every position,
    as ``_attend_split`` does one, in one pass. Their q rows share one dot operand (head g's in
    the first half, g + 1's in the second) and their cache blocks one stacked block (``_kv_pair_block``),
    so both heads' loads are in flight at once; a score between a row and the other head's keys is
    masked out, so each row's softmax and output are its own head's. Writes o / l into ``attn``."""
    G: tl.constexpr = HQ // HKV
    N: tl.constexpr = (HQ + 2 * HKV) * D
    HALF: tl.constexpr = D // 2
    G2: tl.constexpr = 2 * G_PAD                      # q rows of the two heads (padded)
    QM: tl.constexpr = G2 if (G2 > 16 or not DOT) else 16
    R: tl.constexpr = QM // G2
    dd = tl.arange(0, D_PAD)
    dmask = dd < D
    pd = (dd + HALF) % D
    sign = tl.where(dd < HALF, -1.0, 1.0)
    hg = tl.arange(0, G2)
    head = (hg // G_PAD) * G + hg % G_PAD            # q head within the pair's 2 G
    gmask = (hg % G_PAD < G)[:, None] & dmask[None, :]
    hh = tl.arange(0, QM)
    hmask = (hh % R == 0) & ((hh // R) % G_PAD < G)
    qhead = (hh // R // G_PAD) * G + (hh // R) % G_PAD   # each operand row's q head within the pair
    qgrp = hh // R // G_PAD                           # and its kv head: 0 (g) or 1 (g + 1)
    scale = 1.0 / tl.sqrt(D * 1.0)
    g = ((t % (HKV // 2)) * 2)
    b = t // (HKV // 2)
    q, qp, cos, sin, base = _q_rows(qkv_ptr, b, (g * G + head)[:, None] * D, pos, inv_freq, dd, pd, gmask, N)
    kb = base + HQ * D + g * D
    vb = base + (HQ + HKV) * D + g * D
    k0 = tl.load(kb + dd, mask=dmask, other=0.0, cache_modifier=".cg").to(tl.float32)
    k0p = tl.load(kb + pd, mask=dmask, other=0.0, cache_modifier=".cg").to(tl.float32)
    k1 = tl.load(kb + D + dd, mask=dmask, other=0.0, cache_modifier=".cg").to(tl.float32)
    k1p = tl.load(kb + D + pd, mask=dmask, other=0.0, cache_modifier=".cg").to(tl.float32)
    v0 = tl.load(vb + dd, mask=dmask, other=0.0, cache_modifier=".cg").to(tl.float32)
    v1 = tl.load(vb + D + dd, mask=dmask, other=0.0, cache_modifier=".cg").to(tl.float32)
    qr = 1.0 / tl.sqrt(tl.sum(q * q, axis=1) / D + eps)
    stamp(tr, T_INPUT, tl.sum(qr, axis=0), TRACE)
    q = (q * qr[:, None] * qn[None, :]) * cos[None, :] + \
        sign[None, :] * (qp * qr[:, None] * qn_p[None, :]) * sin[None, :]
    if DOT:
        qd = tl.reshape(tl.broadcast_to(q.to(kc_ptr.dtype.element_ty)[:, None, :], [G2, R, D_PAD]), [QM, D_PAD])
    else:
        qd = q
    m = tl.full([QM], float("-inf"), tl.float32)
    l = tl.zeros([QM], tl.float32)
    acc = tl.zeros([QM, D_PAD], tl.float32)
    r = tl.arange(0, 2 * W)
    own = qgrp[:, None] == (r // W)[None, :]         # a row scores only its own head's keys
    m, l, acc = _attend(qd, kt, vt, own & ((r % W) < kv_end)[None, :], m, l, acc, scale, DOT)
    for start in tl.range(W, kv_end, W, num_stages=NSTAGE):
        kb_s, vb_s = _kv_pair_block(kc_ptr, vc_ptr, coff, start, kv_end, dd, dmask, D, S, W)
        m, l, acc = _attend(qd, kb_s, vb_s, own & ((start + r % W) < kv_end)[None, :], m, l, acc, scale, DOT)
    # the new token of each head: append its key and value, and attend to it from registers
    kn0 = _new_key(k0, k0p, kn, kn_p, cos, sin, sign, eps, D).to(kc_ptr.dtype.element_ty)
    kn1 = _new_key(k1, k1p, kn, kn_p, cos, sin, sign, eps, D).to(kc_ptr.dtype.element_ty)
    vn0 = v0.to(vc_ptr.dtype.element_ty)
    vn1 = v1.to(vc_ptr.dtype.element_ty)
    tl.store(kc_ptr + coff + pos * D + dd, kn0, mask=dmask)
    tl.store(vc_ptr + coff + pos * D + dd, vn0, mask=dmask)
    tl.store(kc_ptr + coff + S * D + pos * D + dd, kn1, mask=dmask)
    tl.store(vc_ptr + coff + S * D + pos * D + dd, vn1, mask=dmask)
    first = (qgrp == 0)[:, None]
    k_rows = tl.where(first, kn0.to(tl.float32)[None, :], kn1.to(tl.float32)[None, :])    # [QM, D]
    v_rows = tl.where(first, vn0.to(tl.float32)[None, :], vn1.to(tl.float32)[None, :])
    sc = tl.sum(qd.to(tl.float32) * k_rows, axis=1) * scale
    m_new = tl.maximum(m, sc)
    alpha = tl.exp(m - m_new)
    pr = tl.exp(sc - m_new)
    l = l * alpha + pr
    acc = acc * alpha[:, None] + pr[:, None] * v_rows
    stamp(tr, T_COMPUTED, tl.sum(l, axis=0), TRACE)
    out = acc / l[:, None]
    tl.store(attn_ptr + b * (HQ * D) + (g * G + qhead)[:, None] * D + dd[None, :], out,
             mask=hmask[:, None] & dmask[None, :])
    stamp(tr, T_FIRST, tl.sum(l, axis=0), TRACE)


@triton.jit
def attn_tile(t0, t1, layer, qkv_ptr, qn_ptr, kn_ptr, inv_freq_ptr, lengths_ptr, step, kc_ptr, vc_ptr,
              opart_ptr, ml_ptr, tickets_ptr, attn_ptr, eps, cnt_ptr, target,
              KV_B: tl.constexpr, D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr,
              NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr, D_PAD: tl.constexpr, G_PAD: tl.constexpr,
              NSPLIT_PAD: tl.constexpr, NSTAGE: tl.constexpr, NEW: tl.constexpr, WAIT: tl.constexpr,
              SPIN: tl.constexpr, tr, TRACE: tl.constexpr, P: tl.constexpr):
    HALF: tl.constexpr = D // 2
    # positions per block walked: a split (a multiple of BLOCK_S) is a whole number of them
    # (a pair's product is [2 G_PAD, 2 W, D_PAD]: four times a head's)
    W_VEC: tl.constexpr = VEC_ELEMS // (G_PAD * D_PAD * P * P) if VEC_ELEMS >= G_PAD * D_PAD * P * P else 1
    # (with two kv heads a tile, half a block of each: the stacked block has a head's shapes and registers)
    W: tl.constexpr = BLOCK_S // P if (DOT or W_VEC >= BLOCK_S // P) else W_VEC
    # Where no split can be longer than one walked block (its first, loaded before the wait), the
    # pipelined loop never runs: no pipeline, so the kernel takes none of its shared memory
    SPLIT_MAX: tl.constexpr = (((S + NSPLIT - 1) // NSPLIT + BLOCK_S - 1) // BLOCK_S) * BLOCK_S
    STAGES: tl.constexpr = 1 if SPLIT_MAX <= W else NSTAGE
    dd = tl.arange(0, D_PAD)
    dmask = dd < D
    pd = (dd + HALF) % D
    inv_freq = tl.load(inv_freq_ptr + dd % HALF, mask=dmask, other=0.0)
    qn = tl.load(qn_ptr + layer * D + dd, mask=dmask, other=0.0).to(tl.float32)
    qn_p = tl.load(qn_ptr + layer * D + pd, mask=dmask, other=0.0).to(tl.float32)
    kn = tl.load(kn_ptr + layer * D + dd, mask=dmask, other=0.0).to(tl.float32)
    kn_p = tl.load(kn_ptr + layer * D + pd, mask=dmask, other=0.0).to(tl.float32)
    # The first tile's first KV block is loaded before the wait: positions before the new one
    # were written by earlier steps, so like weights they never wait on this step's producers.
    lo, kv_end, coff, pos, chunk = _split_range(t0, layer, lengths_ptr, step, KV_B, D, HKV, S, NSPLIT, BLOCK_S, NEW, P)
    kt, vt = _tile_block(kc_ptr, vc_ptr, coff, lo, kv_end, dd, dmask, D, S, W, P)
    seen = target
    if WAIT:
        # Every split waits, an empty one too: the tickets of (b, g) serve every layer and step, so
        # a ticket must come after this layer's QKV (and so after the layer before it). Unwaited,
        # a worker holding only empty splits runs ahead and takes later layers' tickets among this
        # one's, and the combine runs on partials not yet written.
        seen = wait_counter(cnt_ptr, target, SPIN)
    stamp(tr, T_WAITED, seen, TRACE)
    for t in range(t0, t1):
        if t > t0:
            lo, kv_end, coff, pos, chunk = _split_range(t, layer, lengths_ptr, step, KV_B, D, HKV, S, NSPLIT, BLOCK_S,
                                                        NEW, P)
            kt, vt = _tile_block(kc_ptr, vc_ptr, coff, lo, kv_end, dd, dmask, D, S, W, P)
        _split(t, kt, vt, lo, kv_end, coff, pos, chunk, qkv_ptr, kc_ptr, vc_ptr, opart_ptr, ml_ptr,
               tickets_ptr, attn_ptr, eps, inv_freq, qn, qn_p, kn, kn_p, D, HQ, HKV, NSPLIT, BLOCK_S, W, D_PAD,
               G_PAD, NSPLIT_PAD, STAGES, NEW, tr, TRACE, P, S)
        # the block is dead once attended: carrying it to the next tile would hold its registers
        # through this whole tile
        kt = tl.zeros_like(kt)
        vt = tl.zeros_like(vt)
    return seen


# The same tile called as a function (the plan's ATTN_CALL): the persistent kernel then allocates its
# registers apart from the other tiles'. Compiled for sm_90 under Triton 3.6, 0.6b's batch-64
# megakernel with the weights-on-M tile called too keeps 17 spill loads and 12 stores, against 76.
attn_tile_called = triton.jit(attn_tile.fn, noinline=True)


@triton.jit
def attn_kernel(layer, qkv_ptr, q_norm_ptr, k_norm_ptr, inv_freq_ptr, lengths_ptr, k_cache_ptr, v_cache_ptr,
                opart_ptr, ml_ptr, tickets_ptr, attn_ptr, eps, KV_B: tl.constexpr, D: tl.constexpr, HQ: tl.constexpr,
                HKV: tl.constexpr, S: tl.constexpr, NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr,
                D_PAD: tl.constexpr, G_PAD: tl.constexpr, NSPLIT_PAD: tl.constexpr, KV_STAGES: tl.constexpr,
                ATTN_NEW: tl.constexpr, ATTN_PAIR: tl.constexpr):
    pid = tl.program_id(0)
    attn_tile(pid, pid + 1, layer, qkv_ptr, q_norm_ptr, k_norm_ptr, inv_freq_ptr, lengths_ptr, step=0,
              kc_ptr=k_cache_ptr, vc_ptr=v_cache_ptr, opart_ptr=opart_ptr, ml_ptr=ml_ptr, tickets_ptr=tickets_ptr,
              attn_ptr=attn_ptr, eps=eps, cnt_ptr=lengths_ptr, target=0, KV_B=KV_B, D=D, HQ=HQ, HKV=HKV, S=S,
              NSPLIT=NSPLIT, BLOCK_S=BLOCK_S, D_PAD=D_PAD, G_PAD=G_PAD, NSPLIT_PAD=NSPLIT_PAD, NSTAGE=KV_STAGES,
              NEW=ATTN_NEW, WAIT=False, SPIN=0, tr=lengths_ptr, TRACE=False, P=ATTN_PAIR)


def attention_ref(st, p, layer, t0, t1):
    """Torch version of tiles [t0, t1), same split arithmetic, for the VM."""
    import torch

    from models.qwen3.reference import apply_rope, rmsnorm, rope_cos_sin
    G, D, P = p.HQ // p.HKV, p.D, p.ATTN_PAIR
    # tile t is split s of kv head g of sequence b; with ATTN_PAIR 2 (one split), heads 2 g' and 2 g' + 1
    heads = [(t % p.NSPLIT, ((t // p.NSPLIT) % (p.HKV // P)) * P + i, t // (p.NSPLIT * (p.HKV // P)))
             for t in range(t0, t1) for i in range(P)]
    for s, g, b in heads:
        pos = int(st.lengths[b])
        cos, sin = rope_cos_sin(torch.tensor([pos]), D, st.rope_theta, torch.float32)
        row = st.qkv[b].float()
        q = row[g * G * D:(g + 1) * G * D].view(G, D)
        k = row[p.HQ * D + g * D:p.HQ * D + (g + 1) * D].view(1, D)
        v = row[(p.HQ + p.HKV) * D + g * D:(p.HQ + p.HKV) * D + (g + 1) * D]
        q = apply_rope(rmsnorm(q, st.q_norm[layer].float(), st.eps), cos, sin)
        k = apply_rope(rmsnorm(k, st.k_norm[layer].float(), st.eps), cos, sin)[0]
        if p.ATTN_NEW:    # split 0 the new position, splits 1.. the cache
            chunk = max(-(-(-(-pos // (p.NSPLIT - 1))) // p.BLOCK_S) * p.BLOCK_S, p.BLOCK_S)
            lo, hi = (pos, pos + 1) if s == 0 else ((s - 1) * chunk, min(s * chunk, pos))
            n_act = 1 + -(-pos // chunk)
        else:
            chunk = -(-(-(-(pos + 1) // p.NSPLIT)) // p.BLOCK_S) * p.BLOCK_S
            lo, hi = s * chunk, min(s * chunk + chunk, pos + 1)
            n_act = -(-(pos + 1) // chunk)
        if lo <= pos < hi:
            st.k_cache[layer, b, g, pos] = k.to(st.k_cache.dtype)
            st.v_cache[layer, b, g, pos] = v.to(st.v_cache.dtype)
        rows = (b * p.HQ + g * G + torch.arange(G)) * p.NSPLIT + s
        if lo < hi:       # an empty split stores no partial
            kk = st.k_cache[layer, b, g, lo:hi].float()
            vv = st.v_cache[layer, b, g, lo:hi].float()
            sc = (q @ kk.T) * D ** -0.5                       # [G, n]
            m = sc.max(dim=1).values
            pr = torch.exp(sc - m[:, None])
            st.opart[rows] = pr @ vv
            st.ml[rows, 0], st.ml[rows, 1] = m, pr.sum(dim=1)
        if p.NSPLIT == 1:     # the kernel's one split writes o / l itself and takes no ticket
            reduce_ref(st, p, b, g, 1)
            continue
        st.tickets[b * p.HKV + g] += 1
        if int(st.tickets[b * p.HKV + g]) % p.NSPLIT == 0:
            reduce_ref(st, p, b, g, n_act)


KINDS = (DeviceKind(Op.ATTN, attn_tile, attn_kernel, attention_ref,
                    reads=("qkv", "q_norm", "k_norm", "inv_freq", "lengths", "k_cache", "v_cache", "opart", "ml",
                           "tickets"),
                    writes=("k_cache", "v_cache", "opart", "ml", "tickets", "attn")),)

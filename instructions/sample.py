"""Sampling inside the step: temperature / top-k / top-p, with each sequence's own settings.

Plans with ``SAMPLE=1`` (``scheduler.graph.build_stages``) run three stages between the LM head
and ARGMAX; greedy plans (``SAMPLE=0``) have none and compile none of them, so their tapes and
binaries are unchanged. A greedy sequence (``inv_temp[b] == 0``) is skipped by all three, so its
token is the LM head's argmax bit for bit; for a sampled one SAMPLE replaces the packed argmax
``amax[b]`` by a key whose index is the drawn token, and ARGMAX writes it as ever.

The draw is Gumbel-max: token = argmax over the allowed tokens of ``(l - m) / T + G``, with
``G = -log(-log(u))`` and ``u`` from Philox (``tl.philox``; ``models.qwen3.sampling.philox_uniform``
is the same in torch) keyed by the sequence's seed with counter (vocabulary index, position of the
sampled token in its sequence = the cache length after the step). So a draw depends only on
(seed, position, logits): the same token whatever the batch, slot or steps per launch. The
allowed tokens are those whose logit is at least a threshold: the k-th largest (top-k), then the
least value whose tokens above it carry ``top_p`` of the top-k set's probability (top-p, as
``models.qwen3.sampling.sample``: the first token past p is kept; ties at the threshold are all
kept). Thresholds are found exactly, by bisection over the logits' order-preserving int32 keys.

The row is cut into chunks of ``SAMPLE_CHUNK`` logits (a plan field, 4096; ``sstats`` holds a
row of ``NS`` words a chunk), so that a sequence's two reads of its 152k logits spread over
many workers instead of one (one program reading the row took about 420 us on an H200):
- SSTATS, a tile per (sequence, chunk): with top-k or top-p, the chunk's count and probability
  mass (relative to the max m) at ``NL`` levels ``(m - l) / T <= D_j`` (D = 2^-9 to 2^6.5, a factor sqrt(2) apart) and
  its part of the normaliser Z; without either, the chunk's best Gumbel score and its index (pure
  temperature needs no threshold, and the best of the chunks' bests is the draw).
- SPICK, a tile per (sequence, chunk): sums the chunks' counts (in chunk order, so every tile
  sees the same totals), takes the first level that holds the top-k set (or top-p's mass) and at
  most ``CAP`` tokens, and writes its chunk's tokens of that level to the sequence's ``cand`` rows
  at the offset of the chunks before it: the candidates in vocabulary order.
- SAMPLE, a tile per sequence: bisects the thresholds and draws over the candidates held in
  registers (one block of CAP). Only a flat distribution whose needed level holds more than CAP
  tokens makes it bisect and draw over the whole row (up to 64 passes: slow, but exact).
"""

import triton
import triton.language as tl

from scheduler.kinds import Op

from .common import RELAXED, wait_counter
from .kind import DeviceKind

BLOCK: tl.constexpr = tl.constexpr(1024)     # logits a pass loads at once
CAP: tl.constexpr = tl.constexpr(1024)       # candidates a sequence keeps (``cand`` rows)
# levels D_j = 2^(LEVEL_LOW + LEVEL_STEP j), j < NL: 2^-9 .. 2^6.5, a factor sqrt(2) apart. The first
# that holds the top-k set must hold at most CAP tokens: in a replay of the random 0.6b model's
# sampled rows (800, top-k 20 or 50) 16 levels a factor 2 apart missed that in 0.6% to 11% of rows
# (the k-th token just past one level, the next holding thousands), these in none; the low ones
# keep a flat top compact.
NL: tl.constexpr = tl.constexpr(32)
LEVEL_LOW: tl.constexpr = tl.constexpr(-9.0)
LEVEL_STEP: tl.constexpr = tl.constexpr(0.5)
LEVEL_BLOCK: tl.constexpr = tl.constexpr(256)    # logits SSTATS loads at once ([LEVEL_BLOCK, NL] compares)
NS: tl.constexpr = tl.constexpr(72)          # sstats words a chunk: NL counts, NL masses, Z, best score, its index
W_MASS: tl.constexpr = tl.constexpr(32)      # = NL: where a chunk's masses start
W_Z: tl.constexpr = tl.constexpr(64)
W_BEST: tl.constexpr = tl.constexpr(65)
W_BEST_IDX: tl.constexpr = tl.constexpr(66)
NCH_MAX: tl.constexpr = tl.constexpr(64)     # chunks a row may have (V / SAMPLE_CHUNK; a power of two)
UNIFORM_SCALE: tl.constexpr = tl.constexpr(4.6566127342e-10)   # Triton's uint_to_uniform_float
U_MIN: tl.constexpr = tl.constexpr(2.3283064e-10)              # u = 0 is drawn as this (G >= -3.1)
INT32_MIN: tl.constexpr = tl.constexpr(-(1 << 31))


@triton.jit
def order_key(v):
    """float32 -> int32 in the same order (-0.0 as 0.0): ``common.argmax_key``'s high word."""
    v = tl.where(v == 0.0, 0.0, v)
    bits = v.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def gumbel(seed, pos, idx):
    """The Gumbel noise of vocabulary index ``idx`` (int32 block) at position ``pos`` under ``seed``."""
    z = idx * 0
    r, _, _, _ = tl.philox(seed, idx, z + pos, z, z)
    x = r.to(tl.int32, bitcast=True)
    x = tl.where(x < 0, -x - 1, x)
    u = tl.maximum(x.to(tl.float32) * UNIFORM_SCALE, U_MIN)
    return -tl.log(-tl.log(u))


@triton.jit
def _ge_stats(src, n, t, m, inv_t):
    """Count and probability mass (relative to the max m) of src[:n] with key >= t."""
    cnt = 0
    mass = 0.0
    for v0 in range(0, n, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        msk = offs < n
        lg = tl.load(src + offs, mask=msk, other=float("-inf"), cache_modifier=".cg")
        sel = msk & (order_key(lg).to(tl.int64) >= t)
        e = tl.exp(-((m - lg) * inv_t))
        cnt += tl.sum(sel.to(tl.int32), axis=0)
        mass += tl.sum(tl.where(sel, e, 0.0), axis=0)
    return cnt, mass


@triton.jit
def _bisect(src, n, lo, hi, need, m, inv_t, BY_MASS: tl.constexpr):
    """The largest key t in [lo, hi] whose tokens (key >= t) number (or, BY_MASS, weigh) at least
    ``need``; lo where none above it does."""
    while lo < hi:
        mid = lo + (hi - lo + 1) // 2
        c, w = _ge_stats(src, n, mid, m, inv_t)
        if BY_MASS:
            have = w
        else:
            have = c.to(tl.float32)
        if have >= need:
            lo = mid
        else:
            hi = mid - 1
    return lo


@triton.jit
def _gumbel_argmax(row, start, end, thr, m, inv_t, seed, pos):
    """The best score ``G - (m - l) / T`` among the allowed tokens (key >= thr) of row[start:end],
    and its token (the first on ties)."""
    best = float("-inf")
    tok = start
    for v0 in range(start, end, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        msk = offs < end
        lg = tl.load(row + offs, mask=msk, other=float("-inf"), cache_modifier=".cg")
        ok = msk & (order_key(lg).to(tl.int64) >= thr)
        sc = tl.where(ok, gumbel(seed, pos, offs) - (m - lg) * inv_t, float("-inf"))
        bb = tl.max(sc, axis=0)
        bi = tl.min(tl.where(ok & (sc == bb), offs, 2147483647), axis=0)
        if bb > best:
            best = bb
            tok = bi
    return best, tok


@triton.jit
def _ladder():
    """The levels D_j (module doc), [NL]: one expression for SSTATS's counts and SPICK's choice."""
    return tl.exp2(tl.arange(0, NL).to(tl.float32) * LEVEL_STEP + LEVEL_LOW)


@triton.jit
def _settings(b, inv_temp_ptr, top_k_ptr, top_p_ptr, amax_ptr, V: tl.constexpr):
    """Sequence b's inverse temperature, top-k on, k as float32, top-p on, p, and its logits' max m."""
    inv_t = tl.load(inv_temp_ptr + b)
    k = tl.load(top_k_ptr + b)
    p = tl.load(top_p_ptr + b)
    k_on = (k > 0) & (k < V)
    kk = tl.where(k_on, k, 0).to(tl.float32)     # 0 where off: any level holds the top-k set
    key = tl.atomic_add(amax_ptr + b, 0, sem=RELAXED, scope="gpu")
    ordered = (key >> 32).to(tl.int32)
    m = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    return inv_t, k_on, kk, p < 1.0, p, m


@triton.jit
def _level(stats, kk, k_on, p, NCH: tl.constexpr):
    """From a sequence's chunk statistics: the first level that holds the top-k set (or top-p's
    mass) and at most CAP tokens (NL where none does), its D, the whole row's Z, and the rows of
    the chunk counts at that level (to offset each chunk's candidates)."""
    ch = tl.arange(0, NCH_MAX)
    lv = tl.arange(0, NL)
    rows = stats + ch[:, None] * NS + lv[None, :]
    on = (ch[:, None] < NCH) & (lv[None, :] >= 0)
    cnts = tl.load(rows, mask=on, other=0.0, cache_modifier=".cg")
    cnt = tl.sum(cnts, axis=0)
    mass = tl.sum(tl.load(rows + W_MASS, mask=on, other=0.0, cache_modifier=".cg"), axis=0)
    Z = tl.sum(tl.load(stats + ch * NS + W_Z, mask=ch < NCH, other=0.0, cache_modifier=".cg"), axis=0)
    D = _ladder()
    ok = (cnt >= kk) & (k_on | (mass >= p * Z)) & (cnt <= CAP)
    j = tl.min(tl.where(ok, lv, NL), axis=0)
    Dj = tl.sum(tl.where(lv == j, D, 0.0), axis=0)
    nj = tl.sum(tl.where(lv == j, cnt, 0.0), axis=0).to(tl.int32)
    per_chunk = tl.sum(tl.where(lv[None, :] == j, cnts, 0.0), axis=1)     # [NCH_MAX]
    return j, Dj, nj, Z, per_chunk


# The three tiles are called, not inlined, in the persistent kernel: their registers then stay out
# of the other tiles' allocation (inlined, the sampling plan's step was 3-4% slower on an H200,
# 0.6b, batch 1 and 8, every sequence greedy: 0.659 against 0.645 ms, 1.063 against 1.022)
@triton.jit(noinline=True)
def sstats_tile(t0, t1, logits_ptr, amax_ptr, lengths_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr,
                sstats_ptr, s, cnt_ptr, target, V: tl.constexpr, SAMPLE_CHUNK: tl.constexpr, WAIT: tl.constexpr,
                SPIN: tl.constexpr):
    """Tiles [t0, t1) of SSTATS (tile t: sequence t // NCH, chunk t % NCH) at step s of the launch."""
    NCH: tl.constexpr = (V + SAMPLE_CHUNK - 1) // SAMPLE_CHUNK
    seen = target
    if WAIT:
        seen = wait_counter(cnt_ptr, target, SPIN)
    for t in range(t0, t1):
        b = t // NCH
        c = t % NCH
        inv_t, k_on, kk, p_on, p, m = _settings(b, inv_temp_ptr, top_k_ptr, top_p_ptr, amax_ptr, V)
        if inv_t > 0.0:
            row = logits_ptr + b * V
            out = sstats_ptr + (b * (NCH + 1) + c) * NS
            c0 = c * SAMPLE_CHUNK
            c1 = tl.minimum(c0 + SAMPLE_CHUNK, V)
            if k_on | p_on:
                lv = tl.arange(0, NL)
                D = _ladder()
                cnt = tl.zeros([NL], dtype=tl.int32)
                mass = tl.zeros([NL], dtype=tl.float32)
                Z = 0.0
                for v0 in range(c0, c1, LEVEL_BLOCK):
                    offs = v0 + tl.arange(0, LEVEL_BLOCK)
                    msk = offs < c1
                    lg = tl.load(row + offs, mask=msk, other=float("-inf"), cache_modifier=".cg")
                    d = (m - lg) * inv_t
                    e = tl.exp(-d)
                    Z += tl.sum(e, axis=0)
                    inl = (d[:, None] <= D[None, :]) & msk[:, None]
                    cnt += tl.sum(inl.to(tl.int32), axis=0)
                    mass += tl.sum(tl.where(inl, e[:, None], 0.0), axis=0)
                tl.store(out + lv, cnt.to(tl.float32))
                tl.store(out + W_MASS + lv, mass)
                tl.store(out + W_Z, Z)
            else:
                # pure temperature: every token allowed
                best, tok = _gumbel_argmax(row, c0, c1, tl.full([], INT32_MIN, tl.int64), m, inv_t,
                                           tl.load(seed_ptr + b), tl.load(lengths_ptr + b) + s + 1)
                tl.store(out + W_BEST, best)
                tl.store(out + W_BEST_IDX, tok.to(tl.float32))     # exact: V < 2^24
    return seen


@triton.jit(noinline=True)
def spick_tile(t0, t1, logits_ptr, amax_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr, sstats_ptr, cand_ptr,
               cand_idx_ptr, cnt_ptr, target, V: tl.constexpr, SAMPLE_CHUNK: tl.constexpr, WAIT: tl.constexpr,
               SPIN: tl.constexpr):
    """Tiles [t0, t1) of SPICK: each chunk's tokens of the chosen level into its sequence's ``cand``
    rows, after the chunks before it; the first chunk also records the level and the count."""
    NCH: tl.constexpr = (V + SAMPLE_CHUNK - 1) // SAMPLE_CHUNK
    seen = target
    if WAIT:
        seen = wait_counter(cnt_ptr, target, SPIN)
    for t in range(t0, t1):
        b = t // NCH
        c = t % NCH
        inv_t, k_on, kk, p_on, p, m = _settings(b, inv_temp_ptr, top_k_ptr, top_p_ptr, amax_ptr, V)
        if (inv_t > 0.0) & (k_on | p_on):
            stats = sstats_ptr + b * (NCH + 1) * NS
            j, Dj, nj, Z, per_chunk = _level(stats, kk, k_on, p, NCH)
            if c == 0:
                tl.store(stats + NCH * NS, j.to(tl.float32))
                tl.store(stats + NCH * NS + 1, nj.to(tl.float32))
            if j < NL:
                ch = tl.arange(0, NCH_MAX)
                n = tl.sum(tl.where(ch < c, per_chunk, 0.0), axis=0).to(tl.int32)
                row = logits_ptr + b * V
                c0 = c * SAMPLE_CHUNK
                c1 = tl.minimum(c0 + SAMPLE_CHUNK, V)
                for v0 in range(c0, c1, BLOCK):
                    offs = v0 + tl.arange(0, BLOCK)
                    msk = offs < c1
                    lg = tl.load(row + offs, mask=msk, other=float("-inf"), cache_modifier=".cg")
                    sel = msk & ((m - lg) * inv_t <= Dj)
                    at = n + tl.cumsum(sel.to(tl.int32), axis=0) - 1
                    sel = sel & (at < CAP)     # never past the row, even were a count off
                    tl.store(cand_ptr + b * CAP + at, lg, mask=sel)
                    tl.store(cand_idx_ptr + b * CAP + at, offs, mask=sel)
                    n += tl.sum(sel.to(tl.int32), axis=0)
    return seen


@triton.jit
def _draw_candidates(cand, cidx, n, m, inv_t, k_on, kk, p_on, p, Z, seed, pos):
    """The draw over n <= CAP candidates (logits cand, indices cidx), held in registers."""
    offs = tl.arange(0, CAP)
    msk = offs < n
    lg = tl.load(cand + offs, mask=msk, other=float("-inf"), cache_modifier=".cg")
    idx = tl.load(cidx + offs, mask=msk, other=0, cache_modifier=".cg")
    key = tl.where(msk, order_key(lg).to(tl.int64), INT32_MIN - 1)
    e = tl.where(msk, tl.exp(-((m - lg) * inv_t)), 0.0)
    thr = tl.full([], INT32_MIN, tl.int64)
    top = order_key(m).to(tl.int64)
    if k_on:
        lo = thr
        hi = top
        while lo < hi:
            mid = lo + (hi - lo + 1) // 2
            if tl.sum((key >= mid).to(tl.int32), axis=0).to(tl.float32) >= kk:
                lo = mid
            else:
                hi = mid - 1
        thr = lo
    if p_on:
        Zs = Z
        if k_on:
            Zs = tl.sum(tl.where(key >= thr, e, 0.0), axis=0)
        need = p * Zs
        lo = thr
        hi = top
        while lo < hi:
            mid = lo + (hi - lo + 1) // 2
            if tl.sum(tl.where(key >= mid, e, 0.0), axis=0) >= need:
                lo = mid
            else:
                hi = mid - 1
        thr = lo
    ok = msk & (key >= thr)
    sc = tl.where(ok, gumbel(seed, pos, idx) - (m - lg) * inv_t, float("-inf"))
    bb = tl.max(sc, axis=0)
    return tl.min(tl.where(ok & (sc == bb), idx, 2147483647), axis=0)


@triton.jit(noinline=True)
def sample_tile(t0, t1, logits_ptr, amax_ptr, lengths_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr,
                sstats_ptr, cand_ptr, cand_idx_ptr, s, cnt_ptr, target, V: tl.constexpr,
                SAMPLE_CHUNK: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr):
    """Sequences [t0, t1) at step s of the launch: a sampled one's amax[b] becomes its drawn token's
    key (the LM head's maximum above it, as ARGMAX reads only the index); greedy ones are left."""
    NCH: tl.constexpr = (V + SAMPLE_CHUNK - 1) // SAMPLE_CHUNK
    seen = target
    if WAIT:
        seen = wait_counter(cnt_ptr, target, SPIN)
    for b in range(t0, t1):
        inv_t, k_on, kk, p_on, p, m = _settings(b, inv_temp_ptr, top_k_ptr, top_p_ptr, amax_ptr, V)
        if inv_t > 0.0:
            stats = sstats_ptr + b * (NCH + 1) * NS
            pos = tl.load(lengths_ptr + b) + s + 1      # the sampled token's position in its sequence
            seed = tl.load(seed_ptr + b)
            ch = tl.arange(0, NCH_MAX)
            if k_on | p_on:
                j = tl.load(stats + NCH * NS, cache_modifier=".cg").to(tl.int32)
                n = tl.load(stats + NCH * NS + 1, cache_modifier=".cg").to(tl.int32)
                Z = tl.sum(tl.load(stats + ch * NS + W_Z, mask=ch < NCH, other=0.0, cache_modifier=".cg"), axis=0)
                if j < NL:
                    tok = _draw_candidates(cand_ptr + b * CAP, cand_idx_ptr + b * CAP, n, m, inv_t, k_on, kk, p_on,
                                           p, Z, seed, pos)
                else:
                    # flat: the needed level holds more than CAP tokens; every pass reads the row
                    row = logits_ptr + b * V
                    thr = tl.full([], INT32_MIN, tl.int64)
                    top = order_key(m).to(tl.int64)
                    if k_on:
                        thr = _bisect(row, V, thr, top, kk, m, inv_t, False)
                    if p_on:
                        Zs = Z
                        if k_on:
                            _, Zs = _ge_stats(row, V, thr, m, inv_t)
                        thr = _bisect(row, V, thr, top, p * Zs, m, inv_t, True)
                    _, tok = _gumbel_argmax(row, 0, V, thr, m, inv_t, seed, pos)
            else:
                best = tl.load(stats + ch * NS + W_BEST, mask=ch < NCH, other=float("-inf"), cache_modifier=".cg")
                at = tl.load(stats + ch * NS + W_BEST_IDX, mask=ch < NCH, other=0.0, cache_modifier=".cg")
                bb = tl.max(best, axis=0)
                tok = tl.min(tl.where((ch < NCH) & (best == bb), at, 3.0e9), axis=0).to(tl.int32)
            key = tl.atomic_add(amax_ptr + b, 0, sem=RELAXED, scope="gpu")
            tl.atomic_xchg(amax_ptr + b, (key >> 32 << 32) | (4294967295 - tok.to(tl.int64)), sem=RELAXED,
                           scope="gpu")
    return seen


@triton.jit
def sstats_kernel(logits_ptr, amax_ptr, lengths_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr, sstats_ptr,
                  V: tl.constexpr, SAMPLE_CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    # one step a launch (s 0), no wait
    sstats_tile(pid, pid + 1, logits_ptr, amax_ptr, lengths_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr,
                sstats_ptr, s=0, cnt_ptr=lengths_ptr, target=0, V=V, SAMPLE_CHUNK=SAMPLE_CHUNK, WAIT=False, SPIN=0)


@triton.jit
def spick_kernel(logits_ptr, amax_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr, sstats_ptr, cand_ptr, cand_idx_ptr,
                 V: tl.constexpr, SAMPLE_CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    spick_tile(pid, pid + 1, logits_ptr, amax_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr, sstats_ptr, cand_ptr,
               cand_idx_ptr, cnt_ptr=amax_ptr, target=0, V=V, SAMPLE_CHUNK=SAMPLE_CHUNK, WAIT=False, SPIN=0)


@triton.jit
def sample_kernel(logits_ptr, amax_ptr, lengths_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr, sstats_ptr,
                  cand_ptr, cand_idx_ptr, V: tl.constexpr, SAMPLE_CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    sample_tile(pid, pid + 1, logits_ptr, amax_ptr, lengths_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr,
                sstats_ptr, cand_ptr, cand_idx_ptr, s=0, cnt_ptr=lengths_ptr, target=0, V=V,
                SAMPLE_CHUNK=SAMPLE_CHUNK, WAIT=False, SPIN=0)


def _no_reference(st, p, layer, t0, t1):
    """SSTATS and SPICK have no torch half: SAMPLE's reference draws from the logits alone."""


def sample_ref(st, p, layer, t0, t1):
    from models.qwen3.sampling import device_sample_reference
    for b in range(t0, t1):
        if float(st.inv_temp[b]) > 0:
            tok = int(device_sample_reference(st.logits[b:b + 1], st.inv_temp[b:b + 1], st.top_k[b:b + 1],
                                              st.top_p[b:b + 1], st.seed[b:b + 1], st.lengths[b:b + 1] + 1)[0])
            key = int(st.amax[b])
            st.amax[b] = (key >> 32 << 32) | (4294967295 - tok)


_SETTINGS = ("amax", "inv_temp", "top_k", "top_p")
KINDS = (DeviceKind(Op.SSTATS, sstats_tile, sstats_kernel, _no_reference,
                    reads=("logits", "lengths", "seed") + _SETTINGS, writes=("sstats",), num_warps=4),
         DeviceKind(Op.SPICK, spick_tile, spick_kernel, _no_reference,
                    reads=("logits", "sstats") + _SETTINGS, writes=("sstats", "cand", "cand_idx"), num_warps=4),
         DeviceKind(Op.SAMPLE, sample_tile, sample_kernel, sample_ref,
                    reads=("logits", "lengths", "seed", "sstats", "cand", "cand_idx") + _SETTINGS, writes=("amax",),
                    num_warps=4))

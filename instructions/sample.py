"""SAMPLE: temperature / top-k / top-p sampling inside the step, with each sequence's own settings.

Plans with ``SAMPLE=1`` (``scheduler.graph.build_stages``) run one SAMPLE instruction tile per
sequence between the LM head and ARGMAX. A greedy sequence (``inv_temp[b] == 0``) is skipped, so
its token is today's argmax bit for bit; for a sampled one the tile replaces the LM head's packed
argmax ``amax[b]`` by a key whose index is the sampled token, and ARGMAX then writes it as ever
(``tokens``, ``hist``, ``lengths``). Greedy plans (``SAMPLE=0``) have no SAMPLE stage and compile
no SAMPLE branch: their tapes and binaries are unchanged.

The draw is Gumbel-max: token = argmax over the allowed tokens of ``(l - m) / T + G``, with
``G = -log(-log(u))`` and ``u`` from Philox (``tl.philox``; ``models.qwen3.sampling.philox_uniform``
is the same in torch) keyed by the sequence's seed with counter (vocabulary index, position of
the sampled token in its sequence = the cache length after the step). So a draw depends only on
(seed, position, logits): the same token whatever the batch, slot or steps per launch.

The allowed tokens are those whose logit is at least a threshold: the k-th largest (top-k), then
the least value whose tokens above it carry ``top_p`` of the top-k set's probability (top-p, as
``models.qwen3.sampling.sample``: the first token past p is kept; ties at the threshold are all
kept). Thresholds are found exactly, by bisection over the logits' order-preserving int32 keys.

To keep that cheap the tile first reads the row once and counts, for ``NL`` levels
``(m - l) / T <= D_j`` (D = 0.5, 1, ..., 64), the tokens and their probability mass; the first
level that holds the top-k set (or top-p's mass, or, without either, ``D >= FULL_CUT``: a token
further below can never win, since a Gumbel draw lies in [-3.1, 16.7]) and at most ``CAP`` tokens
is compacted into the sequence's ``cand`` rows by a second read, and the bisections and the draw
run over those candidates (one BLOCK). Only a flat distribution whose needed level holds more
than CAP tokens makes the bisections read the whole row each (up to 64 passes: slow, but exact).

Cost at Qwen3-0.6B (V = 151936, logits float32: 608 KB a sequence, in L2 after the LM head):
two reads of the row by one program (about 3-6 us each on an H100 SM) plus up to 2 x 32
bisection passes and one Philox draw over at most CAP = 1024 candidates (about 5-10 us), so about
15-25 us a sampled sequence; sequences run on different workers in parallel. A SAMPLE stage
also adds one stage boundary (a counter wait, about 1-2 us). Estimates, not measured.
"""

import triton
import triton.language as tl

from scheduler.kinds import Op

from .common import RELAXED, wait_counter
from .kind import DeviceKind

BLOCK: tl.constexpr = tl.constexpr(1024)     # logits a pass loads at once
CAP: tl.constexpr = tl.constexpr(1024)       # candidates a sequence keeps (``cand`` rows)
NL: tl.constexpr = tl.constexpr(8)           # levels D_j = 2^(j - 1), j < NL: 0.5 .. 64
FULL_CUT: tl.constexpr = tl.constexpr(32.0)  # no top-k or top-p: candidates within this of the max
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
def _gumbel_argmax(src, isrc, compact, n, thr, m, inv_t, seed, pos):
    """The allowed token (key >= thr) of src[:n] with the largest ``G - (m - l) / T`` (the first
    on ties); indices from isrc where ``compact`` (1), else the positions themselves."""
    best = float("-inf")
    tok = 0
    for v0 in range(0, n, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        msk = offs < n
        lg = tl.load(src + offs, mask=msk, other=float("-inf"), cache_modifier=".cg")
        from_list = (offs * 0 + compact) > 0
        idx = tl.load(isrc + offs, mask=msk & from_list, other=0, cache_modifier=".cg")
        idx = tl.where(from_list, idx, offs)
        ok = msk & (order_key(lg).to(tl.int64) >= thr)
        sc = tl.where(ok, gumbel(seed, pos, idx) - (m - lg) * inv_t, float("-inf"))
        bb = tl.max(sc, axis=0)
        bi = tl.min(tl.where(ok & (sc == bb), idx, 2147483647), axis=0)
        if bb > best:
            best = bb
            tok = bi
    return tok


@triton.jit
def sample_row(row, cand, cidx, m, inv_t, k, p, seed, pos, V: tl.constexpr):
    """The sampled token of one logits row (``row``, V float32, maximum m) at inverse temperature
    inv_t > 0, top-k k (0: off), top-p p (1.0: off); cand, cidx: the sequence's CAP scratch words."""
    k_on = (k > 0) & (k < V)
    kk = tl.where(k_on, k, V).to(tl.float32)
    p_on = p < 1.0
    lv = tl.arange(0, NL)
    D = tl.exp2(lv.to(tl.float32) - 1.0)
    cnt = tl.zeros([NL], dtype=tl.int32)
    mass = tl.zeros([NL], dtype=tl.float32)
    Z = 0.0
    for v0 in range(0, V, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        msk = offs < V
        lg = tl.load(row + offs, mask=msk, other=float("-inf"), cache_modifier=".cg")
        d = (m - lg) * inv_t
        e = tl.exp(-d)
        Z += tl.sum(e, axis=0)
        inl = (d[:, None] <= D[None, :]) & msk[:, None]
        cnt += tl.sum(inl.to(tl.int32), axis=0)
        mass += tl.sum(tl.where(inl, e[:, None], 0.0), axis=0)
    ok = (cnt.to(tl.float32) >= kk) & (k_on | (mass >= p * Z)) & (k_on | p_on | (D >= FULL_CUT)) & (cnt <= CAP)
    j = tl.min(tl.where(ok, lv, NL), axis=0)
    compact = j < NL
    Dj = tl.sum(tl.where(lv == j, D, 0.0), axis=0)
    src = row
    n = V
    if compact:
        n = 0
        for v0 in range(0, V, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            msk = offs < V
            lg = tl.load(row + offs, mask=msk, other=float("-inf"), cache_modifier=".cg")
            sel = msk & ((m - lg) * inv_t <= Dj)
            at = n + tl.cumsum(sel.to(tl.int32), axis=0) - 1
            tl.store(cand + at, lg, mask=sel)
            tl.store(cidx + at, offs, mask=sel)
            n += tl.sum(sel.to(tl.int32), axis=0)
        tl.debug_barrier()      # the candidates' stores before any thread reads them back
        src = cand
    thr = tl.full([], INT32_MIN, tl.int64)
    top = order_key(m).to(tl.int64)
    if k_on:
        thr = _bisect(src, n, thr, top, kk, m, inv_t, False)
    if p_on:
        Zs = Z
        if k_on:
            _, Zs = _ge_stats(src, n, thr, m, inv_t)
        thr = _bisect(src, n, thr, top, p * Zs, m, inv_t, True)
    return _gumbel_argmax(src, cidx, compact.to(tl.int32), n, thr, m, inv_t, seed, pos)


@triton.jit
def sample_tile(t0, t1, logits_ptr, amax_ptr, lengths_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr,
                cand_ptr, cand_idx_ptr, s, cnt_ptr, target, V: tl.constexpr, WAIT: tl.constexpr,
                SPIN: tl.constexpr):
    """Sequences [t0, t1) at step s of the launch: a sampled one's amax[b] becomes its drawn token's
    key (the LM head's maximum above it, as ARGMAX reads only the index); greedy ones are left."""
    seen = target
    if WAIT:
        seen = wait_counter(cnt_ptr, target, SPIN)
    for b in range(t0, t1):
        inv_t = tl.load(inv_temp_ptr + b)
        if inv_t > 0.0:
            key = tl.atomic_add(amax_ptr + b, 0, sem=RELAXED, scope="gpu")
            ordered = (key >> 32).to(tl.int32)
            m = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
            pos = tl.load(lengths_ptr + b) + s + 1      # the sampled token's position in its sequence
            tok = sample_row(logits_ptr + b * V, cand_ptr + b * CAP, cand_idx_ptr + b * CAP, m, inv_t,
                             tl.load(top_k_ptr + b), tl.load(top_p_ptr + b), tl.load(seed_ptr + b), pos, V)
            tl.atomic_xchg(amax_ptr + b, (ordered.to(tl.int64) << 32) | (4294967295 - tok.to(tl.int64)),
                           sem=RELAXED, scope="gpu")
    return seen


@triton.jit
def sample_kernel(logits_ptr, amax_ptr, lengths_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr, cand_ptr,
                  cand_idx_ptr, V: tl.constexpr):
    pid = tl.program_id(0)
    # one step a launch (s 0), no wait
    sample_tile(pid, pid + 1, logits_ptr, amax_ptr, lengths_ptr, inv_temp_ptr, top_k_ptr, top_p_ptr, seed_ptr,
                cand_ptr, cand_idx_ptr, s=0, cnt_ptr=lengths_ptr, target=0, V=V, WAIT=False, SPIN=0)


def sample_ref(st, p, layer, t0, t1):
    from models.qwen3.sampling import device_sample_reference
    for b in range(t0, t1):
        if float(st.inv_temp[b]) > 0:
            tok = int(device_sample_reference(st.logits[b:b + 1], st.inv_temp[b:b + 1], st.top_k[b:b + 1],
                                              st.top_p[b:b + 1], st.seed[b:b + 1], st.lengths[b:b + 1] + 1)[0])
            key = int(st.amax[b])
            st.amax[b] = (key >> 32 << 32) | (4294967295 - tok)


KINDS = (DeviceKind(Op.SAMPLE, sample_tile, sample_kernel, sample_ref,
                    reads=("logits", "amax", "lengths", "inv_temp", "top_k", "top_p", "seed"),
                    writes=("amax", "cand", "cand_idx"), num_warps=4),)

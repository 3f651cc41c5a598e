"""Combining split-KV partials: the last split of a (sequence, kv group) to finish does it.

Only the splits that hold positions this step (the first ``n_act``; see ``attention._split_range``)
have partials; empty splits store none and are skipped.

o_h = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s over the active splits, M = max_s m_s.
Not an instruction of its own: each ATTN tile takes a ticket on its (sequence, kv group) after
storing its partial, and the tile that takes the last ticket of the step runs ``reduce_group``.
That removes a dependent step per layer without redundant work.
Tickets only grow, so "last" is ``ticket % NSPLIT == NSPLIT - 1`` and no reset is needed.
Qwen3-0.6B: 2 heads x NSPLIT partials of 128 fp32 -> attn [1, 2048] bf16; reads
NSPLIT*G*(D+2)*4 bytes of L2-resident scratch.
"""

import triton
import triton.language as tl

# partials are summed a few splits at a time: [G_PAD, splits, D_PAD] of at most this many elements
CHUNK_ELEMS: tl.constexpr = tl.constexpr(4096)


@triton.jit
def _chunk(b, g, c0, n_act, opart_ptr, ml_ptr, D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
           NSPLIT: tl.constexpr, D_PAD: tl.constexpr, G_PAD: tl.constexpr, SCH: tl.constexpr):
    """(m [G_PAD, SCH], o [G_PAD, SCH, D_PAD]) of splits [c0, c0 + SCH) below n_act."""
    G: tl.constexpr = HQ // HKV
    dd = tl.arange(0, D_PAD)
    hh = tl.arange(0, G_PAD)
    cs = tl.arange(0, SCH)
    cmask = (hh < G)[:, None] & (c0 + cs < n_act)[None, :]
    crow = (b * HQ + g * G + hh)[:, None] * NSPLIT + c0 + cs[None, :]                  # [G_PAD, SCH]
    m = tl.load(ml_ptr + crow * 2, mask=cmask, other=float("-inf"), cache_modifier=".cg")
    o = tl.load(opart_ptr + crow[:, :, None] * D + dd[None, None, :],
                mask=cmask[:, :, None] & (dd < D)[None, None, :], other=0.0, cache_modifier=".cg")
    return m, o


@triton.jit
def reduce_group(b, g, n_act, opart_ptr, ml_ptr, attn_ptr, D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                 NSPLIT: tl.constexpr, D_PAD: tl.constexpr, G_PAD: tl.constexpr, NSPLIT_PAD: tl.constexpr):
    """attn rows of (sequence b, kv group g) from the partials of its first ``n_act`` splits (the
    others were empty this step). Every load of the first chunk of splits is issued before any
    math, so a short context combines in one round trip to L2."""
    G: tl.constexpr = HQ // HKV
    SCH: tl.constexpr = NSPLIT_PAD if G_PAD * NSPLIT_PAD * D_PAD <= CHUNK_ELEMS else \
        (CHUNK_ELEMS // (G_PAD * D_PAD) if CHUNK_ELEMS >= G_PAD * D_PAD else 1)   # splits per chunk
    dd = tl.arange(0, D_PAD)
    hh = tl.arange(0, G_PAD)
    ss = tl.arange(0, NSPLIT_PAD)
    hmask = hh < G
    head = b * HQ + g * G + hh                                       # [G_PAD]
    mlmask = hmask[:, None] & (ss < n_act)[None, :]
    mlrow = (head[:, None] * NSPLIT + ss[None, :]) * 2
    m = tl.load(ml_ptr + mlrow, mask=mlmask, other=float("-inf"), cache_modifier=".cg")
    l = tl.load(ml_ptr + mlrow + 1, mask=mlmask, other=0.0, cache_modifier=".cg")
    m0, o0 = _chunk(b, g, 0, n_act, opart_ptr, ml_ptr, D, HQ, HKV, NSPLIT, D_PAD, G_PAD, SCH)
    mx = tl.max(m, axis=1)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    total = tl.sum(l * tl.exp(m - mx[:, None]), axis=1)               # [G_PAD]
    total = tl.where(total > 0.0, total, 1.0)
    acc = tl.sum(o0 * tl.exp(m0 - mx[:, None])[:, :, None], axis=1)
    for c0 in range(SCH, n_act, SCH):
        mc, oc = _chunk(b, g, c0, n_act, opart_ptr, ml_ptr, D, HQ, HKV, NSPLIT, D_PAD, G_PAD, SCH)
        acc += tl.sum(oc * tl.exp(mc - mx[:, None])[:, :, None], axis=1)
    out = acc / total[:, None]
    tl.store(attn_ptr + b * (HQ * D) + (g * G + hh)[:, None] * D + dd[None, :], out,
             mask=hmask[:, None] & (dd < D)[None, :])


def reduce_ref(st, p, b, g, n_act):
    import torch
    G = p.HQ // p.HKV
    for h in range(g * G, (g + 1) * G):
        rows = slice((b * p.HQ + h) * p.NSPLIT, (b * p.HQ + h) * p.NSPLIT + n_act)
        m, l, o = st.ml[rows, 0], st.ml[rows, 1], st.opart[rows]
        w = torch.exp(m - m.max())
        st.attn[b, h * p.D:(h + 1) * p.D] = (w[:, None] * o).sum(0) / (w * l).sum()

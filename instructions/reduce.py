"""Combining split-KV partials: the last split of a (sequence, kv group) to finish does it.

o_h = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s, M = max_s m_s (empty splits have
m = -inf and weigh nothing). Not an instruction of its own: each ATTN tile takes a ticket on its
(sequence, kv group) after storing its partial, and the tile that takes the last ticket of the
step runs ``reduce_group``. That removes a dependent step per layer without redundant work.
Tickets only grow, so "last" is ``ticket % NSPLIT == NSPLIT - 1`` and no reset is needed.
Qwen3-0.6B: 2 heads x NSPLIT partials of 128 fp32 -> attn [1, 2048] fp32; reads
NSPLIT*G*(D+2)*4 bytes of L2-resident scratch.
"""

import triton
import triton.language as tl

# partials are summed a few splits at a time: [G_PAD, splits, D_PAD] of at most this many elements
CHUNK_ELEMS: tl.constexpr = tl.constexpr(4096)


@triton.jit
def reduce_group(b, g, opart_ptr, ml_ptr, attn_ptr, D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                 NSPLIT: tl.constexpr, D_PAD: tl.constexpr, G_PAD: tl.constexpr, NSPLIT_PAD: tl.constexpr):
    G: tl.constexpr = HQ // HKV
    SCH: tl.constexpr = NSPLIT_PAD if G_PAD * NSPLIT_PAD * D_PAD <= CHUNK_ELEMS else \
        (CHUNK_ELEMS // (G_PAD * D_PAD) if CHUNK_ELEMS >= G_PAD * D_PAD else 1)   # splits per chunk
    dd = tl.arange(0, D_PAD)
    hh = tl.arange(0, G_PAD)
    ss = tl.arange(0, NSPLIT_PAD)
    cs = tl.arange(0, SCH)
    hmask = hh < G
    head = b * HQ + g * G + hh                                       # [G_PAD]
    mlmask = hmask[:, None] & (ss < NSPLIT)[None, :]
    mlrow = (head[:, None] * NSPLIT + ss[None, :]) * 2
    m = tl.load(ml_ptr + mlrow, mask=mlmask, other=float("-inf"), cache_modifier=".cg")
    l = tl.load(ml_ptr + mlrow + 1, mask=mlmask, other=0.0, cache_modifier=".cg")
    mx = tl.max(m, axis=1)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    total = tl.sum(l * tl.exp(m - mx[:, None]), axis=1)               # [G_PAD]
    total = tl.where(total > 0.0, total, 1.0)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    for c0 in range(0, NSPLIT, SCH):
        cmask = hmask[:, None] & (c0 + cs < NSPLIT)[None, :]
        crow = head[:, None] * NSPLIT + c0 + cs[None, :]                  # [G_PAD, SCH]
        wgt = tl.exp(tl.load(ml_ptr + crow * 2, mask=cmask, other=float("-inf"), cache_modifier=".cg") - mx[:, None])
        o = tl.load(opart_ptr + crow[:, :, None] * D + dd[None, None, :],
                    mask=cmask[:, :, None] & (dd < D)[None, None, :], other=0.0, cache_modifier=".cg")
        acc += tl.sum(o * wgt[:, :, None], axis=1)
    out = acc / total[:, None]
    tl.store(attn_ptr + b * (HQ * D) + (g * G + hh)[:, None] * D + dd[None, :], out,
             mask=hmask[:, None] & (dd < D)[None, :])


def reduce_ref(st, p, b, g):
    import torch
    G = p.HQ // p.HKV
    for h in range(g * G, (g + 1) * G):
        rows = slice((b * p.HQ + h) * p.NSPLIT, (b * p.HQ + h + 1) * p.NSPLIT)
        m, l, o = st.ml[rows, 0], st.ml[rows, 1], st.opart[rows]
        w = torch.exp(m - m.max())
        st.attn[b, h * p.D:(h + 1) * p.D] = (w[:, None] * o).sum(0) / (w * l).sum()

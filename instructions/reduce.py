"""REDUCE: combine the split-KV partials of one (sequence, kv group) into attention outputs.

o_h = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s, M = max_s m_s (empty splits have
m = -inf and weigh nothing). Qwen3-0.6B: 2 heads x NSPLIT partials of 128 fp32 per tile -> attn
[1, 2048] fp32. Reads NSPLIT*G*(D+2)*4 bytes (L2-resident scratch).
"""

import triton
import triton.language as tl

from scheduler.ops import Op

from .common import wait_counter


@triton.jit
def reduce_tile(t0, t1, opart_ptr, ml_ptr, attn_ptr, cnt_ptr, target,
                D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, NSPLIT: tl.constexpr,
                D_PAD: tl.constexpr, G_PAD: tl.constexpr, NSPLIT_PAD: tl.constexpr,
                WAIT: tl.constexpr, SPIN: tl.constexpr):
    G: tl.constexpr = HQ // HKV
    dd = tl.arange(0, D_PAD)
    hh = tl.arange(0, G_PAD)
    ss = tl.arange(0, NSPLIT_PAD)
    hmask = hh < G
    omask = hmask[:, None] & (dd < D)[None, :]
    seen = target
    if WAIT:
        seen = wait_counter(cnt_ptr, target, SPIN)
    for t in range(t0, t1):
        b = t // HKV
        g = t % HKV
        head = b * HQ + g * G + hh                                   # [G_PAD]
        mlmask = hmask[:, None] & (ss < NSPLIT)[None, :]
        mlrow = (head[:, None] * NSPLIT + ss[None, :]) * 2
        m = tl.load(ml_ptr + mlrow, mask=mlmask, other=float("-inf"), cache_modifier=".cg")
        l = tl.load(ml_ptr + mlrow + 1, mask=mlmask, other=0.0, cache_modifier=".cg")
        mx = tl.max(m, axis=1)
        mx = tl.where(mx == float("-inf"), 0.0, mx)
        wgt = tl.exp(m - mx[:, None])                                # [G_PAD, NSPLIT_PAD]
        total = tl.sum(l * wgt, axis=1)
        total = tl.where(total > 0.0, total, 1.0)
        # every split's partial in one load: [G_PAD, NSPLIT_PAD, D_PAD]
        o = tl.load(opart_ptr + (head[:, None, None] * NSPLIT + ss[None, :, None]) * D + dd[None, None, :],
                    mask=mlmask[:, :, None] & (dd < D)[None, None, :], other=0.0, cache_modifier=".cg")
        acc = tl.sum(o * wgt[:, :, None], axis=1)
        out = acc / total[:, None]
        tl.store(attn_ptr + b * (HQ * D) + (g * G + hh)[:, None] * D + dd[None, :], out, mask=omask)
    return seen


@triton.jit
def reduce_kernel(opart_ptr, ml_ptr, attn_ptr, D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                  NSPLIT: tl.constexpr, D_PAD: tl.constexpr, G_PAD: tl.constexpr, NSPLIT_PAD: tl.constexpr):
    pid = tl.program_id(0)
    reduce_tile(pid, pid + 1, opart_ptr, ml_ptr, attn_ptr, ml_ptr, 0, D, HQ, HKV, NSPLIT, D_PAD, G_PAD,
                NSPLIT_PAD, False, 0)


def reduce(st, p, layer):
    reduce_kernel[(p.tiles(Op.REDUCE),)](st.opart, st.ml, st.attn, D=p.D, HQ=p.HQ, HKV=p.HKV, NSPLIT=p.NSPLIT,
                                         D_PAD=p.D_PAD, G_PAD=p.G_PAD, NSPLIT_PAD=p.NSPLIT_PAD,
                                         num_warps=st.num_warps)


def reduce_ref(st, p, layer, t0, t1):
    import torch
    G = p.HQ // p.HKV
    for t in range(t0, t1):
        b, g = t // p.HKV, t % p.HKV
        for h in range(g * G, (g + 1) * G):
            rows = slice((b * p.HQ + h) * p.NSPLIT, (b * p.HQ + h + 1) * p.NSPLIT)
            m, l, o = st.ml[rows, 0], st.ml[rows, 1], st.opart[rows]
            w = torch.exp(m - m.max())
            st.attn[b, h * p.D:(h + 1) * p.D] = (w[:, None] * o).sum(0) / (w * l).sum()

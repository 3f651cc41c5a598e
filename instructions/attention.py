"""ATTN: q/k RMSNorm, RoPE, KV-cache append and split-KV attention partials, fused.

Tile (b, g, s) takes sequence b's raw q rows of kv group g (G = Hq/Hkv heads) and its k and v
head from the QKV scratch, applies q_norm/k_norm per head and RoPE in Qwen's half-split form at
position p = lengths[b], and attends over split s of positions [0, p]. The splits are sized from
the current length at run time (``chunk = ceil(ceil((p+1)/NSPLIT)/BLOCK_S)*BLOCK_S``), so the
tape never changes while short contexts use few splits and long ones spread over every worker.
The split holding p appends the new k and v to the cache and attends to them from registers;
every other position comes from the cache, whose first block is loaded before the wait.
Outputs per head: the unnormalised o [D], the running max m and sum l; the last split of
(b, g) to finish combines them into ``attn`` (``reduce.py``).

Qwen3-0.6B: 8 kv heads x NSPLIT tiles per sequence; reads 2*chunk*128*2 bytes of cache per tile.
Matches ``Qwen3Attention`` (q_norm/k_norm, ``apply_rotary_pos_emb``, eager softmax in fp32).
"""

import triton
import triton.language as tl

from scheduler.ops import Op

from .common import wait_counter
from .reduce import reduce_group, reduce_ref


@triton.jit
def _kv_block(t, layer, lengths_ptr, kc_ptr, vc_ptr, dd, dmask, B: tl.constexpr, D: tl.constexpr,
              HKV: tl.constexpr, S: tl.constexpr, NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr):
    """Tile t's split: its first block of cached keys and values (positions before the new one,
    in the cache's dtype), where the split starts, where its cached positions end, and the cache
    offset of (b, g)."""
    s = t % NSPLIT
    g = (t // NSPLIT) % HKV
    b = t // (NSPLIT * HKV)
    pos = tl.load(lengths_ptr + b)
    chunk = tl.cdiv(tl.cdiv(pos + 1, NSPLIT), BLOCK_S) * BLOCK_S
    lo = s * chunk
    kv_end = tl.minimum(lo + chunk, pos)
    coff = ((layer * B + b) * HKV + g).to(tl.int64) * (S * D)
    kpos = lo + tl.arange(0, BLOCK_S)
    kvmask = (kpos < kv_end)[:, None] & dmask[None, :]
    off = coff + kpos[:, None] * D + dd[None, :]
    kt = tl.load(kc_ptr + off, mask=kvmask, other=0.0)
    vt = tl.load(vc_ptr + off, mask=kvmask, other=0.0)
    return kt, vt, lo, kv_end, coff


@triton.jit
def _attend(q, kt, vt, valid, m, l, acc, scale):
    """Online-softmax update of (max m, sum l, output acc) [G] with a block of keys/values."""
    kt = kt.to(tl.float32)
    vt = vt.to(tl.float32)
    sc = tl.sum(q[:, None, :] * kt[None, :, :], axis=2) * scale          # [G_PAD, BLOCK_S]
    sc = tl.where(valid[None, :], sc, float("-inf"))
    m_new = tl.maximum(m, tl.max(sc, axis=1))
    alpha = tl.exp(m - m_new)
    pr = tl.exp(sc - m_new[:, None])
    l = l * alpha + tl.sum(pr, axis=1)
    acc = acc * alpha[:, None] + tl.sum(pr[:, :, None] * vt[None, :, :], axis=1)
    return m_new, l, acc


@triton.jit
def attn_tile(t0, t1, layer, qkv_ptr, qn_ptr, kn_ptr, inv_freq_ptr, lengths_ptr, kc_ptr, vc_ptr,
              opart_ptr, ml_ptr, tickets_ptr, attn_ptr, eps, cnt_ptr, target,
              B: tl.constexpr, D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, S: tl.constexpr,
              NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr, D_PAD: tl.constexpr, G_PAD: tl.constexpr,
              NSPLIT_PAD: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr):
    G: tl.constexpr = HQ // HKV
    N: tl.constexpr = (HQ + 2 * HKV) * D
    HALF: tl.constexpr = D // 2
    dd = tl.arange(0, D_PAD)
    dmask = dd < D
    pd = (dd + HALF) % D                        # rotate_half partner of each element
    sign = tl.where(dd < HALF, -1.0, 1.0)
    inv_freq = tl.load(inv_freq_ptr + dd % HALF, mask=dmask, other=0.0)
    qn = tl.load(qn_ptr + layer * D + dd, mask=dmask, other=0.0).to(tl.float32)
    qn_p = tl.load(qn_ptr + layer * D + pd, mask=dmask, other=0.0).to(tl.float32)
    kn = tl.load(kn_ptr + layer * D + dd, mask=dmask, other=0.0).to(tl.float32)
    kn_p = tl.load(kn_ptr + layer * D + pd, mask=dmask, other=0.0).to(tl.float32)
    hh = tl.arange(0, G_PAD)
    hmask = hh < G
    qmask = hmask[:, None] & dmask[None, :]
    scale = 1.0 / tl.sqrt(D * 1.0)
    # The first tile's first KV block is loaded before the wait: positions before the new one
    # were written by earlier steps, so like weights they never wait on this step's producers.
    kt, vt, lo, kv_end, coff = _kv_block(t0, layer, lengths_ptr, kc_ptr, vc_ptr, dd, dmask,
                                         B, D, HKV, S, NSPLIT, BLOCK_S)
    seen = target
    if WAIT:
        seen = wait_counter(cnt_ptr, target, SPIN)
    for t in range(t0, t1):
        s = t % NSPLIT
        g = (t // NSPLIT) % HKV
        b = t // (NSPLIT * HKV)
        if t > t0:
            kt, vt, lo, kv_end, coff = _kv_block(t, layer, lengths_ptr, kc_ptr, vc_ptr, dd, dmask,
                                                 B, D, HKV, S, NSPLIT, BLOCK_S)
        pos = tl.load(lengths_ptr + b)
        hi = tl.minimum(lo + tl.cdiv(tl.cdiv(pos + 1, NSPLIT), BLOCK_S) * BLOCK_S, pos + 1)
        ang = pos.to(tl.float32) * inv_freq
        cos = tl.cos(ang)
        sin = tl.sin(ang)
        base = qkv_ptr + b * N
        qoff = (g * G + hh)[:, None] * D
        q = tl.load(base + qoff + dd[None, :], mask=qmask, other=0.0, cache_modifier=".cg")
        qp = tl.load(base + qoff + pd[None, :], mask=qmask, other=0.0, cache_modifier=".cg")
        # the new key and value: loaded with q so that all of this tile's reads are in flight at once
        kb = base + HQ * D + g * D
        k = tl.load(kb + dd, mask=dmask, other=0.0, cache_modifier=".cg")
        kp = tl.load(kb + pd, mask=dmask, other=0.0, cache_modifier=".cg")
        v = tl.load(base + (HQ + HKV) * D + g * D + dd, mask=dmask, other=0.0, cache_modifier=".cg")
        qr = 1.0 / tl.sqrt(tl.sum(q * q, axis=1) / D + eps)
        q = (q * qr[:, None] * qn[None, :]) * cos[None, :] + \
            sign[None, :] * (qp * qr[:, None] * qn_p[None, :]) * sin[None, :]
        m = tl.full([G_PAD], float("-inf"), tl.float32)
        l = tl.zeros([G_PAD], tl.float32)
        acc = tl.zeros([G_PAD, D_PAD], tl.float32)
        if lo < kv_end:
            for start in range(lo, kv_end, BLOCK_S):
                # the next block's loads go out before this block's math (double buffering)
                npos = start + BLOCK_S + tl.arange(0, BLOCK_S)
                noff = coff + npos[:, None] * D + dd[None, :]
                nmask = (npos < kv_end)[:, None] & dmask[None, :]
                kt_next = tl.load(kc_ptr + noff, mask=nmask, other=0.0)
                vt_next = tl.load(vc_ptr + noff, mask=nmask, other=0.0)
                m, l, acc = _attend(q, kt, vt, start + tl.arange(0, BLOCK_S) < kv_end, m, l, acc, scale)
                kt = kt_next
                vt = vt_next
        if (pos >= lo) & (pos < hi):
            # the new token: append its key and value, and attend to it from registers
            kr = 1.0 / tl.sqrt(tl.sum(k * k, axis=0) / D + eps)
            k_new = ((k * kr * kn) * cos + sign * (kp * kr * kn_p) * sin).to(kc_ptr.dtype.element_ty)
            v_new = v.to(vc_ptr.dtype.element_ty)
            tl.store(kc_ptr + coff + pos * D + dd, k_new, mask=dmask)
            tl.store(vc_ptr + coff + pos * D + dd, v_new, mask=dmask)
            sc = tl.sum(q * k_new.to(tl.float32)[None, :], axis=1) * scale        # [G_PAD]
            m_new = tl.maximum(m, sc)
            alpha = tl.exp(m - m_new)
            pr = tl.exp(sc - m_new)
            l = l * alpha + pr
            acc = acc * alpha[:, None] + pr[:, None] * v_new.to(tl.float32)[None, :]
            m = m_new
        row = (b * HQ + g * G + hh) * NSPLIT + s
        tl.store(opart_ptr + row[:, None] * D + dd[None, :], acc, mask=qmask)
        tl.store(ml_ptr + row * 2, m, mask=hmask)
        tl.store(ml_ptr + row * 2 + 1, l, mask=hmask)
        # publish the partial, take a ticket; the last split of this step combines all of them
        tl.debug_barrier()
        ticket = tl.atomic_add(tickets_ptr + b * HKV + g, 1, sem="acq_rel", scope="gpu")
        if ticket % NSPLIT == NSPLIT - 1:
            reduce_group(b, g, opart_ptr, ml_ptr, attn_ptr, D, HQ, HKV, NSPLIT, D_PAD, G_PAD, NSPLIT_PAD)
    return seen


@triton.jit
def attn_kernel(layer, qkv_ptr, qn_ptr, kn_ptr, inv_freq_ptr, lengths_ptr, kc_ptr, vc_ptr, opart_ptr, ml_ptr,
                tickets_ptr, attn_ptr, eps, B: tl.constexpr, D: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                S: tl.constexpr, NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr, D_PAD: tl.constexpr,
                G_PAD: tl.constexpr, NSPLIT_PAD: tl.constexpr):
    pid = tl.program_id(0)
    attn_tile(pid, pid + 1, layer, qkv_ptr, qn_ptr, kn_ptr, inv_freq_ptr, lengths_ptr, kc_ptr, vc_ptr,
              opart_ptr, ml_ptr, tickets_ptr, attn_ptr, eps, lengths_ptr, 0, B, D, HQ, HKV, S, NSPLIT, BLOCK_S,
              D_PAD, G_PAD, NSPLIT_PAD, False, 0)


def attention(st, p, layer):
    attn_kernel[(p.tiles(Op.ATTN),)](
        layer, st.qkv, st.w.q_norm, st.w.k_norm, st.inv_freq, st.lengths, st.k_cache, st.v_cache,
        st.opart, st.ml, st.tickets, st.attn, st.eps, B=p.B, D=p.D, HQ=p.HQ, HKV=p.HKV, S=p.S, NSPLIT=p.NSPLIT,
        BLOCK_S=p.BLOCK_S, D_PAD=p.D_PAD, G_PAD=p.G_PAD, NSPLIT_PAD=p.NSPLIT_PAD, num_warps=st.num_warps)


def attention_ref(st, p, layer, t0, t1):
    """Torch version of tiles [t0, t1), same split arithmetic, for the VM."""
    import torch

    from models.qwen3.reference import apply_rope, rmsnorm, rope_cos_sin
    G, D = p.HQ // p.HKV, p.D
    for t in range(t0, t1):
        s, g, b = t % p.NSPLIT, (t // p.NSPLIT) % p.HKV, t // (p.NSPLIT * p.HKV)
        pos = int(st.lengths[b])
        cos, sin = rope_cos_sin(torch.tensor([pos]), D, st.rope_theta, torch.float32)
        row = st.qkv[b]
        q = row[g * G * D:(g + 1) * G * D].view(G, D)
        k = row[p.HQ * D + g * D:p.HQ * D + (g + 1) * D].view(1, D)
        v = row[(p.HQ + p.HKV) * D + g * D:(p.HQ + p.HKV) * D + (g + 1) * D]
        q = apply_rope(rmsnorm(q, st.w.q_norm[layer].float(), st.eps), cos, sin)
        k = apply_rope(rmsnorm(k, st.w.k_norm[layer].float(), st.eps), cos, sin)[0]
        chunk = -(-(-(-(pos + 1) // p.NSPLIT)) // p.BLOCK_S) * p.BLOCK_S
        lo, hi = s * chunk, min(s * chunk + chunk, pos + 1)
        if lo <= pos < hi:
            st.k_cache[layer, b, g, pos] = k.to(st.k_cache.dtype)
            st.v_cache[layer, b, g, pos] = v.to(st.v_cache.dtype)
        rows = (b * p.HQ + g * G + torch.arange(G)) * p.NSPLIT + s
        if hi <= lo:
            st.opart[rows] = 0.0
            st.ml[rows, 0], st.ml[rows, 1] = float("-inf"), 0.0
        else:
            kk = st.k_cache[layer, b, g, lo:hi].float()
            vv = st.v_cache[layer, b, g, lo:hi].float()
            sc = (q @ kk.T) * D ** -0.5                       # [G, n]
            m = sc.max(dim=1).values
            pr = torch.exp(sc - m[:, None])
            st.opart[rows] = pr @ vv
            st.ml[rows, 0], st.ml[rows, 1] = m, pr.sum(dim=1)
        st.tickets[b * p.HKV + g] += 1
        if int(st.tickets[b * p.HKV + g]) % p.NSPLIT == 0:
            reduce_ref(st, p, b, g)

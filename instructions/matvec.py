"""OPROJ, GATEUP, DOWN, LMHEAD: the row-block GEMVs after attention, each with its epilogue.

- OPROJ  x[b] += Wo[layer] @ attn[b]                          (``o_proj`` + residual)
- GATEUP act[b] = silu(Wg h) * (Wu h), h = rmsnorm(x[b])*w   (``post_attention_layernorm`` + MLP in)
- DOWN   x[b] += Wd[layer] @ act[b]                           (``down_proj`` + residual)
- LMHEAD logits[b] = Wlm @ rmsnorm(x[b])*w_final, and per tile (max, first argmax) for ARGMAX

Qwen3-0.6B per layer: Wo [1024, 2048], Wg|Wu [6144, 1024], Wd [1024, 3072] bf16; the LM head
[151936, 1024] is 311 MB, a quarter of a step's bytes. A tile of R rows reads R*K*2 bytes (R*K and
its block scales where O, gate/up and down are FP8; the LM head stays in the model's dtype).
The tile's first weight chunk is loaded before the wait on its input (weights never depend on
activations), and each next tile's first chunk while the current one computes.
"""

import triton
import triton.language as tl

from scheduler.kinds import Op

from .batch_mma import batch_tiles
from .common import (ARGMAX, BT_BF16, BT_CALL, BT_SWAP, GATEUP, RESIDUAL, T_COMPUTED, T_FIRST, T_INPUT, T_WAITED, claim,
                     next_tile, stamp, wait_counter)
from .gemv import dot_rows2, load_nw, load_s, load_w, load_xn
from .kind import DeviceKind, split_rows, weight_rows
from .tiles import TICK_DOWN, TICK_GU, TICK_O, TICK_STRIDE, gemv_tile
from .wgmma import swap_tiles, swap_tiles_called


@triton.jit
def residual_tile(t0, t1, layer, in_ptr, w_base, ws_base, x_ptr, cnt_ptr, target,
                  B: tl.constexpr, N: tl.constexpr, K: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
                  SB: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr, BT: tl.constexpr, tr, TRACE: tl.constexpr,
                  POOL: tl.constexpr, claims_ptr, claims_base, kpart_ptr, tick_ptr, SK: tl.constexpr, xs_ptr,
                  xss_ptr, nw2_ptr):
    """x[b, rows] += W[layer, rows] @ in[b] (OPROJ with in = attn, DOWN with in = act); ``tick_ptr``:
    the stage's ticket words; the weights-on-M tile also writes the next stage's normalised input
    with the norm weight ``nw2`` (``tiles.gemv_tile``)."""
    return gemv_tile(t0, t1, w_base + tl.cast(layer, tl.int64) * (N * K),
                     ws_base + layer * ((N + SB - 1) // SB * ((K + 127) // 128)), in_ptr, in_ptr, 0.0, x_ptr, x_ptr,
                     cnt_ptr, target, B, N, K, R, BK, SB, False, RESIDUAL, WAIT, SPIN, BT, tr, TRACE,
                     POOL, claims_ptr, claims_base, kpart_ptr, tick_ptr, SK, xs_ptr, xss_ptr, nw2_ptr)


@triton.jit
def gateup_tile(t0, t1, layer, x_ptr, wgu_ptr, wgus_ptr, postnorm_ptr, act_ptr, eps, cnt_ptr, target,
                B: tl.constexpr, H: tl.constexpr, I: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
                SB: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr, BT: tl.constexpr, tr, TRACE: tl.constexpr,
                POOL: tl.constexpr, claims_ptr, claims_base, kpart_ptr, kticks_ptr, SK: tl.constexpr, xs_ptr,
                xss_ptr):
    """Tiles [t0, t1) of gate and up, then with a POOL the pool's tiles as ``gemv_tile`` takes them."""
    if BT >= BT_SWAP:     # (else-chains, not early returns: the code after a return is still compiled)
        g_ptr = wgu_ptr + tl.cast(layer, tl.int64) * (2 * I * H)
        gs_ptr, us_ptr = _gateup_scales(wgus_ptr, layer, H, I, SB)
        seen = (swap_tiles_called if (BT // BT_CALL) % 2 == 1 else swap_tiles)(
            t0, t1, g_ptr, g_ptr + I * H, gs_ptr, us_ptr, xs_ptr, xss_ptr, eps, act_ptr, act_ptr, kpart_ptr,
            kticks_ptr + TICK_GU * TICK_STRIDE, x_ptr, xs_ptr, cnt_ptr, target, B, I, H, R, SK, SB, True, True, GATEUP,
            False, WAIT, SPIN, BT - BT_SWAP, POOL, claims_ptr, claims_base)
    elif BT:
        seen = gateup_batch(t0, t1, layer, x_ptr, wgu_ptr, wgus_ptr, postnorm_ptr, act_ptr, eps, cnt_ptr, target,
                            B, H, I, R, BK, SB, WAIT, SPIN, BT == BT_BF16)
    else:
        seen = gateup_rows_tiles(t0, t1, layer, x_ptr, wgu_ptr, wgus_ptr, postnorm_ptr, act_ptr, eps, cnt_ptr,
                                 target, B, H, I, R, BK, SB, WAIT, SPIN, tr, TRACE, POOL, claims_ptr, claims_base)
    return seen


@triton.jit
def gateup_rows_tiles(t0, t1, layer, x_ptr, wgu_ptr, wgus_ptr, postnorm_ptr, act_ptr, eps, cnt_ptr, target,
                      B: tl.constexpr, H: tl.constexpr, I: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
                      SB: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr, tr, TRACE: tl.constexpr,
                      POOL: tl.constexpr, claims_ptr, claims_base):
    """``gateup_tile``'s tiles with their weights in registers, looping over the B input rows."""
    g_ptr = wgu_ptr + tl.cast(layer, tl.int64) * (2 * I * H)
    u_ptr = g_ptr + I * H
    gs_ptr, us_ptr = _gateup_scales(wgus_ptr, layer, H, I, SB)
    nw_ptr = postnorm_ptr + layer * H
    NT: tl.constexpr = (I + R - 1) // R
    if POOL > 0:
        c = claim(claims_ptr)
        row_end = I
    else:
        row_end = tl.minimum(t1 * R, I)
    g0 = load_w(g_ptr, t0 * R, row_end, H, 0, R, BK)
    u0 = load_w(u_ptr, t0 * R, row_end, H, 0, R, BK)
    gs0 = load_s(g_ptr, gs_ptr, t0 * R, row_end, H, 0, R, BK, SB)
    us0 = load_s(u_ptr, us_ptr, t0 * R, row_end, H, 0, R, BK, SB)
    nw0 = load_nw(nw_ptr, H, BK, True)
    seen = target
    if WAIT:
        seen = wait_counter(cnt_ptr, target, SPIN)
    stamp(tr, T_WAITED, seen, TRACE)
    xn0, rstd = load_xn(x_ptr, nw_ptr, nw0, eps, H, BK, True)
    stamp(tr, T_INPUT, rstd, TRACE)
    if POOL > 0:
        t = t0
        while t < NT:
            nt, c = next_tile(t, t1, c, claims_ptr, claims_base, NT, POOL)
            g_next = load_w(g_ptr, nt * R, row_end, H, 0, R, BK)
            u_next = load_w(u_ptr, nt * R, row_end, H, 0, R, BK)
            gs_next = load_s(g_ptr, gs_ptr, nt * R, row_end, H, 0, R, BK, SB)
            us_next = load_s(u_ptr, us_ptr, nt * R, row_end, H, 0, R, BK, SB)
            _gateup_rows(t, g0, u0, gs0, us0, xn0, rstd, row_end, g_ptr, u_ptr, gs_ptr, us_ptr, x_ptr, nw_ptr, nw0,
                         act_ptr, eps, B, H, I, R, BK, SB, t == t0, tr, TRACE)
            g0 = g_next
            u0 = u_next
            gs0 = gs_next
            us0 = us_next
            t = nt
    else:
        for t in range(t0, t1):
            g_next = load_w(g_ptr, (t + 1) * R, row_end, H, 0, R, BK)
            u_next = load_w(u_ptr, (t + 1) * R, row_end, H, 0, R, BK)
            gs_next = load_s(g_ptr, gs_ptr, (t + 1) * R, row_end, H, 0, R, BK, SB)
            us_next = load_s(u_ptr, us_ptr, (t + 1) * R, row_end, H, 0, R, BK, SB)
            _gateup_rows(t, g0, u0, gs0, us0, xn0, rstd, row_end, g_ptr, u_ptr, gs_ptr, us_ptr, x_ptr, nw_ptr, nw0,
                         act_ptr, eps, B, H, I, R, BK, SB, t == t0, tr, TRACE)
            g0 = g_next
            u0 = u_next
            gs0 = gs_next
            us0 = us_next
    return seen


@triton.jit
def _gateup_rows(t, g0, u0, gs0, us0, xn0, rstd, row_end, g_ptr, u_ptr, gs_ptr, us_ptr, x_ptr, nw_ptr, nw0, act_ptr,
                 eps, B: tl.constexpr, H: tl.constexpr, I: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
                 SB: tl.constexpr, first, tr, TRACE: tl.constexpr):
    """Tile t of ``gateup_tile`` from its first gate and up weight chunks (and their FP8 scales)."""
    rows = t * R + tl.arange(0, R)
    for b in range(B):
        if B > 1:
            xn0, rstd = load_xn(x_ptr + b * H, nw_ptr, nw0, eps, H, BK, True)
        gate, up = dot_rows2(g_ptr, u_ptr, gs_ptr, us_ptr, g0, u0, gs0, us0, xn0, t * R, row_end, H, x_ptr + b * H,
                             nw_ptr, rstd, True, R, BK, SB, True)
        act = gate / (1.0 + tl.exp(-gate)) * up
        if TRACE == 1:     # per tile (not in the light trace, TRACE 2)
            stamp(tr, T_COMPUTED, tl.sum(act, axis=0), TRACE)
            if first:
                stamp(tr, T_FIRST, tl.sum(act, axis=0), TRACE)
        tl.store(act_ptr + b * I + rows, act, mask=rows < row_end)


@triton.jit
def _gateup_scales(wgus_ptr, layer, H: tl.constexpr, I: tl.constexpr, SB: tl.constexpr):
    """FP8: (gate's, up's) scale grids of ``layer``, I / SB rows of H / 128 scales each."""
    KB: tl.constexpr = (H + 127) // 128
    gs_ptr = wgus_ptr + layer * (2 * I // SB * KB)
    return gs_ptr, gs_ptr + I // SB * KB


@triton.jit
def gateup_batch(t0, t1, layer, x_ptr, wgu_ptr, wgus_ptr, postnorm_ptr, act_ptr, eps, cnt_ptr, target,
                 B: tl.constexpr, H: tl.constexpr, I: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
                 SB: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr, XBF16: tl.constexpr):
    """``gateup_tile`` for batched plans: gate and up weights read once per tile for all B rows, which
    share each K-chunk's input load (``batch_mma.batch_tiles``)."""
    g_ptr = wgu_ptr + tl.cast(layer, tl.int64) * (2 * I * H)
    gs_ptr, us_ptr = _gateup_scales(wgus_ptr, layer, H, I, SB)
    return batch_tiles(t0, t1, g_ptr, g_ptr + I * H, gs_ptr, us_ptr, x_ptr, postnorm_ptr + layer * H, eps, act_ptr,
                       act_ptr, cnt_ptr, target, B, I, H, R, SB, True, True, GATEUP, WAIT, SPIN, XBF16)


@triton.jit
def lmhead_tile(t0, t1, x_ptr, lm_ptr, fnorm_ptr, logits_ptr, amax_ptr, eps, cnt_ptr, target,
                B: tl.constexpr, H: tl.constexpr, V: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
                WAIT: tl.constexpr, SPIN: tl.constexpr, BT: tl.constexpr, tr, TRACE: tl.constexpr,
                POOL: tl.constexpr, claims_ptr, claims_base, xs_ptr, xss_ptr):
    # the LM head stays in the model's dtype: its pointer stands in for the scales, which are not read
    return gemv_tile(t0, t1, lm_ptr, lm_ptr, x_ptr, fnorm_ptr, eps, logits_ptr, amax_ptr, cnt_ptr, target,
                     B, V, H, R, BK, 128, True, ARGMAX, WAIT, SPIN, BT, tr, TRACE, POOL, claims_ptr, claims_base,
                     logits_ptr, amax_ptr, 1, xs_ptr, xss_ptr, x_ptr)     # no K-splits: row blocks enough


# The per-op kernels: a program per tile, no wait, no trace and no pool (POOL 0).
@triton.jit
def oproj_kernel(layer, attn_ptr, wo_ptr, x_ptr, wo_scale_ptr, B: tl.constexpr, H: tl.constexpr, HQ: tl.constexpr,
                 D: tl.constexpr, R_O: tl.constexpr, BK_Q: tl.constexpr, SCALE_ROWS: tl.constexpr,
                 BT: tl.constexpr, kpart_ptr, kticks_ptr, SK_O: tl.constexpr, xs_ptr, xss_ptr, post_norm_ptr):
    pid = tl.program_id(0)
    residual_tile(pid, pid + 1, layer, attn_ptr, wo_ptr, wo_scale_ptr, x_ptr, cnt_ptr=attn_ptr, target=0, B=B, N=H,
                  K=HQ * D, R=R_O, BK=BK_Q, SB=SCALE_ROWS, WAIT=False, SPIN=0, BT=BT, tr=x_ptr, TRACE=False, POOL=0,
                  claims_ptr=x_ptr, claims_base=0, kpart_ptr=kpart_ptr, tick_ptr=kticks_ptr + TICK_O * TICK_STRIDE,
                  SK=SK_O, xs_ptr=xs_ptr, xss_ptr=xss_ptr, nw2_ptr=post_norm_ptr + layer * H)


@triton.jit
def down_kernel(layer, act_ptr, wdown_ptr, x_ptr, wdown_scale_ptr, B: tl.constexpr, H: tl.constexpr,
                I: tl.constexpr, R_DOWN: tl.constexpr, BK_I: tl.constexpr, SCALE_ROWS: tl.constexpr,
                BT: tl.constexpr, kpart_ptr, kticks_ptr, SK_DOWN: tl.constexpr, xs_ptr, xss_ptr, input_norm_ptr,
                final_norm_ptr, L: tl.constexpr):
    pid = tl.program_id(0)
    residual_tile(pid, pid + 1, layer, act_ptr, wdown_ptr, wdown_scale_ptr, x_ptr, cnt_ptr=act_ptr, target=0, B=B,
                  N=H, K=I, R=R_DOWN, BK=BK_I, SB=SCALE_ROWS, WAIT=False, SPIN=0, BT=BT, tr=x_ptr, TRACE=False, POOL=0,
                  claims_ptr=x_ptr, claims_base=0, kpart_ptr=kpart_ptr, tick_ptr=kticks_ptr + TICK_DOWN * TICK_STRIDE,
                  SK=SK_DOWN, xs_ptr=xs_ptr, xss_ptr=xss_ptr,
                  nw2_ptr=next_norm(layer, input_norm_ptr, final_norm_ptr, H, L))


@triton.jit
def gateup_kernel(layer, x_ptr, wgate_up_ptr, wgate_up_scale_ptr, post_norm_ptr, act_ptr, eps, B: tl.constexpr,
                  H: tl.constexpr, I: tl.constexpr, R_GU: tl.constexpr, BK_H: tl.constexpr,
                  SCALE_ROWS: tl.constexpr, BT: tl.constexpr, kpart_ptr, kticks_ptr, SK_GU: tl.constexpr, xs_ptr,
                  xss_ptr):
    pid = tl.program_id(0)
    gateup_tile(pid, pid + 1, layer, x_ptr, wgate_up_ptr, wgate_up_scale_ptr, post_norm_ptr, act_ptr, eps,
                cnt_ptr=x_ptr, target=0, B=B, H=H, I=I, R=R_GU, BK=BK_H, SB=SCALE_ROWS, WAIT=False, SPIN=0, BT=BT,
                tr=x_ptr, TRACE=False, POOL=0, claims_ptr=x_ptr, claims_base=0, kpart_ptr=kpart_ptr,
                kticks_ptr=kticks_ptr, SK=SK_GU, xs_ptr=xs_ptr, xss_ptr=xss_ptr)


@triton.jit
def lmhead_kernel(x_ptr, lm_head_ptr, final_norm_ptr, logits_ptr, amax_ptr, eps, B: tl.constexpr,
                  H: tl.constexpr, V: tl.constexpr, R_LM: tl.constexpr, BK_H: tl.constexpr, BT: tl.constexpr, xs_ptr,
                  xss_ptr):
    pid = tl.program_id(0)
    lmhead_tile(pid, pid + 1, x_ptr, lm_head_ptr, final_norm_ptr, logits_ptr, amax_ptr, eps, cnt_ptr=x_ptr,
                target=0, B=B, H=H, V=V, R=R_LM, BK=BK_H, WAIT=False, SPIN=0, BT=BT, tr=x_ptr, TRACE=False,
                POOL=0, claims_ptr=x_ptr, claims_base=0, xs_ptr=xs_ptr, xss_ptr=xss_ptr)


@triton.jit
def next_norm(layer, input_norm_ptr, final_norm_ptr, H: tl.constexpr, L: tl.constexpr):
    """The norm weight of the stage after layer ``layer``'s down projection: the next layer's input
    norm, or after the last layer the final norm (the LM head's)."""
    if layer + 1 < L:
        p = input_norm_ptr + (layer + 1) * H
    else:
        p = final_norm_ptr
    return p


def _rows(t0, t1, R, N):
    return slice(t0 * R, min(t1 * R, N))


def oproj_ref(st, p, layer, t0, t1):
    r = split_rows(t0, t1, p.R_O, p.SK_O, p.H)
    if r is not None:
        st.x[:, r] += st.attn.float() @ weight_rows(st, p, "wo", layer, r).T


def gateup_ref(st, p, layer, t0, t1):
    import torch.nn.functional as F

    from models.qwen3.reference import rmsnorm
    r = split_rows(t0, t1, p.R_GU, p.SK_GU, p.I)
    if r is None:
        return
    h = rmsnorm(st.x, st.post_norm[layer].float(), st.eps)
    gate = h @ weight_rows(st, p, "wgate_up", layer, r).T
    up = h @ weight_rows(st, p, "wgate_up", layer, slice(p.I + r.start, p.I + r.stop)).T
    st.act[:, r] = F.silu(gate) * up


def down_ref(st, p, layer, t0, t1):
    r = split_rows(t0, t1, p.R_DOWN, p.SK_DOWN, p.H)
    if r is not None:
        st.x[:, r] += st.act.float() @ weight_rows(st, p, "wdown", layer, r).T


def lmhead_ref(st, p, layer, t0, t1):
    import torch

    from models.qwen3.reference import rmsnorm

    from .common import argmax_key_ref
    h = rmsnorm(st.x, st.final_norm.float(), st.eps)
    for t in range(t0, t1):
        r = _rows(t, t + 1, p.R_LM, p.V)
        lg = h @ st.lm_head[r].float().T
        st.logits[:, r] = lg
        best, idx = lg.max(dim=1)     # the first maximum
        st.amax.copy_(torch.maximum(st.amax, argmax_key_ref(best, idx + r.start)))


KINDS = (
    DeviceKind(Op.OPROJ, residual_tile, oproj_kernel, oproj_ref, reads=("attn", "wo", "wo_scale", "x", "post_norm"),
               writes=("x", "xs", "xss", "kpart", "kticks")),
    DeviceKind(Op.GATEUP, gateup_tile, gateup_kernel, gateup_ref,
               reads=("x", "xs", "xss", "wgate_up", "wgate_up_scale", "post_norm"),
               writes=("act", "kpart", "kticks")),
    DeviceKind(Op.DOWN, residual_tile, down_kernel, down_ref,
               reads=("act", "wdown", "wdown_scale", "x", "input_norm", "final_norm"),
               writes=("x", "xs", "xss", "kpart", "kticks")),
    DeviceKind(Op.LMHEAD, lmhead_tile, lmhead_kernel, lmhead_ref, reads=("x", "xs", "xss", "lm_head", "final_norm", "amax"),
               writes=("logits", "amax")),
)

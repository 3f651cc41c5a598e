"""QKV: qkv[b] = Wqkv[layer] @ rmsnorm(x[b]) * input_norm[layer], the fused q|k|v projection
with the input RMSNorm recomputed inside each tile (the vector is only hidden_size long, so every
tile recomputing it costs an L2 read instead of a dependent step).

Qwen3-0.6B: x [1, 1024] fp32, Wqkv [28, 4096, 1024] bf16 -> qkv [1, 4096] bf16 (raw projections,
summed in fp32; q/k norm and RoPE happen in ATTN). Reads R*H*2 bytes of weights per tile (R*H with
FP8 weights, plus their scales). Matches
``Qwen3Attention.{q,k,v}_proj`` after ``input_layernorm``.
"""

import triton
import triton.language as tl

from scheduler.kinds import Op

from .common import STORE
from .kind import DeviceKind, split_rows
from .tiles import TICK_QKV, TICK_STRIDE, gemv_tile


@triton.jit
def qkv_tile(t0, t1, layer, x_ptr, wqkv_ptr, wqkv_s_ptr, innorm_ptr, qkv_ptr, eps, cnt_ptr, target,
             B: tl.constexpr, H: tl.constexpr, N: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
             SB: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr, BT: tl.constexpr, tr, TRACE: tl.constexpr,
             kpart_ptr, kticks_ptr, SK: tl.constexpr, xs_ptr, xss_ptr):
    # (FP8: the layer's scale grid, (N / SB) x (H / 128), follows the previous layer's)
    return gemv_tile(t0, t1, wqkv_ptr + tl.cast(layer, tl.int64) * (N * H),
                     wqkv_s_ptr + layer * ((N + SB - 1) // SB * ((H + 127) // 128)), x_ptr, innorm_ptr + layer * H,
                     eps, qkv_ptr, qkv_ptr, cnt_ptr, target, B, N, H, R, BK, SB, True, STORE, WAIT, SPIN, BT, tr,
                     TRACE, 0, cnt_ptr, 0, kpart_ptr, kticks_ptr + TICK_QKV * TICK_STRIDE, SK, xs_ptr, xss_ptr, x_ptr)
    # (no pool: attention waits on each kv group's QKV tiles)


@triton.jit
def qkv_kernel(layer, x_ptr, wqkv_ptr, wqkv_scale_ptr, input_norm_ptr, qkv_ptr, eps, B: tl.constexpr,
               H: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, R_QKV: tl.constexpr,
               BK_H: tl.constexpr, SCALE_ROWS: tl.constexpr, BT: tl.constexpr, kpart_ptr, kticks_ptr,
               SK_QKV: tl.constexpr, xs_ptr, xss_ptr):
    pid = tl.program_id(0)
    qkv_tile(pid, pid + 1, layer, x_ptr, wqkv_ptr, wqkv_scale_ptr, input_norm_ptr, qkv_ptr, eps, cnt_ptr=x_ptr,
             target=0, B=B, H=H, N=(HQ + 2 * HKV) * D, R=R_QKV, BK=BK_H, SB=SCALE_ROWS, WAIT=False, SPIN=0,
             BT=BT, tr=x_ptr, TRACE=False, kpart_ptr=kpart_ptr, kticks_ptr=kticks_ptr, SK=SK_QKV,
             xs_ptr=xs_ptr, xss_ptr=xss_ptr)


def qkv_ref(st, p, layer, t0, t1):
    from models.qwen3.reference import rmsnorm

    from .kind import weight_rows
    rows = split_rows(t0, t1, p.R_QKV, p.SK_QKV, p.QKV_ROWS)
    if rows is not None:
        h = rmsnorm(st.x, st.input_norm[layer].float(), st.eps)
        st.qkv[:, rows] = h @ weight_rows(st, p, "wqkv", layer, rows).T


KINDS = (DeviceKind(Op.QKV, qkv_tile, qkv_kernel, qkv_ref,
                    reads=("x", "xs", "xss", "wqkv", "wqkv_scale", "input_norm"), writes=("qkv", "kpart", "kticks")),)

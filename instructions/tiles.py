"""The GEMV tiles' dispatch: which tile family runs a projection's tiles, by the plan's ``BT``.

- 0: the register tiles (``gemv.gemv_rows_tiles``; batch 1, and the per-sequence loop);
- BT_SPLIT, BT_BF16: the batch-on-M tile (``batch_mma.batch_tiles``, mma.sync);
- BT_SWAP, BT_SWAP_BF16, BT_SWAP_FP8: the weights-on-M tile (``instructions.wgmma``, wgmma on Hopper).
The second of each feeds the MMA one bf16 input operand instead of a split one; the third, with FP8
weights, e4m3 inputs (w8a8).
"""

import triton
import triton.language as tl

from .batch_mma import gemv_batch
from .common import BT_BF16, BT_CALL, BT_SWAP, RESIDUAL
from .gemv import gemv_rows_tiles
from .wgmma import swap_tiles, swap_tiles_called

# The ticket words of the K-split stages (``kticks``): a row of TICK_STRIDE words for each of QKV,
# O (and OPART), gate/up, down (and DPART), one word a row block.
TICK_STRIDE: tl.constexpr = tl.constexpr(4096)
TICK_QKV: tl.constexpr = tl.constexpr(0)
TICK_O: tl.constexpr = tl.constexpr(1)
TICK_GU: tl.constexpr = tl.constexpr(2)
TICK_DOWN: tl.constexpr = tl.constexpr(3)


@triton.jit
def gemv_tile(t0, t1, w_ptr, ws_ptr, in_ptr, nw_ptr, eps, out_ptr, aux_ptr, cnt_ptr, target,
              B: tl.constexpr, N: tl.constexpr, K: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
              SB: tl.constexpr, NORM: tl.constexpr, EPI: tl.constexpr, WAIT: tl.constexpr, SPIN: tl.constexpr,
              BT: tl.constexpr, tr, TRACE: tl.constexpr, POOL: tl.constexpr, claims_ptr, claims_base,
              kpart_ptr, tick_ptr, SK: tl.constexpr, xs_ptr, xss_ptr, nw2_ptr):
    """Tiles [t0, t1) of a row-major [N, K] GEMV over each of B input rows (RMS-normalised with
    weight ``nw`` when NORM), with the epilogue EPI (FP8 weights with their scales ``ws`` at SB
    rows a scale row). The register tiles hold R rows and, with a POOL (the op's last POOL tiles,
    ``scheduler/ops.py``), go on to pool tiles claimed from ``claims_ptr``, as the weights-on-M tile
    does; the batch-on-M tile has no pools. The weights-on-M tile's tiles are R-row blocks times SK
    K-splits, whose partials meet in ``kpart`` under the ticket words at ``tick_ptr``; it reads a
    normalised input from ``xs`` and
    ``xss`` (not ``in_ptr`` and ``nw``), and a RESIDUAL epilogue writes them for the next normalised
    stage with the norm weight ``nw2`` (``instructions.wgmma``)."""
    if BT >= BT_SWAP:     # (else-chains, not early returns: the code after a return is still compiled)
        if NORM:
            x_in = xs_ptr
        else:
            x_in = in_ptr
        seen = (swap_tiles_called if (BT // BT_CALL) % 2 == 1 else swap_tiles)(
            t0, t1, w_ptr, w_ptr, ws_ptr, ws_ptr, x_in, xss_ptr, eps, out_ptr, aux_ptr, kpart_ptr, tick_ptr, nw2_ptr,
            xs_ptr, cnt_ptr, target, B, N, K, R, SK, SB, NORM, False, EPI, EPI == RESIDUAL, WAIT, SPIN, BT - BT_SWAP,
            POOL, claims_ptr, claims_base)
    elif BT:
        seen = gemv_batch(t0, t1, w_ptr, ws_ptr, in_ptr, nw_ptr, eps, out_ptr, aux_ptr, cnt_ptr, target,
                          B, N, K, R, BK, SB, NORM, EPI, WAIT, SPIN, BT == BT_BF16)
    else:
        seen = gemv_rows_tiles(t0, t1, w_ptr, ws_ptr, in_ptr, nw_ptr, eps, out_ptr, aux_ptr, cnt_ptr, target,
                               B, N, K, R, BK, SB, NORM, EPI, WAIT, SPIN, tr, TRACE, POOL, claims_ptr, claims_base)
    return seen

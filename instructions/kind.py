"""The device half of an instruction kind, which each ``instructions/<module>.py`` declares.

The plain-data half (opcode, tiles, bytes per tile, pool) is the kind's row in
``scheduler.kinds``; ``instructions.registry`` pairs every row with the ``DeviceKind`` its module
declares in ``KINDS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class DeviceKind:
    op: int                     # scheduler.kinds.Op
    tile: object                # @triton.jit tile function the persistent kernel dispatches to
    kernel: object              # @triton.jit per-op kernel: one program per tile of a stage (None: ``host``)
    reference: Callable         # torch version of tiles [t0, t1): fn(st, plan, layer, t0, t1)
    reads: tuple[str, ...]      # step buffers (``megakernel.buffers.SPEC``) its tiles read
    writes: tuple[str, ...]     # ... and write
    num_warps: int | None = None    # the per-op kernel's warps, where fixed (else the backend's)
    # the per-op backends' step of a kind that is no kernel there: fn(st, plan, layer) on the host
    # between launches (REDUCE: torch.distributed's all-reduce)
    host: Callable | None = None


def weight_rows(st, plan, name: str, layer: int, rows: slice):
    """Rows ``rows`` of layer ``layer``'s projection ``name`` as float32 for a torch reference:
    FP8 weights (``plan.FP8``) dequantized from their scale grid ``<name>_scale`` as the tiles do."""
    w = st[name]
    if not plan.FP8:
        return w[layer, rows].float()
    from models.qwen3.fp8 import dequantize_grid
    sb = plan.SCALE_ROWS
    g0 = rows.start // sb
    part = dequantize_grid(w[layer, g0 * sb:rows.stop], st[name + "_scale"][layer, g0:], sb)
    return part[rows.start - g0 * sb:]


def split_rows(t0: int, t1: int, R: int, SK: int, N: int) -> slice | None:
    """The rows a torch reference of tiles [t0, t1) computes where a stage's tiles are R-row blocks
    times SK K-splits (tile t: block t // SK, split t % SK): the whole rows of every block whose last
    split is among them (the kernels' last split finishes its block), None where there are none.
    Instructions hold consecutive tiles, so these blocks are consecutive."""
    blocks = [b for b in range(t0 // SK, (t1 - 1) // SK + 1) if t0 <= b * SK + SK - 1 < t1]
    if not blocks:
        return None
    return slice(blocks[0] * R, min((blocks[-1] + 1) * R, N))

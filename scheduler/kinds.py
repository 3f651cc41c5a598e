"""The registry of instruction kinds: the plain-data half of each kind, which the scheduler needs.

One row per kind: its opcode, the ``instructions`` module that holds its device half (the tile
function, the per-op kernel, the buffers it reads and writes, the torch reference; see
``instructions.registry``), how many tiles one instruction of it can cover in a plan, the bytes one
tile reads (what the scheduler balances), the plan field of its pool (``ops`` module doc) and
whether it runs once per layer. Nothing here imports Triton or the instruction modules, so the
scheduler stays testable in milliseconds.

Adding a kind: a row below, its module in ``instructions/`` (docs/design.md, "Adding an
instruction kind").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Kind:
    name: str                                  # the opcode's name (``Op.<name>``)
    opcode: int
    module: str                                # instructions.<module> declares its device half
    tiles: Callable[..., int]                  # plan -> tiles of one layer's stage
    tile_bytes: Callable[..., int]             # (plan, itemsize) -> bytes one tile reads
    pool: str | None = None                    # the plan field of its pool, if it can have one
    per_layer: bool = False                    # a stage per layer (else one per step)
    stages_per_layer: int = 1                  # a per-layer kind's stages a layer (its layer word's range / L)


def weight_bytes(p, rows: int, k: int, itemsize: int) -> int:
    """Bytes of ``rows`` rows of a [N, k] projection: ``itemsize`` a weight, or with the plan's FP8
    one byte a weight plus the float32 scales of the scale rows they touch."""
    if not p.FP8:
        return rows * k * itemsize
    return rows * k + cdiv(rows, p.SCALE_ROWS) * cdiv(k, 128) * 4


# In step order. Opcodes are the tape's first word; 0 (NOOP) and BARRIER (``CONTROL``) are not kinds.
KINDS: tuple[Kind, ...] = (
    Kind("EMBED", 1, "embed", lambda p: p.B, lambda p, it: p.H * it),
    Kind("QKV", 2, "qkv", lambda p: cdiv(p.QKV_ROWS, p.R_QKV) * p.SK_QKV,
         lambda p, it: weight_bytes(p, p.R_QKV, p.H // p.SK_QKV, it),
         per_layer=True),
    Kind("ATTN", 3, "attention", lambda p: p.B * p.HKV * p.NSPLIT // p.ATTN_PAIR,
         lambda p, it: 2 * cdiv(p.S, p.NSPLIT) * p.D * p.ATTN_PAIR * it, per_layer=True),
    Kind("OPROJ", 4, "matvec", lambda p: cdiv(p.H, p.R_O) * p.SK_O,
         lambda p, it: weight_bytes(p, p.R_O, p.HQ * p.D // p.SK_O, it),
         "POOL_O", True),
    Kind("GATEUP", 5, "matvec", lambda p: cdiv(p.I, p.R_GU) * p.SK_GU,
         lambda p, it: 2 * weight_bytes(p, p.R_GU, p.H // p.SK_GU, it),
         "POOL_GU", True),
    Kind("DOWN", 6, "matvec", lambda p: cdiv(p.H, p.R_DOWN) * p.SK_DOWN,
         lambda p, it: weight_bytes(p, p.R_DOWN, p.I // p.SK_DOWN, it),
         "POOL_DOWN", True),
    Kind("LMHEAD", 7, "matvec", lambda p: cdiv(p.V, p.R_LM), lambda p, it: p.R_LM * p.H * it, "POOL_LM"),
    Kind("ARGMAX", 8, "argmax", lambda p: p.B, lambda p, it: 8 * cdiv(p.V, p.R_LM)),
    # Sampling on the device (plans with SAMPLE=1, ``instructions/sample.py``): between the LM head
    # and ARGMAX, two stages of a tile per (sequence, chunk of SAMPLE_CHUNK logits), each reading
    # its chunk once, then a tile per sequence that draws over the candidates
    Kind("SSTATS", 14, "sample", lambda p: p.B * cdiv(p.V, p.SAMPLE_CHUNK), lambda p, it: 4 * p.SAMPLE_CHUNK),
    Kind("SPICK", 15, "sample", lambda p: p.B * cdiv(p.V, p.SAMPLE_CHUNK), lambda p, it: 4 * p.SAMPLE_CHUNK),
    Kind("SAMPLE", 13, "sample", lambda p: p.B, lambda p, it: 8 * 1024),
    # Tensor parallelism (plans with TP > 1, ``instructions/allreduce.py``): O and down write this
    # rank's partial sums instead of adding into x, and REDUCE adds every rank's into x. A REDUCE
    # stage follows each of them; its instructions' layer word is the partial's slot, 2 l (after O)
    # or 2 l + 1 (after down).
    Kind("OPART", 10, "allreduce", lambda p: cdiv(p.H, p.R_O) * p.SK_O,
         lambda p, it: weight_bytes(p, p.R_O, p.HQ * p.D // p.SK_O, it),
         "POOL_O", True),
    Kind("DPART", 11, "allreduce", lambda p: cdiv(p.H, p.R_DOWN) * p.SK_DOWN,
         lambda p, it: weight_bytes(p, p.R_DOWN, p.I // p.SK_DOWN, it),
         "POOL_DOWN", True),
    Kind("REDUCE", 12, "allreduce", lambda p: cdiv(p.H, p.R_AR), lambda p, it: p.TP * p.B * p.R_AR * 4,
         per_layer=True, stages_per_layer=2),
)

# Tape words that are not kinds: padding, and the superkernel's grid-wide barrier (the persistent
# kernel runs it itself).
CONTROL = {"NOOP": 0, "BARRIER": 9}

Op = enum.IntEnum("Op", sorted({**CONTROL, **{k.name: k.opcode for k in KINDS}}.items(), key=lambda kv: kv[1]))
Op.__doc__ = "Opcodes: the registry's kinds and the control words (``CONTROL``)."
Op.__module__ = __name__

BY_OP: dict[int, Kind] = {k.opcode: k for k in KINDS}


def kind(op) -> Kind:
    """The registry row of opcode ``op`` (KeyError for NOOP, BARRIER or an unknown opcode)."""
    return BY_OP[int(op)]


def _check():
    codes = [k.opcode for k in KINDS] + list(CONTROL.values())
    names = [k.name for k in KINDS] + list(CONTROL)
    if len(set(codes)) != len(codes) or len(set(names)) != len(names):
        raise ValueError("scheduler.kinds: every kind needs an opcode and a name of its own")


_check()

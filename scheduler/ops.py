"""The instruction set as plain data: opcodes, the tile plan, and what one instruction costs.

An instruction is eight int32 words::

    op, layer, tile_start, tile_end, wait_counter, wait_per_step, signal_counter, pool

It runs tiles ``[tile_start, tile_end)`` of op ``op`` in layer ``layer``. Before reading its input
it waits until ``counters[wait_counter] >= wait_per_step * (step + 1)`` (counters only grow, so no
reset is needed between steps; counter 0 is never raised and ``wait_per_step`` 0 means "no
wait"); after its last store it adds 1 to ``counters[signal_counter]`` (-1: signals nothing).

A stage with a *pool* (the plan's ``POOL_O``, ``POOL_GU``, ``POOL_DOWN``, ``POOL_LM``: that many of
its last tiles) leaves those tiles to no instruction. Each of the stage's instructions, after its
own tiles, claims pool tiles one at a time from a claims counter until the pool is empty, so the
workers whose memory is fastest that step take more of them and the stage ends when the mean
worker would, not the slowest (see docs/performance.md). The pool word is
``pool_counter | pool_claims << 16``: the claims counter (which nothing waits on or signals) and
the claims one step makes (every instruction claims once more than it takes, so a step makes
``POOL + instructions`` claims and step s's claims are those from ``pool_claims * s``; no reset).
A stage's signals still mean that all its tiles are done: an instruction signals after the pool
tiles it took, and it stops claiming only once the pool has run out.

This module is the scheduler's view of the instruction kinds (their registry is ``kinds``) and
the tile plan; it imports no Triton, so the scheduler is testable in milliseconds. The kernels of
each kind live in ``instructions/<module>.py``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from math import gcd

from .kinds import KINDS, Op, cdiv as _cdiv, kind

WORDS = 8
# Worker programs a GPU runs on each SM by default: two, so one's loads overlap the other's waits
WORKERS_PER_SM = 2
# From this batch a model whose layers are short at one worker an SM runs one worker of 8 warps an SM
# (``default_layout``): H200, 0.6b batch 32 1.380 -> 1.242 ms, 64 1.916 -> 1.810; at 8b it lost
# (batch 32 +1.9%), at 0.6b batch 16 (mma.sync, the tile called) it gained 0.7%, and at 8 it lost
WHOLE_SM_MIN_BATCH = 32
# the pool word: claims counter in the low bits, claims a step above them
POOL_SHIFT = 16
# The persistent backend zeroes its int32 counters every this many steps, so a pool's claims a
# step must stay below 2^31 / this
COUNTER_RESET_STEPS = 65536
MAX_POOL_CLAIMS = (1 << 31) // COUNTER_RESET_STEPS - 1


@dataclass(frozen=True)
class Instr:
    op: int
    layer: int = 0
    tile_start: int = 0
    tile_end: int = 0
    wait_counter: int = 0
    wait_per_step: int = 0
    signal_counter: int = -1
    pool_counter: int = 0     # a pooled stage's claims counter (0: the stage has no pool)
    pool_claims: int = 0      # the claims that stage makes a step

    def encode(self) -> list[int]:
        return [self.op, self.layer, self.tile_start, self.tile_end, self.wait_counter,
                self.wait_per_step, self.signal_counter, self.pool_counter | self.pool_claims << POOL_SHIFT]

    @staticmethod
    def decode(words) -> "Instr":
        w = [int(v) for v in words]
        return Instr(*w[:7], w[7] & (1 << POOL_SHIFT) - 1, w[7] >> POOL_SHIFT)

    @property
    def ntiles(self) -> int:
        return self.tile_end - self.tile_start

    def describe(self) -> str:
        name = Op(self.op).name
        if self.op in (Op.NOOP, Op.BARRIER):
            return f"{name}"
        return f"{name} layer {self.layer} tiles {self.tile_start}..{self.tile_end - 1}"


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def next_pow2(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


# How a batched tile (instructions.batch_mma.batch_tiles) feeds its float32 input to the tensor cores
# beside 16-bit or FP8 weights: "split" into a bf16 head and a bf16 remainder, two MMAs a weight
# block, about 16 bits of the input kept; "bf16" rounded to one bf16 operand, one MMA (as
# transformers and vLLM multiply bf16 weights), with the RMSNorm sums of squares added by a
# pairwise tree instead of three MMAs; "fp8" (the weights-on-M tile with FP8 weights, w8a8):
# quantized to e4m3 per 128 columns, multiplied on the FP8 tensor cores (instructions/wgmma.py). The
# rules take "bf16" for bf16 weights on the weights-on-M tile (rule bf16-input), "fp8" for FP8 ones
# unless asked for weight-only FP8, and "split" otherwise (float32 models stay float32-exact).
BATCH_INPUTS = {"split": 0, "bf16": 1, "fp8": 2}


# The weights-on-M tile's pipeline (Plan.SWAP_SMEM) in KB: its default and the step the tiles'
# kind encodes it in (``instructions.wgmma`` reads it from there)
SWAP_SMEM_BASE = 80
SWAP_SMEM_STEP = 16


@dataclass(frozen=True)
class Plan:
    """Tile sizes and buffer shapes for one (model, batch, max_seq_len, workers). Every field is a
    compile-time constant of the kernels."""
    B: int          # batch
    H: int          # hidden
    D: int          # head_dim
    HQ: int         # query heads
    HKV: int        # kv heads
    I: int          # intermediate
    V: int          # vocab
    L: int          # layers
    S: int          # max_seq_len
    R_QKV: int      # rows per tile of each GEMV
    R_O: int
    R_GU: int
    R_DOWN: int
    R_LM: int
    BK_H: int       # K-chunk for GEMVs whose input is hidden-sized
    BK_Q: int       # ... q_size (O projection)
    BK_I: int       # ... intermediate (down projection)
    NSPLIT: int     # KV splits per (sequence, kv head)
    BLOCK_S: int    # positions per attention block
    D_PAD: int
    G_PAD: int
    KV_STAGES: int = 3  # attention's software pipeline over KV blocks (KV_STAGES - 1 in flight; 1: none)
    ATTN_NEW: int = 0   # 1: attention's split 0 holds the new position alone, splits 1.. the cache
    # kv heads an attention tile takes (1 or 2; 2 with one split): where a batch's tiles are several
    # a worker, two heads' cache blocks in flight at once instead of one after the other
    ATTN_PAIR: int = 1
    # GEMV tiles: 0 loop over the sequences with weights in registers; from batch 2 the weights are
    # read once for all B rows, by the batch-on-M tile (1, instructions.batch_mma.batch_tiles) or the
    # weights-on-M tile (2, instructions.wgmma: Hopper's wgmma, and K-splits SK_*)
    BATCHED: int = 0
    POOL_O: int = 0     # the stage's last tiles claimed at run time (module doc; 0: none)
    POOL_GU: int = 0
    POOL_DOWN: int = 0
    POOL_LM: int = 0
    TP: int = 1         # tensor parallel ranks: shapes above are one rank's (models/qwen3/tp.py)
    R_AR: int = 1       # rows of x per REDUCE tile (TP > 1)
    FP8: int = 0        # 1: QKV, O, gate/up and down weights are block FP8 (one byte a weight, scales beside)
    BATCH_INPUT: int = 0    # the batched tiles' MMA input, a value of BATCH_INPUTS (0: "split")
    SK_QKV: int = 1     # K-splits of each row block (BATCHED 2): tiles = row blocks x SK
    SK_O: int = 1
    SK_GU: int = 1
    SK_DOWN: int = 1
    # 1: the weights-on-M tile takes its weights by tensor descriptor (TMA, one bulk copy a chunk
    # issued by one thread) instead of per-thread pointer loads (cp.async); its inputs stay pointer
    # loads, masked to the K-split
    SWAP_TMA: int = 0
    # the weights-on-M tile's batch (the dot's N) padded to at least this, 8 or 16: Triton 3.6 (the
    # GPU machines') lowers a dot of N = 8 to mma.sync and emits wgmma from N = 16 (3.9 from 8)
    SWAP_MIN_N: int = 8
    # 1: the dots lower as Triton chooses (wgmma on Hopper where it can); 0: the step's kernels are
    # compiled with Triton's DISABLE_MMA_V3, every dot on mma.sync (``megakernel.backends.triton_mma``).
    # In the persistent kernel the weights-on-M tile's wgmma at a small N costs spills and 20 KB more
    # shared memory than mma.sync for no faster MMA ("The weights-on-M tile" in docs/performance.md)
    MMA_V3: int = 1
    # 1: the persistent kernel calls the weights-on-M tile as a function instead of inlining it, so
    # its registers are allocated apart from the other tiles' (as the sampling tiles are)
    SWAP_CALL: int = 0
    # 0-2: the weights-on-M tile's first chunks of weights (of 128 columns) taken into registers
    # before its wait, as the batch-1 register tiles take theirs, and added after the pipelined rest
    SWAP_PRE: int = 0
    # KB of shared memory the weights-on-M tile's pipeline may take (SWAP_SMEM_BASE to 224, in steps of
    # SWAP_SMEM_STEP): its stages of weights and input, and whether a chunk is 128 columns or 64. 112
    # is the most at which two workers still fit an SM (228 KB); 80 leaves the rest of the kernel room
    SWAP_SMEM: int = SWAP_SMEM_BASE
    # 1: the persistent kernel calls attention's tile as a function (its own registers): 1-2% faster
    # beside the called mma.sync tile, level or slower on wgmma (docs/performance.md)
    ATTN_CALL: int = 0
    SAMPLE: int = 0     # 1: the sampling stages between the LM head and ARGMAX (sampling on the device)
    SAMPLE_CHUNK: int = 4096    # logits a sampling tile reads (instructions/sample.py), at most 64 a row
    # The KV cache's allocated batch, the layer stride of k_cache/v_cache in sequences: a step of
    # the first B slots of a larger cache (megakernel.serve's batch buckets) reads it in place.
    # 0: B, a cache of this batch alone. Only attention's addressing depends on it.
    KV_B: int = 0

    def __post_init__(self):
        if self.BATCH_INPUT not in BATCH_INPUTS.values():
            raise ValueError(f"BATCH_INPUT={self.BATCH_INPUT} is not one of "
                             + ", ".join(f"{v} ({k})" for k, v in BATCH_INPUTS.items()))
        if self.BATCH_INPUT == BATCH_INPUTS["fp8"] and not (self.BATCHED == 2 and self.FP8):
            raise ValueError("BATCH_INPUT=2 (fp8, w8a8) needs FP8 weights on the weights-on-M tile (FP8=1, BATCHED=2)")
        if self.BATCHED not in (0, 1, 2):
            raise ValueError(f"BATCHED={self.BATCHED} is not 0 (per sequence), 1 (batch on M) or 2 (weights on M)")
        if self.SWAP_TMA not in (0, 1) or (self.SWAP_TMA and self.BATCHED != 2):
            raise ValueError(f"SWAP_TMA={self.SWAP_TMA}: 0, or 1 on the weights-on-M tile (BATCHED=2)")
        if self.MMA_V3 not in (0, 1) or (not self.MMA_V3 and self.BATCHED != 2):
            raise ValueError(f"MMA_V3={self.MMA_V3}: 1, or 0 (every dot on mma.sync) on the weights-on-M tile "
                             f"(BATCHED=2; with BATCHED={self.BATCHED} set MMA_V3=1)")
        if self.ATTN_CALL not in (0, 1):
            raise ValueError(f"ATTN_CALL={self.ATTN_CALL}: 0 (attention's tile inlined) or 1 (called)")
        if self.SWAP_CALL not in (0, 1) or (self.SWAP_CALL and self.BATCHED != 2):
            raise ValueError(f"SWAP_CALL={self.SWAP_CALL}: 0, or 1 on the weights-on-M tile "
                             f"(BATCHED=2; with BATCHED={self.BATCHED} set SWAP_CALL=0)")
        if self.SWAP_PRE not in (0, 1, 2) or (self.SWAP_PRE and self.BATCHED != 2):
            raise ValueError(f"SWAP_PRE={self.SWAP_PRE}: 0, or 1 or 2 chunks on the weights-on-M tile "
                             f"(BATCHED=2; with BATCHED={self.BATCHED} set SWAP_PRE=0)")
        if (not (SWAP_SMEM_BASE <= self.SWAP_SMEM <= 224 and self.SWAP_SMEM % SWAP_SMEM_STEP == 0)
                or (self.SWAP_SMEM != SWAP_SMEM_BASE and self.BATCHED != 2)):
            raise ValueError(f"SWAP_SMEM={self.SWAP_SMEM}: the weights-on-M tile's pipeline takes {SWAP_SMEM_BASE} to "
                             f"224 KB, a multiple of {SWAP_SMEM_STEP} ({SWAP_SMEM_BASE} where BATCHED={self.BATCHED} "
                             f"is not 2)")
        if self.SWAP_MIN_N not in (8, 16):
            raise ValueError(f"SWAP_MIN_N={self.SWAP_MIN_N}: the weights-on-M tile pads the batch to 8 or 16")
        if self.SAMPLE and not (self.SAMPLE_CHUNK >= 1 and -(-self.V // self.SAMPLE_CHUNK) <= 64):
            raise ValueError(f"SAMPLE_CHUNK={self.SAMPLE_CHUNK}: the sampling stages cut a row of {self.V} logits "
                             f"into at most 64 chunks")
        for name in ("SK_QKV", "SK_O", "SK_GU", "SK_DOWN"):
            if getattr(self, name) != 1 and self.BATCHED != 2:
                raise ValueError(f"{name}={getattr(self, name)}: K-splits are the weights-on-M tile's (BATCHED=2)")
        if self.BATCHED == 2:
            # O's and down's row blocks write x's sums of squares a block of SWAP_ROWS columns each
            for name in ("R_O", "R_DOWN"):
                if getattr(self, name) != SWAP_ROWS:
                    raise ValueError(f"{name}={getattr(self, name)}: the weights-on-M tile's O and down blocks are "
                                     f"{SWAP_ROWS} rows")
            for name in ("R_QKV", "R_GU", "R_LM"):
                if not 1 <= getattr(self, name) <= 128:
                    raise ValueError(f"{name}={getattr(self, name)}: a weights-on-M tile holds 1 to 128 rows")
            if self.TP > 1 and self.R_AR % SWAP_ROWS:
                # REDUCE writes x's xs and xss there, whole blocks of SWAP_ROWS columns a tile
                raise ValueError(f"R_AR={self.R_AR}: a REDUCE tile of the weights-on-M tile is whole "
                                 f"{SWAP_ROWS}-column blocks")
        pooled = [f for f in POOL_FIELDS.values() if getattr(self, f)]
        if pooled and (self.BATCHED == 1 or self.SWAP_PRE):
            raise ValueError(f"{pooled[0]}={getattr(self, pooled[0])}: pools are the register tiles' and the "
                             f"weights-on-M tile's without chunks before its wait (SWAP_PRE=0), not "
                             f"BATCHED={self.BATCHED} with SWAP_PRE={self.SWAP_PRE}")
        if self.KV_B and self.KV_B < self.B:
            raise ValueError(f"KV_B={self.KV_B}: the KV cache must hold at least the plan's batch B={self.B}")
        if self.ATTN_NEW and self.NSPLIT < 2:
            raise ValueError(f"ATTN_NEW=1 needs NSPLIT >= 2 (split 0 holds the new position, the others the "
                             f"cache), not {self.NSPLIT}: set ATTN_NEW=0 with one split")
        if self.ATTN_PAIR not in (1, 2) or (self.ATTN_PAIR == 2 and (self.NSPLIT != 1 or self.HKV % 2)):
            raise ValueError(f"ATTN_PAIR={self.ATTN_PAIR}: 1, or 2 (two kv heads a tile) with one split (NSPLIT=1, "
                             f"here {self.NSPLIT}) and an even number of kv heads (here {self.HKV})")

    def pool(self, op: Op) -> int:
        """Tiles of ``op``'s pool (its last ones), 0 where it has none."""
        field = POOL_FIELDS.get(op)
        return getattr(self, field) if field else 0

    @property
    def QKV_ROWS(self) -> int:
        return (self.HQ + 2 * self.HKV) * self.D

    @property
    def NSPLIT_PAD(self) -> int:
        """NSPLIT rounded up to a power of two (the combine's tl.arange), so an override of NSPLIT
        cannot leave it stale."""
        return next_pow2(self.NSPLIT)

    @property
    def SCALE_ROWS(self) -> int:
        """Rows a scale row covers in the FP8 projections' stacked scale grids (``models.qwen3.fp8.
        scale_rows``: 128 unless a fused part of a small shape is not a multiple of 128)."""
        return gcd(128, self.HQ * self.D, self.HKV * self.D, self.I)

    def tiles(self, op: Op) -> int:
        """Tiles of one stage of ``op`` (``scheduler.kinds``)."""
        return kind(op).tiles(self)

    @property
    def BT(self) -> int:
        """The GEMV tiles' kind as the kernels dispatch on it (``instructions.tiles.gemv_tile``):
        0 the register tiles, 1 + BATCH_INPUT the batch-on-M tile, 3 + BATCH_INPUT the weights-on-M one,
        plus 8 (``instructions.common.BT_TMA``) where that one takes its weights by TMA, 16
        (``BT_N16``) where it pads the batch to 16, 32 where its dots are compiled for mma.sync
        (MMA_V3 0; the tile ignores it: it keys the per-op kernels' compiled code), 64
        (``BT_CALL``) where it is called, not inlined (SWAP_CALL), and 128 (``BT_PRE``) times the
        chunks it takes before its wait (SWAP_PRE), and 512 (``BT_SMEM``) times the SWAP_SMEM_STEP KB its
        pipeline takes above SWAP_SMEM_BASE (SWAP_SMEM)."""
        if self.BATCHED != 2:
            return 2 * self.BATCHED - 1 + self.BATCH_INPUT if self.BATCHED else 0
        return (3 + self.BATCH_INPUT + 8 * self.SWAP_TMA + (16 if self.SWAP_MIN_N == 16 else 0) + 32 * (1 - self.MMA_V3)
                + 64 * self.SWAP_CALL + 128 * self.SWAP_PRE + 512 * ((self.SWAP_SMEM - SWAP_SMEM_BASE) // SWAP_SMEM_STEP))

    @property
    def kv_batch(self) -> int:
        """Sequences between one layer's KV cache and the next (``KV_B``, or B where 0)."""
        return self.KV_B or self.B

    def constexprs(self) -> dict:
        return {**asdict(self), "KV_B": self.kv_batch, "NSPLIT_PAD": self.NSPLIT_PAD, "SCALE_ROWS": self.SCALE_ROWS,
                "BT": self.BT}


# Batched plans (batch 2 and up) read each weight once per step for the whole batch
# (instructions.batch_mma.batch_tiles): every worker gets about one tile of about N / workers rows,
# so it reads the batch's input rows about once per stage; tiles of more than BATCH_MAX_ROWS rows
# are cut into several (the LM head), walked by one pipelined loop.
BATCH_MAX_ROWS = 128
BATCH_MIN_ROWS = 16     # tl.dot's N minimum: fewer rows would only pad
# The batched tile pads the batch to a power of two of at most this many rows
# (instructions.batch_mma.batch_tiles); a larger batch is refused rather than cut short.
MAX_BATCH = 128


def batched_rows(N: int, workers: int, align: int = 8) -> int:
    """Rows per tile of a batched GEMV of N rows: a multiple of ``align``, about one tile a worker,
    at most BATCH_MAX_ROWS (then about as many tiles a worker as that takes)."""
    per = _cdiv(N, max(1, workers))
    per = _cdiv(per, _cdiv(per, BATCH_MAX_ROWS))
    return max(BATCH_MIN_ROWS, _cdiv(per, align) * align)


# The weights-on-M tile (BATCHED 2, instructions.wgmma): row blocks of 64 rows (wgmma's M), each
# split over K until the stage has about one tile a worker; a split covers a multiple of 128 columns
# (a chunk, and one FP8 scale block) where K allows.
SWAP_ROWS = 64


def swap_rows(N: int, D: int | None = None) -> int:
    """Rows a weights-on-M tile holds: SWAP_ROWS, or for the QKV projection at most the largest power
    of two dividing the head dim (attention waits on each kv head's tiles)."""
    return SWAP_ROWS if D is None else min(SWAP_ROWS, D & -D)


def swap_splits(N: int, K: int, R: int, workers: int) -> int:
    """K-splits of each of a stage's cdiv(N, R) row blocks: the most, a power of two, that keep the
    stage's tiles within ``workers`` and each split's columns a multiple of 128 (of K / SK, where K
    is below 128 a chunk)."""
    sk = 1
    while (_cdiv(N, R) * sk * 2 <= workers and K % (sk * 2) == 0
           and (K // (sk * 2)) % 128 == 0):
        sk *= 2
    return sk


def batched_qkv_rows(N: int, D: int, workers: int) -> int:
    """``batched_rows`` for the fused QKV projection, whose tiles must not straddle a kv head's rows
    (attention waits on each head's tiles): a power of two dividing D, the one whose busiest worker
    holds the fewest rows (then the largest)."""
    cands = [r for r in (16, 32, 64, 128) if D % r == 0] or [D & -D]
    return min(cands, key=lambda r: (_cdiv(_cdiv(N, r), max(1, workers)) * r, -r))


# Rows of weights one tile holds in registers: about this many elements per K-chunk, for a program
# of 4 warps (128 per thread; a program of more warps holds proportionally more).
TILE_ELEMS = 16384
MAX_BK = 4096
# Pools (module doc): in a plan whose gate/up stage streams at least POOL_MIN_BYTES of weights a
# worker at batch 1, a stage whose tiles give every worker at least POOL_MIN_TILES leaves
# 1 / POOL_DIV of them to a pool.
POOL_FIELDS = {Op[k.name]: k.pool for k in KINDS if k.pool}
POOL_MIN_BYTES = 512 * 1024
POOL_MIN_TILES = 4
POOL_DIV = 5
# Short layers: a layer's weights under this many bytes a worker, where attention's stage is a
# large share of the layer (0.6b at 264 workers; not 1.7b)
ATTN_NEW_MAX_BYTES = 256 * 1024


def _block_k(K: int, max_bk: int = MAX_BK) -> int:
    return min(next_pow2(K), max_bk)


def _rows(N: int, K: int, workers: int, cap: int = 64, max_bk: int = MAX_BK, elems: int = TILE_ELEMS) -> int:
    """Power-of-two rows per tile: as few tiles as gives each worker at most one (so a worker's
    whole share of a GEMV is loaded before it waits), within what a tile can hold in registers.
    With two workers per SM this still gives every SM at least one tile."""
    by_regs = max(1, elems // _block_k(K, max_bk))
    by_workers = next_pow2(_cdiv(N, max(1, workers)))
    return max(1, min(cap, _pow2_floor(by_regs), by_workers))


def _balanced(R: int, N: int, workers: int, slack: float = 1.1) -> int:
    """The largest power of two <= R rows per tile whose busiest worker holds at most ``slack``
    times the fewest rows any tile size gives it. Tile counts that do not divide among the
    workers leave some with one tile more (0.6b's gate/up at 8 rows is 384 tiles on 264 workers,
    so 120 hold 16 rows, where 4-row tiles give at most 12)."""
    load = {r: _cdiv(_cdiv(N, r), max(1, workers)) * r for r in (1 << i for i in range(R.bit_length())) if r <= R}
    best = min(load.values())
    return max(r for r, v in load.items() if v <= slack * best)


@dataclass(frozen=True)
class PlanInputs:
    """What a plan is made for, and the tile sizes the register budget allows it (``_rows``)."""
    cfg: object
    B: int
    S: int
    workers: int
    max_bk: int
    elems: int                  # TILE_ELEMS scaled to the program's warps
    nsplit_given: bool          # the caller fixed NSPLIT
    short: bool                 # a layer's bf16 weights are under ATTN_NEW_MAX_BYTES a worker
    bf16: bool = False          # bf16 weights (not FP8): the batched tile may round its input to bf16
    num_warps: int = 4          # warps a worker

    def rows(self, N: int, K: int, workers: int | None = None, cap: int = 64) -> int:
        return _rows(N, K, self.workers if workers is None else workers, cap, self.max_bk, self.elems)

    @property
    def short_b1(self) -> bool:
        return self.short and self.B == 1


@dataclass(frozen=True)
class Rule:
    """One of ``make_plan``'s overrides of the base plan: where ``when`` holds, ``then``'s fields."""
    name: str
    when: object    # (PlanInputs, Plan) -> bool
    then: object    # (PlanInputs, Plan) -> dict of fields
    why: str


def _swap_plan(p: Plan, workers: int) -> dict:
    """The fields of a weights-on-M batched plan (BATCHED 2) for ``workers`` workers."""
    r_qkv, r = swap_rows(p.QKV_ROWS, p.D), swap_rows(p.H)
    return dict(BATCHED=2, R_QKV=r_qkv, R_O=r, R_GU=r, R_DOWN=r, R_LM=r,
                SK_QKV=swap_splits(p.QKV_ROWS, p.H, r_qkv, workers), SK_O=swap_splits(p.H, p.HQ * p.D, r, workers),
                SK_GU=swap_splits(p.I, p.H, r, workers), SK_DOWN=swap_splits(p.H, p.I, r, workers))


# A block's last split sums every split's B x 64 float32 partials, SK * B * 256 bytes, after reading
# its own 64 x K / SK weights: 128 * K / SK bytes. The sum is least at SK = sqrt(K / (2B)) (the
# nearest power of two). Timed from batch 32 (H100): 0.6b batch 64, O's 16 splits and down's 8 to 4
# each, 2.693 -> 2.502 ms; batch 32, O's 16 to 8, 1.696 -> 1.628; 8b batch 64 with fewer splits than
# this is slower (9.342 -> 10.230). Below batch 32 the stage's tile count decides (``swap_splits``).
def _splits(p: Plan) -> dict:
    return dict(SK_QKV=p.SK_QKV, SK_O=p.SK_O, SK_GU=p.SK_GU, SK_DOWN=p.SK_DOWN)


def _balanced_splits(x: PlanInputs, p: Plan) -> dict:
    ks = dict(SK_QKV=p.H, SK_O=p.HQ * p.D, SK_GU=p.H, SK_DOWN=p.I)
    return {f: min(sk, 1 << max(0, round(0.5 * math.log2(ks[f] / (2 * x.B)) + 1e-9)))
            for f, sk in _splits(p).items()}


def batch_on_m_plan(p: Plan, workers: int) -> Plan:
    """``p`` (batched) on the batch-on-M tile (BATCHED 1): rows about N / workers, no K-splits."""
    return replace(p, BATCHED=1, MMA_V3=1, SWAP_CALL=0, SWAP_PRE=0, BATCH_INPUT=0, R_QKV=batched_qkv_rows(p.QKV_ROWS, p.D, workers),
                   R_O=batched_rows(p.H, workers),
                   R_GU=batched_rows(p.I, workers), R_DOWN=batched_rows(p.H, workers), R_LM=batched_rows(p.V, workers),
                   SK_QKV=1, SK_O=1, SK_GU=1, SK_DOWN=1)


def _pools(x: PlanInputs, p: Plan) -> dict:
    return {field: min(p.tiles(op) // POOL_DIV, MAX_POOL_CLAIMS - x.workers)
            for op, field in POOL_FIELDS.items() if p.tiles(op) >= POOL_MIN_TILES * x.workers}


# Applied in order to the base plan (``_base_plan``); each sees the plan the rules before it made.
# The measurements behind them are in docs/performance.md.
PLAN_RULES: tuple[Rule, ...] = (
    Rule("splits-by-context",
         lambda x, p: not x.nsplit_given and not x.short_b1,
         lambda x, p: dict(NSPLIT=max(1, min(p.NSPLIT, next_pow2(_cdiv(x.S, p.BLOCK_S))))),
         "no more attention splits than KV blocks at max_seq_len (short layers at batch 1 keep one a worker)"),
    Rule("balanced-gateup",
         lambda x, p: x.B == 1,
         lambda x, p: dict(R_GU=_balanced(p.R_GU, p.I, x.workers)),
         "gate/up tiles whose count divides evenly among the workers, so no worker holds one too many"),
    Rule("half-down-tiles",
         lambda x, p: x.B == 1 and p.I > 2 * p.BK_I,
         lambda x, p: dict(R_DOWN=max(1, p.R_DOWN // 2)),
         "down rows of more than two chunks: half the bytes in flight at the wait, and fewer spills"),
    Rule("narrow-down-chunks",
         lambda x, p: x.B == 1 and p.I > 4 * p.BK_I and p.BK_I >= 32,
         lambda x, p: dict(BK_I=p.BK_I // 2, R_DOWN=p.R_DOWN * 2),
         "down rows of more than four chunks: half-width chunks of twice the rows read each input chunk once"),
    Rule("o-on-half-the-workers",
         lambda x, p: x.short_b1,
         lambda x, p: dict(R_O=x.rows(p.H, p.HQ * p.D, x.workers // 2)),
         "short layers at batch 1: the workers without an O tile go on to gate/up and load it during O"),
    Rule("deep-kv-pipeline",
         lambda x, p: x.S >= 8192,
         lambda x, p: dict(KV_STAGES=4),
         "a long context: one more KV block in flight (a stage of shared memory costs every kernel L1)"),
    Rule("batched",
         lambda x, p: x.B >= 2,
         lambda x, p: _swap_plan(p, x.workers),
         "a batch reads each weight once on the weights-on-M tile (wgmma), split over K to about a tile a worker"),
    Rule("balanced-splits",
         lambda x, p: p.BATCHED == 2 and x.B >= 32 and _balanced_splits(x, p) != _splits(p),
         _balanced_splits,
         "from batch 32: K-splits that balance a split's weights against the partials its last split sums"),
    # H200, ms a step: 0.6b batch 64 2.196 -> 2.045, 8b 6.979 -> 6.427; batch 16 and 32 flat
    # (0.6b 1.139 -> 1.142, 1.437 -> 1.447; 8b 4.768 -> 4.685, 5.314 -> 5.329)
    Rule("deep-pipeline",
         lambda x, p: p.BATCHED == 2 and x.B > 32,
         lambda x, p: dict(SWAP_SMEM=112),
         "from batch 33: 112 KB of pipeline a worker, so gate/up's chunks stay 128 columns wide (64 in 80 KB)"),
    # H200, with one worker of 8 warps an SM (``default_layout``): 0.6b batch 32 1.380 -> 1.242 ms, 64
    # 1.916 -> 1.810 against two workers of 4 warps with 80 and 112 KB
    Rule("whole-sm-pipeline",
         lambda x, p: p.BATCHED == 2 and x.num_warps >= 8,
         lambda x, p: dict(SWAP_SMEM=224),
         "one worker of 8 warps an SM: its whole shared memory (224 KB) for the pipeline"),
    Rule("bf16-input",
         lambda x, p: x.bf16 and p.BATCHED == 2,
         lambda x, p: dict(BATCH_INPUT=BATCH_INPUTS["bf16"]),
         "bf16 weights: the input rounded to one bf16 MMA operand, as transformers does (half the input bytes)"),
    Rule("mma-sync-to-16",
         lambda x, p: p.BATCHED == 2 and x.B <= 16,
         lambda x, p: dict(MMA_V3=0),
         "to batch 16 on mma.sync: wgmma at N 16 costs the persistent kernel spills and shared memory"),
    Rule("called-to-16",
         lambda x, p: p.BATCHED == 2 and not p.MMA_V3,
         lambda x, p: dict(SWAP_CALL=1, ATTN_CALL=1),
         "the mma.sync tile and attention's called, not inlined: their own registers, a third of the spills"),
    # H100: 0.6b batch 8 1.062 -> 1.017 ms, 16 1.245 -> 1.218; 8b 8 5.965 -> 5.893, 16 6.223 -> 6.154
    # (two chunks: slower, spills). bf16 weights only: w8a8's e4m3 tile spilled with it (8b batch 1
    # 3.851 -> 4.605), and FP8 weight-only's decoded chunk is likely to spill alike (untimed)
    Rule("weights-before-the-wait",
         lambda x, p: x.bf16 and p.BATCHED == 2 and not p.MMA_V3,
         lambda x, p: dict(SWAP_PRE=1),
         "the mma.sync tile's first chunk of weights loaded before its wait, as the batch-1 tiles load theirs"),
    Rule("pools",
         lambda x, p: x.B == 1 and not p.BATCHED and cost(p, Op.GATEUP, p.tiles(Op.GATEUP)) >= POOL_MIN_BYTES * x.workers,
         _pools,
         "long layers: a fifth of each large stage claimed at run time, so it ends with the mean worker"),
    Rule("whole-budget-gateup",
         lambda x, p: short_b1_mlp(p, x.workers) and not p.BATCHED,
         lambda x, p: dict(R_GU=max(1, x.rows(p.I, p.H) // 2)),
         "the tape places gate/up by when workers get there (graph.lagged): a tile takes the whole budget"),
    # H100, 0.6b batch 64 2.467 -> 2.315 ms, 8b 8.432 -> 8.193; batch 32 (256 tiles) 1.547 -> 1.627
    Rule("attention-pairs",
         lambda x, p: x.B >= 2 and x.B * p.HKV > x.workers and p.NSPLIT == 1 and p.HKV % 2 == 0 and not p.ATTN_NEW,
         lambda x, p: dict(ATTN_PAIR=2),
         "more kv heads than workers: two an attention tile, their cache blocks in flight at once"),
    Rule("new-position-split",
         lambda x, p: p.NSPLIT > 1 and _cdiv(x.S, p.NSPLIT - 1) <= p.BLOCK_S and x.short,
         lambda x, p: dict(ATTN_NEW=1),
         "short layers, short context: split 0 holds the new position, so its RoPE and append run beside the cache"),
)


def _base_plan(x: PlanInputs, nsplit: int | None, lm_rows: int | None) -> Plan:
    """The plan before ``PLAN_RULES``: one tile a worker within the register budget (``_rows``)."""
    cfg = x.cfg
    H, D, I = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    d_pad = next_pow2(D)
    # attention walks a split in blocks of BLOCK_S positions (tl.dot needs >= 16); larger blocks
    # cost the megakernel spills (its dot operands' registers)
    block_s = max(16, min(64, _pow2_floor(4096 // d_pad)))
    # one attention tile a worker at most; a power of two (33 splits at 264 workers and 8 kv heads
    # would cost the megakernel spills). Splits past the context are empty at run time.
    nsplit = nsplit if nsplit is not None else _pow2_floor(max(1, x.workers // (x.B * cfg.num_key_value_heads)))
    return Plan(
        B=x.B, H=H, D=D, HQ=cfg.num_attention_heads, HKV=cfg.num_key_value_heads, I=I,
        V=cfg.vocab_size, L=cfg.num_hidden_layers, S=x.S,
        R_QKV=min(x.rows(cfg.qkv_size, H), D & -D),      # a QKV tile never straddles two heads
        R_O=x.rows(H, cfg.q_size), R_GU=max(1, x.rows(I, H) // 2), R_DOWN=x.rows(H, I),
        R_LM=lm_rows or x.rows(cfg.vocab_size, H, cap=16),
        BK_H=_block_k(H, x.max_bk), BK_Q=_block_k(cfg.q_size, x.max_bk), BK_I=_block_k(I, x.max_bk),
        NSPLIT=nsplit, BLOCK_S=block_s, D_PAD=d_pad, G_PAD=next_pow2(cfg.group_size), KV_STAGES=3)


def plan_and_rules(cfg, batch_size: int, max_seq_len: int, workers: int, nsplit: int | None = None,
                   lm_rows: int | None = None, max_bk: int = MAX_BK, num_warps: int = 4, tp: int = 1,
                   fp8: bool = False, w8a8: bool = False, tp_swap: bool = True,
                   bf16_inputs: bool = False) -> tuple[Plan, list[tuple[Rule, dict]]]:
    """``make_plan``'s plan, and the rules of ``PLAN_RULES`` that fired with the fields each set.
    ``tp`` > 1: ``cfg`` is one rank's shapes (``models.qwen3.tp.shard_config``). ``fp8`` (FP8
    projections) is set after the rules: tiles are sized as for bf16 weights. ``w8a8`` (with
    ``fp8``): FP8 activations too, which only the weights-on-M tile multiplies, so every batch
    (batch 1 too) runs it (``w8a8_plan``), at any ``tp``. ``bf16_inputs``: the weights are bf16
    (the model's dtype), so the weights-on-M tile may round its input to one bf16 operand (rule
    ``bf16-input``; float32 models keep the float32-exact "split", and TP, not yet timed with it).

    Under TP the rules' batched plans take the weights-on-M tile as at TP 1 (REDUCE writes the xs and
    xss it reads, ``instructions/allreduce.py``); ``tp_swap=False`` keeps them on the older batch-on-M
    tile (``batch_on_m_plan``, rule ``tp-batch-on-m``), for comparison. On two H200s at 8b batch 8 the
    weights-on-M tile took 3.34 ms a step against 6.58 (docs/performance.md, "Plans of TP > 1").
    w8a8 needs the weights-on-M tile at any ``tp``."""
    if not 1 <= batch_size <= MAX_BATCH:
        raise ValueError(f"batch size {batch_size} is outside what the kernels run: 1 to {MAX_BATCH}")
    x = PlanInputs(cfg, batch_size, max_seq_len, workers, max_bk, TILE_ELEMS * num_warps // 4, nsplit is not None,
                   short=short_layers(cfg, workers), bf16=bf16_inputs and not fp8 and tp == 1, num_warps=num_warps)
    plan = _base_plan(x, nsplit, lm_rows)
    fired = []
    for rule in PLAN_RULES:
        if rule.when(x, plan):
            fields = rule.then(x, plan)
            plan = replace(plan, **fields)
            fired.append((rule, fields))
    if tp > 1 and plan.BATCHED == 2 and not tp_swap and not (fp8 and w8a8):
        plan = batch_on_m_plan(plan, workers)
        fired.append((TP_BATCH_ON_M_RULE, {}))
    if tp > 1:
        # REDUCE tiles: few enough that the cross-GPU polls stay few (one per rank a tile), at
        # least 128 rows, so a tile's peer reads are whole 512-byte runs per sequence (and, for
        # the weights-on-M tile's xs, whole 64-column blocks: ``Plan`` checks it)
        plan = replace(plan, TP=tp, R_AR=min(next_pow2(plan.H), max(128, next_pow2(_cdiv(plan.H, max(1, workers))))))
    if fp8 and w8a8:
        # every plan can take the weights-on-M tile that quantizes the inputs (under TP its REDUCE
        # writes the normalised input)
        fields = w8a8_plan(plan, workers)
        fired.append((W8A8_RULE, fields))
        plan = replace(plan, FP8=1, **fields)
    return (replace(plan, FP8=1) if fp8 else plan), fired


W8A8_RULE = Rule("w8a8", lambda x, p: False, lambda x, p: {},
                 "FP8 activations: every projection on the weights-on-M tile with e4m3 inputs (batch 1 too)")
TP_BATCH_ON_M_RULE = Rule("tp-batch-on-m", lambda x, p: False, lambda x, p: {},
                          "tensor parallel on the batch-on-M tile, as asked (tp_swap=False): the plan TP ran "
                          "before its REDUCE wrote xs, kept for comparison")


def w8a8_plan(p: Plan, workers: int) -> dict:
    """The fields that put a plan's projections on the weights-on-M tile with FP8 inputs."""
    fields = _swap_plan(p, workers) if p.BATCHED != 2 else {}
    # e4m3 runs on wgmma at every batch (mma.sync was 8% slower at 8b batch 16), the tile called to
    # batch 16 (2-7% faster at 8b batch 1, 8 and 16; docs/performance.md)
    return {**fields, "BATCH_INPUT": BATCH_INPUTS["fp8"], "MMA_V3": 1, "SWAP_CALL": int(p.B <= 16),
            **dict.fromkeys(POOL_FIELDS.values(), 0)}


def make_plan(cfg, batch_size: int, max_seq_len: int, workers: int, nsplit: int | None = None,
              lm_rows: int | None = None, max_bk: int = MAX_BK, num_warps: int = 4, tp: int = 1,
              fp8: bool = False, w8a8: bool = False, tp_swap: bool = True, bf16_inputs: bool = False) -> Plan:
    """Tile sizes for ``cfg`` at ``batch_size`` and ``max_seq_len`` on ``workers`` workers: the base
    plan with ``PLAN_RULES`` applied (``plan_and_rules`` says which fired). ``tp`` > 1: ``cfg`` is
    one rank's shapes, and the step adds the ranks' partial sums after O and down; ``tp_swap=False``:
    its batched plans on the batch-on-M tile (``plan_and_rules``). ``fp8``: the
    plan of FP8 projections (their bytes in ``cost``; the kernels read the format from the weights)."""
    return plan_and_rules(cfg, batch_size, max_seq_len, workers, nsplit, lm_rows, max_bk, num_warps, tp=tp,
                          fp8=fp8, w8a8=w8a8, tp_swap=tp_swap, bf16_inputs=bf16_inputs)[0]


def short_layers(cfg, workers: int) -> bool:
    """Whether a layer's bf16 weights are under ATTN_NEW_MAX_BYTES a worker (``PlanInputs.short``)."""
    return cfg.layer_matrix_params * 2 < ATTN_NEW_MAX_BYTES * workers


def default_layout(cfg, batch_size: int, sms: int, bf16: bool, tp: int = 1, fp8: bool = False,
                   workers: int | None = None) -> tuple[int, int]:
    """(warps a worker, workers an SM) of the rules' plans on a GPU of ``sms`` SMs: two workers of 4
    warps, so that one's loads overlap the other's waits; or, from batch ``WHOLE_SM_MIN_BATCH`` where
    a layer's bf16 weights are short at one worker an SM (0.6b), one worker of 8 warps with the whole
    SM's shared memory for the weights-on-M tile's pipeline (rule ``whole-sm-pipeline``): its stages
    are a chunk or two a worker, so bytes in flight, not the second worker's overlap, set their pace.
    Timed with bf16 weights at TP 1 only. A count of ``workers`` asked for that one an SM cannot
    hold keeps two of 4 warps, which holds it."""
    if (short_layers(cfg, sms) and batch_size >= WHOLE_SM_MIN_BATCH and bf16 and not fp8 and tp == 1
            and (workers is None or workers <= sms)):
        return 8, 1
    return 4, WORKERS_PER_SM


def short_b1_mlp(plan: Plan, workers: int) -> bool:
    """Batch 1 with the O projection on at most half the workers and no pools (the plan's
    o-on-half-the-workers rule without the pools rule): the balanced megakernel tape then places
    O, gate/up and down by when their workers get there (``scheduler.graph.lagged``)."""
    return (plan.B == 1 and not plan.BATCHED and not any(plan.pool(op) for op in POOL_FIELDS)
            and 0 < 2 * plan.tiles(Op.OPROJ) <= workers)


def without_pools(plan: Plan) -> Plan:
    """The plan with every stage's tiles in its instructions (a superkernel tape has no counters to
    claim from)."""
    return replace(plan, **dict.fromkeys(POOL_FIELDS.values(), 0))


def cost(plan: Plan, op: Op, ntiles: int, itemsize: int = 2) -> int:
    """Bytes an instruction of ``ntiles`` tiles reads from memory (weights dominate at batch 1;
    attention counts the KV cache at full length). Control words (NOOP, BARRIER) read nothing."""
    k = _BY_OP.get(op)
    return k.tile_bytes(plan, itemsize) * ntiles if k else 0


_BY_OP = {Op[k.name]: k for k in KINDS}

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
worker would, not the slowest (the stages' tails, bench/NOTES.md 58). The pool word is
``pool_counter | pool_claims << 16``: the claims counter (which nothing waits on or signals) and
the claims one step makes (every instruction claims once more than it takes, so a step makes
``POOL + instructions`` claims and step s's claims are those from ``pool_claims * s``; no reset).
A stage's signals still mean that all its tiles are done: an instruction signals after the pool
tiles it took, and it stops claiming only once the pool has run out.

This module is the scheduler's view of the instruction kinds and imports no Triton; the kernels
of each kind live in ``instructions/<kind>.py`` (DESIGN.md keeps the two apart so that the
scheduler is testable in milliseconds).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import partial

from .kinds import KINDS, Op, cdiv as _cdiv, kind

WORDS = 8
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
    BATCHED: int = 0    # GEMV tiles read weights once for all B rows (1) or loop over the sequences (0)
    POOL_O: int = 0     # the stage's last tiles claimed at run time (module doc; 0: none)
    POOL_GU: int = 0
    POOL_DOWN: int = 0
    POOL_LM: int = 0

    def __post_init__(self):
        if self.ATTN_NEW and self.NSPLIT < 2:
            raise ValueError(f"ATTN_NEW=1 needs NSPLIT >= 2 (split 0 holds the new position, the others the "
                             f"cache), not {self.NSPLIT}: set ATTN_NEW=0 with one split")

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

    def tiles(self, op: Op) -> int:
        """Tiles of one stage of ``op`` (``scheduler.kinds``)."""
        return kind(op).tiles(self)

    def constexprs(self) -> dict:
        return {**asdict(self), "NSPLIT_PAD": self.NSPLIT_PAD}


# Batched plans (batch 2 and up) read each weight once per step for the whole batch
# (instructions.common.batch_tiles): every worker gets about one tile of about N / workers rows,
# so it reads the batch's input rows about once per stage; tiles of more than BATCH_MAX_ROWS rows
# are cut into several (the LM head), walked by one pipelined loop.
BATCH_MAX_ROWS = 128
BATCH_MIN_ROWS = 16     # tl.dot's N minimum: fewer rows would only pad


def batched_rows(N: int, workers: int, align: int = 8) -> int:
    """Rows per tile of a batched GEMV of N rows: a multiple of ``align``, about one tile a worker,
    at most BATCH_MAX_ROWS (then about as many tiles a worker as that takes)."""
    per = _cdiv(N, max(1, workers))
    per = _cdiv(per, _cdiv(per, BATCH_MAX_ROWS))
    return max(BATCH_MIN_ROWS, _cdiv(per, align) * align)


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
# Attention's new position gets a split of its own (ATTN_NEW) only where a layer's weights are
# under this many bytes a worker (0.6b: 119 KB at 264 workers; 1.7b: 380 KB).
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
    workers leave some with one tile more: 0.6b's gate/up at 8 rows is 384 tiles on 264 workers,
    so 120 hold 16 rows, where 4-row tiles (768) give at most 12 (0.732 -> 0.720 ms on the H200,
    bench/NOTES.md 31). (There the tape now places gate/up unevenly on purpose, ``short_b1_mlp``,
    and the tile takes the whole budget.)"""
    load = {r: _cdiv(_cdiv(N, r), max(1, workers)) * r for r in (1 << i for i in range(R.bit_length())) if r <= R}
    best = min(load.values())
    return max(r for r, v in load.items() if v <= slack * best)


def make_plan(cfg, batch_size: int, max_seq_len: int, workers: int, nsplit: int | None = None,
              lm_rows: int | None = None, max_bk: int = MAX_BK, num_warps: int = 4) -> Plan:
    H, D, I = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    rows = partial(_rows, max_bk=max_bk, elems=TILE_ELEMS * num_warps // 4)
    G = cfg.group_size
    qkv_rows = cfg.qkv_size
    g_pad, d_pad = next_pow2(G), next_pow2(D)
    # Attention walks a split in blocks of BLOCK_S positions (tl.dot needs >= 16): 32 x 128 keys
    # and values are 8 KB each in bf16. The tile keeps NSTAGE - 1 blocks in flight in shared
    # memory (instructions/attention.py), so the block size sets the registers of one block's
    # dot operands, not the bytes in flight: 64 costs the megakernel spills
    # (python -m megakernel.compile_check --set BLOCK_S=64)
    block_s = max(16, min(64, _pow2_floor(4096 // d_pad)))
    # Short layers (bf16 weights under ATTN_NEW_MAX_BYTES a worker: 0.6b's 119 KB at 264 workers,
    # 1.7b's 380 KB), where attention's stage is a large share of the layer; at batch 1 the plan
    # spreads attention and the O projection for them (below)
    short = cfg.layer_matrix_params * 2 < ATTN_NEW_MAX_BYTES * workers
    short_b1 = short and batch_size == 1
    if nsplit is None:
        # One attention tile per worker at most: with every worker busy at a long context, more
        # splits would only give a worker two tiles in a row (the tape is static), each with its
        # own q, partial and ticket, and a longer combine. A power of two: 32, not 33, for 264
        # workers and 8 kv heads (33 works too, but cost the megakernel 40 more bytes of spills
        # on Triton 3.6 in compile_check). Splits are cut at run time from the current length,
        # so at a short context the later ones are empty; never more splits than blocks at
        # max_seq_len, except for short layers at batch 1, where every worker holding a split,
        # most of them empty, measured faster (H100, 0.6b at max_seq_len 392, the same one-block
        # cuts: 32 splits 0.723-0.726 ms against 16's 0.729-0.735; not at 1.7b, +0.7%, or 8b,
        # +1.5%: their spills; bench/NOTES.md 61)
        nsplit = _pow2_floor(max(1, workers // (batch_size * cfg.num_key_value_heads)))
        if not short_b1:
            nsplit = max(1, min(nsplit, next_pow2(_cdiv(max_seq_len, block_s))))
    r_gu_max = max(1, rows(I, H, workers) // 2)      # rows of gate and of up per tile
    r_down = rows(H, I, workers)
    bk_i = _block_k(I, max_bk)
    r_gu = r_gu_max
    if batch_size == 1:
        r_gu = _balanced(r_gu, I, workers)
        # Down tiles of half the register budget where a row takes more than two chunks: each
        # worker then has half the bytes in flight when it polls and fewer spills. H200,
        # max_seq_len 392, float32 act: 0.6b R_DOWN 4 -> 2 0.719 -> 0.710 ms, 8b 4.70 -> 4.45-4.55
        # (bench/NOTES.md 32; the same for QKV: 0.6b -1%, 8b +2%). With act in bf16 (NOTES 54) the
        # whole budget pays where the row is one or two chunks: H100, R_DOWN 2 -> 4, 0.6b
        # 0.741-0.745 -> 0.735-0.737 ms, 1.7b 1.477 -> 1.459, while 8b (three chunks) still loses,
        # 5.40 -> 5.48 (NOTES 55)
        if I > 2 * bk_i:
            r_down = max(1, r_down // 2)
        if I > 4 * bk_i and bk_i >= 32:
            # Down rows of more than four chunks (14b, 32b): chunks of half the width and twice
            # the rows, the same registers. Each tile reads its input chunk again from L2 (then
            # float32: as many bytes as its bf16 weights at 2 rows; bf16 since NOTES 54), so this
            # halves the input per weight byte. H200, max_seq_len 392: 14b 8.38 -> 8.10 ms,
            # 32b 19.44-19.65 -> 18.43-18.48; not taken at 8b (4.21-4.35 against 4.31: the same)
            # or 4b (2.61 -> 2.91: 3 tiles of 4 rows on its busiest worker where 5 of 2 gave 10,
            # and 72 spills against 32) (bench/NOTES.md 50)
            bk_i, r_down = bk_i // 2, r_down * 2
    plan = Plan(
        B=batch_size, H=H, D=D, HQ=cfg.num_attention_heads, HKV=cfg.num_key_value_heads, I=I,
        V=cfg.vocab_size, L=cfg.num_hidden_layers, S=max_seq_len,
        R_QKV=min(rows(qkv_rows, H, workers), D & -D),
        # short layers at batch 1: the O projection on half the workers, so the others go on to
        # gate/up and ask for its weights during O (0.6b with 32 splits: 0.716-0.720 ms against
        # 0.723-0.726; with 16 no gain, H100; at max_seq_len 1024 on the H200 0.711-0.718 against
        # 0.735-0.739, bench/NOTES.md 30 and 61)
        R_O=rows(H, cfg.q_size, workers // 2 if short_b1 else workers),
        R_GU=r_gu, R_DOWN=r_down,
        R_LM=lm_rows or rows(cfg.vocab_size, H, workers, cap=16),
        BK_H=_block_k(H, max_bk), BK_Q=_block_k(cfg.q_size, max_bk), BK_I=bk_i,
        NSPLIT=nsplit, BLOCK_S=block_s, D_PAD=d_pad, G_PAD=g_pad,
        # Blocks in flight per attention tile: 3 stages (two blocks ahead, 33 KB of shared memory)
        # unless a split can be long. The megakernel's shared memory is the largest any of its
        # instructions needs, and each KB of it is a KB less of L1 for every instruction: 4 stages
        # (50 KB) cost 0.6b 0.850 vs 0.771 ms and 8b 5.32 vs 4.76 ms at a short context on the H200,
        # and won only at 32k (1.81 vs 2.08 ms with 2). bench/NOTES.md 18. (Where no split can be
        # longer than its first block the attention tile uses no pipeline at all: it knows the
        # block it walks; NOTES.md 25.)
        KV_STAGES=4 if max_seq_len >= 8192 else 3)
    if batch_size >= 2:
        plan = replace(plan, BATCHED=1, R_QKV=batched_qkv_rows(qkv_rows, D, workers),
                       R_O=batched_rows(H, workers), R_GU=batched_rows(I, workers),
                       R_DOWN=batched_rows(H, workers), R_LM=batched_rows(cfg.vocab_size, workers))
    if batch_size == 1 and not plan.BATCHED and cost(plan, Op.GATEUP, plan.tiles(Op.GATEUP)) >= POOL_MIN_BYTES * workers:
        # A stage whose workers stream several tiles each ends when the slowest does: the memory
        # system serves the SMs unevenly (H100, 14b: gate/up's last instruction ends 9.3 us after
        # its median one, down's 4.4, of 120 and 64 us), so a pool of its last tiles goes to
        # whichever workers are free: 8b 5.41 -> 5.33 ms, 14b 10.46 -> 9.97, 32b 23.32 -> 22.24.
        # Where the layers are short (gate/up under 512 KB a worker) the pools' code costs more
        # than their tails: 0.6b (the LM head's alone) 0.733 -> 0.738, 1.7b 1.48 -> 1.50, 4b 3.19 ->
        # 3.22 (bench/NOTES.md 58)
        plan = replace(plan, **{field: min(plan.tiles(op) // POOL_DIV, MAX_POOL_CLAIMS - workers)
                                for op, field in POOL_FIELDS.items() if plan.tiles(op) >= POOL_MIN_TILES * workers})
    if short_b1_mlp(plan, workers) and not plan.BATCHED:
        # The tape places gate/up by when its workers get there (scheduler.graph.lagged): the O
        # projection's workers get the fewest tiles and the others one more, the first loaded during
        # attention, so a tile takes the whole register budget (0.6b: 8 rows of gate and of up, one
        # tile on each O worker, two on most others). H100, max_seq_len 392: 0.698-0.701 ms/token
        # against 0.717-0.721 with 4-row tiles placed evenly (3 a worker); 8-row tiles placed evenly
        # (two on 192 workers) 0.721-0.723 (bench/NOTES.md 63)
        plan = replace(plan, R_GU=r_gu_max)
    if nsplit > 1 and _cdiv(max_seq_len, nsplit - 1) <= block_s and short:
        # Split 0 takes the new position alone (instructions/attention.py), so its norm, RoPE,
        # append and score run beside the cached blocks' math, not after one: where every cached
        # split is still one block with one split fewer for them, and the layers are short enough
        # for attention's stage to count (H100: 0.6b 0.734 -> 0.731 ms; 1.7b and 4b 0.1-0.3% slower,
        # their register allocation, bench/NOTES.md 59). A longer context keeps all NSPLIT splits
        # for the cache, whose blocks then dwarf the new token.
        plan = replace(plan, ATTN_NEW=1)
    return plan


def short_b1_mlp(plan: Plan, workers: int) -> bool:
    """Batch 1 with the O projection on at most half the workers and no pools (``make_plan``'s
    short layers): the balanced megakernel tape then places O, gate/up and down by when their
    workers get there (``scheduler.graph.lagged``), and gate/up tiles take a tile's whole register
    budget."""
    return (plan.B == 1 and not any(plan.pool(op) for op in POOL_FIELDS)
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

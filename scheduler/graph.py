"""The decode step as a graph of tile instructions, assigned to workers as a tape.

A step is a list of *stages* in dependency order (embed; per layer QKV, attention, O
projection, gate/up, down; LM head; sample, where the plan's SAMPLE asks for it; argmax). Each
stage's tiles are cut into instructions of contiguous tiles, at most about one per worker, never crossing a *segment* (tiles that raise the
same counter). A consumer waits on the counter of the producer segment it needs, for as many
signals as that segment has instructions: the attention of kv head g waits only for the QKV tiles
of that head's rows, everything else for the whole previous stage.

Two tape modes share the kernel: ``megakernel`` (waits on producer counters, so a worker loads
its next weights while producers finish) and ``superkernel`` (no per-instruction waits; a
BARRIER instruction on every worker between stages, the shape of a grid-wide barrier).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .ops import MAX_POOL_CLAIMS, POOL_SHIFT, Instr, Op, Plan, cost, short_b1_mlp, without_pools


@dataclass
class Segment:
    tile_start: int
    tile_end: int
    key: tuple            # (op, layer, group): which counter its instructions raise


@dataclass
class Stage:
    op: Op
    layer: int
    segments: list[Segment]
    waits_on: list[tuple] = field(default_factory=list)   # one key per segment (or one for all)

    @property
    def ntiles(self) -> int:
        return sum(s.tile_end - s.tile_start for s in self.segments)


def qkv_group(plan: Plan, tile: int) -> int:
    """The kv head whose rows tile ``tile`` of the fused QKV projection computes."""
    row, G, D = tile // plan.SK_QKV * plan.R_QKV, plan.HQ // plan.HKV, plan.D
    q, kv = plan.HQ * D, plan.HKV * D
    if row < q:
        return row // (G * D)
    if row < q + kv:
        return (row - q) // D
    return (row - q - kv) // D


def build_stages(plan: Plan) -> list[Stage]:
    p = plan
    stages: list[Stage] = [Stage(Op.EMBED, 0, [Segment(0, p.B, (Op.EMBED, 0, 0))])]
    prev = (Op.EMBED, 0, 0)
    for l in range(p.L):
        # QKV: segments of consecutive tiles in the same kv group
        segs: list[Segment] = []
        for t in range(p.tiles(Op.QKV)):
            g = qkv_group(p, t) // p.ATTN_PAIR     # (an attention tile of two kv heads waits on both)
            if segs and segs[-1].key == (Op.QKV, l, g) and segs[-1].tile_end == t:
                segs[-1].tile_end = t + 1
            else:
                segs.append(Segment(t, t + 1, (Op.QKV, l, g)))
        stages.append(Stage(Op.QKV, l, segs, [prev]))
        # attention: tile (b, g, s) = (b * HKV + g) * NSPLIT + s; waits on its group's QKV tiles
        # (with ATTN_PAIR 2, tile (b, g) takes kv heads 2 g and 2 g + 1). All of them raise one
        # counter: the O projection needs every head.
        segs, waits = [], []
        for b in range(p.B):
            for g in range(p.HKV // p.ATTN_PAIR):
                t0 = (b * (p.HKV // p.ATTN_PAIR) + g) * p.NSPLIT
                segs.append(Segment(t0, t0 + p.NSPLIT, (Op.ATTN, l, 0)))
                waits.append((Op.QKV, l, g))
        stages.append(Stage(Op.ATTN, l, segs, waits))
        # a stage's pool (its last tiles, ops module doc) belongs to no instruction
        if p.TP == 1:
            for op, dep in ((Op.OPROJ, (Op.ATTN, l, 0)), (Op.GATEUP, (Op.OPROJ, l, 0)),
                            (Op.DOWN, (Op.GATEUP, l, 0))):
                stages.append(Stage(op, l, [Segment(0, p.tiles(op) - p.pool(op), (op, l, 0))], [dep]))
            prev = (Op.DOWN, l, 0)
            continue
        # tensor parallel: O and down write this rank's partial sums, each followed by a REDUCE of
        # every rank's into x (its layer word the partial's slot: 2 l, 2 l + 1)
        n_red = p.tiles(Op.REDUCE)
        for op, dep in ((Op.OPART, (Op.ATTN, l, 0)), (Op.REDUCE, (Op.OPART, l, 0)),
                        (Op.GATEUP, (Op.REDUCE, 2 * l, 0)), (Op.DPART, (Op.GATEUP, l, 0)),
                        (Op.REDUCE, (Op.DPART, l, 0))):
            slot = 2 * l + (op == Op.REDUCE and dep[0] == Op.DPART)
            at = slot if op == Op.REDUCE else l
            n = n_red if op == Op.REDUCE else p.tiles(op) - p.pool(op)
            stages.append(Stage(op, at, [Segment(0, n, (op, at, 0))], [dep]))
        prev = (Op.REDUCE, 2 * l + 1, 0)
    stages.append(Stage(Op.LMHEAD, 0, [Segment(0, p.tiles(Op.LMHEAD) - p.POOL_LM, (Op.LMHEAD, 0, 0))], [prev]))
    last = (Op.LMHEAD, 0, 0)
    if p.SAMPLE:
        # sampling on the device: each sampled sequence's token replaces the LM head's argmax
        for op in (Op.SSTATS, Op.SPICK, Op.SAMPLE):
            stages.append(Stage(op, 0, [Segment(0, p.tiles(op), (op, 0, 0))], [last]))
            last = (op, 0, 0)
    stages.append(Stage(Op.ARGMAX, 0, [Segment(0, p.B, (Op.ARGMAX, 0, 0))], [last]))
    return stages


def _minmax_parts(sizes: list[int], workers: int) -> list[int]:
    """Pieces per segment, ``workers`` in all (fewer where every piece is one tile), such that the
    largest piece is as small as it can be: each next piece goes to the segment whose pieces are
    largest."""
    parts = [1] * len(sizes)
    heap = [(-n, i) for i, n in enumerate(sizes)]
    heapq.heapify(heap)
    for _ in range(workers - len(sizes)):
        largest, i = heapq.heappop(heap)
        if -largest <= 1:
            break
        parts[i] += 1
        heapq.heappush(heap, (-sizes[i] // parts[i], i))     # minus the largest piece's tiles
    return parts


def split_stage(stage: Stage, workers: int) -> list[tuple[int, int, Segment, tuple]]:
    """Cut a stage into (tile_start, tile_end, segment, waits_on) pieces of about
    ntiles / workers tiles each, never crossing a segment boundary, and no more pieces than
    workers where the segments allow: rounding each segment's pieces up to ntiles / workers tiles
    can make more (8b's QKV: 24 segments of kv groups' q, k and v rows, 272 pieces for 264
    workers, so 8 workers would run two: 10 tiles where a cut along the segments needs 7)."""
    sizes = [seg.tile_end - seg.tile_start for seg in stage.segments]
    chunk = max(1, -(-stage.ntiles // workers))
    parts = [-(-n // chunk) for n in sizes]
    if sum(parts) > workers >= len(sizes):
        parts = _minmax_parts(sizes, workers)
    pieces = []
    for i, seg in enumerate(stage.segments):
        dep = stage.waits_on[i] if len(stage.waits_on) == len(stage.segments) else stage.waits_on[0] \
            if stage.waits_on else None
        n = sizes[i]
        for k in range(parts[i]):
            a = seg.tile_start + k * n // parts[i]
            b = seg.tile_start + (k + 1) * n // parts[i]
            pieces.append((a, b, seg, dep))
    return pieces


def lagged(plan: Plan, workers: int, mode: str = "megakernel", strategy: str = "balanced") -> bool:
    """Whether the balanced megakernel tape places attention, O, gate/up and down by when their
    workers get there (``_Placer``): at batch 1 where the O projection runs on at most half the
    workers (the plan's short layers, ``ops.short_b1_mlp``), so that those workers reach gate/up
    last while the others, with no O tile, reach it during attention and load their first gate/up
    tile then. Per layer:

    - attention's splits go in two halves (where they fit one a worker): split s < NSPLIT / 2 of
      group g to worker g * NSPLIT / 2 + s, split s + NSPLIT / 2 to that worker + workers / 2, so
      the two programs of an SM hold one early split (busy at a short context) and one late
      (empty) one. Such a tape assumes rows w and w + workers / 2 share an SM (``Tape.sm_mates``),
      which the backend makes so where the workers are two an SM (``megakernel.kernel._paired_row``);
    - O goes to the workers whose attention split is the latest of its group (empty at a short
      context: they reach O, and ask for its weights, as attention starts), one per SM;
    - gate/up gives those O workers the fewest tiles (``lagged_gateup``: they ask for all of them at
      O's end) and the others, which reach gate/up during attention with their first tile in
      registers, one more (and, with the halves, no SM four where three can do);
    - down goes to the O workers alone where that is at most two tiles each (their gate/up ends
      first), so the others reach the next layer's QKV, and its weights, during down.

    Measurements: docs/performance.md."""
    return (mode == "megakernel" and strategy == "balanced" and plan.TP == 1 and short_b1_mlp(plan, workers))


def _piece(stage: Stage, a: int, b: int):
    return (a, b, stage.segments[0], stage.waits_on[0])


def lagged_gateup(stage: Stage, late: int, workers: int) -> tuple[list, list]:
    """Gate/up cut for ``late`` workers that reach it at the O projection's end and ``workers - late``
    that reach it early, each of which loads its first tile's weights before the wait: m tiles for
    each late worker, at most m + 1 for each early one, m the least that covers the stage, so the
    bytes each worker asks for after O are at most m tiles. (late pieces, early pieces)."""
    n, early = stage.ntiles, workers - late
    m = 1
    while late * m + early * (m + 1) < n:
        m += 1
    t0 = stage.segments[0].tile_start
    cuts = [min(n, i * m) for i in range(late + 1)]
    late_pieces = [_piece(stage, t0 + a, t0 + b) for a, b in zip(cuts, cuts[1:]) if b > a]
    rest, start = n - cuts[-1], t0 + cuts[-1]
    parts = min(early, rest)
    early_pieces = [_piece(stage, start + j * rest // parts, start + (j + 1) * rest // parts) for j in range(parts)]
    return late_pieces, early_pieces


@dataclass
class Tape:
    plan: Plan
    workers: list[list[Instr]]
    num_counters: int
    counter_names: dict[int, str]
    mode: str
    strategy: str
    # the placement assumes rows w and w + workers / 2 run on one SM (the backend makes it so where
    # it can: ``megakernel.kernel._paired_row``)
    sm_mates: bool = False

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def instructions(self):
        for w, lst in enumerate(self.workers):
            for i, ins in enumerate(lst):
                yield w, i, ins


STRATEGIES = ("round-robin", "balanced")
MODES = ("megakernel", "superkernel")


class _Counters:
    """Counter numbers by key ((op, layer, group), a pool's (op, layer, "pool"), or a barrier's),
    from 1 in the order first asked for (0 is never raised), with their names for error messages."""

    def __init__(self):
        self.ids: dict[tuple, int] = {}
        self.names: dict[int, str] = {0: "never raised"}

    def __call__(self, key) -> int:
        if key not in self.ids:
            self.ids[key] = c = len(self.ids) + 1
            op, layer, group = key
            self.names[c] = f"BARRIER {layer}" if op == Op.BARRIER else \
                f"REDUCE of layer {layer // 2} after {'down' if layer % 2 else 'O'}" if op == Op.REDUCE else \
                f"{Op(op).name} layer {layer} pool claims" if group == "pool" else \
                f"{Op(op).name} layer {layer} group {group}"
        return self.ids[key]


def _instructions(plan: Plan, stage: Stage, pieces, mode: str, counter: _Counters, signals: dict) -> list[Instr]:
    """A stage's pieces as instructions: in megakernel mode each waits on its producer segment's
    counter (for as many signals as that segment has instructions) and raises its own segment's."""
    pool = plan.pool(stage.op)
    pc = counter((stage.op, stage.layer, "pool")) if pool else 0
    claims = pool + len(pieces) if pool else 0
    if claims > MAX_POOL_CLAIMS or pc >= 1 << POOL_SHIFT:
        raise ValueError(f"{stage.op.name} layer {stage.layer}: a pool of {pool} tiles over {len(pieces)} "
                         f"instructions makes {claims} claims a step (at most {MAX_POOL_CLAIMS}) on counter "
                         f"{pc} (below {1 << POOL_SHIFT}): use a smaller pool")
    instrs = []
    for a, b, seg, dep in pieces:
        if mode == "megakernel":
            wc, wn = (counter(dep), signals[dep]) if dep is not None else (0, 0)
            sc = counter(seg.key)
        else:
            wc, wn, sc = 0, 0, -1
        instrs.append(Instr(int(stage.op), stage.layer, a, b, wc, wn, sc, pc, claims))
    return instrs


class _Placer:
    """Worker lists and their loads (bytes, plus one an instruction) as stages are placed."""

    def __init__(self, plan: Plan, workers: int, strategy: str, lag: bool, halves: bool, late_gu: dict):
        self.plan, self.workers, self.strategy = plan, workers, strategy
        self.lag, self.halves, self.late_gu = lag, halves, late_gu
        self.lists: list[list[Instr]] = [[] for _ in range(workers)]
        self.load = [0] * workers
        self.rr = 0                         # round-robin: the next stage's first worker
        self.split_of: dict[int, int] = {}  # worker: the earliest attention split it holds this layer
        self.o_workers: list[int] = []      # the workers holding this layer's O projection

    def put(self, ins: Instr, w: int):
        self.lists[w].append(ins)
        self.load[w] += cost(self.plan, Op(ins.op), ins.ntiles) + 1

    def place(self, instrs, ws) -> list[tuple[Instr, int]]:
        """Largest first, each to the worker of ``ws`` with the least load of this stage, then of the
        step so far: a stage ends when its busiest worker does."""
        heap = [(0, self.load[v], v) for v in ws]
        heapq.heapify(heap)
        placed = []
        for ins in sorted(instrs, key=lambda i: -cost(self.plan, Op(i.op), i.ntiles)):
            stage_load, _, w = heapq.heappop(heap)
            before = self.load[w]
            self.put(ins, w)
            placed.append((ins, w))
            heapq.heappush(heap, (stage_load + self.load[w] - before, self.load[w], w))
        return placed

    def stage(self, stage: Stage, instrs: list[Instr]):
        plan, workers = self.plan, self.workers
        if self.strategy == "round-robin":
            for j, ins in enumerate(instrs):
                self.lists[(self.rr + j) % workers].append(ins)
            self.rr = (self.rr + len(instrs)) % workers
        elif self.halves and stage.op == Op.ATTN:
            self._attention_halves(instrs)
        elif self.lag and stage.op == Op.OPROJ:
            # the workers whose earliest split is the latest first
            first = sorted(range(workers), key=lambda v: (-self.split_of.get(v, plan.NSPLIT), self.load[v]))
            self.o_workers = [w for _, w in self.place(instrs, first[:len(instrs)])]
        elif self.lag and stage.op == Op.GATEUP:
            self._lagged_gateup(instrs, self.late_gu[stage.layer])
        elif self.lag and stage.op == Op.DOWN and len(instrs) == len(self.o_workers):
            self.place(instrs, self.o_workers)
        else:
            placed = self.place(instrs, range(workers))
            if stage.op == Op.ATTN:
                # at a short context the early splits of each group hold its positions, the later none
                self.split_of = {}
                for ins, w in placed:
                    self.split_of[w] = min(self.split_of.get(w, plan.NSPLIT), ins.tile_start % plan.NSPLIT)

    def _attention_halves(self, instrs):
        """Split s < NSPLIT / 2 of group g on worker g * NSPLIT / 2 + s, split s + NSPLIT / 2 on that
        worker + workers / 2, its SM mate: each SM holds one worker with an early (at a short
        context: busy) split and one with a late (empty) one, and O goes to the latter."""
        half, workers = self.plan.NSPLIT // 2, self.workers
        self.split_of = dict.fromkeys(range(workers), -1)      # no split: O goes there last
        for ins in instrs:
            g, s = divmod(ins.tile_start, self.plan.NSPLIT)
            w = g * half + s % half + (workers // 2 if s >= half else 0)
            self.put(ins, w)
            self.split_of[w] = s

    def _lagged_gateup(self, instrs, n_late: int):
        late_placed = self.place(instrs[:n_late], self.o_workers)
        early = sorted(set(range(self.workers)) - set(self.o_workers))
        if not self.halves:
            self.place(instrs[n_late:], early)
            return
        # largest first, each to the free early worker whose SM (w and w + workers / 2, the tape's
        # sm_mates) holds the fewest gate/up tiles so far: no SM holds four where three can do
        half = self.workers // 2
        on_sm = [0] * half
        for ins, w in late_placed:
            on_sm[w % half] += ins.ntiles
        free = set(early)
        for ins in sorted(instrs[n_late:], key=lambda i: -i.ntiles):
            w = min(free, key=lambda v: (on_sm[v % half], v))
            free.remove(w)
            self.put(ins, w)
            on_sm[w % half] += ins.ntiles


def _lagged_pieces(stages, pieces_per_stage, workers: int) -> dict[int, int]:
    """Recut each layer's gate/up and down for the lagged placement (``lagged``), in place; returns
    layer: how many of its gate/up pieces go to its O workers (the first ones)."""
    late_gu = {}
    n_o = {s.layer: len(p) for s, p in zip(stages, pieces_per_stage) if s.op == Op.OPROJ}
    for k, s in enumerate(stages):
        if s.op == Op.GATEUP:
            late, early = lagged_gateup(s, n_o[s.layer], workers)
            pieces_per_stage[k] = late + early
            late_gu[s.layer] = len(late)
        elif s.op == Op.DOWN and s.ntiles <= 2 * n_o[s.layer]:
            n = s.ntiles
            pieces_per_stage[k] = [_piece(s, j * n // n_o[s.layer], (j + 1) * n // n_o[s.layer])
                                   for j in range(n_o[s.layer])]
    return late_gu


def build_tape(plan: Plan, workers: int, strategy: str = "balanced", mode: str = "megakernel") -> Tape:
    """Assign every tile of a decode step to ``workers`` workers.

    round-robin: instruction j of a stage goes to worker (first + j) mod W, where ``first``
    continues from the previous stage, so short stages do not always land on worker 0.
    balanced: list scheduling (``_Placer.place``); where ``lagged`` holds, attention, O, gate/up
    and down are placed by when their workers get there instead. Both keep every worker's list in
    stage order, which with co-resident workers rules out deadlock (a wait only names earlier
    stages). A superkernel tape has no pools (``Tape.plan`` is the plan without them)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: {', '.join(STRATEGIES)}")
    if mode not in MODES:
        raise ValueError(f"unknown tape mode {mode!r}: {', '.join(MODES)}")
    if workers < 1:
        raise ValueError("workers must be at least 1")
    if mode == "superkernel":
        plan = without_pools(plan)      # pools claim from counters, which a superkernel tape has not
    stages = build_stages(plan)
    counter = _Counters()
    pieces_per_stage = [split_stage(s, workers) for s in stages]
    lag = lagged(plan, workers, mode, strategy)
    # attention's splits in two halves of the workers: every (group, split) one tile, one
    # instruction each, and half of them fit half the workers
    halves = (lag and plan.NSPLIT % 2 == 0 and plan.tiles(Op.ATTN) // 2 <= workers // 2
              and all(b - a == 1 for s, pcs in zip(stages, pieces_per_stage) if s.op == Op.ATTN for a, b, _, _ in pcs))
    late_gu = _lagged_pieces(stages, pieces_per_stage, workers) if lag else {}
    signals: dict[tuple, int] = {}
    for pieces in pieces_per_stage:
        for a, b, seg, dep in pieces:
            signals[seg.key] = signals.get(seg.key, 0) + 1
    placer = _Placer(plan, workers, strategy, lag, halves, late_gu)
    for k, (stage, pieces) in enumerate(zip(stages, pieces_per_stage)):
        placer.stage(stage, _instructions(plan, stage, pieces, mode, counter, signals))
        if mode == "superkernel" and k < len(stages) - 1:
            bar = counter((Op.BARRIER, k, 0))
            for lst in placer.lists:
                lst.append(Instr(int(Op.BARRIER), k, 0, 0, bar, workers, bar))
    lists = placer.lists
    # within a stage the balanced strategy reorders; restore each worker's stage order
    if strategy == "balanced":
        rank = {(s.op, s.layer): i for i, s in enumerate(stages)}
        for lst in lists:
            lst.sort(key=lambda i: (rank.get((Op(i.op), i.layer), -1) if i.op != Op.BARRIER else
                                    i.layer + 0.5, i.tile_start))
    return Tape(plan, lists, len(counter.ids) + 1, counter.names, mode, strategy, sm_mates=halves)


def encode(tape: Tape):
    """int32 tensors: tape [workers, max_len, WORDS] padded with NOOP, and lengths [workers]."""
    import torch

    from .ops import WORDS
    n = max(1, max(len(l) for l in tape.workers))
    out = torch.zeros(tape.num_workers, n, WORDS, dtype=torch.int32)
    for w, lst in enumerate(tape.workers):
        if lst:
            out[w, :len(lst)] = torch.tensor([i.encode() for i in lst], dtype=torch.int32)
    lengths = torch.tensor([len(l) for l in tape.workers], dtype=torch.int32)
    return out, lengths


def decode(words, lengths) -> list[list[Instr]]:
    return [[Instr.decode(words[w, i].tolist()) for i in range(int(lengths[w]))] for w in range(words.shape[0])]

"""python -m megakernel.tune: choose the plan by measuring candidate plans on this GPU, and cache the fastest.

    python -m megakernel.tune --model 0.6b --batch-size 1,8 --max-seq-len 4096 --budget-s 600

For each batch size and max_seq_len, the candidates are the plan's fields around the rules' plan
(scheduler.ops.make_plan): rows per tile of each GEMV, K-chunk widths, attention's splits, block
and pipeline depth, pools on or off, the tape's placement strategy and, on CUDA, the workers per
SM (and, for the batched weights-on-M tile, one worker of 8 warps an SM). A pass measures every
one-field move from the best plan so far; the next pass moves from the new best, until a pass finds
nothing faster or the time budget is spent. Each candidate's tape is first checked by the
validator (an invalid one is skipped, with the reason), then timed with real decode steps of the
persistent kernel on the same weights and prompt: the median over a few launches. The winner is
measured again against the rules' plan, alternating, and kept only if it is still faster. The
result goes to the plan cache (megakernel/plans.py), which generate, bench, serve and MegaQwen3
read. Ctrl-C stops the search and keeps what it has measured.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import megakernel  # noqa: F401  (selects the device before any kernel module loads)

import torch

from scheduler.graph import build_tape
from scheduler.ops import (BATCH_INPUTS, BATCH_MAX_ROWS, BATCH_MIN_ROWS, MAX_BK, MAX_POOL_CLAIMS, POOL_DIV, POOL_FIELDS,
                           SWAP_SMEM_BASE, TILE_ELEMS, WORKERS_PER_SM, Op, Plan, next_pow2)
from scheduler.validate import TapeError, validate

from . import cli
from . import device as devices
from . import plans

# A candidate must beat the best so far by this fraction to become the best (timing noise).
MIN_GAIN = 0.01
# A tile of more weight elements than this many times the register budget would only spill.
MAX_TILE_BUDGETS = 2
# Rounds of the final rules-against-winner check, each a measurement of both.
CONFIRM_ROUNDS = 2
GPU_DEFAULTS = {"steps": 32, "reps": 5}
CPU_DEFAULTS = {"steps": 1, "reps": 2}
# Fields whose change moves work between workers or in time but leaves every tile's arithmetic as it
# is: plans that differ only in these give bit-identical logits. The others change the order of a
# sum (K-chunk width; rows per tile, through the register layout of the reduction or the batched
# tile's K slices; attention's splits and blocks, through the combine) and so the rounding.
ORDER_ONLY_FIELDS = ("KV_STAGES", "POOL_O", "POOL_GU", "POOL_DOWN", "POOL_LM")
# rows field -> (the K-chunk field its tiles use, the op)
ROWS = {"R_QKV": ("BK_H", Op.QKV), "R_O": ("BK_Q", Op.OPROJ), "R_GU": ("BK_H", Op.GATEUP),
        "R_DOWN": ("BK_I", Op.DOWN), "R_LM": ("BK_H", Op.LMHEAD)}


@dataclass(frozen=True)
class Candidate:
    """A plan to measure: ``fields`` (sorted pairs) differ from the rules' plan at its worker count."""
    fields: tuple = ()
    strategy: str = "balanced"
    workers_per_sm: int | None = None      # None: the device's default (and off CUDA)
    num_warps: int = 4

    @classmethod
    def of(cls, base: Plan, plan: Plan, strategy: str, workers_per_sm: int | None, num_warps: int = 4) -> "Candidate":
        diff = {k: getattr(plan, k) for k in plans.TUNABLE if getattr(plan, k) != getattr(base, k)}
        return cls(tuple(sorted(diff.items())), strategy, workers_per_sm, num_warps)

    @property
    def overrides(self) -> dict:
        return dict(self.fields)

    def options(self) -> dict:
        opts = {"plan_overrides": self.overrides, "strategy": self.strategy}
        if self.workers_per_sm is not None:
            opts["workers_per_sm"] = self.workers_per_sm
        if self.num_warps != 4:
            opts["num_warps"] = self.num_warps
        return opts

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.fields]
        if self.strategy != "balanced":
            parts.append(f"strategy={self.strategy}")
        if self.workers_per_sm not in (None, WORKERS_PER_SM):
            parts.append(f"workers_per_sm={self.workers_per_sm}")
        if self.num_warps != 4:
            parts.append(f"num_warps={self.num_warps}")
        return " ".join(parts) or "rules"


def order_only(a: Candidate, b: Candidate) -> bool:
    """Whether plans ``a`` and ``b`` have the same tile arithmetic (``ORDER_ONLY_FIELDS``)."""
    fa, fb = a.overrides, b.overrides
    moved = {k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k)}
    return (a.workers_per_sm, a.num_warps) == (b.workers_per_sm, b.num_warps) and moved <= set(ORDER_ONLY_FIELDS)


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _tiles(plan: Plan, op: Op) -> int:
    return plan.tiles(op)


def can_pool(plan: Plan) -> bool:
    """Whether the plan's GEMV tiles take pools: the register tiles, and the weights-on-M tile where
    it loads no chunk before its wait (SWAP_PRE 0); not the batch-on-M tile."""
    return not plan.BATCHED or (plan.BATCHED == 2 and not plan.SWAP_PRE)


def with_pools(plan: Plan, workers: int, on: bool) -> Plan:
    """Pools in every stage whose tiles give each worker one at least (a fifth of its tiles), or none
    (always none where the tiles take none, ``can_pool``)."""
    if not on or not can_pool(plan):
        return replace(plan, **dict.fromkeys(POOL_FIELDS.values(), 0))
    return replace(plan, **{f: (min(_tiles(plan, op) // POOL_DIV, MAX_POOL_CLAIMS - workers)
                                if _tiles(plan, op) >= workers else 0) for op, f in POOL_FIELDS.items()})


# the op each K-split field cuts
SPLITS = {"SK_QKV": Op.QKV, "SK_O": Op.OPROJ, "SK_GU": Op.GATEUP, "SK_DOWN": Op.DOWN}


def _rescale_pool(plan: Plan, op: Op, workers: int) -> Plan:
    """After a change of ``op``'s rows or K-splits: its pool, where it has one, a fifth of its new tile count."""
    field = POOL_FIELDS.get(op)
    if not field or not getattr(plan, field):
        return plan
    return replace(plan, **{field: min(_tiles(plan, op) // POOL_DIV, MAX_POOL_CLAIMS - workers)})


def check_plan(plan: Plan, num_warps: int = 4) -> str | None:
    """Why the kernels cannot run ``plan`` (None: they can). The tape validator checks the rest."""
    budget = MAX_TILE_BUDGETS * TILE_ELEMS * num_warps // 4
    if plan.BATCHED == 2:
        for name, K in (("SK_QKV", plan.H), ("SK_O", plan.HQ * plan.D), ("SK_GU", plan.H), ("SK_DOWN", plan.I)):
            sk = getattr(plan, name)
            if not (_pow2(sk) and K % sk == 0 and (K // sk) % 128 == 0 or sk == 1):
                return f"{name}={sk}: K-splits are a power of two over whole 128-column chunks"
        if not (_pow2(plan.R_QKV) and plan.D % plan.R_QKV == 0):
            return f"R_QKV={plan.R_QKV}: a QKV tile is a power of two of rows dividing the head dim"
    for name, (bk, op) in ROWS.items():
        r = getattr(plan, name)
        if plan.BATCHED == 2:
            continue        # (the rest is checked where the plan is made: Plan.__post_init__)
        if plan.BATCHED:
            if name == "R_QKV" and not (_pow2(r) and plan.D % r == 0 and BATCH_MIN_ROWS <= r <= BATCH_MAX_ROWS):
                return f"R_QKV={r}: a batched QKV tile is a power of two of 16 to 128 rows dividing the head dim"
            if name != "R_QKV" and not (r % 8 == 0 and BATCH_MIN_ROWS <= r <= BATCH_MAX_ROWS):
                return f"{name}={r}: a batched tile is a multiple of 8 rows, 16 to {BATCH_MAX_ROWS}"
        else:
            if not _pow2(r):
                return f"{name}={r}: rows per tile must be a power of two"
            if name == "R_QKV" and r > (plan.D & -plan.D):
                return f"R_QKV={r}: a QKV tile must not straddle two heads"
            if r * getattr(plan, bk) > budget:
                return f"{name}={r} x {bk}={getattr(plan, bk)}: over {MAX_TILE_BUDGETS}x the register budget"
    for name, K in (("BK_H", plan.H), ("BK_Q", plan.HQ * plan.D), ("BK_I", plan.I)):
        bk = getattr(plan, name)
        if not (_pow2(bk) and 16 <= bk <= min(MAX_BK, next_pow2(K))):
            return f"{name}={bk}: a K-chunk is a power of two from 16 to min({MAX_BK}, the row's width)"
    if not (_pow2(plan.BLOCK_S) and 16 <= plan.BLOCK_S <= 64):
        return f"BLOCK_S={plan.BLOCK_S}: attention blocks are 16, 32 or 64 positions"
    if not 1 <= plan.KV_STAGES <= 4:
        return f"KV_STAGES={plan.KV_STAGES}: 1 to 4"
    if not (_pow2(plan.NSPLIT) and plan.NSPLIT <= 64):
        return f"NSPLIT={plan.NSPLIT}: a power of two up to 64"
    for op, field in POOL_FIELDS.items():
        if getattr(plan, field) >= _tiles(plan, op):
            return f"{field}={getattr(plan, field)}: a pool of all of its stage's {_tiles(plan, op)} tiles"
    return None


def moves(base: Plan, cand: Candidate, workers: int, cuda: bool) -> list[Candidate]:
    """The one-field moves from ``cand`` (relative to ``base``, the rules' plan at its worker
    count), most promising first: pools on/off, attention splits, rows per tile, workers per SM,
    placement, K-chunks, attention blocks and pipeline depth, the new-position split, the batched
    tiles' input (split or bf16)."""
    p = replace(base, **cand.overrides)
    out: list[tuple[Plan, str, int | None]] = []

    def add(plan: Plan, strategy=cand.strategy, wps=cand.workers_per_sm):
        out.append((plan, strategy, wps))

    layouts: list[Candidate] = []      # moves to another layout, relative to the rules' plan there
    pooled = any(p.pool(op) for op in POOL_FIELDS)
    if can_pool(p):
        add(with_pools(p, workers, not pooled))
    for v in (p.NSPLIT * 2, p.NSPLIT // 2):
        if v >= 1 and (v <= 2 or v * p.B * p.HKV <= 2 * workers):
            # (two kv heads a tile take one split: more splits end the pairs)
            add(replace(p, NSPLIT=v, ATTN_NEW=p.ATTN_NEW if v >= 2 else 0, ATTN_PAIR=p.ATTN_PAIR if v == 1 else 1))
    if p.BATCHED == 2:
        # the weights-on-M tile: K-splits, and the rows of the stages whose blocks write no xss
        for name in ("SK_GU", "SK_DOWN", "SK_O", "SK_QKV"):
            for v in (getattr(p, name) * 2, getattr(p, name) // 2):
                if v >= 1:
                    add(_rescale_pool(replace(p, **{name: v}), SPLITS[name], workers))
        for name in ("R_GU", "R_LM", "R_QKV"):
            for v in (getattr(p, name) * 2, getattr(p, name) // 2):
                if 8 <= v <= 128:
                    add(replace(p, **{name: v}))
    for name in ("R_GU", "R_DOWN", "R_O", "R_QKV", "R_LM"):
        if p.BATCHED == 2:
            break
        r = getattr(p, name)
        # a batched tile's rows stay a multiple of 8 (``check_plan``)
        for v in (r * 2, r // 2 // 8 * 8 if p.BATCHED and name != "R_QKV" else r // 2):
            if v >= 1:
                add(_rescale_pool(replace(p, **{name: v}), ROWS[name][1], workers))
    if cuda and cand.num_warps == 4:
        other = None if cand.workers_per_sm == 1 else 1      # None: the default, WORKERS_PER_SM
        out.append((None, cand.strategy, other))      # the rules' plan at that worker count
    if cuda and p.BATCHED == 2:
        # the other layout: one worker of 8 warps an SM with its whole shared memory (224 KB of
        # pipeline, rule whole-sm-pipeline), or two of 4 (0.6b batch 32 on an H200: 1.437 -> 1.328 ms; 8b +1.9%)
        if cand.num_warps == 4:
            layouts.append(Candidate((), cand.strategy, 1, 8))
        else:
            layouts.append(Candidate((), cand.strategy, None))
    add(p, strategy="round-robin" if cand.strategy == "balanced" else "balanced")
    if not p.BATCHED:
        for name in ("BK_H", "BK_Q", "BK_I"):
            bk = getattr(p, name)
            for v in (bk * 2, bk // 2):
                add(replace(p, **{name: v}))
    for v in (p.BLOCK_S * 2, p.BLOCK_S // 2):
        add(replace(p, BLOCK_S=v))
    for v in (2, 3, 4):
        if v != p.KV_STAGES:
            add(replace(p, KV_STAGES=v))
    if p.NSPLIT >= 2:
        add(replace(p, ATTN_NEW=1 - p.ATTN_NEW))
    add(replace(p, ATTN_CALL=1 - p.ATTN_CALL))     # attention's tile called, not inlined
    if p.NSPLIT == 1 and p.HKV % 2 == 0:
        add(replace(p, ATTN_PAIR=3 - p.ATTN_PAIR))  # two kv heads an attention tile
    if p.BATCHED == 2:  # the weights-on-M tile's weights by TMA or by pointer loads, its MMA, its padding
        add(replace(p, SWAP_TMA=1 - p.SWAP_TMA))
        add(replace(p, MMA_V3=1 - p.MMA_V3))
        add(replace(p, SWAP_CALL=1 - p.SWAP_CALL))
        for v in (p.SWAP_PRE + 1, p.SWAP_PRE - 1):
            if 0 <= v <= 2:
                add(replace(p, SWAP_PRE=v))
        # the pipeline's shared memory: the default, or the most at which two workers fit an SM
        add(replace(p, SWAP_SMEM=112 if p.SWAP_SMEM == SWAP_SMEM_BASE else SWAP_SMEM_BASE))
        if p.B <= 8:
            add(replace(p, SWAP_MIN_N=24 - p.SWAP_MIN_N))
    if p.BATCHED and p.BATCH_INPUT != BATCH_INPUTS["fp8"]:
        # last: one bf16 MMA measured slower on the batch-on-M tile (H100); untimed on the other. (w8a8's
        # e4m3 input is the checkpoint's scheme, not a move)
        add(replace(p, BATCH_INPUT=1 - p.BATCH_INPUT))
    cands = [Candidate((), strategy, wps) if plan is None else Candidate.of(base, plan, strategy, wps, cand.num_warps)
             for plan, strategy, wps in out] + layouts
    seen, result = {cand}, []
    for c in cands:
        if c not in seen:
            seen.add(c)
            result.append(c)
    return result


# ---------------------------------------------------------------------------------------------
# Measuring


class Skip(Exception):
    """A candidate that cannot run; the message says why."""


@dataclass
class Measured:
    candidate: Candidate
    ms: float | None            # median ms per decode step; None where skipped
    note: str = ""


@dataclass
class Outcome:
    key: plans.Key
    entry: plans.Entry | None   # None where not even the rules' plan was measured
    measured: list[Measured]
    interrupted: bool = False


def _default_timer(backend):
    from .bench import Timer
    return Timer(backend.st.x.device)


class Tuner:
    """Measures candidate plans of one (model, batch, max_seq_len) with the persistent kernel.

    ``timer(backend)`` is a context manager with ``ms()`` around the timed launches (default: the
    bench's, device events on a GPU); ``clock()`` gives seconds for the budget. Both are
    parameters so that tests can run the search with a fake timer and clock."""

    def __init__(self, model, batch_size: int, max_seq_len: int, prompt_len: int = 128, steps: int | None = None,
                 reps: int | None = None, timer: Callable = _default_timer, clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] | None = None, seed: int = 0, fp8_activations: str | None = None):
        from .backends import default_workers, rules_layout
        from .runtime import MegaQwen3
        dev = model.device
        if dev.type not in ("cuda", "cpu"):
            raise ValueError(f"tuning runs the persistent kernel on CUDA or through the CPU interpreter, not {dev.type}")
        defaults = GPU_DEFAULTS if dev.type == "cuda" else CPU_DEFAULTS
        self.steps = steps or defaults["steps"]
        self.reps = reps or defaults["reps"]
        if max_seq_len < 2 + self.steps:
            raise ValueError(f"max_seq_len {max_seq_len} leaves no room for a prompt and {self.steps} steps")
        # the reference backend first (no kernel to build); each candidate brings its own
        # (FP8 weights: the scheme a run would take, ``fp8_activations`` or the checkpoint's; its
        # tiles differ, so it names the plan's key)
        self.mk = MegaQwen3(model, max_seq_len=max_seq_len, batch_size=batch_size, backend="reference", plan="rules",
                            fp8_activations=fp8_activations)
        self.mk.backend_name = "megakernel"
        self.cuda = dev.type == "cuda"
        self.sms = default_workers(dev) if self.cuda else 0
        # the rules' plan in the rules' layout of workers (``scheduler.ops.default_layout``), as a run takes it
        warps, per_sm = rules_layout(self.mk) if self.cuda else (4, None)
        self.rules = Candidate((), "balanced", per_sm, warps) if warps != 4 else Candidate()
        self.timer, self.clock = timer, clock
        self.log = log or (lambda msg: None)
        P = max(1, min(prompt_len, max_seq_len - self.steps - 1))
        g = torch.Generator().manual_seed(seed)
        self.prompt = torch.randint(0, model.config.vocab_size, (batch_size, P), generator=g)
        self.key = plans.Key.of(dev, model.config, model.dtype, batch_size, max_seq_len,
                                quant=plans.quant_name(model.weights.quantization, self.mk.w8a8))
        self.measured: dict[Candidate, Measured] = {}

    def workers(self, cand: Candidate) -> int:
        return self.sms * (cand.workers_per_sm or WORKERS_PER_SM) if self.cuda else 1

    def base(self, cand: Candidate) -> Plan:
        from .backends import tile_plan
        return tile_plan(self.mk, self.workers(cand), num_warps=cand.num_warps)

    def plan(self, cand: Candidate) -> Plan:
        """The candidate's plan, checked: a Skip names what is wrong with it or its tape."""
        try:
            plan = replace(self.base(cand), **cand.overrides)
        except (ValueError, TypeError) as e:
            raise Skip(str(e)) from None
        why = check_plan(plan, cand.num_warps)
        if why:
            raise Skip(why)
        try:
            validate(build_tape(plan, self.workers(cand), strategy=cand.strategy, mode="megakernel"))
        except (TapeError, ValueError) as e:
            raise Skip(f"invalid tape: {str(e).splitlines()[0]}") from None
        return plan

    def time_steps(self, cand: Candidate) -> float:
        """Median ms per decode step of ``cand``: after a warm-up launch (which compiles), ``reps``
        launches of ``steps`` greedy steps each from the same prefilled prompt."""
        from .backends import MegakernelError, make_kernel_backend
        from .bench import _sync
        mk = self.mk
        self.plan(cand)
        try:
            backend = make_kernel_backend("megakernel", mk, **cand.options())
        except (RuntimeError, ValueError) as e:       # e.g. fewer workers resident than asked
            raise Skip(f"the kernel does not build: {cli.one_line(e)}") from None
        if backend.tape.num_workers != self.workers(cand):
            raise Skip(f"only {backend.tape.num_workers} of its {self.workers(cand)} workers fit resident")
        mk.backend = backend
        k = self.steps
        try:
            mk.prefill(self.prompt)
            mk.steps(k, per_launch=k)
            backend.synchronize()
            times = []
            for _ in range(self.reps):
                mk.prefill(self.prompt)
                with self.timer(backend) as t:
                    mk.steps(k, per_launch=k)
                _sync(mk.weights.device)
                backend.synchronize()
                times.append(t.ms() / k)
        except MegakernelError as e:
            raise Skip(f"a wait timed out: {cli.one_line(e)[:200]}") from None
        finally:
            mk.backend = None
        return statistics.median(times)

    def measure(self, cand: Candidate) -> Measured:
        if cand in self.measured:
            return self.measured[cand]
        try:
            m = Measured(cand, self.time_steps(cand))
            self.log(f"  {m.ms:8.4f} ms/step  {cand.describe()}")
        except Skip as e:
            m = Measured(cand, None, str(e))
            self.log(f"  {'skipped':>8}           {cand.describe()}: {e}")
        self.measured[cand] = m
        return m

    def search(self, budget_s: float, progress=None) -> Outcome:
        """Hill-climb from the rules' plan by one-field moves until a pass finds nothing faster or
        ``budget_s`` is spent (the rules' plan is measured whatever the budget); then the winner
        against the rules' plan, alternating. Ctrl-C ends it with what was measured."""
        start = self.clock()
        deadline = start + budget_s
        rules = self.rules
        durations: list[float] = []
        interrupted = False
        best = None

        def timed(c: Candidate) -> Measured:
            t0 = self.clock()
            m = self.measure(c)
            durations.append(self.clock() - t0)
            if progress is not None:
                progress(self.clock() - start, best_ms(), c)
            return m

        def best_ms():
            return self.measured[best].ms if best is not None and best in self.measured else None

        try:
            first = timed(rules)
            if first.ms is None:
                raise RuntimeError(f"the rules' plan does not run: {first.note}")
            best = rules
            improved = True
            while improved:
                improved = False
                center = best
                for c in moves(self.base(center), center, self.workers(center), self.cuda):
                    if c in self.measured:
                        continue
                    est = statistics.mean(durations) if durations else 0.0
                    if self.clock() + est > deadline:
                        break
                    m = timed(c)
                    if m.ms is not None and m.ms < self.measured[best].ms * (1 - MIN_GAIN):
                        best = c
                if best != center and self.clock() < deadline:
                    improved = True
            rules_ms, best_ms_ = self._confirm(rules, best)
            if best != rules and best_ms_ >= rules_ms:
                self.log(f"  the winner ({best.describe()}) measured {best_ms_:.4f} ms/step against the rules' "
                         f"{rules_ms:.4f} when checked again: keeping the rules' plan")
                best, best_ms_ = rules, rules_ms
        except KeyboardInterrupt:
            interrupted = True
            if best is None:
                return Outcome(self.key, None, list(self.measured.values()), True)
            rules_ms, best_ms_ = self.measured[rules].ms, self.measured[best].ms
        entry = plans.Entry(key=self.key, fields=best.overrides, strategy=best.strategy,
                            workers_per_sm=(best.workers_per_sm or WORKERS_PER_SM) if self.cuda else None,
                            num_warps=best.num_warps,
                            tuned_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            rules_ms=round(rules_ms, 5), tuned_ms=round(best_ms_, 5),
                            max_seq_len=self.mk.max_seq_len, measured=sum(m.ms is not None for m in self.measured.values()),
                            extra={"interrupted": interrupted, "steps": self.steps, "reps": self.reps,
                                   "prompt_len": self.prompt.shape[1]})
        return Outcome(self.key, entry, list(self.measured.values()), interrupted)

    def _confirm(self, rules: Candidate, best: Candidate) -> tuple[float, float]:
        """Medians of the rules' plan and ``best``, measured again in turn (with the search's own
        measurement of each), so that a lucky launch does not pick the plan."""
        if best == rules:
            return self.measured[rules].ms, self.measured[rules].ms
        r, b = [self.measured[rules].ms], [self.measured[best].ms]
        for _ in range(CONFIRM_ROUNDS):
            r.append(self.time_steps(rules))
            b.append(self.time_steps(best))
        self.log(f"  checked again: rules {statistics.median(r):.4f}, {best.describe()} {statistics.median(b):.4f} "
                 f"ms/step")
        return statistics.median(r), statistics.median(b)


def tune(model, batch_sizes, max_seq_lens, budget_s: float, prompt_len: int = 128, steps: int | None = None,
         reps: int | None = None, timer: Callable = _default_timer, clock: Callable[[], float] = time.monotonic,
         log: Callable[[str], None] | None = None, show_progress: bool | None = None,
         cache: Path | None = None, fp8_activations: str | None = None) -> list[Outcome]:
    """Tune every (batch size, max_seq_len), sharing ``budget_s`` among those left, and write each
    result to the plan cache as soon as it is known (so Ctrl-C loses nothing measured)."""
    from tqdm import tqdm
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    settings = [(B, S) for B in batch_sizes for S in max_seq_lens]
    deadline = clock() + budget_s
    outcomes = []
    for i, (B, S) in enumerate(settings):
        share = max(0.0, (deadline - clock()) / (len(settings) - i))
        bar = tqdm(total=round(share, 1), unit="s", desc=f"batch {B}, max_seq_len {S}", file=sys.stderr,
                   disable=not show_progress if show_progress is not None else None, leave=True,
                   bar_format="{desc}: {percentage:3.0f}% of the budget |{bar}| {n:.0f}/{total:.0f} s {postfix}")

        def progress(elapsed, best_ms, cand, bar=bar):
            bar.n = round(min(elapsed, bar.total), 1)
            bar.set_postfix_str(f"best {best_ms:.4f} ms/step" if best_ms else "", refresh=True)

        tuner = Tuner(model, B, S, prompt_len, steps, reps, timer=timer, clock=clock,
                      log=lambda msg: bar.write(msg, file=sys.stderr), seed=i, fp8_activations=fp8_activations)
        log(f"tuning batch {B}, max_seq_len {S} (context bucket {tuner.key.context}), budget {share:.0f} s")
        try:
            out = tuner.search(share, progress)
        finally:
            bar.close()
        outcomes.append(out)
        if out.entry is not None:
            path = plans.save([out.entry], cache)
            log(f"batch {B}, max_seq_len {S}: {out.entry.describe()}; {out.entry.measured} plans measured"
                f"{' (interrupted)' if out.interrupted else ''}; saved to {path}")
        if out.interrupted:
            raise KeyboardInterrupt
    return outcomes


# ---------------------------------------------------------------------------------------------
# Command line


def _int_list(flag: str, text: str, least: int) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise cli.UsageError(f"{flag} takes integers separated by commas, got {text!r}") from None
    if not values:
        raise cli.UsageError(f"{flag} is empty")
    bad = [v for v in values if v < least]
    if bad:
        raise cli.UsageError(f"{flag} values must be at least {least}, got {bad[0]}")
    return list(dict.fromkeys(values))


def build_parser() -> cli.Parser:
    from .model import DTYPES
    p = cli.Parser(prog="python -m megakernel.tune", description=cli.description(__doc__),
                   epilog="example:\n  python -m megakernel.tune -m 0.6b --batch-size 1,8 --max-seq-len 512 "
                          "--budget-s 600")
    p.add_argument("-m", "--model", required=True,
                   help="size alias (0.6b 1.7b 4b 8b 14b 32b), Hugging Face repo id, checkpoint folder, or "
                        "tiny-random")
    p.add_argument("--random-weights", action="store_true",
                   help="deterministic random weights of the model's shapes (a plan depends on shapes only)")
    p.add_argument("--batch-size", default="1", metavar="B[,B...]", help="batch sizes to tune, comma-separated")
    p.add_argument("--max-seq-len", default="4096", metavar="N[,N...]",
                   help="KV-cache lengths to tune, comma-separated; a plan serves every max_seq_len of its "
                        "power-of-two bucket (e.g. 2049 to 4096)")
    p.add_argument("--budget-s", type=cli.number, default=600.0, help="seconds for the whole search, shared "
                                                                        "among the settings")
    p.add_argument("--prompt-len", type=cli.at_least(1), default=128,
                   help="tokens in the cache when the steps are timed")
    p.add_argument("--steps", type=cli.at_least(1), default=None,
                   help=f"decode steps per timed launch (default {GPU_DEFAULTS['steps']} on a GPU, "
                        f"{CPU_DEFAULTS['steps']} on the CPU)")
    p.add_argument("--reps", type=cli.at_least(1), default=None,
                   help=f"timed launches per candidate, their median kept (default {GPU_DEFAULTS['reps']} on a "
                        f"GPU, {CPU_DEFAULTS['reps']} on the CPU)")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="weight dtype (default: bfloat16 on a GPU, float32 on the CPU)")
    p.add_argument("--quantize", choices=("fp8",), default=None,
                   help="fp8: tune the plan of block-FP8 projections (quantized on load, as bench and generate "
                        "take it; an -FP8 checkpoint is FP8 already)")
    p.add_argument("--fp8-activations", choices=("dynamic", "none"), default=None,
                   help="FP8 weights: the scheme to tune, dynamic (w8a8, the default) or none (weight-only); "
                        "each has its own plans")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: the best available)")
    p.add_argument("--force-cpu", action="store_true",
                   help="tune a real-sized model on the CPU anyway (Triton's interpreter: minutes a step)")
    return p


def main(argv=None) -> int:
    def body() -> int:
        from .backends import MAX_STEPS_PER_LAUNCH
        from .bench import CPU_MAX_PARAMS, _cpu_refusal
        from .model import locate_model, resolve_dtype
        args = build_parser().parse_args(argv)
        batches = _int_list("--batch-size", args.batch_size, 1)
        lens = _int_list("--max-seq-len", args.max_seq_len, 2)
        if args.budget_s <= 0:
            raise cli.UsageError(f"--budget-s must be positive, got {args.budget_s:g}")
        if args.steps is not None and args.steps > MAX_STEPS_PER_LAUNCH:
            raise cli.UsageError(f"--steps must be at most {MAX_STEPS_PER_LAUNCH} (steps one launch runs)")
        dev = devices.resolve(args.device)
        if dev.type not in ("cuda", "cpu"):
            raise cli.UsageError(f"tuning runs the persistent kernel on CUDA (or the CPU interpreter), not {dev.type}")
        dtype = resolve_dtype(args.dtype, dev)
        if dev.type == "cpu" and dtype != torch.float32:
            raise cli.UsageError("on the CPU the kernels run through Triton's interpreter, which needs --dtype float32")
        steps = args.steps or (GPU_DEFAULTS if dev.type == "cuda" else CPU_DEFAULTS)["steps"]
        short = [n for n in lens if n < 2 + steps]
        if short:
            raise cli.UsageError(f"--max-seq-len {short[0]} leaves no room for a prompt and {steps} timed steps")
        source = locate_model(args.model, random_weights=args.random_weights)
        if dev.type == "cpu" and source.config.num_parameters() > CPU_MAX_PARAMS and not args.force_cpu:
            raise cli.UsageError(_cpu_refusal(args.model, source.config.num_parameters()))
        if args.fp8_activations and not (args.quantize or source.quantization):
            raise cli.UsageError("--fp8-activations is for FP8 weights: add --quantize fp8 (or tune an -FP8 checkpoint)")
        model = source.load(dev, dtype, progress=sys.stderr.isatty(), quantize=args.quantize)
        from .runtime import fp8_scheme
        scheme = fp8_scheme(model.weights.quantization, args.fp8_activations)
        fp8 = "" if scheme is None else f", FP8 {'w8a8' if scheme == 'dynamic' else 'weight-only'} projections"
        print(f"tuning {args.model} ({plans.shape_name(model.config)}, {plans.dtype_name(model.dtype)}{fp8}) on "
              f"{plans.device_name(dev)}, Triton {plans.triton_version()}; cache {plans.cache_path()}",
              file=sys.stderr)
        outcomes = tune(model, batches, lens, args.budget_s, args.prompt_len, args.steps, args.reps,
                        fp8_activations=args.fp8_activations)
        for out in outcomes:
            e = out.entry
            gain = 100 * (e.rules_ms / e.tuned_ms - 1) if e and e.tuned_ms else 0.0
            print(f"batch {e.key.batch}  context {e.key.context}  rules {e.rules_ms:.4f} ms/step  tuned "
                  f"{e.tuned_ms:.4f} ms/step  ({gain:+.1f}%)  {e.changes()}")
        return 0

    return cli.run(body)


if __name__ == "__main__":
    sys.exit(main())

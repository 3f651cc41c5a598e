"""The step's buffers, specified once: what each is, its shape, dtype and role.

``SPEC`` lists every tensor a decode step touches. ``StepBuffers.allocate`` builds them from it
(taking the weights and the model's state where they are given), and ``kernel_args`` binds any
kernel's parameters to them by name: a parameter ``<name>_ptr`` is buffer ``<name>``, a
constexpr is a plan field (or a backend option), anything else a named scalar. So the persistent
kernel's and every per-op kernel's argument order is written only in their signatures.

Roles:
- ``weight``: the model's weights (``Qwen3Weights``), checked against the spec;
- ``scale``: the FP8 projections' block scales, the model's where its plan is FP8 (``Plan.FP8``),
  else a one-element placeholder that no kernel reads (the kernels take the pointer either way);
- ``state``: what persists between steps and the runtime owns (tokens, lengths, the KV cache,
  logits); allocated here only where not given (``compile_check``, on meta tensors);
- ``scratch``: the step's activations and partials, allocated here;
- ``control``: the persistent kernel's tape, counters and bookkeeping (only with ``workers``).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Callable

import torch

from instructions.common import KEY_EMPTY, TRACE_SLOTS
from instructions.sample import CAP as _CAP, NS as _NS
from instructions.tiles import TICK_STRIDE
from instructions.wgmma import SS_ROWS, kpart_elems
from scheduler.ops import WORDS, Plan

# The most decode steps one launch of the persistent kernel runs, and so the rows of ``hist``;
# greedy decoding computes and drops at most this many steps past a stop token.
MAX_STEPS_PER_LAUNCH = 64
SAMPLE_CAP = _CAP.value      # candidates a sampled sequence keeps (instructions.sample)
SAMPLE_NS = _NS.value        # words of a chunk's statistics (instructions.sample)
# SM ids the persistent kernel can pair programs on (``kernel._paired_row``; its MAX_SMS)
MAX_SMS = 1024

ACT = "act"     # the weights' dtype: qkv, attn and act are kept in it, as transformers keeps them


@dataclass(frozen=True)
class Dims:
    """The sizes a buffer's shape is written in: the plan's, and the persistent kernel's tape."""
    plan: Plan
    workers: int = 0        # programs of the persistent kernel (0: no control buffers)
    tape_len: int = 1       # instructions in the longest worker's list
    counters: int = 0       # counter words of the tape
    trace: bool = False

    def __getattr__(self, name):
        return getattr(self.plan, name)


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: Callable[[Dims], tuple]
    dtype: object           # a torch dtype, or ACT
    role: str               # weight | state | scratch | control
    hot: bool = False       # in the one allocation laid out for the L2 (``hot_buffers``)
    doc: str = ""


_f32, _i32, _i64 = torch.float32, torch.int32, torch.int64


def _grid(d: Dims, rows: int, k: int) -> tuple:
    """An FP8 projection's stacked scale grid [L, rows / SCALE_ROWS, K / 128] (one element without FP8)."""
    return (d.L, math.ceil(rows / d.SCALE_ROWS), math.ceil(k / 128)) if d.FP8 else (1,)


SPEC: tuple[Buffer, ...] = (
    # weights (Qwen3Weights), stacked over layers
    Buffer("embed", lambda d: (d.V, d.H), ACT, "weight"),
    Buffer("lm_head", lambda d: (d.V, d.H), ACT, "weight", doc="the embedding itself when tied"),
    Buffer("final_norm", lambda d: (d.H,), ACT, "weight"),
    Buffer("input_norm", lambda d: (d.L, d.H), ACT, "weight"),
    Buffer("post_norm", lambda d: (d.L, d.H), ACT, "weight"),
    Buffer("q_norm", lambda d: (d.L, d.D), ACT, "weight"),
    Buffer("k_norm", lambda d: (d.L, d.D), ACT, "weight"),
    Buffer("wqkv", lambda d: (d.L, d.QKV_ROWS, d.H), ACT, "weight", doc="q rows, then k rows, then v rows"),
    Buffer("wo", lambda d: (d.L, d.H, d.HQ * d.D), ACT, "weight"),
    Buffer("wgate_up", lambda d: (d.L, 2 * d.I, d.H), ACT, "weight", doc="gate rows, then up rows"),
    Buffer("wdown", lambda d: (d.L, d.H, d.I), ACT, "weight"),
    Buffer("wqkv_scale", lambda d: _grid(d, d.QKV_ROWS, d.H), _f32, "scale", doc="models.qwen3.fp8 scale grids"),
    Buffer("wo_scale", lambda d: _grid(d, d.H, d.HQ * d.D), _f32, "scale"),
    Buffer("wgate_up_scale", lambda d: _grid(d, 2 * d.I, d.H), _f32, "scale"),
    Buffer("wdown_scale", lambda d: _grid(d, d.H, d.I), _f32, "scale"),
    # the runtime's state
    Buffer("tokens", lambda d: (d.B,), _i32, "state", doc="each sequence's pending input token"),
    Buffer("lengths", lambda d: (d.B,), _i32, "state", doc="positions cached: the next token's position"),
    Buffer("k_cache", lambda d: (d.L, d.B, d.HKV, d.S, d.D), ACT, "state"),
    Buffer("v_cache", lambda d: (d.L, d.B, d.HKV, d.S, d.D), ACT, "state"),
    Buffer("logits", lambda d: (d.B, d.V), _f32, "state"),
    # each sequence's sampling settings (instructions/sample.py; read only by plans with SAMPLE)
    Buffer("inv_temp", lambda d: (d.B,), _f32, "state", doc="1 / temperature; 0: greedy"),
    Buffer("top_k", lambda d: (d.B,), _i32, "state", doc="0: no top-k"),
    Buffer("top_p", lambda d: (d.B,), _f32, "state", doc="1.0: no top-p"),
    Buffer("seed", lambda d: (d.B,), _i64, "state", doc="the sequence's Philox key"),
    # tensor parallelism (TP > 1; instructions/allreduce.py): each rank's partial sums and flags, in
    # symmetric memory where the persistent kernel reads its peers' (megakernel/tp.py), and their
    # addresses in this process; one word each at TP 1
    Buffer("part", lambda d: (2 * d.L, d.B, d.H) if d.TP > 1 else (1, 1, 1), _f32, "state",
           doc="slot 2 l: O's partial sum of layer l, 2 l + 1: down's"),
    Buffer("flags", lambda d: (1 + 2 * d.L,) if d.TP > 1 else (1,), _i32, "state",
           doc="[0] abort (1 + the rank that aborted), [1 + slot] the last step whose partial is published"),
    Buffer("peers", lambda d: (2 * d.TP,), _i64, "state", doc="every rank's part, then flags, addresses"),
    # scratch; the hot ones in their layout's order
    Buffer("x", lambda d: (d.B, d.H), _f32, "scratch", hot=True, doc="the residual stream"),
    Buffer("attn", lambda d: (d.B, d.HQ * d.D), ACT, "scratch", hot=True, doc="attention's output"),
    Buffer("counters", lambda d: (d.counters,), _i32, "scratch", hot=True, doc="the tape's counters (only grow)"),
    Buffer("act", lambda d: (d.B, d.I), ACT, "scratch", hot=True, doc="silu(gate) * up"),
    Buffer("qkv", lambda d: (d.B, d.QKV_ROWS), ACT, "scratch", hot=True, doc="raw q, k, v projections"),
    Buffer("opart", lambda d: (d.B * d.HQ * d.NSPLIT, d.D), _f32, "scratch", doc="attention partials"),
    Buffer("ml", lambda d: (d.B * d.HQ * d.NSPLIT, 2), _f32, "scratch", doc="partials' max and sum"),
    Buffer("tickets", lambda d: (d.B * d.HKV,), _i32, "scratch", doc="attention splits finished (only grow)"),
    Buffer("amax", lambda d: (d.B,), _i64, "scratch", doc="the LM head's packed argmax (common.argmax_key)"),
    Buffer("kpart", lambda d: (kpart_elems(d.plan),), _f32, "scratch",
           doc="the K-split tiles' partial sums and sums of squares (instructions.wgmma)"),
    Buffer("xs", lambda d: (2, d.B, d.H) if d.BATCHED == 2 else (1,), ACT, "scratch",
           doc="x times the next norm weight, a head and a remainder (instructions.wgmma)"),
    Buffer("xss", lambda d: (math.ceil(d.H / SS_ROWS.value), d.B) if d.BATCHED == 2 else (1,), _f32, "scratch",
           doc="x's sums of squares over each SS_ROWS columns (instructions.wgmma)"),
    Buffer("kticks", lambda d: (4 * TICK_STRIDE.value,), _i32, "scratch",
           doc="the K-split stages' tickets, a word a row block (instructions.tiles; only grow)"),
    Buffer("inv_freq", lambda d: (d.D // 2,), _f32, "scratch", doc="RoPE frequencies, as transformers computes"),
    Buffer("sstats", lambda d: (d.B, (-(-d.V // d.SAMPLE_CHUNK) + 1) * SAMPLE_NS if d.SAMPLE else 1), _f32,
           "scratch", doc="a sampled sequence's chunk statistics, then its level and count (instructions.sample)"),
    Buffer("cand", lambda d: (d.B, SAMPLE_CAP if d.SAMPLE else 1), _f32, "scratch",
           doc="a sampled sequence's candidate logits (instructions.sample)"),
    Buffer("cand_idx", lambda d: (d.B, SAMPLE_CAP if d.SAMPLE else 1), _i32, "scratch", doc="... and their indices"),
    Buffer("hist", lambda d: (MAX_STEPS_PER_LAUNCH, d.B), _i32, "scratch", doc="each step's token in a launch"),
    # the persistent kernel's
    Buffer("tape", lambda d: (d.workers, d.tape_len, WORDS), _i32, "control", doc="scheduler.graph.encode"),
    Buffer("tape_len", lambda d: (d.workers,), _i32, "control", doc="instructions in each worker's list"),
    Buffer("epoch", lambda d: (d.workers,), _i32, "control", doc="steps each program has run"),
    Buffer("err", lambda d: (1 + 4 * d.workers,), _i32, "control",
           doc="[0] a wait timed out; [1 + 4w:5 + 4w] program w's (position + 1, counter, target, seen)"),
    Buffer("trace", lambda d: (d.workers * d.tape_len * TRACE_SLOTS.value if d.trace else 1,), _i64, "control"),
    Buffer("pairs", lambda d: (1 + 2 * MAX_SMS + d.workers,), _i32, "control", doc="kernel._paired_row's counts"),
)
BY_NAME = {b.name: b for b in SPEC}

# The hot buffers are every worker's polls and the reads right after them. The H100's and H200's
# L2 alternates its two halves in 4 KB chunks (bit 12 XOR bit 13 of the address), so each starts
# at a chunk 1 (mod 4) and one of at most 8 KB lies in one half, the same for all (see
# docs/performance.md).
HOT_CHUNK, HOT_ALIGN = 4096, 65536


def hot_buffers(shapes, dtypes, device) -> list[torch.Tensor]:
    """Zeroed tensors of ``shapes`` and ``dtypes`` in one allocation, laid out as above."""
    sizes = [math.prod(sh) * dt.itemsize for sh, dt in zip(shapes, dtypes)]
    starts, at = [], HOT_CHUNK
    for n in sizes:
        starts.append(at)
        at += -(-max(n, 1) // (4 * HOT_CHUNK)) * 4 * HOT_CHUNK     # the next chunk 1 (mod 4) past it
    raw = torch.zeros(at + HOT_ALIGN, dtype=torch.uint8, device=device)
    base = -raw.data_ptr() % HOT_ALIGN
    return [raw[base + a: base + a + n].view(dt).view(sh) for a, n, sh, dt in zip(starts, sizes, shapes, dtypes)]


class StepBuffers:
    """The buffers of ``SPEC`` by name (``st.x``, ``st["x"]``), and the step's scalars."""

    def __init__(self, tensors: dict[str, torch.Tensor], eps: float, rope_theta: float, num_warps: int = 4):
        self.tensors = tensors
        self.eps, self.rope_theta, self.num_warps = eps, rope_theta, num_warps

    def __getattr__(self, name):
        try:
            return self.__dict__["tensors"][name]
        except KeyError:
            raise AttributeError(f"no step buffer {name!r}") from None

    def __getitem__(self, name) -> torch.Tensor:
        return self.tensors[name]

    @staticmethod
    def allocate(plan: Plan, config, weights, state: dict | None = None, num_warps: int = 4, workers: int = 0,
                 tape: tuple | None = None, counters: int = 0, trace: bool = False) -> "StepBuffers":
        """The buffers of a step of ``plan`` on the weights' device. ``state``: the runtime's tensors
        by name (allocated where missing); ``workers`` > 0 adds the persistent kernel's control
        buffers, ``tape`` being ``scheduler.graph.encode``'s (words, lengths)."""
        dev, adt = weights.device, weights.dtype
        if bool(plan.FP8) != bool(weights.quantization):
            raise ValueError(f"a plan {'with' if plan.FP8 else 'without'} FP8 for weights "
                             f"{'in FP8' if weights.quantization else 'in ' + str(adt)}: make the plan with "
                             f"fp8={bool(weights.quantization)}")
        d = Dims(plan, workers, tape[0].shape[1] if tape else 1, counters, bool(trace))
        given = {**weights.tensors(), **(state or {})}
        if tape:
            given.update(tape=tape[0].to(dev), tape_len=tape[1].to(dev))
        out: dict[str, torch.Tensor] = {}
        hot = [b for b in SPEC if b.hot]
        for b, t in zip(hot, hot_buffers([b.shape(d) for b in hot], [_dtype(b, adt) for b in hot], dev)):
            out[b.name] = t
        for b in SPEC:
            if b.hot or (b.role == "control" and not workers):
                continue
            shape, dtype = b.shape(d), _dtype(b, adt)
            if b.name in given:
                t = given[b.name]
                if tuple(t.shape) != tuple(shape) or (b.role != "weight" and t.dtype != dtype):
                    raise ValueError(f"step buffer {b.name}: {tuple(t.shape)} {t.dtype}, the spec says "
                                     f"{tuple(shape)} {dtype}")
                if b.name in ("k_cache", "v_cache") and cache_batch(t) != plan.kv_batch:
                    # the kernels address the cache from its base with the plan's layer stride
                    raise ValueError(f"step buffer {b.name} is a view of a cache of batch {cache_batch(t)}; the "
                                     f"plan's KV_B says {plan.kv_batch}")
                out[b.name] = t
            elif b.role == "weight" or (b.role == "scale" and plan.FP8) or b.name in ("tape", "tape_len"):
                raise ValueError(f"step buffer {b.name} ({b.role}) must be given")
            else:
                out[b.name] = torch.zeros(shape, dtype=dtype, device=dev)
        out["amax"].fill_(KEY_EMPTY.value)
        D = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
        out["inv_freq"].copy_(inv_freq)
        return StepBuffers(out, config.rms_norm_eps, config.rope_theta, num_warps)


def cache_batch(k: torch.Tensor) -> int:
    """The allocated batch of a KV cache ``k`` [L, B, Hkv, S, D], or of a view of its first B slots
    (``k[:, :B]``): its layer stride in sequences, the plan's ``KV_B``. A ValueError where the
    kernels cannot address it so: each sequence's [Hkv, S, D] must be contiguous and the layers a
    whole number of sequences apart."""
    L, B, Hkv, S, D = k.shape
    seq = Hkv * S * D
    if tuple(k.stride()[1:]) != (seq, S * D, D, 1) or k.stride(0) % seq or k.stride(0) // seq < B:
        raise ValueError(f"a KV cache of shape {tuple(k.shape)} with strides {tuple(k.stride())}: the kernels need "
                         f"[L, B, Hkv, S, D] contiguous but for the batch (a view of a larger cache's first slots)")
    return k.stride(0) // seq


def _dtype(b: Buffer, act) -> torch.dtype:
    return act if b.dtype == ACT else b.dtype


def kernel_params(fn) -> list[tuple[str, bool]]:
    """(name, is constexpr) of a @triton.jit kernel's parameters, in order (compiled or interpreted)."""
    out = []
    for p in inspect.signature(fn.fn).parameters.values():
        a = p.annotation
        out.append((p.name, a is not inspect.Parameter.empty and "constexpr" in (a if isinstance(a, str) else
                                                                                  getattr(a, "__name__", str(a)))))
    return out


def kernel_args(fn, st: StepBuffers, constexprs: dict, **scalars) -> dict:
    """Keyword arguments of a launch of ``fn``, every parameter by name: ``<buffer>_ptr`` from
    ``st``, a constexpr from ``constexprs``, anything else from ``scalars`` (or ``st``'s eps)."""
    values = {"eps": st.eps, **scalars}
    args = {}
    for name, const in kernel_params(fn):
        if const:
            source, key = constexprs, name
        elif name.endswith("_ptr"):
            source, key = st.tensors, name[:-4]
        else:
            source, key = values, name
        if key not in source:
            raise KeyError(f"{fn.fn.__name__}: no value for its parameter {name!r} "
                           f"({'a constexpr' if const else 'a buffer' if name.endswith('_ptr') else 'a scalar'})")
        args[name] = source[key]
    return args

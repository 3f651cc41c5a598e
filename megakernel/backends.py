"""The kernel backends: ``megakernel``, ``superkernel``, ``per-op`` and ``cuda-graph``.

All four run the same tile functions (``instructions/``) over the same scratch buffers:
- megakernel: one persistent launch per step over a tape with counter waits (``scheduler``);
- superkernel: one persistent launch over a tape with a grid-wide barrier between stages;
- per-op: each stage launched as its own standalone kernel over all its tiles, in order;
- cuda-graph: the per-op launches of a step captured once in a CUDA graph and replayed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import torch

from instructions import common as k_common
from instructions.registry import DEVICE_KINDS
from scheduler.graph import Tape, build_tape, build_stages, encode
from scheduler.ops import COUNTER_RESET_STEPS, MAX_BK, WORKERS_PER_SM, Op, Plan, default_layout, make_plan

from . import device as devices
# HOT_CHUNK, MAX_STEPS_PER_LAUNCH and hot_buffers stay importable from here (bench and tests use them)
from .buffers import HOT_CHUNK, MAX_STEPS_PER_LAUNCH, StepBuffers, cache_batch, hot_buffers, kernel_args  # noqa: F401


class MegakernelError(RuntimeError):
    """A persistent kernel stopped on a wait that timed out; the message names the instruction."""


class RankError(MegakernelError):
    """Another rank of a tensor-parallel run stopped or failed (or this one did): the message names
    it (``megakernel.tp``)."""


def model_state(mk) -> dict[str, torch.Tensor]:
    """The runtime's tensors a step advances (``buffers.SPEC``'s state role), by buffer name; with
    tensor parallelism also its symmetric buffers (``megakernel.tp``), where it has them."""
    return dict(tokens=mk.tokens, lengths=mk.cache.lengths, k_cache=mk.cache.k, v_cache=mk.cache.v,
                logits=mk.logits, **getattr(mk, "sampling_buffers", {}), **getattr(mk, "tp_buffers", {}))


def step_buffers(mk, plan: Plan, num_warps: int = 4, **control) -> StepBuffers:
    """The buffers of a step of ``mk`` (a ``MegaQwen3``) under ``plan``."""
    return StepBuffers.allocate(plan, mk.config, mk.weights, model_state(mk), num_warps, **control)


def default_workers(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    if device.type == "npu":
        return devices.npu_vector_cores(device)
    return 1    # the interpreter runs programs one after another: one worker runs the whole tape


def rules_layout(mk, workers: int | None = None) -> tuple[int, int]:
    """(warps a worker, workers an SM) of ``mk``'s rules' plan on its CUDA GPU, for ``workers``
    workers where a count is asked for (``scheduler.ops.default_layout``)."""
    w = mk.weights
    return default_layout(mk.config, mk.batch_size, default_workers(w.device), bf16=w.dtype == torch.bfloat16,
                          tp=getattr(mk, "tp", 1), fp8=w.quantization == "fp8", workers=workers)


def tile_plan(mk, workers: int, max_bk: int = MAX_BK, overrides: dict | None = None, num_warps: int = 4,
              tp_swap: bool = True) -> Plan:
    """The tile sizes for ``workers`` workers: the rules' plan, with the fields of ``mk``'s tuned
    plan where it runs one (``megakernel.plans``), then any fields overridden (experiments). The
    persistent and per-op backends both use it, so with the same workers their numbers agree bit
    for bit. ``tp_swap`` (the backends' option): a tensor-parallel batch on the weights-on-M tile (the
    default), or with False on the batch-on-M tile, for comparison (``scheduler.ops.plan_and_rules``)."""
    fp8 = mk.weights.quantization == "fp8"
    plan = make_plan(mk.config, mk.batch_size, mk.max_seq_len, workers, max_bk=max_bk, num_warps=num_warps,
                     tp=getattr(mk, "tp", 1), fp8=fp8, w8a8=getattr(mk, "w8a8", False), tp_swap=tp_swap,
                     bf16_inputs=mk.weights.dtype == torch.bfloat16)
    choice = getattr(mk, "plan_choice", None)
    tuned = choice.entry.fields if choice is not None and choice.entry is not None else {}
    if tuned:
        try:
            plan = dataclasses.replace(plan, **tuned)
        except ValueError as e:     # tuned by a version whose tiles took other sizes
            import sys
            print(f"warning: the cached tuned plan does not fit this version's tiles ({e}); using the rules' "
                  f"plan (python -m megakernel.tune makes a new one)", file=sys.stderr)
    plan = with_cache(plan, mk)
    plan = dataclasses.replace(plan, **(overrides or {}))
    # the tiles read the weights' format from their pointers; the plan's byte costs must assume the
    # same one (checked here, on the host: triton-ascend cannot fold a dtype test in the kernel)
    if bool(plan.FP8) != fp8:
        raise ValueError(f"the plan's FP8={plan.FP8} does not match the weights ({mk.weights.quantization or 'not quantized'})")
    return plan


def _tma_scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def set_tma_allocator(plan: Plan, device: torch.device):
    """Give Triton its scratch allocator where ``plan``'s tiles make tensor descriptors (SWAP_TMA):
    a launch then asks it for the memory each program writes its descriptors to. Triton keeps the
    allocator in a context variable, which a new thread (the server's engine) does not inherit, so
    each launch sets it."""
    if plan.SWAP_TMA and device.type == "cuda":
        import triton
        triton.set_allocator(_tma_scratch)


@contextlib.contextmanager
def triton_mma(plan: Plan):
    """Compile ``plan``'s kernels as its MMA_V3 asks: 0 sets Triton's DISABLE_MMA_V3, which its compiler
    reads as it lowers the dots (and keys its disk cache by), so every dot is mma.sync. Triton has no
    per-dot choice; the plan's BT keeps such kernels apart in its in-memory cache. Wraps the calls
    that may compile."""
    if plan.MMA_V3:
        yield
        return
    old = os.environ.get("DISABLE_MMA_V3")
    os.environ["DISABLE_MMA_V3"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["DISABLE_MMA_V3"]
        else:
            os.environ["DISABLE_MMA_V3"] = old


def with_cache(plan: Plan, mk) -> Plan:
    """``plan`` with the layer stride of ``mk``'s KV cache (``Plan.KV_B``): a batch bucket's cache is a
    view of the first slots of the server's one cache (``runtime.SlotView``), read in place."""
    kv = cache_batch(mk.cache.k)
    return plan if kv == plan.B else dataclasses.replace(plan, KV_B=kv)


def _check_kernel_device(mk, name):
    dev = mk.weights.device
    if dev.type == "cpu" and not devices.interpreted():
        raise RuntimeError(f"backend {name} on the CPU needs Triton's interpreter: set TRITON_INTERPRET=1 "
                           f"before importing megakernel (or DEVICE=cpu)")
    if dev.type == "cpu" and mk.weights.dtype != torch.float32:
        raise RuntimeError(f"backend {name} on the CPU needs float32 weights (the interpreter has no "
                           f"{mk.weights.dtype} arithmetic); load the model with dtype=torch.float32")


TRACE_SLOTS = k_common.TRACE_SLOTS.value
TRACE_PHASES = {"waited": k_common.T_WAITED.value, "input": k_common.T_INPUT.value,
                "computed": k_common.T_COMPUTED.value, "first": k_common.T_FIRST.value}


class PersistentBackend:
    """megakernel / superkernel: one launch of the persistent kernel per step."""

    def __init__(self, mk, mode: str = "megakernel", num_workers: int | None = None,
                 strategy: str = "balanced", spin: int | None = None, num_warps: int = 4, trace: int = 0,
                 workers_per_sm: int = WORKERS_PER_SM, max_bk: int = MAX_BK, plan_overrides: dict | None = None,
                 prefetch_tape: bool | None = None, tp_swap: bool = True, maxnreg: int | None = None,
                 uniform_tape: bool | None = None):
        _check_kernel_device(mk, mode)
        # a cap on the registers a thread (ptxas' maxnreg), so that more workers fit an SM
        if maxnreg is not None and not 1 <= maxnreg <= 255:
            raise ValueError(f"maxnreg={maxnreg}: a thread's register cap is 1 to 255 (ptxas allots at most 255)")
        self.maxnreg = maxnreg
        self.tp_swap = bool(tp_swap)      # tile_plan's: False puts TP batches on the batch-on-M tile
        # triton-ascend cannot lower the vector tape fetch (tests/npu_lowering.py): scalar there
        self.prefetch_tape = prefetch_tape if prefetch_tape is not None else mk.weights.device.type != "npu"
        # the tape's words made warp-uniform (``warp_uniform``: PTX's redux.sync, sm_80 and up, so not
        # on the interpreter or triton-ascend; meta tensors are compile_check's CUDA compiles). On by
        # default where it was timed, Hopper (docs/performance.md, "The tape's words warp-uniform")
        dev = mk.weights.device
        cap = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
        redux = dev.type == "meta" or (cap is not None and cap >= (8, 0))
        timed = dev.type == "meta" or (cap is not None and cap >= (9, 0))
        self.uniform_tape = timed if uniform_tape is None else bool(uniform_tape)
        if self.uniform_tape and not redux:
            raise ValueError(f"uniform_tape=True needs a CUDA GPU of compute capability 8.0 or above (PTX's "
                             f"redux.sync), not {dev.type}")
        self.plan_overrides = plan_overrides or {}
        from .kernel import megakernel
        self.kernel = megakernel
        self.mk, self.mode, self.trace = mk, mode, trace
        dev = mk.weights.device
        if dev.type == "cpu" and num_workers not in (None, 1):
            raise ValueError("the interpreter runs one program at a time: use num_workers=1 on the CPU")
        # polls before a wait gives up: well under a second on a GPU (a legal wait is microseconds);
        # on the interpreter every legal wait is already satisfied (one worker, topological
        # order), so a few polls suffice, except a REDUCE's on the other ranks' processes
        tp = getattr(mk, "tp", 1)
        self.spin = spin if spin is not None else (1 << 19 if dev.type == "cuda" else 1 << 16 if tp > 1 else 4)
        self.num_warps, self.strategy, self.max_bk = num_warps, strategy, max_bk
        self.steps = self._reset_at = 0
        self._pending = None
        self._launch_args: dict = {}
        self.sms = default_workers(dev) if dev.type == "cuda" else 0   # SM pairs: CUDA only (_build)
        self.num_workers, self.workers_per_sm = num_workers, workers_per_sm
        self.sampling = False           # the tape has a SAMPLE stage (``set_sampling``)
        self._variants: dict[bool, dict] = {}
        self._build_fitting()

    # Sampling on the device: every kernel backend runs a plan with SAMPLE=1 (a SAMPLE stage before
    # ARGMAX, instructions/sample.py) while any sequence samples, and the greedy plan otherwise, so
    # greedy decoding keeps its tape and binary. Each plan's tape, buffers and counters are built
    # once, on first use, and kept (``set_sampling`` swaps them).
    device_sampling = True
    _VARIANT = ("tape", "plan", "st", "words", "counters", "epoch", "err", "pairs", "trace_buf", "argmax_c",
                "argmax_n", "sm_pairs", "_err_host", "steps", "_reset_at", "_pending", "kernel_info")

    def set_sampling(self, on: bool):
        """Run the plan with a SAMPLE stage (``on``) or the greedy one from the next launch."""
        on = bool(on)
        if on == self.sampling:
            return
        self._check_errors(now=True)     # a pending error belongs to the plan it happened in
        self._variants[self.sampling] = {a: getattr(self, a) for a in self._VARIANT if hasattr(self, a)}
        self.sampling = on
        if on in self._variants:
            for a, v in self._variants[on].items():
                setattr(self, a, v)
            return
        self.steps = self._reset_at = 0
        self._pending = None
        self._build_fitting()

    def _build_fitting(self):
        """Build the tape of the current plan for the workers asked for, or, on a GPU, as many as
        the compiled kernel lets be resident at once."""
        num_workers, sms = self.num_workers, self.sms
        if self.mk.weights.device.type != "cuda":
            self._build(num_workers or 1)
            return
        self._build(num_workers or sms * self.workers_per_sm)
        fit = sms * self.resident_per_sm()
        if self.tape.num_workers > fit:
            if num_workers:
                raise RuntimeError(f"{num_workers} workers cannot all be resident at once ({fit} fit on this "
                                   f"GPU with this kernel's registers and shared memory): a persistent kernel "
                                   f"would deadlock. Use at most {fit}.")
            self._build(fit)
        if self.sm_pairs and self.kernel_info["resident_per_sm"] != 2:
            # three programs might share an SM, and one hold another's row: leave the driver's placement
            self.sm_pairs = 0

    def _build(self, workers: int):
        mk, dev = self.mk, self.mk.weights.device
        overrides = {**self.plan_overrides, "SAMPLE": int(self.sampling)}
        self.tape: Tape = build_tape(tile_plan(mk, workers, self.max_bk, overrides, self.num_warps, self.tp_swap),
                                     workers, strategy=self.strategy, mode=self.mode)
        self.plan = self.tape.plan      # a superkernel tape's is without pools
        self.st = st = step_buffers(mk, self.plan, self.num_warps, workers=workers, tape=encode(self.tape),
                                    counters=self.tape.num_counters, trace=bool(self.trace))
        # the backend's own names for the control buffers (tests and the trace read them)
        self.words, self.counters, self.epoch, self.err, self.pairs = st.tape, st.counters, st.epoch, st.err, st.pairs
        self.trace_buf = st.trace
        # the counter the step boundary waits on (several steps per launch): ARGMAX's, raised
        # argmax_n times a step; none in superkernel mode, which runs one step per launch
        argmaxes = [ins for _, _, ins in self.tape.instructions() if ins.op == Op.ARGMAX and ins.signal_counter > 0]
        self.argmax_c, self.argmax_n = (argmaxes[0].signal_counter, len(argmaxes)) if argmaxes else (0, 0)
        # a tape that assumes rows w and w + workers / 2 share an SM gets it where the workers are
        # exactly two a SM (``kernel._paired_row``): SM_PAIRS = workers / 2, else 0 (the driver's)
        self.sm_pairs = workers // 2 if (dev.type == "cuda" and self.tape.sm_mates and workers == 2 * self.sms) else 0
        self._err_host = torch.zeros_like(self.err, device="cpu", pin_memory=dev.type == "cuda")

    def resident_per_sm(self) -> int:
        """Programs of the compiled kernel that fit on one SM at once (registers, shared memory,
        threads): the grid must not exceed SMs times this, or workers would wait on programs that
        never start."""
        with triton_mma(self.plan):
            k = self.kernel.warmup(grid=(self.tape.num_workers,), **self.launch_args())
        k._init_handles()     # loads the binary; n_regs and n_spills are read from it
        props = torch.cuda.get_device_properties(self.mk.weights.device)
        threads = 32 * self.num_warps
        regs = max(1, k.n_regs) * threads
        by_regs = getattr(props, "regs_per_multiprocessor", 65536) // regs
        by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // threads
        smem = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
        # the driver reserves 1 KB of an SM's shared memory for every resident block (sm_80 on)
        reserved = 1024 if props.major >= 8 else 0
        by_smem = smem // (max(1, k.metadata.shared) + reserved)
        self.kernel_info = {"n_regs": k.n_regs, "n_spills": k.n_spills, "shared": k.metadata.shared,
                            "resident_per_sm": min(by_regs, by_threads, by_smem)}
        if min(by_regs, by_threads, by_smem) < 1:
            raise RuntimeError(f"{self.mode}: the compiled kernel needs {k.metadata.shared} bytes of shared memory "
                               f"and {k.n_regs} registers a thread; not one program fits on an SM of this GPU "
                               f"({smem} bytes of shared memory). Fewer pipeline stages or a smaller batch.")
        return min(by_regs, by_threads, by_smem)

    def reset_counters(self):
        group = getattr(self.mk, "tp_group", None)
        if group is not None:
            group.reset_flags()     # every rank at once: a peer may still read this one's flags
        self._reset_at = self.steps
        self.counters.zero_()
        self.st.amax.fill_(k_common.KEY_EMPTY.value)     # a failed step may have left a partial maximum
        self.epoch.zero_()
        self.st.tickets.zero_()
        self.pairs.zero_()

    def launch_args(self, steps: int = 1) -> dict:
        """The persistent kernel's keyword arguments for a launch of ``steps`` steps (``kernel_args``),
        made once per setting: building them (a signature and the plan's fields) cost about 200 us a
        launch, which a one-step launch pays on top of the kernel."""
        return self._launch_entry(steps).kwargs

    def _launch_entry(self, steps: int) -> "_Launch":
        key = (steps, self.spin, self.trace, self.prefetch_tape, self.uniform_tape, self.sm_pairs, self.words.shape[1],
               self.num_warps)
        entry = self._launch_args.get(key)
        if entry is None or entry.plan is not self.plan or entry.st is not self.st:   # a rebuild, another variant
            entry = self._launch_args[key] = _Launch(self.plan, self.st, self._make_launch_args(steps))
        return entry

    def _make_launch_args(self, steps: int) -> dict:
        consts = dict(self.plan.constexprs(), SPIN=self.spin, TRACE=self.trace, PREFETCH_TAPE=self.prefetch_tape,
                      SM_PAIRS=self.sm_pairs, UNIFORM_TAPE=self.uniform_tape)
        kwargs = kernel_args(self.kernel, self.st, consts, max_len=self.words.shape[1], steps=steps,
                             argmax_c=self.argmax_c, argmax_n=self.argmax_n)
        kwargs["num_warps"] = self.num_warps
        if self.maxnreg is not None:
            kwargs["maxnreg"] = self.maxnreg
        if self.st.x.device.type == "cuda":
            kwargs["launch_cooperative_grid"] = True   # the driver refuses a grid that is not co-resident
        return kwargs

    @property
    def max_steps_per_launch(self) -> int:
        """Decode steps one launch can run: several in megakernel mode, one in superkernel mode
        (its step has no counter for the next step to wait on)."""
        return MAX_STEPS_PER_LAUNCH if self.argmax_n else 1

    def launch(self, steps: int = 1):
        set_tma_allocator(self.plan, self.st.x.device)
        grid = (self.tape.num_workers,)
        entry = self._launch_entry(steps)
        if entry.compiled is not None:
            # the kernel Triton's JIT chose for these very arguments (the same tensors and scalars,
            # so the same specialization), launched without its binder, which binds and keys the
            # kernel's hundred parameters anew each launch
            entry.compiled[grid + (1, 1)](*entry.args)
            return
        with triton_mma(self.plan):
            k = self.kernel[grid](**entry.kwargs)
        if self.st.x.device.type == "cuda":
            entry.compiled = k.result() if hasattr(k, "result") else k
            entry.args = tuple(entry.kwargs[name] for name in self.kernel.arg_names)

    def decode(self, steps: int = 1):
        """``steps`` decode steps in one launch (greedy, or sampled on the device with the plan's
        SAMPLE stage); step s's token lands in ``st.hist[s]``."""
        if not 1 <= steps <= self.max_steps_per_launch:
            raise ValueError(f"{self.mode} runs 1 to {self.max_steps_per_launch} steps per launch, not {steps}")
        # counters are int32: start again from zero well before they could overflow
        if self.steps - self._reset_at >= COUNTER_RESET_STEPS:
            self.reset_counters()
        self.launch(steps)
        self.steps += steps
        self._check_errors()

    def _check_errors(self, now: bool = False):
        """Report a timed-out wait. On a GPU the error word of step n is read while step n+1 runs,
        so checking costs no pipeline bubble; ``now=True`` (or the CPU) checks at once."""
        dev = self.err.device
        if dev.type == "meta":      # compile_check's buffers: nothing has run
            return
        if dev.type != "cuda":
            err = self.err.tolist()
        else:
            prev = self._pending
            self._err_host.copy_(self.err, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            self._pending = ev
            if now:
                ev.synchronize()
            elif prev is None:
                return
            else:
                prev.synchronize()
            err = self._err_host.tolist()
        if err[0]:
            self.raise_error(err)

    def raise_error(self, err):
        """Name the root cause among the workers that stopped: a stalled wait whose producers all
        ran (the wait asks for more than the tape provides), or else the cycle of stalled waits."""
        stuck = {}
        # err's rows are programs'; with SM pairs each program took a tape row of its own
        rows = self.pairs[-self.tape.num_workers:].tolist() if self.sm_pairs else range(self.tape.num_workers)
        for pid in range(self.tape.num_workers):
            pos1, counter, target, seen = err[1 + 4 * pid: 5 + 4 * pid]
            if pos1 == -2:      # a program found no tape row (``kernel._paired_row``): nothing else ran right
                pairing = (f"program {pid} on SM {counter} found no SM id below {target} to count on"
                           if seen < 0 else f"program {pid}, the second on SM {counter}, timed out waiting for "
                           f"the first to publish its tape row in launch {target} (it read {seen}): are "
                           f"the {self.tape.num_workers} programs two an SM?")
                self.err.zero_()
                self.reset_counters()
                raise MegakernelError(f"{self.mode}: {pairing}. The step's outputs are invalid; counters were reset.")
        for pid, w in enumerate(rows):
            pos1, counter, target, seen = err[1 + 4 * pid: 5 + 4 * pid]
            if pos1:
                stuck[w] = (pos1 - 1, counter, target, seen)
        self.err.zero_()
        group = getattr(self.mk, "tp_group", None)
        if group is not None:
            self._raise_rank_error(stuck, group)
        self.reset_counters()
        producers = {}
        for w, i, ins in self.tape.instructions():
            producers.setdefault(ins.signal_counter, []).append((w, i))

        def pending(counter):   # producers of the counter that never signalled
            return [(w, i) for w, i in producers.get(counter, []) if w in stuck and i >= stuck[w][0]]

        def describe(w):
            pos, counter, target, seen = stuck[w]
            if pos < 0:
                return (f"worker {w} timed out at the start of a step of a launch of several, waiting for the "
                        f"previous step's ARGMAX (counter {counter}) to reach {target}; it saw {seen}")
            ins = self.tape.workers[w][pos] if pos < len(self.tape.workers[w]) else None
            return (f"worker {w} timed out at tape position {pos} ({ins.describe() if ins else '?'}) waiting "
                    f"for counter {counter} ({self.tape.counter_names.get(counter, '?')}) to reach {target}; "
                    f"it saw {seen}")
        roots = [w for w in stuck if stuck[w][0] < 0] or [w for w in stuck if not pending(stuck[w][1])]
        if roots:
            msg = describe(roots[0]) + (", though every instruction that raises it ran"
                                        if producers.get(stuck[roots[0]][1]) else ", which nothing raises")
        else:
            msg = "deadlock: " + "; ".join(describe(w) + f", raised by the stalled {pending(stuck[w][1])[:2]}"
                                          for w in list(stuck)[:3])
        others = len(stuck) - 1
        raise MegakernelError(f"{self.mode}: {msg}. {others} other worker(s) stalled behind it. The step's "
                              f"outputs are invalid; counters were reset.")

    def _raise_rank_error(self, stuck: dict, group):
        """A tensor-parallel step that failed: stop every rank (``tp.TPGroup.abort``) and raise
        ``RankError`` naming the rank that stopped first, as far as this rank can tell: one that
        aborted, one whose flag never came (a REDUCE's codes, ``instructions.allreduce``), or this
        one, whose own wait timed out. The group's flags are left as they are: it is spent."""
        from instructions.allreduce import ABORTED, PEER_TIMEOUT
        aborted = PEER_TIMEOUT.value - (1 << 16)    # codes below this: ABORTED - rank
        why = None
        for w, (pos, counter, target, seen) in stuck.items():
            ins = self.tape.workers[w][pos] if 0 <= pos < len(self.tape.workers[w]) else None
            if ins is None or ins.op != Op.REDUCE or seen >= 0:
                continue
            if seen <= aborted:
                why = f"rank {ABORTED.value - seen} aborted the run (its step failed)"
                break
            why = (f"rank {PEER_TIMEOUT.value - seen} never published its partial sum for {ins.describe()} "
                   f"({self.tape.counter_names.get(ins.signal_counter, '?')}): it stopped or failed")
        first = group.aborted_by()
        if why is None:
            why = (f"rank {first} aborted the run (its step failed)" if first is not None and first != group.rank
                   else f"this rank's step failed: worker {next(iter(stuck), '?')} timed out on a wait of its own")
        group.abort()
        raise RankError(f"{self.mode} rank {group.rank} of {group.tp}: {why}. The step's outputs are invalid and the "
                        f"tensor-parallel group is stopped: start the run again.")

    def synchronize(self):
        self._check_errors(now=True)

    def trace_events(self):
        """(worker, tape position, instruction, start_ns, end_ns, phases, sm) of the last step
        (trace=True); phases maps the tile's stamps (``TRACE_PHASES``) to global times in ns, 0
        where the instruction kind stamps none; sm is the SM the worker ran on."""
        t = self.trace_buf.view(self.tape.num_workers, -1, TRACE_SLOTS).cpu()
        out = []
        for w, lst in enumerate(self.tape.workers):
            for i, ins in enumerate(lst):
                phases = {name: int(t[w, i, slot]) for name, slot in TRACE_PHASES.items()}
                out.append((w, i, ins, int(t[w, i, 0]), int(t[w, i, 1]), phases,
                            int(t[w, i, k_common.T_SM.value])))
        return out


def per_op_launches(st: StepBuffers, plan: Plan) -> list[tuple]:
    """The step as standalone launches in stage order: (kernel, grid, keyword arguments), each kind's
    per-op kernel over all its tiles (``instructions.registry``)."""
    launches = []
    consts = plan.constexprs()
    for stage in build_stages(plan):
        kind = DEVICE_KINDS[stage.op]
        if kind.kernel is None:     # a host step between launches (REDUCE: the all-reduce)
            launches.append((kind.host, None, dict(st=st, plan=plan, layer=stage.layer)))
            continue
        kwargs = kernel_args(kind.kernel, st, consts, layer=stage.layer)
        kwargs["num_warps"] = kind.num_warps or st.num_warps
        launches.append((kind.kernel, (plan.tiles(stage.op),), kwargs))
    return launches


class PerOpBackend:
    """Each instruction kind launched as its own kernel over all its tiles."""

    def __init__(self, mk, num_workers: int | None = None, num_warps: int = 4, graph: bool = False,
                 workers_per_sm: int = WORKERS_PER_SM, max_bk: int = MAX_BK, plan_overrides: dict | None = None,
                 tp_swap: bool = True, **_):
        _check_kernel_device(mk, "cuda-graph" if graph else "per-op")
        dev = mk.weights.device
        if graph and dev.type != "cuda":
            raise RuntimeError("backend cuda-graph needs a CUDA GPU")
        self.mk = mk
        # the same tile sizes as the megakernel would use, so the numbers agree bit for bit
        self.workers = num_workers or default_workers(dev) * (workers_per_sm if dev.type == "cuda" else 1)
        self.max_bk, self.plan_overrides, self.num_warps = max_bk, plan_overrides or {}, num_warps
        self.tp_swap = bool(tp_swap)     # as PersistentBackend's
        self.use_graph = graph
        self.sampling = False
        self._variants: dict[bool, tuple] = {}
        self._build()

    # as PersistentBackend's: a SAMPLE stage while any sequence samples; each plan built once
    device_sampling = True

    def _build(self):
        overrides = {**self.plan_overrides, "SAMPLE": int(self.sampling)}
        self.plan = tile_plan(self.mk, self.workers, self.max_bk, overrides, self.num_warps, self.tp_swap)
        self.st = step_buffers(self.mk, self.plan, self.num_warps)
        self.seq = per_op_launches(self.st, self.plan)
        self.graph = None

    def set_sampling(self, on: bool):
        """Run the plan with a SAMPLE stage (``on``) or the greedy one from the next step."""
        on = bool(on)
        if on == self.sampling:
            return
        self._variants[self.sampling] = (self.plan, self.st, self.seq, self.graph)
        self.sampling = on
        if on in self._variants:
            self.plan, self.st, self.seq, self.graph = self._variants[on]
        else:
            self._build()

    def launch(self):
        set_tma_allocator(self.plan, self.st.x.device)
        with triton_mma(self.plan):
            for fn, grid, kwargs in self.seq:
                if grid is None:
                    fn(**kwargs)
                else:
                    fn[grid](**kwargs)

    def decode(self):
        if not self.use_graph:
            self.launch()
            return
        if self.graph is None:
            self._capture()
        self.graph.replay()

    def _capture(self):
        # capture must not change the state: run on copies of what a step mutates, then restore
        mutated = (self.st.tokens, self.st.lengths, self.st.k_cache, self.st.v_cache)
        saved = [t.clone() for t in mutated]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            self.launch()     # compile every kernel outside the capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.launch()
        for t, v in zip(mutated, saved):
            t.copy_(v)
        self.graph = g

    def synchronize(self):
        pass


@dataclasses.dataclass
class _Launch:
    """A launch setting of the persistent kernel: the plan and buffers its arguments were made for,
    its keyword arguments, and (on a GPU, after its first launch) the compiled kernel with its
    positional arguments."""
    plan: Plan
    st: StepBuffers
    kwargs: dict
    compiled: object = None
    args: tuple = ()


def make_kernel_backend(name: str, mk, **options):
    if name in ("megakernel", "superkernel"):
        return PersistentBackend(mk, mode=name, **options)
    if name == "per-op":
        return PerOpBackend(mk, **options)
    if name == "cuda-graph":
        return PerOpBackend(mk, graph=True, **options)
    raise ValueError(name)

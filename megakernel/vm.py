"""The ``vm`` backend: a pure-torch interpreter of the instruction tape.

It runs the very tape the persistent kernel would (same plan, same assignment, same counters),
but each instruction is the torch reference of its kind (``instructions.registry``) and the
workers are interleaved on the host: round-robin, each advancing while its next instruction's
wait is satisfied. A tape that computes the wrong thing or cannot finish therefore fails here, on
the CPU, with the stuck instructions named, instead of hanging a GPU.
"""

from __future__ import annotations

from dataclasses import replace

from instructions.registry import DEVICE_KINDS
from scheduler.graph import Tape, build_tape
from scheduler.ops import Op, make_plan
from scheduler.validate import run_workers, stuck_report, validate

from .backends import step_buffers, with_cache


class VMError(RuntimeError):
    """The workers stopped with instructions left: the message names them."""


def reference_kernels() -> dict:
    """Op -> the torch reference of its tiles, ``fn(state, plan, layer, t0, t1)``."""
    return {op: k.reference for op, k in DEVICE_KINDS.items()}


class VMBackend:
    """Decode steps of ``mk`` (a ``MegaQwen3``) by interpreting its tape with torch references."""

    def __init__(self, mk, num_workers: int | None = 1, strategy: str = "balanced", mode: str = "megakernel",
                 check: bool = True, plan_overrides: dict | None = None, tp_swap: bool = True, **_):
        self.mk = mk
        if getattr(mk, "w8a8", False):
            raise ValueError("the vm backend's references multiply weight-only FP8; build it with "
                             "fp8_activations='none'")
        workers = num_workers or 1
        plan = replace(make_plan(mk.config, mk.batch_size, mk.max_seq_len, workers, tp=getattr(mk, "tp", 1),
                                 fp8=mk.weights.quantization == "fp8", tp_swap=tp_swap), **(plan_overrides or {}))
        plan = with_cache(plan, mk)
        self.tape: Tape = build_tape(plan, workers, strategy=strategy, mode=mode)
        self.plan = self.tape.plan      # a superkernel tape's is without pools
        if check:
            validate(self.tape)
        self.st = step_buffers(mk, self.plan)
        self.kernels = reference_kernels()
        self.counters: dict[int, int] = {}
        self.steps = 0
        self.order: list = []      # the instructions of the last step, in the order they ran

    def decode(self):
        st, p, kernels = self.st, self.plan, self.kernels
        order = []
        pools_taken = set()

        def execute(ins):
            order.append(ins)
            if ins.op not in (Op.NOOP, Op.BARRIER):
                kernels[Op(ins.op)](st, p, ins.layer, ins.tile_start, ins.tile_end)
                pool = p.pool(ins.op)
                if pool and (ins.op, ins.layer) not in pools_taken:
                    # the first of the stage's instructions to run claims its whole pool (one of the
                    # orders the claims can take on a device)
                    pools_taken.add((ins.op, ins.layer))
                    n = p.tiles(ins.op)
                    kernels[Op(ins.op)](st, p, ins.layer, n - pool, n)

        lists = self.tape.workers
        pos, signalled, _ = run_workers(lists, self.counters, self.steps, execute)
        self.order = order
        if any(n < len(lst) for n, lst in zip(pos, lists)):
            msg = stuck_report(lists, pos, signalled, self.counters, self.steps, self.tape.counter_names)
            self.counters = {}
            self.steps = 0
            raise VMError(f"vm: step stopped with instructions left ({msg}). The step's outputs are "
                          f"invalid; counters were reset.")
        self.steps += 1

    def synchronize(self):
        pass

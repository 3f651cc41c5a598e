"""python -m megakernel.tape: what the instruction tape of a model looks like, without weights.

Prints instructions per kind and per worker (count, bytes read, estimated time), the critical
path in dependent steps (the longest chain of counter waits; each costs a cross-worker round trip,
see docs/performance.md), the balance of bytes across workers, and validates the tape. With
``--explain``, which of the plan's rules (``scheduler.ops.PLAN_RULES``) fired and why. Needs only
the model's shapes: a size alias (its published config), a Hugging
Face repo id of one, or a checkpoint folder with a config.json.
"""

from __future__ import annotations

import sys
from collections import defaultdict

from models.qwen3.weights import shapes_for
from scheduler.graph import MODES, STRATEGIES, build_tape
from scheduler.ops import WORKERS_PER_SM, Op, cost, plan_and_rules
from scheduler.validate import TapeError, dependent_steps, validate


# what the runtime runs on an H100 by default: WORKERS_PER_SM programs on each of its 132 SMs
H100_SMS = 132
RUNTIME_WORKERS = WORKERS_PER_SM * H100_SMS


def summary(cfg: Qwen3Config, workers: int, strategy: str, mode: str, batch_size: int, max_seq_len: int,
            bandwidth_gbs: float, step_us: float, name: str = "", explain: bool = False) -> str:
    plan, fired = plan_and_rules(cfg, batch_size, max_seq_len, workers)
    tape = build_tape(plan, workers, strategy=strategy, mode=mode)
    validate(tape)
    deps = dependent_steps(tape)
    per_worker_bw = bandwidth_gbs * 1e9 / workers
    out = [f"tape: {name or 'model'}  mode {mode}  strategy {strategy}  workers {workers}  "
           f"batch {batch_size}  max_seq_len {max_seq_len}",
           "plan: " + " ".join(f"{k}={v}" for k, v in plan.constexprs().items())]
    if explain:
        out.append("plan rules fired, in order:" if fired else "plan rules fired: none (the base plan)")
        out += [f"  {rule.name}: {' '.join(f'{k}={v}' for k, v in fields.items())}  ({rule.why})"
                for rule, fields in fired]

    # tiles and bytes of each kind, a pool's tiles (claimed at run time) counted once per stage
    kinds: dict[Op, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    stages = set()
    for _, _, ins in tape.instructions():
        op = Op(ins.op)
        k = kinds[op]
        k[0] += 1
        k[1] += ins.ntiles
        k[2] += cost(plan, op, ins.ntiles)
        if plan.pool(op) and (op, ins.layer) not in stages:
            stages.add((op, ins.layer))
            k[1] += plan.pool(op)
            k[2] += cost(plan, op, plan.pool(op))
            k[3] += plan.pool(op)
    total = sum(k[2] for k in kinds.values())
    out += ["", f"{'kind':<8} {'instrs':>8} {'tiles':>8} {'pooled':>8} {'MB':>10} {'share':>6}"]
    for op in sorted(kinds):
        n, t, b, p = kinds[op]
        out.append(f"{op.name:<8} {n:>8} {t:>8} {p:>8} {b / 1e6:>10.3f} {100 * b / max(1, total):>5.1f}%")
    out.append(f"{'total':<8} {sum(k[0] for k in kinds.values()):>8} {sum(k[1] for k in kinds.values()):>8} "
               f"{sum(k[3] for k in kinds.values()):>8} {total / 1e6:>10.3f}")

    # a pool's bytes shared evenly among its stage's instructions (what run-time claims aim at)
    stage_n = defaultdict(int)
    for _, _, ins in tape.instructions():
        stage_n[(ins.op, ins.layer)] += 1

    def instr_cost(ins) -> float:
        pool = plan.pool(ins.op)
        return cost(plan, Op(ins.op), ins.ntiles) + (cost(plan, Op(ins.op), pool) / stage_n[(ins.op, ins.layer)]
                                                     if pool else 0)

    bytes_w = [sum(instr_cost(i) for i in lst) for lst in tape.workers]
    out += ["", f"{'worker':>6} {'instrs':>7} {'waits':>6} {'MB':>9} {'est us':>8}"]
    for w, lst in enumerate(tape.workers):
        waits = sum(1 for i in lst if i.wait_per_step > 0)
        out.append(f"{w:>6} {len(lst):>7} {waits:>6} {bytes_w[w] / 1e6:>9.3f} {bytes_w[w] / per_worker_bw * 1e6:>8.1f}")

    mean = sum(bytes_w) / workers
    slowest = max(bytes_w) / per_worker_bw * 1e6
    # each stage waits for the whole previous one: where a worker cannot start loading the next
    # stage's weights early (superkernel), a step takes the sum over stages of the busiest worker
    stage_w: dict[tuple, list[float]] = defaultdict(lambda: [0.0] * workers)
    for w, _, ins in tape.instructions():
        if ins.op != Op.BARRIER:
            stage_w[(ins.op, ins.layer)][w] += instr_cost(ins)
    staged = sum(max(v) for v in stage_w.values()) / per_worker_bw * 1e6
    floor = total / (bandwidth_gbs * 1e9) * 1e6
    out += ["",
            f"counters: {tape.num_counters - 1}",
            f"dependent steps: {deps} per step over {plan.L} layers",
            f"dependent steps per layer: {deps / plan.L:.2f}",
            f"balance (max/mean bytes per worker): {max(bytes_w) / mean if mean else 1.0:.3f}",
            f"estimate at {bandwidth_gbs:g} GB/s: floor {floor:.1f} us; stage by stage (the busiest worker of "
            f"each stage, summed) {staged:.1f} us = {staged / floor:.3f} x the floor; with loads overlapping "
            f"across stages (the slowest worker) {slowest:.1f} us",
            f"estimate per token: {slowest:.1f} .. {staged:.1f} us + {deps} dependent steps x {step_us:g} us = "
            f"{slowest + deps * step_us:.1f} .. {staged + deps * step_us:.1f} us",
            "valid: every tile exactly once, every wait on its producer, no deadlock"]
    return "\n".join(out)


def build_parser():
    from . import cli
    ap = cli.Parser(prog="python -m megakernel.tape", description=cli.description(__doc__),
                    epilog="example:\n  python -m megakernel.tape -m 0.6b --workers 264 --batch-size 4")
    ap.add_argument("-m", "--model", required=True,
                    help="size alias (0.6b 1.7b 4b 8b 14b 32b), its repo id, a checkpoint folder with a config.json, "
                         "or the demo shape tiny-random")
    ap.add_argument("--workers", type=cli.at_least(1), default=RUNTIME_WORKERS,
                    help=f"worker programs; the default is what the runtime runs on an H100 ({WORKERS_PER_SM} "
                         f"programs on each of its {H100_SMS} SMs), so the tape printed is the tape that runs there")
    ap.add_argument("--strategy", choices=STRATEGIES, default="balanced", help="how tiles are placed on workers")
    ap.add_argument("--mode", choices=MODES, default="megakernel",
                    help="megakernel: counter waits; superkernel: grid barriers between stages")
    ap.add_argument("--batch-size", type=cli.at_least(1), default=1, help="sequences decoded together")
    ap.add_argument("--max-seq-len", type=cli.at_least(2), default=4096, help="KV-cache positions per sequence")
    ap.add_argument("--bandwidth", type=cli.number, default=4300.0,
                    help="memory bandwidth in GB/s for the time estimate (the default is an H200's measured copy "
                         "bandwidth)")
    ap.add_argument("--step-us", type=cli.number, default=1.6, help="cost of one dependent step in microseconds")
    ap.add_argument("--explain", action="store_true", help="say which plan rules fired, and why")
    return ap


def main(argv=None) -> int:
    from . import cli

    def body() -> int:
        args = build_parser().parse_args(argv)
        if args.bandwidth <= 0:
            raise cli.UsageError(f"--bandwidth must be positive, got {args.bandwidth:g}")
        if args.step_us < 0:
            raise cli.UsageError(f"--step-us cannot be negative, got {args.step_us:g}")
        cfg = shapes_for(args.model)
        try:
            text = summary(cfg, args.workers, args.strategy, args.mode, args.batch_size, args.max_seq_len,
                           args.bandwidth, args.step_us, name=args.model, explain=args.explain)
        except TapeError as e:      # the scheduler's fault, not the input's: status 1
            print(f"error: invalid tape: {str(e).splitlines()[0]}", file=sys.stderr)
            return 1
        print(text)
        return 0

    return cli.run(body)


if __name__ == "__main__":
    sys.exit(main())

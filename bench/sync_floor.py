"""The cost of a dependent stage with no weights: what the megakernel's sync structure costs alone.

One persistent launch of P programs runs S stages. In each stage every program waits until all P
programs have signalled the previous stage's counter (the megakernel's ``wait_counter``: one
acquire poll broadcast through shared memory), then, with ``--data``, loads the previous stage's
whole output vector (H float32, through L2, as a GEMV tile loads its input) and stores its own
H / P slice of this stage's output, and signals (CTA barrier, then one release atomic): the
chain of one megakernel stage (poll, input, stores, release) with none of its weights or math.
The time per stage, times the stages of a step (5 per layer), is the floor of the megakernel's
structure at a size whose weights take less time than that.

``--reduce N,...`` adds rows where, instead of storing a slice, the first N programs each add a
whole H-vector into the stage's output with atomics (float32, and int64 as a fixed-point sum that
does not depend on the order): what a split-K reduction of N partials costs a stage.

``--replicas R,...`` adds rows where each program stores its slice into R copies of the output
and reads copy ``pid % R`` of the input: whether every program reading the same lines of L2 (each
line lives in one L2 slice, which then serves all P programs) is part of the input's cost.

    python3 bench/sync_floor.py [--programs 264,132] [--stages 140] [--hidden 1024] [--reduce 8,64,264]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from instructions.common import RELEASE, wait_counter  # noqa: E402


@triton.jit
def chain_kernel(counters_ptr, data_ptr, out_ptr, red_ptr, stages, nred, SPIN: tl.constexpr, DATA: tl.constexpr,
                 H: tl.constexpr, SLICE: tl.constexpr, RED: tl.constexpr, REP: tl.constexpr = 1):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    kk = tl.arange(0, H)
    ss = tl.arange(0, SLICE)
    acc = 0.0
    for s in range(stages):
        if s > 0:
            seen = wait_counter(counters_ptr + s - 1, nprog, SPIN)
            acc += tl.where(seen < nprog, 1.0e9, 0.0)        # a timed-out wait shows in the output
            if DATA:
                x = tl.load(data_ptr + ((s - 1) * REP + pid % REP) * H + kk, cache_modifier=".cg")
                acc += tl.sum(x, axis=0) * 1e-9
        if RED == 1:
            if pid < nred:
                tl.atomic_add(data_ptr + s * H + kk, acc + kk.to(tl.float32), sem="relaxed", scope="gpu")
        elif RED == 2:
            if pid < nred:
                tl.atomic_add(red_ptr + s * H + kk, (acc + kk.to(tl.float32)).to(tl.int64), sem="relaxed",
                              scope="gpu")
        elif DATA:
            for r in tl.static_range(REP):
                tl.store(data_ptr + (s * REP + r) * H + pid * SLICE + ss, acc + ss.to(tl.float32),
                         mask=pid * SLICE + ss < H)
        tl.debug_barrier()
        tl.atomic_add(counters_ptr + s, 1, sem=RELEASE, scope="gpu")
    tl.store(out_ptr + pid, acc)


def per_stage_us(programs: int, stages: int, hidden: int, data: bool, red: int = 0, nred: int = 0,
                 reps: int = 20, replicas: int = 1) -> float:
    dev = "cuda"
    counters = torch.zeros(stages, dtype=torch.int32, device=dev)
    buf = torch.zeros(stages * hidden * replicas, dtype=torch.float32, device=dev)
    rbuf = torch.zeros(stages * hidden if red == 2 else 1, dtype=torch.int64, device=dev)
    out = torch.zeros(programs, dtype=torch.float32, device=dev)
    slice_ = triton.next_power_of_2(-(-hidden // programs))
    times = []
    for _ in range(reps + 2):
        counters.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        chain_kernel[(programs,)](counters, buf, out, rbuf, stages, nred, SPIN=1 << 20, DATA=data, H=hidden,
                                  SLICE=slice_, RED=red, REP=replicas, num_warps=4, launch_cooperative_grid=True)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    if float(out.max()) >= 1e9:
        raise RuntimeError("a wait timed out")
    times = sorted(times[2:])
    return times[len(times) // 2] / stages


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", default="264,132")
    ap.add_argument("--stages", type=int, default=140)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--reduce", default="", help="partial counts N for the atomic-reduction rows")
    ap.add_argument("--replicas", default="", help="copies R of each stage's output for the replica rows")
    args = ap.parse_args()
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), flush=True)
    for p in (int(x) for x in args.programs.split(",")):
        for data in (False, True):
            us = per_stage_us(p, args.stages, args.hidden, data)
            what = f"poll + {args.hidden}-float input + own slice stored + release" if data else "poll + release"
            print(f"programs {p:4d}  {what:55s} {us:6.2f} us per stage "
                  f"(x {args.stages} stages: {us * args.stages:6.1f} us)", flush=True)
        for r in (int(x) for x in args.replicas.split(",") if x):
            us = per_stage_us(p, args.stages, args.hidden, True, replicas=r)
            what = f"poll + input from copy pid % {r} + slice stored {r}x + release"
            print(f"programs {p:4d}  {what:55s} {us:6.2f} us per stage", flush=True)
        for n in (int(x) for x in args.reduce.split(",") if x):
            for red, kind in ((1, "float32"), (2, "int64")):
                us = per_stage_us(p, args.stages, args.hidden, True, red, min(n, p))
                what = f"poll + input + {min(n, p)} partials added ({kind} atomics) + release"
                print(f"programs {p:4d}  {what:55s} {us:6.2f} us per stage", flush=True)


if __name__ == "__main__":
    main()

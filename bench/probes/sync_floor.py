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

``--flags`` adds rows where each output word carries its own version (float32 bits | stage << 32,
one 8-byte store, single-copy atomic) and the producer signals with a *relaxed* atomic (no fence
before it): the consumer still polls the counter, then loads its input and checks every word's
version, reloading until all are current (counted and printed). What the release fence costs a
stage when the data can prove themselves current.

``--subcounters K,...`` adds rows where each stage has K counters, one 128-byte line apart, program p
signalling counter p % K and every consumer polling all K at once: whether the P atomics queueing on
one address are part of a stage's cost (P = 264 costs ~0.3 us a stage more than 132).

``--replicas R,...`` adds rows where each program stores its slice into R copies of the output
and reads copy ``pid % R`` of the input: whether every program reading the same lines of L2 (each
line lives in one L2 slice, which then serves all P programs) is part of the input's cost.

    python3 bench/probes/sync_floor.py [--programs 264,132] [--stages 140] [--hidden 1024] [--reduce 8,64,264]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository root

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from instructions.common import RELEASE, wait_counter  # noqa: E402


@triton.jit
def chain_kernel(counters_ptr, data_ptr, out_ptr, red_ptr, stages, nred, SPIN: tl.constexpr, DATA: tl.constexpr,
                 H: tl.constexpr, SLICE: tl.constexpr, RED: tl.constexpr, REP: tl.constexpr = 1,
                 NSUB: tl.constexpr = 1):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    kk = tl.arange(0, H)
    ss = tl.arange(0, SLICE)
    acc = 0.0
    for s in range(stages):
        if s > 0:
            if NSUB == 1:
                seen = wait_counter(counters_ptr + s - 1, nprog, SPIN)
                acc += tl.where(seen < nprog, 1.0e9, 0.0)        # a timed-out wait shows in the output
            else:
                # NSUB counters one 128-byte line apart, program p signalling p % NSUB: polled at once
                kq = tl.arange(0, NSUB)
                need = (nprog - kq + NSUB - 1) // NSUB
                subs = counters_ptr + ((s - 1) * NSUB + kq) * 32
                short = tl.max(need - tl.atomic_add(subs, tl.zeros_like(kq), sem="acquire", scope="gpu"), axis=0)
                it = 0
                while (short > 0) & (it < SPIN):
                    short = tl.max(need - tl.atomic_add(subs, tl.zeros_like(kq), sem="acquire", scope="gpu"),
                                   axis=0)
                    it += 1
                acc += tl.where(short > 0, 1.0e9, 0.0)
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
        if NSUB == 1:
            tl.atomic_add(counters_ptr + s, 1, sem=RELEASE, scope="gpu")
        else:
            tl.atomic_add(counters_ptr + (s * NSUB + pid % NSUB) * 32, 1, sem=RELEASE, scope="gpu")
    tl.store(out_ptr + pid, acc)


@triton.jit
def flag_chain_kernel(counters_ptr, data_ptr, out_ptr, retry_ptr, stages, SPIN: tl.constexpr, H: tl.constexpr,
                      SLICE: tl.constexpr, RELAXED_POLL: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    kk = tl.arange(0, H)
    ss = tl.arange(0, SLICE)
    acc = 0.0
    retries = 0
    for s in range(stages):
        if s > 0:
            if RELAXED_POLL:
                seen = tl.atomic_add(counters_ptr + s - 1, 0, sem="relaxed", scope="gpu")
                it = 0
                while (seen < nprog) & (it < SPIN):
                    seen = tl.atomic_add(counters_ptr + s - 1, 0, sem="relaxed", scope="gpu")
                    it += 1
            else:
                seen = wait_counter(counters_ptr + s - 1, nprog, SPIN)
            acc += tl.where(seen < nprog, 1.0e9, 0.0)
            w = tl.load(data_ptr + (s - 1) * H + kk, cache_modifier=".cg")
            stale = tl.sum(((w >> 32).to(tl.int32) != s).to(tl.int32), axis=0)
            it = 0
            while (stale > 0) & (it < SPIN):
                w = tl.load(data_ptr + (s - 1) * H + kk, volatile=True)
                stale = tl.sum(((w >> 32).to(tl.int32) != s).to(tl.int32), axis=0)
                it += 1
            retries += it
            acc += tl.where(stale > 0, 1.0e9, 0.0)
            x = (w & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
            acc += tl.sum(x, axis=0) * 1e-9
        val = (acc + ss.to(tl.float32)).to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
        tl.store(data_ptr + s * H + pid * SLICE + ss, val | (tl.cast(s + 1, tl.int64) << 32),
                 mask=pid * SLICE + ss < H)
        tl.debug_barrier()
        tl.atomic_add(counters_ptr + s, 1, sem="relaxed", scope="gpu")
    tl.store(out_ptr + pid, acc)
    tl.store(retry_ptr + pid, retries)


def launch_us(launch, reset, reps: int) -> float:
    """Median time of ``reps`` event-timed launches (after two untimed ones), ``reset()`` before each."""
    times = []
    for _ in range(reps + 2):
        reset()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        launch()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times = sorted(times[2:])
    return times[len(times) // 2]


def flag_stage_us(programs: int, stages: int, hidden: int, relaxed_poll: bool, reps: int = 20):
    dev = "cuda"
    counters = torch.zeros(stages, dtype=torch.int32, device=dev)
    buf = torch.zeros(stages * hidden, dtype=torch.int64, device=dev)
    out = torch.zeros(programs, dtype=torch.float32, device=dev)
    retry = torch.zeros(programs, dtype=torch.int32, device=dev)
    slice_ = triton.next_power_of_2(-(-hidden // programs))
    nretry = []

    def reset():      # before the timed region: the previous launch's reloads, then a clean slate
        nretry.append(retry.sum())
        retry.zero_()
        counters.zero_()
        buf.zero_()

    def launch():
        flag_chain_kernel[(programs,)](counters, buf, out, retry, stages, SPIN=1 << 20, H=hidden, SLICE=slice_,
                                       RELAXED_POLL=relaxed_poll, num_warps=4, launch_cooperative_grid=True)

    us = launch_us(launch, reset, reps)
    nretry.append(retry.sum())
    if float(out.max()) >= 1e9:
        raise RuntimeError("a wait timed out")
    return us / stages, float(sum(nretry)) / (reps + 2)


def per_stage_us(programs: int, stages: int, hidden: int, data: bool, red: int = 0, nred: int = 0,
                 reps: int = 20, replicas: int = 1, nsub: int = 1) -> float:
    dev = "cuda"
    counters = torch.zeros(stages * (1 if nsub == 1 else nsub * 32), dtype=torch.int32, device=dev)
    buf = torch.zeros(stages * hidden * replicas, dtype=torch.float32, device=dev)
    rbuf = torch.zeros(stages * hidden if red == 2 else 1, dtype=torch.int64, device=dev)
    out = torch.zeros(programs, dtype=torch.float32, device=dev)
    slice_ = triton.next_power_of_2(-(-hidden // programs))

    def launch():
        chain_kernel[(programs,)](counters, buf, out, rbuf, stages, nred, SPIN=1 << 20, DATA=data, H=hidden,
                                  SLICE=slice_, RED=red, REP=replicas, NSUB=nsub, num_warps=4,
                                  launch_cooperative_grid=True)

    us = launch_us(launch, counters.zero_, reps)
    if float(out.max()) >= 1e9:
        raise RuntimeError("a wait timed out")
    return us / stages


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", default="264,132")
    ap.add_argument("--stages", type=int, default=140)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--reduce", default="", help="partial counts N for the atomic-reduction rows")
    ap.add_argument("--subcounters", default="", help="counts K of per-stage counters for the split-counter rows")
    ap.add_argument("--flags", action="store_true", help="rows with versioned words and relaxed signals")
    ap.add_argument("--replicas", default="", help="copies R of each stage's output for the replica rows")
    args = ap.parse_args()
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), flush=True)
    for p in (int(x) for x in args.programs.split(",")):
        for data in (False, True):
            us = per_stage_us(p, args.stages, args.hidden, data)
            what = f"poll + {args.hidden}-float input + own slice stored + release" if data else "poll + release"
            print(f"programs {p:4d}  {what:55s} {us:6.2f} us per stage "
                  f"(x {args.stages} stages: {us * args.stages:6.1f} us)", flush=True)
        for k in (int(x) for x in args.subcounters.split(",") if x):
            for data in (False, True):
                us = per_stage_us(p, args.stages, args.hidden, data, nsub=k)
                what = f"{k} counters per stage (program p signals p % {k}){' + input' if data else ''}"
                print(f"programs {p:4d}  {what:55s} {us:6.2f} us per stage", flush=True)
        if args.flags:
            for relaxed in (False, True):
                us, nr = flag_stage_us(p, args.stages, args.hidden, relaxed)
                what = f"{'relaxed' if relaxed else 'acquire'} poll + versioned input + relaxed signal"
                print(f"programs {p:4d}  {what:55s} {us:6.2f} us per stage "
                      f"({nr:.1f} reloads per launch)", flush=True)
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

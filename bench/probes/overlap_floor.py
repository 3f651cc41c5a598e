"""Can the weights stream under the dependent chain? A megakernel stage with weights, by load path.

``sync_floor.py`` measures a stage's chain with no weights (poll, input, stores, release).
This adds what a GEMV tile does: every program owns an [R, K] bf16 block of fresh weights per
stage (stages x programs x R x K, more than L2 holds, so every block comes from HBM once) and
stores its R dot products with the previous stage's output; the next stage reads them. What
changes between modes is only how and when the block is fetched:

    reg        plain loads issued before the wait, used after the input (the megakernel today)
    after      plain loads issued after the wait (no overlap at all)
    reg-ahead  plain loads of the *next* stage's block issued at this stage's start, carried in
               registers across the loop (two blocks live)
    tma        one thread copies the block to shared memory with the bulk-copy engine
               (``cp.async.bulk``, completion on an mbarrier) before the wait; the tile reads it
               back after the input: no register or LSU slot holds the bytes while polling
    tma-ahead  the same copy issued one stage ahead into the other of two buffers, so the next
               stage's weights stream during this stage's whole chain

With a perfect memory system a stage costs max(chain, bytes / bandwidth); each mode's distance
from that says whether in-flight weights lengthen the chain's round trips (docs/performance.md,
"Weights streamed under the chain") and whether the bulk-copy path (not the SM's load/store unit)
avoids it. NVIDIA Hopper only (inline PTX for the copy engine).

    python3 bench/probes/overlap_floor.py [--programs 264] [--stages 140] [--rows 8,16] [--modes ...]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository root

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from instructions.common import RELEASE, wait_counter  # noqa: E402
from sync_floor import launch_us  # noqa: E402  (the script's own folder is on sys.path)

MODES = {"none": 0, "reg": 1, "after": 2, "reg-ahead": 3, "tma": 4, "tma-ahead": 5}
# Variants, appended to a mode's name: "+cg" weights through L2 only (no L1 fill in flight when the
# poll's acquire invalidates L1), "+relaxed" a relaxed poll (no acquire, so no L1 invalidation;
# the input is read with .cg anyway), "+noread" (tma modes) the copy lands but is never read.
VARIANTS = ("cg", "relaxed", "noread")


@triton.jit
def _poll(cnt_ptr, target, SPIN: tl.constexpr, RELAXED_POLL: tl.constexpr):
    if RELAXED_POLL:
        seen = tl.atomic_add(cnt_ptr, 0, sem="relaxed", scope="gpu")
        it = 0
        while (seen < target) & (it < SPIN):
            seen = tl.atomic_add(cnt_ptr, 0, sem="relaxed", scope="gpu")
            it += 1
    else:
        seen = wait_counter(cnt_ptr, target, SPIN)
    return seen


@triton.jit
def _one_thread(asm: tl.constexpr, constraints: tl.constexpr, args):
    """``asm`` (PTX, $1.. for args) executed by thread 0 of the program only."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; mov.u32 $0, 0;\n"
        "@p " + asm + " }", "=r," + constraints, args, dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _smem(NBYTES: tl.constexpr):
    """Shared address of a static buffer of NBYTES (declared in PTX; Triton gives a kernel none)."""
    return tl.inline_asm_elementwise(
        "{ .shared .align 128 .b8 ovl_buf[" + NBYTES + "]; mov.u32 $0, ovl_buf; }",
        "=r", [], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _copy(dst, src, nbytes, bar):
    """Bulk copy of nbytes from global src to shared dst, completing on the mbarrier bar."""
    _one_thread("fence.proxy.async.shared::cta;", "r", [nbytes])
    _one_thread("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$1], $2;", "r,r", [bar, nbytes])
    _one_thread("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$1], [$2], $3, [$4];",
                "r,l,r,r", [dst, src, nbytes, bar])


@triton.jit
def _bar_wait(bar, parity, SPIN: tl.constexpr):
    done = 0
    it = 0
    while (done == 0) & (it < SPIN):
        done = tl.inline_asm_elementwise(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; selp.u32 $0, 1, 0, p; }",
            "=r,r,r", [bar, parity], dtype=tl.int32, is_pure=False, pack=1)
        it += 1
    return done


@triton.jit
def _dot_smem(buf, x_ptr, R: tl.constexpr, K: tl.constexpr):
    """Rows of the [R, K] bf16 block at shared address buf times x[K] (float32, through L2)."""
    C8: tl.constexpr = K // 8
    r = tl.arange(0, R)[:, None]
    c = tl.arange(0, C8)[None, :]
    w0, w1, w2, w3 = tl.inline_asm_elementwise(
        "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", [buf + (r * C8 + c) * 16],
        dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=False, pack=1)
    k8 = tl.arange(0, C8) * 8
    acc = (w0 << 16).to(tl.float32, bitcast=True) * tl.load(x_ptr + k8 + 0, cache_modifier=".cg")[None, :]
    acc += (w0 & -65536).to(tl.float32, bitcast=True) * tl.load(x_ptr + k8 + 1, cache_modifier=".cg")[None, :]
    acc += (w1 << 16).to(tl.float32, bitcast=True) * tl.load(x_ptr + k8 + 2, cache_modifier=".cg")[None, :]
    acc += (w1 & -65536).to(tl.float32, bitcast=True) * tl.load(x_ptr + k8 + 3, cache_modifier=".cg")[None, :]
    acc += (w2 << 16).to(tl.float32, bitcast=True) * tl.load(x_ptr + k8 + 4, cache_modifier=".cg")[None, :]
    acc += (w2 & -65536).to(tl.float32, bitcast=True) * tl.load(x_ptr + k8 + 5, cache_modifier=".cg")[None, :]
    acc += (w3 << 16).to(tl.float32, bitcast=True) * tl.load(x_ptr + k8 + 6, cache_modifier=".cg")[None, :]
    acc += (w3 & -65536).to(tl.float32, bitcast=True) * tl.load(x_ptr + k8 + 7, cache_modifier=".cg")[None, :]
    return tl.sum(acc, axis=1)


@triton.jit
def overlap_kernel(counters_ptr, data_ptr, w_ptr, out_ptr, stages, MODE: tl.constexpr, R: tl.constexpr,
                   K: tl.constexpr, SPIN: tl.constexpr, SMEM: tl.constexpr, WCG: tl.constexpr, WEV: tl.constexpr,
                   RELAXED_POLL: tl.constexpr, NOREAD: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    rr = tl.arange(0, R)
    kk = tl.arange(0, K)
    blk = rr[:, None] * K + kk[None, :]
    NB: tl.constexpr = R * K * 2          # bytes of one block
    PR = nprog * R                        # one stage's output: every program's R values
    bad = 0
    if MODE >= 4:
        sb = _smem(SMEM)
        bars = sb + (MODE - 3) * NB       # mbarriers after the buffer(s): one for tma, two for tma-ahead
        _one_thread("mbarrier.init.shared::cta.b64 [$1], 1; mbarrier.init.shared::cta.b64 [$2], 1; "
                    "fence.mbarrier_init.release.cluster;", "r,r", [bars, bars + 8])
        tl.debug_barrier()
        if MODE == 5:
            _copy(sb, w_ptr + pid * (R * K), NB, bars)
    wn = tl.zeros([R, K], dtype=tl.bfloat16)
    if MODE == 3:
        wn = tl.load(w_ptr + pid * (R * K) + blk, cache_modifier=WCG, eviction_policy=WEV)
    for s in range(stages):
        wblk = w_ptr + (s * nprog + pid).to(tl.int64) * (R * K)
        if MODE == 1:
            w = tl.load(wblk + blk, cache_modifier=WCG, eviction_policy=WEV)
        if MODE == 3:
            w = wn
            if s + 1 < stages:
                wn = tl.load(wblk + nprog * (R * K) + blk, cache_modifier=WCG, eviction_policy=WEV)
        if MODE == 4:
            _copy(sb, wblk, NB, bars)
        if MODE == 5:
            if s + 1 < stages:
                _copy(sb + ((s + 1) % 2) * NB, wblk + nprog * (R * K), NB, bars + ((s + 1) % 2) * 8)
        if s > 0:
            seen = _poll(counters_ptr + s - 1, nprog, SPIN, RELAXED_POLL)
            bad += tl.where(seen < nprog, 1, 0)
        x_ptr = data_ptr + s * PR
        if MODE >= 4:      # the copy of this stage's block landed (tma: one buffer; tma-ahead: two in turn)
            cur = 0 if MODE == 4 else s % 2
            bad += 1 - _bar_wait(bars + cur * 8, s % 2 if MODE == 4 else (s // 2) % 2, SPIN)
        if (MODE == 0) or ((MODE >= 4) and NOREAD):
            y = tl.sum(tl.load(x_ptr + kk, cache_modifier=".cg"), axis=0) + rr.to(tl.float32)
        elif MODE <= 3:
            if MODE == 2:
                w = tl.load(wblk + blk, cache_modifier=WCG, eviction_policy=WEV)
            x = tl.load(x_ptr + kk, cache_modifier=".cg")
            y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        else:
            y = _dot_smem(sb + cur * NB, x_ptr, R, K)
        tl.store(data_ptr + (s + 1) * PR + pid * R + rr, y * 0.03125)   # ~unit scale stage after stage
        tl.debug_barrier()                 # every thread's stores and shared reads are done
        tl.atomic_add(counters_ptr + s, 1, sem=RELEASE, scope="gpu")
    tl.store(out_ptr + pid, bad)


def run(name: str, programs: int, stages: int, rows: int, k: int, reps: int, check: bool) -> float:
    mode, *var = name.split("+")
    if mode not in MODES or not set(var) <= set(VARIANTS):
        raise ValueError(f"unknown mode {name!r}: modes {sorted(MODES)}, variants +{' +'.join(VARIANTS)}")
    if programs * rows < k:
        raise ValueError(f"{programs} programs x {rows} rows is one stage's output, less than the next stage's "
                         f"{k} inputs")
    nbuf = 2 if mode == "tma-ahead" else 1
    if mode.startswith("tma") and nbuf * rows * k * 2 + 16 > 48 * 1024:
        raise ValueError(f"{nbuf} x {rows * k * 2} B of buffers: static shared memory holds at most 48 KB")
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(1234 + rows)
    w = torch.randn(stages * programs * rows * k, device=dev, generator=g).to(torch.bfloat16)
    data = torch.zeros((stages + 1) * programs * rows, device=dev)
    data[:k] = torch.randn(k, device=dev, generator=g)
    counters = torch.zeros(stages, dtype=torch.int32, device=dev)
    out = torch.zeros(programs, dtype=torch.int32, device=dev)
    smem = str(nbuf * rows * k * 2 + 16)
    us = launch_us(lambda: overlap_kernel[(programs,)](
        counters, data, w, out, stages, MODE=MODES[mode], R=rows, K=k, SPIN=1 << 20, SMEM=smem,
        WCG=".cg" if "cg" in var else "", WEV="" if "cg" in var else "evict_first", RELAXED_POLL="relaxed" in var,
        NOREAD="noread" in var, num_warps=4, launch_cooperative_grid=True), counters.zero_, reps) / stages
    if int(out.max()) != 0:
        raise RuntimeError(f"{mode}: a wait timed out")
    if check and mode != "none" and "noread" not in var:
        check_chain(w, data, programs * rows, k, stages, mode)
    return us


def check_chain(w, data, pr: int, k: int, stages: int, name: str):
    """The chain computed what torch computes: stage s's pr outputs are its [pr, k] block of w
    times the stage's input (the first k values of the stage before), scaled by 1/32; checked at
    stages 0, 1 and the last."""
    wf = w.view(stages, pr, k).float()
    for s in (0, 1, stages - 1):
        ref = (wf[s] @ data[s * pr:s * pr + k]) * 0.03125
        got = data[(s + 1) * pr:(s + 2) * pr]
        if not torch.allclose(got, ref, rtol=1e-3, atol=1e-5):
            raise RuntimeError(f"{name}: stage {s} output differs by {(got - ref).abs().max().item():.3g}")


def device_and_copy_bandwidth() -> float:
    """Prints the versions and the GPU, and returns (and prints) a 256 MB device copy's bandwidth in
    TB/s (read + written): the yardstick of a stage's bytes."""
    props = torch.cuda.get_device_properties(0)
    print(torch.__version__, triton.__version__, props.name, flush=True)
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        a.record(); dst.copy_(src); b.record(); torch.cuda.synchronize()
    bw = 2 * src.numel() / (a.elapsed_time(b) * 1e-3) / 1e12
    print(f"copy bandwidth {bw:.2f} TB/s", flush=True)
    return bw


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", default="264")
    ap.add_argument("--stages", type=int, default=140)
    ap.add_argument("--rows", default="8,16", help="R: each program's block is R x K bf16 per stage")
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    bw = device_and_copy_bandwidth()
    for p in (int(x) for x in args.programs.split(",")):
        for r in (int(x) for x in args.rows.split(",")):
            mb = p * r * args.k * 2 / 1e6
            print(f"programs {p}, block {r} x {args.k} bf16: {mb:.2f} MB per stage, "
                  f"{mb / bw:.2f} us at copy bandwidth", flush=True)
            for m in args.modes.split(","):
                try:
                    us = run(m, p, args.stages, r, args.k, args.reps, check=True)
                    print(f"  {m:10s} {us:6.2f} us per stage", flush=True)
                except Exception as e:  # one mode's failure (e.g. shared memory) must not hide the rest
                    print(f"  {m:10s} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)




@triton.jit
def background_kernel(counters_ptr, data_ptr, w_ptr, out_ptr, bytes_ptr, stages, nchain, nblocks,
                      R: tl.constexpr, K: tl.constexpr, SPIN: tl.constexpr, TMA: tl.constexpr, SMEM: tl.constexpr):
    """Programs below nchain run the weightless chain (mode none); the others stream [R, K] blocks
    of w from HBM (plain loads, or bulk copies to shared memory with TMA) until the chain's last
    counter is full, and count the bytes they read: does streaming on *other* programs lengthen
    the chain as much as a program's own in-flight loads do?"""
    pid = tl.program_id(0)
    rr = tl.arange(0, R)
    kk = tl.arange(0, K)
    NB: tl.constexpr = R * K * 2
    if pid < nchain:
        PR = nchain * R
        bad = 0
        for s in range(stages):
            if s > 0:
                seen = wait_counter(counters_ptr + s - 1, nchain, SPIN)
                bad += tl.where(seen < nchain, 1, 0)
            y = tl.sum(tl.load(data_ptr + s * PR + kk, cache_modifier=".cg"), axis=0) * 1e-3 + rr.to(tl.float32)
            tl.store(data_ptr + (s + 1) * PR + pid * R + rr, y)
            tl.debug_barrier()
            tl.atomic_add(counters_ptr + s, 1, sem=RELEASE, scope="gpu")
        tl.store(out_ptr + pid, bad)
    else:
        q = pid - nchain
        nq = tl.num_programs(0) - nchain
        acc = tl.zeros([R], dtype=tl.float32)
        n = 0
        done = 0
        if TMA:
            sb = _smem(SMEM)
            _one_thread("mbarrier.init.shared::cta.b64 [$1], 1; fence.mbarrier_init.release.cluster;", "r", [sb + NB])
            tl.debug_barrier()
        while (done < nchain) & (n < nblocks):
            b = (q + n * nq) % nblocks
            if TMA:
                _copy(sb, w_ptr + b.to(tl.int64) * (R * K), NB, sb + NB)
                _bar_wait(sb + NB, n % 2, SPIN)
                tl.debug_barrier()
            else:
                w = tl.load(w_ptr + b.to(tl.int64) * (R * K) + rr[:, None] * K + kk[None, :],
                            eviction_policy="evict_first")
                acc += tl.sum(w.to(tl.float32), axis=1)
            n += 1
            if n % 4 == 0:
                done = tl.load(counters_ptr + stages - 1, volatile=True)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0).to(tl.int32))     # a use, so the loads stay
        tl.atomic_add(bytes_ptr, n.to(tl.int64) * NB, sem="relaxed")


def run_background(programs: int, nchain: int, stages: int, rows: int, k: int, reps: int, tma: bool):
    """Per-stage time of the chain and the streamers' bandwidth (TB/s) over the kernel's time."""
    dev = "cuda"
    nblocks = (3 << 30) // (rows * k * 2)          # 3 GB of blocks: far more than L2
    w = torch.ones(nblocks * rows * k, dtype=torch.bfloat16, device=dev)
    data = torch.rand((stages + 1) * nchain * rows + k, device=dev)
    counters = torch.zeros(stages, dtype=torch.int32, device=dev)
    out = torch.zeros(programs, dtype=torch.int32, device=dev)
    nbytes = torch.zeros(1, dtype=torch.int64, device=dev)
    times, bws = [], []
    for _ in range(reps + 2):
        counters.zero_()
        nbytes.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        background_kernel[(programs,)](counters, data, w, out, nbytes, stages, nchain, nblocks, R=rows, K=k,
                                       SPIN=1 << 20, TMA=tma, SMEM=str(rows * k * 2 + 16), num_warps=4,
                                       launch_cooperative_grid=True)
        b.record()
        torch.cuda.synchronize()
        ms = a.elapsed_time(b)
        times.append(ms * 1e3 / stages)
        bws.append(float(nbytes) / (ms * 1e-3) / 1e12)
    if int(out[:nchain].max()) != 0:
        raise RuntimeError("a wait timed out")
    times, bws = sorted(times[2:]), sorted(bws[2:])
    return times[len(times) // 2], bws[len(bws) // 2]


def background_main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=264)
    ap.add_argument("--chain", default="132,66")
    ap.add_argument("--stages", type=int, default=140)
    ap.add_argument("--rows", type=int, default=16, help="a streamer's block: rows x 1024 bf16")
    args = ap.parse_args(sys.argv[2:])
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), flush=True)
    for c in (int(x) for x in args.chain.split(",")):
        alone, _ = run_background(c, c, args.stages, args.rows, 1024, 10, False)
        print(f"chain of {c} programs alone: {alone:.2f} us per stage", flush=True)
        for tma in (False, True):
            us, bw = run_background(args.programs, c, args.stages, args.rows, 1024, 10, tma)
            print(f"  + {args.programs - c} programs streaming {'bulk copies' if tma else 'plain loads'} "
                  f"({args.rows} x 1024 bf16 blocks): chain {us:.2f} us per stage, streamers {bw:.2f} TB/s",
                  flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["background"]:
        background_main()
    else:
        main()

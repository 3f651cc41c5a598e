"""Weights through a ring of shared-memory buffers several stages ahead (Gluon): does the stage get cheaper?

``overlap_floor.py`` measured a megakernel stage (poll, 1024-float input, R dot
products stored, release) with an [R, 1024] bf16 block of fresh weights per program per stage,
fetched in every way Triton's ``tl`` allows: a stage costs the weightless chain plus 0.6-1.0 x the
block's time at copy bandwidth. Its bulk-copy modes looked ahead at most one stage (Triton gives a
kernel no shared memory, so its buffers were a 48 KB static PTX array) and read the block back
through inline ``ld.shared`` at ~1.2 us a stage.

Gluon (``triton.experimental.gluon``, Triton >= 3.6) has what those modes lacked: shared memory
allocated by the compiler (up to ~227 KB a CTA), TMA tensor copies completing on mbarriers, and
reads back from shared memory in a register layout of our choosing. Here every program keeps a ring
of D buffers; at the start the copies of its first D stages are in flight, and each stage, once its
block is read, refills that buffer with the block D stages later. So the weights stream at a
steady pace, D - 1 stages ahead of the chain, whatever the chain is waiting for. Where D = 1 the
copy of a stage's block goes out only after the previous stage's release (``overlap_floor``'s
``tma``, without its read-back cost).

If a stage then costs about max(chain, block / bandwidth), a lower-level rewrite of the tiles (Gluon)
is worth its cost; if it still costs chain + ~alpha x block, no load path can hide the weights
under this chain and the step's floor is the chain's.

Blocks are [R, 4, 256] bf16 (TMA boxes are at most 256 elements a dimension); a warp reads one
quarter of every row, 8 contiguous elements a thread. The tile's output is checked against torch
at three stages, as in ``overlap_floor``. NVIDIA Hopper or newer only.

    python3 bench/probes/ring_floor.py [--programs 264,132] [--rows 8,16,24] [--depths 1,2,3,4] [--stages 140]

Waits on the chain's counters are bounded (SPIN polls, counted in the output). The mbarrier wait
for a program's own copy is Gluon's (unbounded): no other program's progress is involved.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository root

import torch  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

import overlap_floor  # noqa: E402  (the script's own folder is on sys.path)
from sync_floor import launch_us  # noqa: E402

SMEM_PER_SM = 227 * 1024      # H100 / H200: the most one SM's CTAs may allocate together


@gluon.jit
def _poll(cnt_ptr, target, SPIN: gl.constexpr):
    seen = gl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
    it = 0
    while (seen < target) & (it < SPIN):
        seen = gl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
        it += 1
    return seen


@gluon.jit
def ring_kernel(counters_ptr, data_ptr, w_desc, out_ptr, stages, R: gl.constexpr, D: gl.constexpr,
                WR: gl.constexpr, SPIN: gl.constexpr, NOREAD: gl.constexpr):
    """The chain of ``overlap_floor`` with each program's block of stage s in buffer s % D of a
    ring, copied D stages ahead. WR: warps along the rows (num_warps = 4 * WR)."""
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 1, 32], [WR, 4, 1], [2, 1, 0])
    XL: gl.constexpr = gl.SliceLayout(0, L3)                       # [4, 256]: the input
    YL: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, L3))    # [R]: the tile's outputs
    NB: gl.constexpr = w_desc.block_type.nbytes
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    PR = nprog * R
    ring = gl.allocate_shared_memory(gl.bfloat16, [D, R, 4, 256], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [D, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(D):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(D):        # the host asks for stages >= D
        mbarrier.expect(bars.index(i), NB)
        tma.async_copy_global_to_shared(w_desc, [(i * nprog + pid) * R, 0, 0], bars.index(i), ring.index(i))
    xj = gl.arange(0, 4, layout=gl.SliceLayout(1, XL))
    xc = gl.arange(0, 256, layout=gl.SliceLayout(0, XL))
    xo = gl.expand_dims(xj, 1) * 256 + gl.expand_dims(xc, 0)
    rr = gl.arange(0, R, layout=YL)
    bad = 0
    for s in range(stages):
        slot = s % D
        if s > 0:
            seen = _poll(counters_ptr + s - 1, nprog, SPIN)
            bad += (seen < nprog).to(gl.int32)
        x = gl.load(data_ptr + s * PR + xo, cache_modifier=".cg")
        mbarrier.wait(bars.index(slot), (s // D) & 1)
        if NOREAD:
            y = gl.sum(gl.sum(x, axis=1), axis=0) + rr.to(gl.float32)
        else:
            w = ring.index(slot).load(L3)
            y = gl.sum(gl.sum(w.to(gl.float32) * gl.expand_dims(x, 0), axis=2), axis=1)
        gl.store(data_ptr + (s + 1) * PR + pid * R + rr, y * 0.03125)   # ~unit scale stage after stage
        gl.thread_barrier()            # every thread's stores and shared reads are done
        gl.atomic_add(counters_ptr + s, 1, sem="release", scope="gpu")
        if s + D < stages:             # refill this buffer with the block D stages on
            fence_async_shared()
            mbarrier.expect(bars.index(slot), NB)
            tma.async_copy_global_to_shared(w_desc, [((s + D) * nprog + pid) * R, 0, 0], bars.index(slot),
                                            ring.index(slot))
    for i in gl.static_range(D):
        mbarrier.invalidate(bars.index(i))
    gl.store(out_ptr + pid, bad)


def run(programs: int, stages: int, rows: int, depth: int, reps: int, noread: bool = False) -> float:
    """Median us per stage of the ring with ``depth`` buffers; checks three stages against torch."""
    if programs * rows < 1024:
        raise ValueError(f"{programs} programs x {rows} rows is one stage's output, less than the next stage's "
                         f"1024 inputs")
    if stages < depth:
        raise ValueError(f"{stages} stages, fewer than the ring's {depth} buffers")
    per_sm = -(-programs // torch.cuda.get_device_properties(0).multi_processor_count)
    need = depth * rows * 2048 + 8 * depth
    if per_sm * need > SMEM_PER_SM:
        raise ValueError(f"{per_sm} programs per SM x {need} B of ring exceed {SMEM_PER_SM} B of shared memory")
    wr = 2 if per_sm == 1 else 1       # one program per SM: 8 warps, as the megakernel's 132-worker plan
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(4321 + rows)
    w = torch.randn(stages * programs * rows * 1024, device=dev, generator=g).to(torch.bfloat16)
    w3 = w.view(stages * programs * rows, 4, 256)
    lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)
    desc = TensorDescriptor(w3, list(w3.shape), list(w3.stride()), [rows, 4, 256], lay)
    data = torch.zeros((stages + 1) * programs * rows, device=dev)
    data[:1024] = torch.randn(1024, device=dev, generator=g)
    counters = torch.zeros(stages, dtype=torch.int32, device=dev)
    out = torch.zeros(programs, dtype=torch.int32, device=dev)
    us = launch_us(lambda: ring_kernel[(programs,)](
        counters, data, desc, out, stages, R=rows, D=depth, WR=wr, SPIN=1 << 20, NOREAD=noread,
        num_warps=4 * wr, launch_cooperative_grid=True), counters.zero_, reps) / stages
    if int(out.max()) != 0:
        raise RuntimeError(f"ring D={depth}: a wait timed out ({int(out.max())} stages)")
    if not noread:
        overlap_floor.check_chain(w, data, programs * rows, 1024, stages, f"ring D={depth}")
    return us


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", default="264,132")
    ap.add_argument("--stages", type=int, default=140)
    ap.add_argument("--rows", default="8,16", help="R: each program's block is R x 1024 bf16 per stage")
    ap.add_argument("--depths", default="1,2,3,4")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--baseline", default="none,reg", help="overlap_floor.py modes run beside, same shapes")
    args = ap.parse_args()
    bw = overlap_floor.device_and_copy_bandwidth()
    for p in (int(x) for x in args.programs.split(",")):
        for r in (int(x) for x in args.rows.split(",")):
            mb = p * r * 1024 * 2 / 1e6
            print(f"programs {p}, block {r} x 1024 bf16: {mb:.2f} MB per stage, {mb / bw:.2f} us at copy bandwidth",
                  flush=True)
            for m in (x for x in args.baseline.split(",") if x):
                try:
                    us = overlap_floor.run(m, p, args.stages, r, 1024, args.reps, check=True)
                    print(f"  {m:14s} {us:6.2f} us per stage", flush=True)
                except Exception as e:  # noqa: BLE001 - one mode's failure must not hide the rest
                    print(f"  {m:14s} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
            for d in (int(x) for x in args.depths.split(",")):
                for noread in (False, True):
                    name = f"ring D={d}" + (" noread" if noread else "")
                    try:
                        us = run(p, args.stages, r, d, args.reps, noread)
                        print(f"  {name:14s} {us:6.2f} us per stage", flush=True)
                    except Exception as e:  # noqa: BLE001
                        print(f"  {name:14s} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)


if __name__ == "__main__":
    main()

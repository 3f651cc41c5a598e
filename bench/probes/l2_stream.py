"""Does an SM stream weights faster from the L2 half near it? (docs/performance.md, "Buffers")

``l2_partition.py`` found the H100's L2 in two halves that alternate by bit 12 xor bit 13 of the address
(4 KB chunks), each half nearer to part of the SMs. A decode step streams every weight once from
HBM; half of each SM's chunks live in the far half. This probe measures the read bandwidth when
every program reads only chunks of its SM's near half, only of its far half, or contiguous bytes
(both halves, as the megakernel's tiles do), the same bytes per program in each mode.

1. Which half is near each SM: ``l2_partition.py``'s pointer chase through the lines of 16
   chunks, from every SM; an SM's near half is the group of chunks it reaches sooner.
2. Streaming: P programs (2 per SM by default), each owning a region of 2C chunks of a buffer
   too large for the L2, reading C of them (its near half's, its far half's, or the first C)
   16 KB at a time; the time of the launch gives the bandwidth.

    python3 bench/probes/l2_stream.py [--per-sm 2] [--chunks 496] [--reps 5]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository root

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from instructions.common import sm_id  # noqa: E402
from l2_partition import CHUNK, chase  # noqa: E402  (the script's own folder is on sys.path)


@triton.jit
def half_chunk(k, h):
    """The k-th chunk of half h (bit 0 xor bit 1 of the chunk index) among chunks 0, 1, 2, ..."""
    j = k % 2
    a = tl.where(j == 0, 0, 3)          # half 0: chunks 0, 3 of each group of four
    b = tl.where(j == 0, 1, 2)          # half 1: chunks 1, 2
    return (k // 2) * 4 + tl.where(h == 0, a, b)


@triton.jit
def stream(buf_ptr, near_ptr, out_ptr, C: tl.constexpr, MODE: tl.constexpr, PAR: tl.constexpr):
    """MODE 0: the region's first C chunks; 1: its C chunks of the near half; 2: of the far half.
    PAR chunks (4 KB each) in flight per iteration."""
    pid = tl.program_id(0)
    h = tl.load(near_ptr + sm_id())
    if MODE == 2:
        h = 1 - h
    region = buf_ptr + pid.to(tl.int64) * (2 * C * 1024)
    w = tl.arange(0, 1024)
    jj = tl.arange(0, PAR)
    acc = tl.zeros([PAR, 1024], dtype=tl.int32)
    for k0 in range(0, C, PAR):
        k = k0 + jj
        if MODE == 0:
            c = k
        else:
            c = half_chunk(k, h)
        acc ^= tl.load(region + c.to(tl.int64)[:, None] * 1024 + w[None, :], mask=(k < C)[:, None], other=0)
    tl.store(out_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


def near_halves(P: int, chunks: int = 16, loads: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """(near half per SM id, latency difference far - near in ns per SM id) from a pointer chase."""
    raw = torch.zeros(2 * (4 << 20) // 4, dtype=torch.int32, device="cuda")
    base = ((-raw.data_ptr()) % (4 << 20)) // 4
    arena = raw[base:base + chunks * CHUNK]
    i = torch.arange(CHUNK, device="cuda")
    arena.copy_(((i // 32 + 1) % 32 * 32).repeat(chunks))
    out = torch.zeros(P * chunks * 3, dtype=torch.int64, device="cuda")
    chase[(P,)](arena, out, NCHUNK=chunks, LOADS=loads)
    torch.cuda.synchronize()
    o = out.view(P, chunks, 3).cpu()
    ns = o[:, :, 0].double() / loads
    sm = o[:, 0, 1]
    c = torch.arange(chunks)
    half = (c & 1) ^ ((c >> 1) & 1)
    d = ns[:, half == 0].mean(dim=1) - ns[:, half == 1].mean(dim=1)      # > 0: half 1 is nearer
    near = torch.zeros(int(sm.max()) + 1, dtype=torch.int32)
    diff = torch.zeros(int(sm.max()) + 1, dtype=torch.float64)
    near[sm] = (d > 0).int()
    diff[sm] = d.abs()
    return near, diff


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-sm", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=496, help="chunks each program reads (4 KB each)")
    ap.add_argument("--par", type=int, default=4, help="chunks in flight per program")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    P = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), f"{P} SMs", torch.__version__, triton.__version__, flush=True)
    near, diff = near_halves(P)
    print(f"near half per SM: {int((near == 0).sum())} SMs near half 0, {int((near == 1).sum())} near half 1; "
          f"|far - near| ns per load: min {diff.min():.1f} median {diff.median():.1f} max {diff.max():.1f}")
    near = near.cuda()
    n = P * args.per_sm
    C = args.chunks
    buf = torch.randint(0, 1 << 30, (n * 2 * C * CHUNK,), dtype=torch.int32, device="cuda")
    out = torch.zeros(n, dtype=torch.int32, device="cuda")
    nbytes = n * C * CHUNK * 4
    # the copy bandwidth, as the bench measures the floor with (read + write)
    a = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=5, rep=50)
    print(f"copy bandwidth {2 * a.numel() / ms / 1e6:.0f} GB/s")
    del a, b
    names = {0: "contiguous", 1: "near half", 2: "far half"}
    for par in sorted({1, 2, args.par, 8}):
        for rep in range(args.reps):
            row = []
            for mode in (0, 1, 2):
                stream[(n,)](buf, near, out, C=C, MODE=mode, PAR=par)
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                stream[(n,)](buf, near, out, C=C, MODE=mode, PAR=par)
                e1.record()
                torch.cuda.synchronize()
                row.append(f"{names[mode]} {nbytes / e0.elapsed_time(e1) / 1e6:6.0f} GB/s")
            print(f"programs {n} chunks in flight {par} ({par * 4} KB): " + "  ".join(row), flush=True)


if __name__ == "__main__":
    main()

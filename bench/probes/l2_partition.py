"""L2 latency from each SM to each 4 KB chunk of an arena (docs/performance.md, "Buffers").

bench/placement.py found the step's time depending on where the residual stream x lies, with an
8 KB period: slower when its 4 KB straddle certain 4 KB boundaries. The H100's L2 is two
partitions, each near half of the SMs; this asks whether that is the pattern: every program chases
pointers through the 32 lines of one 4 KB chunk (each load's address is the previous load's value,
so the loads are serial) through L2 (``volatile``: no L1), and records the mean latency per load,
for every chunk of the first 64 KB of a 4 MB-aligned arena, with its SM id.

    python3 bench/probes/l2_partition.py [--chunks 16] [--loads 256] [--arenas 2]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository root

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from instructions.common import sm_id  # noqa: E402

CHUNK = 1024     # int32 words: 4 KB


@triton.jit
def chase(arena_ptr, out_ptr, NCHUNK: tl.constexpr, LOADS: tl.constexpr):
    pid = tl.program_id(0)
    for c in range(NCHUNK):
        base = arena_ptr + c * 1024
        idx = tl.load(base + (pid % 32) * 32, volatile=True)      # warm the first line
        t0 = tl.extra.cuda.globaltimer()
        for _ in range(LOADS):
            idx = tl.load(base + idx, volatile=True)
        t1 = tl.extra.cuda.globaltimer()
        # the timer read waits on idx: store both so the loop cannot be dropped
        tl.store(out_ptr + (pid * NCHUNK + c) * 3, (t1 - t0 + (idx & 0)).to(tl.int64))
        tl.store(out_ptr + (pid * NCHUNK + c) * 3 + 1, sm_id().to(tl.int64))
        tl.store(out_ptr + (pid * NCHUNK + c) * 3 + 2, idx.to(tl.int64))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--loads", type=int, default=256)
    ap.add_argument("--arenas", type=int, default=2)
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    P = props.multi_processor_count
    print(torch.cuda.get_device_name(), f"{P} SMs", flush=True)
    keep = []
    for a in range(args.arenas):
        raw = torch.zeros(2 * (4 << 20) // 4, dtype=torch.int32, device="cuda")
        keep.append(raw)
        base = ((-raw.data_ptr()) % (4 << 20)) // 4
        arena = raw[base:base + args.chunks * CHUNK]
        # within each chunk: word i (a line start) holds the index of the next line's start
        i = torch.arange(CHUNK, device="cuda")
        arena.copy_(((i // 32 + 1) % 32 * 32).repeat(args.chunks))
        out = torch.zeros(P * args.chunks * 3, dtype=torch.int64, device="cuda")
        chase[(P,)](arena, out, NCHUNK=args.chunks, LOADS=args.loads)
        torch.cuda.synchronize()
        o = out.view(P, args.chunks, 3).cpu()
        ns = o[:, :, 0].double() / args.loads
        sm = o[:, 0, 1]
        order = torch.argsort(sm)
        print(f"arena {a} at {arena.data_ptr():#x}: mean ns per load, rows = SM (sorted), cols = 4 KB chunk")
        for p in order.tolist():
            print(f"sm {int(sm[p]):3d} " + " ".join(f"{v:4.0f}" for v in ns[p].tolist()))
        # the two groups: chunks whose latency pattern over SMs agrees
        col = ns - ns.mean(dim=1, keepdim=True)
        ref = col[:, 0]
        corr = [float(torch.corrcoef(torch.stack([ref, col[:, c]]))[0, 1]) for c in range(args.chunks)]
        print("chunk correlation with chunk 0: " + " ".join(f"{c:+.2f}" for c in corr), flush=True)


if __name__ == "__main__":
    main()

"""Does the megakernel's step time depend on where its small hot buffers lie? (docs/performance.md, "Buffers")

One process, one compiled kernel: each of the step's small buffers (the tape, the sync counters,
the attention tickets, the activations) is moved in turn into a fresh allocation at a byte offset,
and batch-1 decode is timed there (launches of 64 steps after a fresh prefill). Everything
else stays put, so any difference is the buffer's address, not the code.

    python3 bench/placement.py [--model 0.6b] [--offsets 0,128,512,2048,8192,65536] [--buffers counters,x,...]
    python3 bench/placement.py --arena --step 512 --offsets 32768 --buffers x     (a sweep in the arena)
    python3 bench/placement.py --layouts "orig;x@0x1000,counters@0x5000"          (whole layouts, interleaved)
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megakernel import MegaQwen3, load_model  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--offsets", default="0,128,256,512,1024,4096,16384,65536")
ap.add_argument("--buffers", default="words,counters,tickets,x,qkv,attn,act,opart,ml,amax")
ap.add_argument("--launches", type=int, default=4)
ap.add_argument("--max-seq-len", type=int, default=392)
ap.add_argument("--model", default="0.6b")
ap.add_argument("--arena", action="store_true",
                help="offsets from a 2 MB-aligned base in one arena (else: from a fresh allocation)")
ap.add_argument("--layouts", default="",
                help="';'-separated layouts of 'buffer@offset,...' in the arena (implies --arena), each timed "
                     "--repeats times, interleaved; 'orig' is the buffers as allocated")
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--step", type=int, default=0, help="with --arena: offsets 0, step, ... up to the last of --offsets")
args = ap.parse_args()

model = load_model(args.model, random_weights=True, device="cuda", dtype=torch.bfloat16, progress=False)
prompt = torch.randint(0, model.config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(int(time.time())))
mk = MegaQwen3(model, max_seq_len=args.max_seq_len, batch_size=1, backend="megakernel")
be = mk.backend
mk.prefill(prompt)
ref_tokens = mk.steps(64 * args.launches, per_launch=64).clone()


def owner(name):
    return be if name in ("words", "counters") else be.st


def timed() -> float:
    mk.prefill(prompt)
    ev = []
    for _ in range(args.launches):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        toks = mk.steps(64, per_launch=64)
        b.record()
        ev.append((a, b, toks))
    torch.cuda.synchronize()
    be.synchronize()
    toks = torch.cat([t for _, _, t in ev], dim=1)
    ms = sorted(a.elapsed_time(b) / 64 for a, b, _ in ev)
    return ms[len(ms) // 2], bool((toks == ref_tokens).all())


ARENA = 4 << 20
args.arena = args.arena or bool(args.layouts)
arena = torch.zeros(2 * ARENA, dtype=torch.uint8, device="cuda") if args.arena else None
base = (-arena.data_ptr()) % ARENA if args.arena else 0      # a 4 MB-aligned start within the arena


def place(name, off):
    """Put buffer ``name`` ``off`` bytes past a fresh allocation's start (or the arena's aligned
    base); returns what keeps the allocation alive and the buffer it replaced."""
    obj = owner(name)
    old = getattr(obj, name)
    n = old.numel() * old.element_size()
    raw = arena if args.arena else torch.zeros(n + off, dtype=torch.uint8, device=old.device)
    at = base + off if args.arena else off
    new = raw[at:at + n].view(old.dtype).view(old.shape)
    new.copy_(old)
    setattr(obj, name, new)
    be.reset_counters()
    return raw, old


print(torch.__version__, torch.cuda.get_device_name(), flush=True)
if args.layouts:
    layouts = args.layouts.split(";")
    res = {lay: [] for lay in layouts}
    for _ in range(args.repeats):
        for lay in layouts:
            olds = []
            for spec in ([] if lay == "orig" else lay.split(",")):
                name, off = spec.split("@")
                olds.append((name, place(name, int(off, 0))[1]))
            ms, same = timed()
            res[lay].append(f"{ms:.4f}{'' if same else '!'}")
            for name, old in reversed(olds):
                setattr(owner(name), name, old)
            be.reset_counters()
    for lay, r in res.items():
        print(f"{lay:40s} " + " ".join(r), flush=True)
    sys.exit(0)
print(f"orig: {timed()}", {n: getattr(owner(n), n).data_ptr() % (1 << 21) for n in args.buffers.split(",")}, flush=True)
for name in args.buffers.split(","):
    row = []
    offs = [int(o) for o in args.offsets.split(",")]
    if args.step:
        offs = list(range(0, max(offs) + 1, args.step))
    for off in offs:
        raw, old = place(name, off)
        ms, same = timed()
        row.append(f"{off}:{ms:.4f}{'' if same else '!'}@{getattr(owner(name), name).data_ptr() % (1 << 21):x}")
        setattr(owner(name), name, old)
        be.reset_counters()
        del raw
    print(f"{name:9s} " + " ".join(row), flush=True)
print(f"orig: {timed()}", flush=True)

"""Per-kernel GPU time of the per-op backend's step (torch.profiler), random weights: where a step's
time goes by stage (the kernels are the megakernel's tiles, one launch a stage). Plan fields as
``--set NAME=N``.

    python3 bench/perop_profile.py [--model 0.6b] [--batch-size 1] [--steps 8] [--max-seq-len 392]
                                   [--prompt-len 128] [--set SWAP_CALL=1 ...]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from megakernel import MegaQwen3, load_model  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="0.6b")
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--max-seq-len", type=int, default=392)
ap.add_argument("--batch-size", type=int, default=1)
ap.add_argument("--prompt-len", type=int, default=128)
ap.add_argument("--set", action="append", default=[], metavar="NAME=N", help="a plan field")
args = ap.parse_args()
overrides = {k: int(v) for k, v in (a.split("=", 1) for a in args.set)}
model = load_model(args.model, random_weights=True, device="cuda", dtype=torch.bfloat16, progress=False)
mk = MegaQwen3(model, max_seq_len=args.max_seq_len, batch_size=args.batch_size, backend="per-op",
               plan_overrides=overrides)
mk.prefill(torch.randint(0, model.config.vocab_size, (args.batch_size, args.prompt_len)))
for _ in range(3):
    mk.step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(args.steps):
        mk.step()
    torch.cuda.synchronize()
rows = [(e.key, e.device_time_total / args.steps, e.count // args.steps) for e in prof.key_averages()]
total = sum(t for _, t, _ in rows)
print(f"{args.model} batch {args.batch_size}: {total:.1f} us of kernels a step")
for k, t, n in sorted(rows, key=lambda r: -r[1])[:12]:
    print(f"{k[:40]:40s} {t:9.1f} us a step  x{n}  ({100 * t / total:4.1f}%)")

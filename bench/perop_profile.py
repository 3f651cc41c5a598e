"""Per-kernel GPU time of the per-op backend's step (torch.profiler), random weights, batch 1.

    python3 bench/perop_profile.py [--model 0.6b] [--steps 8] [--max-seq-len 392]
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
args = ap.parse_args()
model = load_model(args.model, random_weights=True, device="cuda", dtype=torch.bfloat16, progress=False)
mk = MegaQwen3(model, max_seq_len=args.max_seq_len, batch_size=1, backend="per-op")
mk.prefill(torch.randint(0, model.config.vocab_size, (1, 128)))
for _ in range(3):
    mk.step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(args.steps):
        mk.step()
    torch.cuda.synchronize()
rows = [(e.key, e.device_time_total / args.steps, e.count // args.steps) for e in prof.key_averages()]
for k, t, n in sorted(rows, key=lambda r: -r[1])[:12]:
    print(f"{k[:40]:40s} {t:9.1f} us a step  x{n}")

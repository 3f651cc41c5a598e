"""Where a batch-8 run and a batch-1 run of the same prompt part ways (tests/test_gpu_sizes.py::
test_batch8_equals_eight_batch1_runs): the KV cache after prefill, then each decode step's logits
of sequence b in both, until their tokens differ; prints the top-2 logits there (a near-tie or a
real difference). Same prompt construction as the test.

    PROMPT_SEED=1795268737 python3 bench/batch_diverge.py --seq 3 [--backend megakernel]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megakernel import MegaQwen3, load_model  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--seq", type=int, default=3)
ap.add_argument("--backend", default="megakernel")
ap.add_argument("--steps", type=int, default=64)
args = ap.parse_args()
seed = int(os.environ["PROMPT_SEED"])
model = load_model("0.6b", random_weights=True, device="cuda", dtype=torch.bfloat16, progress=False)
prompt = torch.randint(0, model.config.vocab_size, (8, 24), generator=torch.Generator().manual_seed(seed))
b = args.seq
mb = MegaQwen3(model, max_seq_len=96, batch_size=8, backend=args.backend)
m1 = MegaQwen3(model, max_seq_len=96, batch_size=1, backend=args.backend)
mb.prefill(prompt)
m1.prefill(prompt[b:b + 1])
lb, l1 = mb.logits[b], m1.logits[0]     # prefill returns the first tokens; the logits stay here
T = prompt.shape[1]
dk = (mb.cache.k[:, b, :, :T].float() - m1.cache.k[:, 0, :, :T].float()).abs().max().item()
dv = (mb.cache.v[:, b, :, :T].float() - m1.cache.v[:, 0, :, :T].float()).abs().max().item()
print(f"{args.backend} seed {seed} seq {b}: after prefill max|dK| {dk:.3g} max|dV| {dv:.3g} "
      f"max|dlogits| {(lb - l1).abs().max().item():.3g}; plans batched={mb.backend.plan.BATCHED if hasattr(mb.backend, 'plan') else '-'}")
for step in range(args.steps):
    tb, t1 = int(mb.tokens[b]), int(m1.tokens[0])
    if tb != t1:
        for name, lg in (("batch 8", lb), ("batch 1", l1)):
            v, i = lg.topk(2)
            print(f"  step {step}: {name} top2 {i.tolist()} {v.tolist()} (gap {(v[0] - v[1]).item():.3g})")
        break
    mb.step(); m1.step()
    lb, l1 = mb.logits[b].clone(), m1.logits[0].clone()
    d = (lb - l1).abs().max().item()
    if step % 8 == 0 or d > 1e-3:
        print(f"  step {step}: max|dlogits| {d:.3g} (logit scale {l1.abs().max().item():.3g})")
else:
    print(f"  tokens equal for {args.steps} steps")

"""How far a batch-8 run's logits stray from each sequence's run alone, over several prompts
(the quantities tests/test_gpu_sizes.py::test_batch8_equals_eight_batch1_runs bounds): for each
sequence, the largest |logit difference| over the steps while the greedy tokens agree, the step
where they part (if they do) and the gap between the two tokens' logits there (in the run alone).

    python3 bench/batch_vs_alone.py --seeds 6 [--steps 64] [--backend megakernel]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megakernel import MegaQwen3, load_model  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--seeds", type=int, default=6)
ap.add_argument("--first-seed", type=int, default=1000)
ap.add_argument("--steps", type=int, default=64)
ap.add_argument("--backend", default="megakernel")
args = ap.parse_args()
model = load_model("0.6b", random_weights=True, device="cuda", dtype=torch.bfloat16, progress=False)
all_d, gaps, parted_runs = [], [], []
for seed in range(args.first_seed, args.first_seed + args.seeds):
    prompt = torch.randint(0, model.config.vocab_size, (8, 24), generator=torch.Generator().manual_seed(seed))
    batch = MegaQwen3(model, max_seq_len=96, batch_size=8, backend=args.backend)
    batch.prefill(prompt)
    toks, logits = [batch.tokens.long().cpu()], []
    for _ in range(args.steps):
        batch.step()
        toks.append(batch.tokens.long().cpu())
        logits.append(batch.logits.clone())
    parted, row = 0, []
    for b in range(8):
        alone = MegaQwen3(model, max_seq_len=96, batch_size=1, backend=args.backend)
        alone.prefill(prompt[b:b + 1])
        dmax, part = 0.0, None
        for i in range(args.steps):
            alone.step()
            dmax = max(dmax, (alone.logits[0] - logits[i][b]).abs().max().item())
            t = int(alone.tokens[0])
            if t != int(toks[i + 1][b]):
                lg = alone.logits[0]
                part = (i, abs(lg[t] - lg[int(toks[i + 1][b])]).item())
                break
        all_d.append(dmax)
        if part:
            parted += 1
            gaps.append(part[1])
        row.append(f"{dmax:.3g}" + (f"@{part[0]}:{part[1]:.3g}" if part else ""))
        del alone
    parted_runs.append(parted)
    print(f"seed {seed}: max|dlogit| per sequence (@step parted:gap) " + " ".join(row), flush=True)
all_d.sort()
print(f"{args.backend}: max|dlogit| over {len(all_d)} sequences: median {all_d[len(all_d) // 2]:.3g} "
      f"p90 {all_d[int(0.9 * (len(all_d) - 1))]:.3g} max {all_d[-1]:.3g}; parted per run {parted_runs}; "
      f"gaps where parted: {' '.join(f'{g:.3g}' for g in sorted(gaps))}")

#!/usr/bin/env bash
# (MEGAKERNEL_NEXT_EARLY and st=lag-all need bench/results/s24r3/next-early.diff and
# bench/results/s24r4/lag-experiment.diff on the commit before session 24.)
# Session 24, GPU round 3 (H100, 0.6b): MEGAKERNEL_NEXT_EARLY=1 (an instruction's second tile's
# weights asked for right after its wait, before the input load) on the plan and on lag-all, one
# process per setting, alternating twice; tokens against per-op in each.
#   bash bench/rounds/s24r3.sh "$OUT/s24r3"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
P=megakernel:spl=64
LA=$P:R_GU=8:st=lag-all
for r in 1 2; do
  for e in 0 1; do
    echo "== NEXT_EARLY=$e" | tee -a "$out/ab.txt"
    MEGAKERNEL_NEXT_EARLY=$e timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
      --backends "per-op,$P,$LA,$P,$LA" 2>&1 | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
  done
done

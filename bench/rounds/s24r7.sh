#!/usr/bin/env bash
# Session 24, GPU round 7 (H100, 0.6b): MEGAKERNEL_GU_EARLY=1 (gate/up's second tile asked for
# right after the wait, before the input load; the first iteration peeled, gate/up only: the
# critical workers after NOTES 63 are those with two gate/up tiles) against the plan, one process
# per setting, alternating twice; tokens against per-op in each.
#   bash bench/rounds/s24r7.sh "$OUT/s24r7"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
P=megakernel:spl=64
for r in 1 2; do
  for e in 0 1; do
    echo "== GU_EARLY=$e" | tee -a "$out/ab.txt"
    MEGAKERNEL_GU_EARLY=$e timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
      --backends "per-op,$P,$P" 2>&1 | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
  done
done

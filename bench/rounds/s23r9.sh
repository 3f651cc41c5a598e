#!/usr/bin/env bash
# Session 23, GPU round 9 (H100, 0.6b): which workers hold the 128 O tiles (MEGAKERNEL_O_ON, read
# when a tape is built; the diff is results/s23r9/o-on.diff): the balanced strategy's (half of them
# on workers with a busy attention split at this length), "empty" (workers whose split is empty at
# short contexts: the highest split indices) or "active" (the lowest); one process each, alternating.
#   bash bench/rounds/s23r9.sh "$OUT/s23r9"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
b=megakernel:spl=64
for r in 1 2 3; do
  for e in "" empty active; do
    MEGAKERNEL_O_ON=$e timeout 100 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
      --backends "per-op,$b,$b" 2>&1 | grep -E "median|equal|rror" | grep -v per-op: | sed "s/^/o_on=${e:-plan} /" \
      | tee -a "$out/ab.txt"
  done
done

#!/usr/bin/env bash
# (Needs bench/results/s24r11/l2-next.diff on the commit before session 24's NOTES 65.)
# Session 24, GPU round 11 (H100, 0.6b): the second tile's weights asked for into L2 before the
# wait (MEGAKERNEL_L2_NEXT: 1 gate/up, 2 gate/up and down; one bulk prefetch by one thread, no
# registers): since NOTES 63 the workers with two gate/up tiles (and the O workers with two down
# tiles) end those stages, their second tile asked for from HBM only after the input arrives; the
# prefetch runs while they wait (during O, during gate/up's tail). One process per setting,
# alternating twice; tokens against per-op in each.
#   bash bench/rounds/s24r11.sh "$OUT/s24r11"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
P=megakernel:spl=64
for r in 1 2; do
  for e in 0 1 2; do
    echo "== L2_NEXT=$e" | tee -a "$out/ab.txt"
    MEGAKERNEL_L2_NEXT=$e timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
      --backends "per-op,$P,$P" 2>&1 | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
  done
done

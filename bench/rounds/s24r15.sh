#!/usr/bin/env bash
# Session 24, GPU round 15 (H100, 0.6b): gate/up's one-tile pieces on the lowest workers (with
# attention in halves they share SMs with each other on the H100/H200: w and w + 8 for w < 8,
# bench/sm_map.py), so that no SM holds four gate/up tiles (8 did), against the previous commit in
# _main/, one process each, alternating twice.
#   bash bench/rounds/s24r15.sh "$OUT/s24r15"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
here=$(pwd)
P=megakernel:spl=64
for r in 1 2; do
  for tree in new main; do
    d=$here; [ $tree = main ] && d=$here/_main
    echo "== $tree" | tee -a "$out/ab.txt"
    (cd "$d" && timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
      --backends "per-op,$P,$P" 2>&1) | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
  done
done

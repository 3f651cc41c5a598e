#!/usr/bin/env bash
# Session 25, GPU round 6 (H100): attention per kv group on today's code (bench/attn_groups.py on a
# light trace): how long the O projection waits for the slowest group, and how long a combine takes.
#   bash bench/rounds/s25r6.sh "$OUT/s25r6"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
P=megakernel:spl=64
for r in 1 2; do
  timeout 150 python3 bench/gpu_smoke.py --steps 128 --max-seq-len 392 --backends $P:trace=2 --trace-dir "$out/tr$r" \
    2>&1 | grep -E "median|rror" | tee -a "$out/groups.txt"
  for f in "$out"/tr$r/*.json; do python3 bench/attn_groups.py "$f"; done >> "$out/groups.txt" 2>&1
  rm -rf "$out/tr$r"
done
cat "$out/groups.txt"

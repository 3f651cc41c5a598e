#!/usr/bin/env bash
# Session 21, GPU round 5 (H100): ATTN_NEW (the plan's at max_seq_len 392) against ATTN_NEW=0 at 1.7b
# and 4b, one process per size, the plan first and last; 64 steps, 16 a launch.
#   bash bench/rounds/s21r5.sh "$OUT/s21r5"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
for m in 1.7b 4b; do
  timeout 250 python3 bench/gpu_smoke.py --model $m --steps 64 --max-seq-len 392 --backends \
    per-op,megakernel:spl=16,megakernel:spl=16:ATTN_NEW=0,megakernel:spl=16:ATTN_NEW=0,megakernel:spl=16 2>&1 \
    | grep -E "median|equal|regs|rror" | sed "s/^/$m /" | tee -a "$out/ab.txt"
done

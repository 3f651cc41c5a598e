#!/usr/bin/env bash
# Session 21, GPU round 3 (H100): the new-position split as the plan field ATTN_NEW (make_plan sets
# it at max_seq_len 392) against ATTN_NEW=0, one process per size with the plan first and last:
# 0.6b (256 steps, 64 a launch), 8b and 14b (32 steps, 16 a launch); tokens against per-op's.
#   bash bench/rounds/s21r3.sh "$OUT/s21r3"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
timeout 200 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 --backends \
  per-op,megakernel:spl=64,megakernel:spl=64:ATTN_NEW=0,megakernel:spl=64:ATTN_NEW=0,megakernel:spl=64 2>&1 \
  | grep -E "median|equal|regs|rror" | sed "s/^/0.6b /" | tee "$out/ab.txt"
for m in 8b 14b; do
  timeout 260 python3 bench/gpu_smoke.py --model $m --steps 32 --max-seq-len 392 --backends \
    per-op,megakernel:spl=16,megakernel:spl=16:ATTN_NEW=0,megakernel:spl=16 2>&1 \
    | grep -E "median|equal|regs|rror" | sed "s/^/$m /" | tee -a "$out/ab.txt"
done

#!/usr/bin/env bash
# Session 23, GPU round 10 (H100, 0.6b): attention blocks of 16 positions (BLOCK_S 16: twice the
# cached splits per group at max_seq_len 392, each half the math, twice the partials to combine)
# beside the plan, one process, alternating.
#   bash bench/rounds/s23r10.sh "$OUT/s23r10"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
b=megakernel:spl=64
timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 --backends \
  per-op,$b,$b:BLOCK_S=16,$b,$b:BLOCK_S=16,$b,$b:BLOCK_S=16 2>&1 | grep -E "median|regs|equal|rror" \
  | tee -a "$out/ab.txt"

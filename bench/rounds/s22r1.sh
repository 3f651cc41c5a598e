#!/usr/bin/env bash
# Session 22, GPU rounds 1 and 3 (H100): the folded step edges (plan field FOLD, which make_plan sets at
# batch 1: no EMBED, no boundary wait, layer 0's QKV waits on the previous step's LM head) against
# FOLD=0 at 0.6b, one process, alternating (256 steps, 64 a launch; tokens against per-op's); then
# the GPU tests.
# Round 3 ran it again after ARGMAX moved to a worker whose first instruction is not a QKV tile.
#   bash bench/rounds/s22r1.sh "$OUT/s22r1"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
timeout 330 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 --backends \
  per-op,megakernel:spl=64,megakernel:spl=64:FOLD=0,megakernel:spl=64,megakernel:spl=64:FOLD=0,megakernel:spl=64,megakernel:spl=64:FOLD=0 2>&1 \
  | grep -E "median|equal|regs|rror" | sed "s/^/0.6b /" | tee "$out/ab.txt"
timeout 250 python3 -m pytest -m gpu -q -s 2>&1 | tee "$out/gpu-tests.log" | tail -4

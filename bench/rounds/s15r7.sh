#!/usr/bin/env bash
# Session 15, GPU round 7 (H200): the down chunk shape of s15r6 (BK_I 2048, R_DOWN 4: -3% at 14b,
# -5.5% at 32b) at 4b and 8b, whose down rows are also longer than two 4096-chunks, before a plan
# rule. Variants in one process, then again in the reverse order.
#   bash bench/rounds/s15r7.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
{
for m in 8b 4b; do
  timeout 200 python3 bench/gpu_smoke.py --model $m --steps 128 --max-seq-len 392 \
    --backends per-op,$mk,$mk:BK_I=2048:R_DOWN=4,$mk:BK_I=2048:R_DOWN=2,$mk 2>&1 | pick $m
done
} | tee "$out/ab.txt"

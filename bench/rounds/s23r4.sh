#!/usr/bin/env bash
# Session 23, GPU round 4 (H100): around NSPLIT 32 + R_O 8 at 0.6b (P below; s23r3: 0.720-0.722
# against the plan's 0.729-0.735), each variant beside P in one process; then the plan against
# NSPLIT 32 at 1.7b, 4b and 8b (make_plan caps NSPLIT at the blocks of max_seq_len: 16 at 392).
#   bash bench/rounds/s23r4.sh "$OUT/s23r4"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
b=megakernel:spl=64
P=$b:NSPLIT=32:R_O=8
list=per-op,$P
for v in NSPLIT=64:R_O=8 NSPLIT=32:R_O=16 NSPLIT=32:R_O=8:R_GU=8 NSPLIT=32:R_O=8:R_QKV=8 NSPLIT=32:R_O=8:R_DOWN=2 \
         NSPLIT=32:R_O=8:ATTN_NEW=0 ""; do list="$list,$b${v:+:$v},$P"; done
timeout 250 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 --backends "$list" 2>&1 \
  | grep -E "median|regs|equal|rror" | sed "s/^/0.6b /" | tee -a "$out/ab.txt"
for m in 1.7b 4b 8b; do
  extra=""; [ $m = 1.7b ] && extra=",$b:NSPLIT=32:R_O=16"
  timeout 200 python3 bench/gpu_smoke.py --model $m --steps 128 --max-seq-len 392 \
    --backends "per-op,$b,$b:NSPLIT=32,$b,$b:NSPLIT=32$extra" 2>&1 \
    | grep -E "median|regs|equal|rror" | sed "s/^/$m /" | tee -a "$out/ab.txt"
done

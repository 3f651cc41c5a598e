#!/usr/bin/env bash
# Session 24, GPU round 6 (H100, 0.6b): the plan's other fields around the lagged placement
# (NOTES 63), each beside the plan P in one process, alternating: ATTN_NEW 0, R_DOWN 2, R_LM 8,
# 256 workers (O still on half of them), BLOCK_S 16.
#   bash bench/rounds/s24r6.sh "$OUT/s24r6"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
P=megakernel:spl=64
list=per-op,$P
for v in ATTN_NEW=0 R_DOWN=2 R_LM=8 workers=256 BLOCK_S=16; do list="$list,$P:$v,$P"; done
timeout 300 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 --backends "$list" 2>&1 \
  | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"

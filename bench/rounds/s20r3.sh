#!/usr/bin/env bash
# Session 20, GPU round 3 (H100): pools against none at the other sizes (s20r2: 14b 10.46 -> 9.97,
# 0.6b's LM head pool 0.733 -> 0.738), one process per size, in turn and reversed, tokens against
# per-op's.
#   bash bench/rounds/s20r3.sh "$OUT/s20r3" "1.7b 4b 8b 32b"
set -u
out=${1:?out}; sizes=${2:-"1.7b 4b 8b 32b"}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
none=POOL_O=0:POOL_GU=0:POOL_DOWN=0:POOL_LM=0
for m in $sizes; do
  timeout 400 python3 bench/gpu_smoke.py --model $m --steps 32 --max-seq-len 392 --backends \
    per-op,megakernel:spl=16,megakernel:spl=16:$none,megakernel:spl=16:$none,megakernel:spl=16 2>&1 \
    | grep -E "median|equal|regs|rror" | sed "s/^/$m /" | tee "$out/ab-$m.txt"
done

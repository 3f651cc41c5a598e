#!/usr/bin/env bash
# Session 20, GPU round 4 (H100, 14b): the pool's size (a fifth of each pooled stage, make_plan's
# rule, against a third and a tenth) and half-height down tiles with a pool (down's tail stayed
# 3.4 us in s20r2's trace: 4.8 tiles of 136 KB a worker); one process, the plan first and last.
#   bash bench/rounds/s20r4.sh "$OUT/s20r4"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
third=POOL_O=426:POOL_GU=2901:POOL_DOWN=426:POOL_LM=12661
tenth=POOL_O=128:POOL_GU=870:POOL_DOWN=128:POOL_LM=3798
timeout 560 python3 bench/gpu_smoke.py --model 14b --steps 32 --max-seq-len 392 --backends \
  per-op,megakernel:spl=16,megakernel:spl=16:R_DOWN=2:POOL_DOWN=512,megakernel:spl=16:$third,megakernel:spl=16:$tenth,megakernel:spl=16 \
  2>&1 | grep -E "median|equal|regs|rror" | tee "$out/ab14b.txt"

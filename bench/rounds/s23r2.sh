#!/usr/bin/env bash
# Session 23, GPU round 2 (H100, 0.6b): the plan's fields swept on today's code, each variant beside
# the plan in one process (the plan between every two variants, so drift shows), 256 steps, 64 a
# launch; tokens against the plan's first run (the variants that keep its sums must match).
#   bash bench/rounds/s23r2.sh "$OUT/s23r2"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
b=megakernel:spl=64
sweep() {   # one process: the plan, then each variant followed by the plan again
  local list=$b
  for v in "$@"; do list="$list,$b:$v,$b"; done
  timeout 280 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 --backends "$list" 2>&1 \
    | grep -E "median|regs|equal|rror" | tee -a "$out/sweep.txt"
}
sweep R_QKV=8 R_O=2 R_O=8 R_GU=2 R_GU=8 R_DOWN=2 R_DOWN=8
sweep R_LM=8 NSPLIT=8 NSPLIT=32 ATTN_NEW=0 bk=2048:R_DOWN=4 bk=2048:R_DOWN=2 st=round-robin

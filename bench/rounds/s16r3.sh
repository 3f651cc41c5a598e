#!/usr/bin/env bash
# Session 16, GPU round 3: the pool's claims counter now comes to the kernel as an argument, not a
# tape word read for every instruction (s16r2: that tree was 0.762-0.763 ms against main's
# 0.758-0.759; with LM_POOL=0 it now compiles to main's SASS exactly). Per round: main's tree,
# then this tree with the pool and without (LM_POOL=0) in both orders; three rounds; tokens
# compared with per-op in the first.
#   bash bench/rounds/s16r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
for rep in $(seq ${REPS:-3}); do
  po=; [ "$rep" = 1 ] && po=per-op,
  (cd _main && timeout 120 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $mk 2>&1 | pick "main-$rep")
  timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $po$mk,$mk:LM_POOL=0 2>&1 \
    | pick "new-$rep"
  timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $mk:LM_POOL=0,$mk 2>&1 \
    | pick "new-rev-$rep"
done | tee "$out/ab.txt"

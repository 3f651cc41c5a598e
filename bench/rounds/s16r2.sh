#!/usr/bin/env bash
# Session 16, GPU round 2: s16r1 put main's tree (0.761 ms, its own process, last) ahead of this
# tree's LM_POOL=0 (0.766) and pool (0.762-0.764); one process per tree, alternating, three times:
# main; this tree with the plan's pool (a fifth) and with a third.
#   bash bench/rounds/s16r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|regs|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
for rep in $(seq ${REPS:-3}); do
  (cd _main && timeout 120 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $mk 2>&1 | pick "main-$rep")
  timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $mk,$mk:LM_POOL=3165 2>&1 \
    | pick "pool-$rep"
done | tee "$out/ab.txt"

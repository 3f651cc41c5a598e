#!/usr/bin/env bash
# Session 17, GPU round 2: NOTES 51's LM head pool again, now with every tile kind a function of
# its own (MEGAKERNEL_NOINLINE=1, s17r1: as fast as inlined), so the pool's code should no longer
# move the other kinds' register allocation. Per round: noinline without the pool (LM_POOL=0),
# noinline with it, in both orders, and the inlined kernel with the pool; three rounds; tokens
# compared with per-op in the first.
#   bash bench/rounds/s17r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
for rep in $(seq ${REPS:-3}); do
  po=; [ "$rep" = 1 ] && po=per-op,
  MEGAKERNEL_NOINLINE=1 timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
    --backends $po$mk:LM_POOL=0,$mk 2>&1 | pick "ni-$rep"
  MEGAKERNEL_NOINLINE=1 timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
    --backends $mk,$mk:LM_POOL=0 2>&1 | pick "ni-rev-$rep"
  timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $po$mk 2>&1 | pick "inline-pool-$rep"
done | tee "$out/ab.txt"

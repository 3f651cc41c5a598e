#!/usr/bin/env bash
# Session 17, GPU round 14: the L2 layout of x, attn and the counters (NOTES 53, measured on the
# H100) on an H200, against the session's starting commit (007ef24), alternating processes, three
# times at 0.6b; tokens compared with per-op in the first.
#   bash bench/rounds/s17r14.sh "$OUT"    (007ef24's tree unpacked in _main/)
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
for rep in $(seq ${REPS:-3}); do
  po=; [ "$rep" = 1 ] && po=per-op,
  (cd _main && timeout 200 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $po$mk 2>&1 | pick "start-$rep")
  timeout 200 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $po$mk 2>&1 | pick "hot-$rep"
done | tee "$out/ab.txt"

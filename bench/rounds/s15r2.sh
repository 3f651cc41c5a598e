#!/usr/bin/env bash
# Session 15, GPU round 2 (H200): gate and up's K-chunks loaded together (dot_rows2) where the
# hidden size takes two chunks (14b, 32b: 5120 = 4096 + 1024; every smaller preset compiles to the
# same SASS as before). Main unpacked in _main/; one process per tree and size, interleaved, twice;
# per-op first in each process (every backend's tokens are compared with its).
#   bash bench/rounds/s15r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|mismatch|Error|error" | sed "s/^/$1 /"; }
for rep in 1 2; do
  for m in ${SIZES:-32b 14b}; do
    timeout 200 python3 bench/gpu_smoke.py --model $m --steps 64 --max-seq-len 392 \
      --backends per-op,cuda-graph,megakernel:spl=64 2>&1 | pick "$m new"
    (cd _main && timeout 200 python3 bench/gpu_smoke.py --model $m --steps 64 --max-seq-len 392 \
      --backends per-op,cuda-graph,megakernel:spl=64 2>&1 | pick "$m main")
  done
done | tee "$out/ab.txt"

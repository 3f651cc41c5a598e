#!/usr/bin/env bash
# Session 13, GPU round 4: do the checks cost in their fast path or in their slow path? The tagged
# words with relaxed DOWN (and EMBED) signals or every kind relaxed, with the checks' slow paths
# compiled out (MEGAKERNEL_NO_SLOW=1: unsafe, a tile computes from whatever it read) and in; the
# format alone (MEGAKERNEL_RELAX=""); main (_main/). One process each, interleaved, twice.
#   bash bench/rounds/s13r4.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "megakernel.*median|megakernel.*tokens equal|regs" | sed "s/^/$1 /"; }
run() { timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends per-op,megakernel:spl=64 2>&1; }
for rep in 1 2; do
  for rx in DOWN QKV,ATTN,OPROJ,GATEUP,DOWN; do
    for ns in 0 1; do
      MEGAKERNEL_RELAX=$rx MEGAKERNEL_NO_SLOW=$ns run | pick "relax=[$rx] no_slow=$ns"
    done
  done
  MEGAKERNEL_RELAX= run | pick "relax=[]"
  (cd _main && run | pick main)
done | tee "$out/slow.txt"

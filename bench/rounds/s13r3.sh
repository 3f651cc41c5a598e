#!/usr/bin/env bash
# Session 13, GPU round 3: which kinds should signal relaxed (MEGAKERNEL_RELAX: the kinds whose
# outputs their readers check; "" = the tagged format alone, every signal released), against main
# (_main/). One process each, interleaved, twice.
#   bash bench/rounds/s13r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "megakernel.*median|megakernel.*tokens equal|regs" | sed "s/^/$1 /"; }
for rep in 1 2; do
  for rx in QKV,ATTN,OPROJ,GATEUP,DOWN "" OPROJ,GATEUP,DOWN GATEUP,DOWN OPROJ,DOWN DOWN; do
    MEGAKERNEL_RELAX=$rx timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
      --backends per-op,megakernel:spl=64 2>&1 | pick "relax=[$rx]"
  done
  (cd _main && timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
    --backends per-op,megakernel:spl=64 2>&1 | pick main)
done | tee "$out/relax.txt"

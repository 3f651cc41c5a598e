#!/usr/bin/env bash
# Session 13, GPU round 1 (branch tag8-experiment, the repository root) against main (unpacked in
# _main/): tagged float32 words (version in the low 8 mantissa bits, checked through the norm's and
# the row sums' NaN) with relaxed signals; the same with every signal a release
# (MEGAKERNEL_TAG_RELEASE=1); main. One process each, interleaved, twice; cuda-graph once per tree.
#   bash bench/rounds/s13r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs" | sed "s/^/$1 /"; }
for rep in 1 2; do
  MEGAKERNEL_TAG_RELEASE=0 timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
    --backends per-op,megakernel:spl=64 2>&1 | pick tag8
  MEGAKERNEL_TAG_RELEASE=1 timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
    --backends per-op,megakernel:spl=64 2>&1 | pick tag8-release
  (cd _main && timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
    --backends per-op,megakernel:spl=64 2>&1 | pick main)
done | tee "$out/ab.txt"
timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends cuda-graph 2>&1 | pick tag8 | tee -a "$out/ab.txt"
(cd _main && timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends cuda-graph 2>&1 \
  | pick main) | tee -a "$out/ab.txt"

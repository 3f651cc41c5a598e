#!/usr/bin/env bash
# Session 13, GPU round 7: dot_rows with each K-chunk's loads issued before the previous chunk's
# product (the repository root) against main (_main/), at 8b (down's K, 12288, is three chunks)
# and 0.6b (one chunk everywhere: the same kernel). Megakernel and cuda-graph, one process each,
# interleaved, twice.
#   bash bench/rounds/s13r7.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs" | sed "s/^/$1 /"; }
run() { timeout 140 python3 bench/gpu_smoke.py --model $1 --steps 128 --max-seq-len 392 \
  --backends per-op,megakernel:spl=64,cuda-graph 2>&1; }
for rep in 1 2; do
  run 8b | pick "new 8b"
  (cd _main && run 8b | pick "main 8b")
done | tee "$out/pipelined.txt"

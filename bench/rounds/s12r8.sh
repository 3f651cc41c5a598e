#!/usr/bin/env bash
# Session 12, GPU round 8: tagged words (branch tagged-experiment, run from _tagged/) with the
# residual rows' check moved after the math (their load still issued before it), against main
# (the repository root), one process each, interleaved, twice.
#   (cd _tagged && bash bench/rounds/s12r8.sh "$OUT")
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
for rep in 1 2; do
  timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends per-op,megakernel:spl=64 2>&1 \
    | grep -E "megakernel.*median|megakernel.*tokens equal|regs" | sed "s/^/tagged /"
  (cd .. && timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends per-op,megakernel:spl=64 \
    2>&1 | grep -E "megakernel.*median|megakernel.*tokens equal|regs" | sed "s/^/main /")
done | tee "$out/deferred.txt"

#!/usr/bin/env bash
# Session 12, GPU round 4 (diagnostic, not a valid protocol): what the release fences cost the real
# step, where the next stage's weights are in flight while the last producers fence. The kernel's
# signal relaxed (1), and the attention ticket too (2), and the poll too (3), against main (0), one
# process each, interleaved, twice. Tokens against per-op in each process.
#   bash bench/rounds/s12r4.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
for rep in 1 2; do
  for d in 0 1 2 3; do
    MEGAKERNEL_DIAG_RELAXED=$d timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
      --backends per-op,megakernel:spl=64 2>&1 | grep -E "median|tokens equal|regs|Error" | sed "s/^/diag$d /"
  done
done | tee "$out/relaxed.txt"

#!/usr/bin/env bash
# Session 9, GPU round 6: every GPU test after the one-split attention path; then shorter KV
# blocks for the 0.6b batch-1 splits at max_seq_len 392 (BLOCK_S 16: up to 25 active splits of 16
# positions at NSPLIT 32, against the plan's 13 of 32), one process, interleaved, 256 steps.
#   bash bench/rounds/s9r6.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -m gpu -q -s 2>&1 | tee "$out/h200-gpu-tests.log" | tail -4
timeout 280 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends \
megakernel,megakernel:NSPLIT=32:BLOCK_S=16,megakernel:BLOCK_S=16,megakernel,megakernel:NSPLIT=32:BLOCK_S=16,megakernel:BLOCK_S=16 2>&1 \
  | tee "$out/smoke.log" | grep -v "^  workers"

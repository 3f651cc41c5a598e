#!/usr/bin/env bash
# Session 7, GPU round 5: the code to keep (norm weight before the wait, residual rows before the
# math; s7r1 "early") with gate/up tiles of 4 rows (R_GU=4: 768 tiles, 2-3 per worker, at most
# 48 KB of weights per worker) against 8 (384 tiles: 120 workers hold two, 64 KB), interleaved
# twice; 0.6b batch 1, max_seq_len 392, 256 steps.   bash bench/rounds/s7r5.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 250 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends \
per-op,megakernel,megakernel:R_GU=4,megakernel,megakernel:R_GU=4,cuda-graph 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"

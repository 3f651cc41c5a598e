#!/usr/bin/env bash
# Session 9, GPU round 4: fewer attention splits at the recorded run's max_seq_len 392 (the plan
# takes 16), down to one split that walks every block and normalises its own output (no ticket,
# no combine: new in attention._split). One process, interleaved, 256 steps, 0.6b batch 1.
#   bash bench/rounds/s9r4.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
timeout 580 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends \
per-op:NSPLIT=1,megakernel,megakernel:NSPLIT=1,megakernel:NSPLIT=2,megakernel:NSPLIT=4,megakernel:NSPLIT=1:KV_STAGES=2,megakernel:NSPLIT=1:KV_STAGES=4,megakernel:NSPLIT=1:BLOCK_S=64:KV_STAGES=2,megakernel,megakernel:NSPLIT=1 2>&1 \
  | tee "$out/smoke.log" | grep -v "^  workers"

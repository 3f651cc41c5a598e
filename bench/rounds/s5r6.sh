#!/usr/bin/env bash
# Session 5, GPU round 6: attention pipeline depth where a split holds one KV block (max_seq_len
# 1024: every split at most 32 positions, so the pipelined loop after the first block never runs):
# KV_STAGES 3 (the plan's) against 2 and 1, interleaved twice, at 0.6b and 8b.
#   bash bench/rounds/s5r6.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 300 python3 bench/gpu_smoke.py --steps 128 --backends \
per-op,megakernel,megakernel:KV_STAGES=2,megakernel:KV_STAGES=1,megakernel,megakernel:KV_STAGES=2,megakernel:KV_STAGES=1 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"
timeout 200 python3 bench/gpu_smoke.py --steps 64 --model 8b --backends \
megakernel,megakernel:KV_STAGES=2,megakernel:KV_STAGES=1 2>&1 | tee "$out/r/smoke-8b.log" | grep -v "^  workers"
tar czf "$out/results.tgz" -C "$out" r

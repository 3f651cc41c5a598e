#!/usr/bin/env bash
# Session 5, GPU round 4: where batch 8 and batch 1 part ways in the failing batch test (session 4's
# seeds), for the megakernel and per-op.   bash bench/rounds/s5r4.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
for be in megakernel per-op; do
  PROMPT_SEED=1795268737 timeout 120 python3 bench/batch_diverge.py --seq 3 --backend $be
  PROMPT_SEED=1795268000 timeout 120 python3 bench/batch_diverge.py --seq 7 --backend $be
done 2>&1 | grep -v Warning | tee "$out/r/diverge.log"
tar czf "$out/results.tgz" -C "$out" r

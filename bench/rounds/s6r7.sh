#!/usr/bin/env bash
# Session 6, GPU round 7: gate/up balance on main's code. 120 of 264 workers hold two 8-row gate/up
# tiles (+1.5 us on the stage, NOTES 29's trace); 4-row tiles give every worker 2-3 (12 rows at most
# instead of 16); with R_O 8 the O projection leaves 136 workers free to start gate/up early.
# Interleaved twice, 256 steps.   bash bench/rounds/s6r7.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 300 python3 bench/gpu_smoke.py --steps 256 --backends \
megakernel,megakernel:R_GU=4,megakernel:R_GU=4:R_O=8,megakernel:R_O=8,megakernel,megakernel:R_GU=4,megakernel:R_GU=4:R_O=8,megakernel:R_O=8 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"

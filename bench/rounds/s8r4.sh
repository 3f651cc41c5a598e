#!/usr/bin/env bash
# Session 8, GPU round 4: smaller first tiles for the stages whose wait returns late (QKV: 32 KB
# loaded before its wait, which returns ~1 us after the down stage ends, against 0.35-0.5 for O
# and down): R_QKV 8 and R_DOWN 2 against main, interleaved in one process. 0.6b batch 1,
# max_seq_len 392, 256 steps.   bash bench/rounds/s8r4.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 300 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends \
megakernel,megakernel:R_QKV=8,megakernel:R_DOWN=2,megakernel,megakernel:R_QKV=8,megakernel:R_DOWN=2 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"

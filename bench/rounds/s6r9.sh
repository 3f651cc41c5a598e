#!/usr/bin/env bash
# Session 6, GPU round 9: R_O 8 against 4 at the recorded run's max_seq_len (392: prompt 128 + 256
# new + 8; NSPLIT 16), where s6r8's recorded run gave 0.740 ms against session 5's 0.737 (R_O 4).
# Interleaved three times, 256 steps.   bash bench/rounds/s6r9.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 250 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends \
per-op,megakernel,megakernel:R_O=4,megakernel,megakernel:R_O=4,megakernel,megakernel:R_O=4 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"

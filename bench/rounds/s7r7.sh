#!/usr/bin/env bash
# Session 7, GPU round 7: main after s7r6 (0.6b R_GU 4) against 2-row gate/up tiles (R_GU 2: the
# same 12 rows on the busiest worker in 6 tiles), interleaved twice, and a phase trace of main.
# 0.6b batch 1, max_seq_len 392, 256 steps.   bash bench/rounds/s7r7.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 250 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --trace-dir "$out/r/trace" --backends \
megakernel,megakernel:R_GU=2,megakernel,megakernel:R_GU=2,megakernel:trace=1 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"
for f in "$out"/r/trace/*.json; do python3 bench/phase_stats.py "$f"; done 2>&1 | tee "$out/r/phases.txt"
python3 bench/trace_summary.py "$out"/r/trace/*.json > "$out/r/trace_summary.txt" 2>&1
rm -rf "$out/r/trace"

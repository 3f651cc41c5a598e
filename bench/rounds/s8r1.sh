#!/usr/bin/env bash
# Session 8, GPU round 1: the O projection split over kv groups (OSPLIT, make_plan's batch-1
# default now: each O tile combines its group's attention splits, no tickets, fixed-point adds)
# against the previous cut (OSPLIT=0), interleaved; per-op for the tokens; a phase trace; 8b both
# ways. Batch 1, max_seq_len 392, 256 steps.   bash bench/rounds/s8r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 300 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --trace-dir "$out/r/trace" --backends \
megakernel,megakernel:OSPLIT=0,megakernel,megakernel:OSPLIT=0,per-op,megakernel:trace=1 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"
for f in "$out"/r/trace/*.json; do python3 bench/phase_stats.py "$f"; done 2>&1 | tee "$out/r/phases.txt"
python3 bench/trace_summary.py "$out"/r/trace/*.json > "$out/r/trace_summary.txt" 2>&1
rm -rf "$out/r/trace"
timeout 250 python3 bench/gpu_smoke.py --model 8b --steps 128 --max-seq-len 392 --backends \
megakernel,megakernel:OSPLIT=0,megakernel 2>&1 | tee "$out/r/smoke8b.log" | grep -v "^  workers"

#!/usr/bin/env bash
# Session 8, GPU round 7: every GPU test and the recorded 0.6b batch-1 run with every peer, on main
# with make_plan's half-size down tiles at batch 1 (0.6b R_DOWN 2), then a phase trace of it.
#   bash bench/rounds/s8r7.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
bash "$(dirname "$0")/../recorded_run.sh" "$out/r"
timeout 120 python3 bench/gpu_smoke.py --steps 128 --max-seq-len 392 --trace-dir "$out/r/trace" \
  --backends megakernel:trace=1 2>&1 | grep -v "^  workers" | tail -3
for f in "$out"/r/trace/*.json; do python3 bench/phase_stats.py "$f"; done 2>&1 | tee "$out/r/phases.txt"
python3 bench/trace_summary.py "$out"/r/trace/*.json > "$out/r/trace_summary.txt" 2>&1
rm -rf "$out/r/trace"

#!/usr/bin/env bash
# Session 8, GPU round 2: OSPLIT's combine computed in the GEMV's flat column layout
# (MEGAKERNEL_FLAT_COMBINE=1, read at import) against OSPLIT=0 and the per-head combine of s8r1;
# OSPLIT with 8 splits; a phase trace. 0.6b batch 1, max_seq_len 392, 256 steps.
#   bash bench/rounds/s8r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
MEGAKERNEL_FLAT_COMBINE=1 timeout 250 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
  --trace-dir "$out/r/trace" --backends \
megakernel,megakernel:OSPLIT=0,megakernel,megakernel:OSPLIT=0,megakernel:NSPLIT=8:NSPLIT_PAD=8,megakernel:trace=1 2>&1 \
  | tee "$out/r/smoke-flat.log" | grep -v "^  workers"
timeout 100 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends megakernel,megakernel:OSPLIT=0 2>&1 \
  | tee "$out/r/smoke-perhead.log" | grep -v "^  workers"
for f in "$out"/r/trace/*.json; do python3 bench/phase_stats.py "$f"; done 2>&1 | tee "$out/r/phases.txt"
python3 bench/trace_summary.py "$out"/r/trace/*.json > "$out/r/trace_summary.txt" 2>&1
rm -rf "$out/r/trace"

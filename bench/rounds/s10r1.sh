#!/usr/bin/env bash
# Session 10, GPU round 1: attention's splits add into per-head sums against a shared reference
# (ATTN_SUM 1, the new default) against the last split combining (ATTN_SUM 0, the old path), for
# the megakernel and cuda-graph, 0.6b batch 1 at the recorded run's max_seq_len 392, 256 steps, one
# process, interleaved; then both traced, and the phase table of each.
# Predicted: the ticket's and the combine's round trips (~1.8 us of ATTN's 7.1 us gap) leave the
# chain, O's input costs about a plain load more: -1.3 to -1.7 us per layer, -35 to -48 us a step
# (H100 0.782 -> ~0.74 ms, H200 0.710 -> ~0.67).
#   bash bench/rounds/s10r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
timeout 420 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --trace-dir "$out" --backends \
megakernel,megakernel:ATTN_SUM=0,cuda-graph,cuda-graph:ATTN_SUM=0,megakernel,megakernel:ATTN_SUM=0,\
megakernel:trace=1,megakernel:ATTN_SUM=0:trace=1 2>&1 | tee "$out/smoke.log" | grep -v "^  workers"
for f in "$out"/*.json; do echo "== $f"; python3 bench/phase_stats.py "$f"; done 2>&1 | tee "$out/phases.txt"

#!/usr/bin/env bash
# Session 10, GPU round 5: s10r4 left the O projection's input at 2.1 us whether the divisors
# went through L2 or L1: they shared one L2 line, the target of every split's atomic add of its
# sum of p, and the O tiles' loads queued behind those adds. Now one line per head (SUM_STRIDE).
# Summed attention against the last split combining, 0.6b batch 1, max_seq_len 392, 256 steps.
# Predicted: O's input ~0.8 us as with no division (s10r2 nodiv: 0.761 ms).
#   bash bench/rounds/s10r5.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
timeout 200 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --trace-dir "$out" \
  --backends megakernel,megakernel:ATTN_SUM=0,megakernel,megakernel:ATTN_SUM=0,megakernel:trace=1,cuda-graph,cuda-graph:ATTN_SUM=0 2>&1 \
  | grep "median\|tokens equal" | tee "$out/smoke.txt"
python3 bench/phase_stats.py "$out/megakernel_trace1.json" | tee "$out/phases.txt"

#!/usr/bin/env bash
# Session 10, GPU round 3: the O projection loads attention's divisors once per head and broadcasts
# them (s10r2: per element they cost 2.5 us). Summed attention (float64, then float32 sums; with
# and without position 0's score in the reference) against the last split combining, 0.6b batch 1,
# max_seq_len 392, 256 steps; the default traced.
# Predicted: O's input back to ~0.8 us, so the step ~0.76 ms against ~0.78 (s10r2 nodiv: 0.761).
#   bash bench/rounds/s10r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
for d in none f32 noref; do
  MEGAKERNEL_DIAG=$d timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --trace-dir "$out/$d" \
    --backends megakernel,megakernel:ATTN_SUM=0,megakernel,megakernel:ATTN_SUM=0,megakernel:trace=1 2>&1 \
    | grep "median\|tokens equal" | sed "s/^/$d /"
  python3 bench/phase_stats.py "$out/$d/megakernel_trace1.json" | sed "s/^/$d /"
done 2>&1 | tee "$out/diag.txt"

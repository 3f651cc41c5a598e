#!/usr/bin/env bash
# Session 10, GPU round 4: the shared reference from position 0's score alone (no k norm and two
# reductions before the block math: s10r3's ATTN math phase was +0.8 us over the last-split
# combine), and the O projection's divisors through L1 (MEGAKERNEL_DIAG=ca: one L2 request per SM
# instead of one per warp on the one line all 256 tiles read) against L2 only.
#   bash bench/rounds/s10r4.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
for d in none ca; do
  MEGAKERNEL_DIAG=$d timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --trace-dir "$out/$d" \
    --backends megakernel,megakernel:ATTN_SUM=0,megakernel,megakernel:ATTN_SUM=0,megakernel:trace=1 2>&1 \
    | grep "median\|tokens equal" | sed "s/^/$d /"
  python3 bench/phase_stats.py "$out/$d/megakernel_trace1.json" | sed "s/^/$d /"
done 2>&1 | tee "$out/diag.txt"

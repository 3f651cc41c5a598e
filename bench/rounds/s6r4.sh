#!/usr/bin/env bash
# Session 6, GPU round 4: attention splits of one KV block on CUDA cores instead of tensor cores
# (MEGAKERNEL_ATTN_VEC_SHORT=1: no 16-row padding of q, no dot-operand layout conversions, 4 KB
# of shared memory instead of 17), alternated twice with the default at 0.6b; phase traces.
#   bash bench/rounds/s6r4.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
i=0
for v in 0 1 0 1; do
  i=$((i+1)); echo "=== run $i MEGAKERNEL_ATTN_VEC_SHORT=$v"
  be=megakernel
  [ $i -le 2 ] && be=per-op,megakernel,megakernel:trace=1
  MEGAKERNEL_ATTN_VEC_SHORT=$v timeout 100 python3 bench/gpu_smoke.py --steps 128 --trace-dir "$out/r/trace$v" \
    --backends $be 2>&1 | tee "$out/r/smoke$i.log" | grep -v "^  workers"
  [ $i -le 2 ] && python3 bench/phase_stats.py "$out/r/trace$v/megakernel_trace1.json" 2>&1 | tee "$out/r/phases$v.txt"
done

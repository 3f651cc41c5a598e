#!/usr/bin/env bash
# Session 11, GPU round 3: the LM head's argmax packed into one int64 per sequence that every tile
# raises with an atomic max (ARGMAX reads one word instead of 9496 (max, argmax) pairs in ten
# dependent chunks), against the previous commit (a copy in _ab_old/), alternating processes,
# 0.6b batch 1, max_seq_len 392, 256 steps, 64 steps per launch; then the traced step of each.
#   bash bench/rounds/s11r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
for i in 1 2; do
  for tree in _ab_old .; do
    (cd $tree && timeout 120 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 \
      --backends per-op,megakernel:spl=64,megakernel,megakernel:spl=64 --trace-dir "$out/$tree-$i" 2>&1) \
      | grep "median\|tokens equal\|regs" | sed "s|^|$tree $i |"
  done
done 2>&1 | tee "$out/ab.txt"
for tree in _ab_old .; do
  (cd $tree && timeout 120 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 \
    --backends megakernel:trace=1 --trace-dir "$out/trace-$tree" 2>&1 | grep median)
  python3 bench/trace_summary.py "$out/trace-$tree/megakernel_trace1.json" 2>&1 | tail -25 | sed "s|^|$tree |"
done 2>&1 | tee "$out/traces.txt"

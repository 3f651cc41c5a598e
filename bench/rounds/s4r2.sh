#!/usr/bin/env bash
# Session 4, GPU round 2: L2 prefetch hints (Hopper bulk prefetch of a later instruction's weights,
# backend option l2_prefetch = distance in weight-streaming instructions), 0.6b b1, with a phase
# trace; 8b at distance 0 and 2.   bash bench/rounds/s4r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 200 python3 bench/gpu_smoke.py --steps 128 --trace-dir "$out/r/trace" \
  --backends megakernel,megakernel:pf=1,megakernel:pf=2,megakernel:pf=3,megakernel:NSPLIT=8:pf=2,cuda-graph,megakernel:pf=2:trace=1,megakernel:trace=1 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"
for f in "$out"/r/trace/*.json; do echo "== $f"; python3 bench/phase_stats.py "$f"; done 2>&1 | tee "$out/r/phases.txt"
timeout 240 python3 bench/gpu_smoke.py --model 8b --steps 32 --backends megakernel,megakernel:pf=2,megakernel:pf=1 2>&1 \
  | tee "$out/r/smoke-8b.log" | grep -v "^  workers"
tar czf "$out/results.tgz" -C "$out" r

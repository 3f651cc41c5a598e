#!/usr/bin/env bash
# Session 4, GPU round 3: the "alternate" tape strategy (layer stages on two halves of the workers in
# turn, so a worker's next weights load during the other half's stage) against "balanced", with
# NSPLIT 8 and 32, 0.6b b1; phase traces of both.   bash bench/rounds/s4r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 220 python3 bench/gpu_smoke.py --steps 128 --trace-dir "$out/r/trace" \
  --backends megakernel,megakernel:NSPLIT=8,megakernel:st=alternate,megakernel:st=alternate:NSPLIT=8,megakernel:st=alternate:NSPLIT=8:R_O=8,cuda-graph,megakernel:st=alternate:NSPLIT=8:trace=1,megakernel:NSPLIT=8:trace=1 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"
for f in "$out"/r/trace/*.json; do echo "== $f"; python3 bench/phase_stats.py "$f"; done 2>&1 | tee "$out/r/phases.txt"
timeout 200 python3 bench/gpu_smoke.py --model 8b --steps 32 --backends megakernel,megakernel:st=alternate 2>&1 \
  | tee "$out/r/smoke-8b.log" | grep -v "^  workers"
tar czf "$out/results.tgz" -C "$out" r

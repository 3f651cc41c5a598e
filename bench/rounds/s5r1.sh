#!/usr/bin/env bash
# Session 5, GPU round 1 (run twice: per-thread cp.async, then the bulk-copy engine): weights staged
# in shared memory one instruction ahead (sw=1, the
# default) against the previous tiles (sw=0) at 0.6b and 8b, with phase traces; the megakernel
# GPU tests.   bash bench/rounds/s5r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 240 python3 bench/gpu_smoke.py --steps 128 --trace-dir "$out/r/trace" \
  --backends per-op,megakernel:sw=0,megakernel,superkernel,cuda-graph,megakernel:sw=0:trace=1,megakernel:trace=1 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"
for f in "$out"/r/trace/*.json; do echo "== $f"; python3 bench/phase_stats.py "$f"; done 2>&1 | tee "$out/r/phases.txt"
timeout 150 python3 bench/gpu_smoke.py --steps 64 --model 8b --backends megakernel:sw=0,megakernel 2>&1 \
  | tee "$out/r/smoke-8b.log" | grep -v "^  workers"
timeout 150 python3 -m pytest -m gpu -q -x tests/test_gpu_megakernel.py 2>&1 | tee "$out/r/gpu-tests.log" | tail -3
tar czf "$out/results.tgz" -C "$out" r

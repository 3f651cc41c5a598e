#!/usr/bin/env bash
# Session 6, GPU round 1: the down projection fused into the gate/up tiles (FUSED_MLP, split-K
# partial sums into the int64 fixed-point dx; 4 dependent stages per layer instead of 5) against
# the separate DOWN stage (FUSED_MLP=0), interleaved twice at 0.6b, and 16-row gate/up tiles (one
# per worker); phase traces of both; the megakernel GPU tests.   bash bench/rounds/s6r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 300 python3 bench/gpu_smoke.py --steps 128 --trace-dir "$out/r/trace" --backends \
per-op,megakernel,megakernel:FUSED_MLP=0,megakernel:R_GU=16,megakernel,megakernel:FUSED_MLP=0,cuda-graph,megakernel:trace=1,megakernel:FUSED_MLP=0:trace=1 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"
for f in "$out"/r/trace/*.json; do echo "== $f"; python3 bench/phase_stats.py "$f"; done 2>&1 | tee "$out/r/phases.txt"
timeout 200 python3 -m pytest -m gpu -q -x tests/test_gpu_megakernel.py 2>&1 | tee "$out/r/gpu-tests.log" | tail -3
tar czf "$out/results.tgz" -C "$out" r

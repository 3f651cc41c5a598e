#!/usr/bin/env bash
# Session 4, GPU round 4: attention splits past the current length skip their work (no wait, no
# partial; the combine reads only the active splits, its first chunk in one round trip), NSPLIT 8/16/32;
# one worker of 8 warps per SM; the GPU tests.   bash bench/rounds/s4r4.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 230 python3 bench/gpu_smoke.py --steps 128 --trace-dir "$out/r/trace" \
  --backends per-op,megakernel,megakernel:NSPLIT=8,megakernel:NSPLIT=16,megakernel:nw=8:wps=1,megakernel:nw=8:wps=1:NSPLIT=8,cuda-graph,megakernel:NSPLIT=8:trace=1 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"
for f in "$out"/r/trace/*.json; do echo "== $f"; python3 bench/phase_stats.py "$f"; done 2>&1 | tee "$out/r/phases.txt"
timeout 150 python3 bench/attn_bench.py --contexts 1024,32768 2>&1 | tee "$out/r/attn.log" | grep "ctx\|step:"
timeout 200 python3 -m pytest -m gpu -q -x tests/test_gpu_megakernel.py 2>&1 | tee "$out/r/gpu-tests.log" | tail -3
tar czf "$out/results.tgz" -C "$out" r

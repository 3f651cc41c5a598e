#!/usr/bin/env bash
# Session 5, GPU round 3: staging with the next tile's weights no longer loaded before the wait
# (s5r2: every staged kind was slower), per kind (sk bitmask: 1 QKV, 2 O, 4 GU, 8 DOWN, 16 LM head).
#   bash bench/rounds/s5r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 400 python3 bench/gpu_smoke.py --steps 128 --trace-dir "$out/r/trace" --backends \
per-op,megakernel:sw=0,megakernel,megakernel:sk=1,megakernel:sk=2,megakernel:sk=4,megakernel:sk=8,megakernel:sk=16,megakernel:sw=0:pad=1,megakernel:trace=1 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"
for f in "$out"/r/trace/*.json; do echo "== $f"; python3 bench/phase_stats.py "$f"; done 2>&1 | tee "$out/r/phases.txt"
tar czf "$out/results.tgz" -C "$out" r

#!/usr/bin/env bash
# Session 24, GPU round 9 (H200): the lagged placement (NOTES 63, measured on the H100) against
# the commit before it (858f6aa, unpacked in _main/), one process each, alternating twice; then the
# GPU tests and the recorded run, whose H200 row was session 19's.
#   bash bench/rounds/s24r9.sh "$OUT/s24r9"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
here=$(pwd)
for r in 1 2; do
  for tree in new before; do
    d=$here; [ $tree = before ] && d=$here/_main
    echo "== $tree" | tee -a "$out/ab.txt"
    (cd "$d" && timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
      --backends "per-op,megakernel:spl=64,megakernel:spl=64" 2>&1) \
      | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
  done
done
bash bench/recorded_run.sh "$out"

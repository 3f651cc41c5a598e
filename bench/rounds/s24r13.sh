#!/usr/bin/env bash
# Session 24, GPU round 13 (H100, 0.6b): attention's splits in two halves of the workers (NOTES 65:
# a group's early splits on the lower half, its late ones on the upper, so that each SM holds one
# of each and one O worker), as built into the lagged placement, against the previous commit
# unpacked in _main/, one process each, alternating twice; then the GPU tests and the recorded run.
#   bash bench/rounds/s24r13.sh "$OUT/s24r13"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
here=$(pwd)
for r in 1 2; do
  for tree in new main; do
    d=$here; [ $tree = main ] && d=$here/_main
    echo "== $tree" | tee -a "$out/ab.txt"
    (cd "$d" && timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
      --backends "per-op,megakernel:spl=64,megakernel:spl=64" 2>&1) \
      | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
  done
done
bash bench/recorded_run.sh "$out"

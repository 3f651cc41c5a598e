#!/usr/bin/env bash
# Session 24, GPU round 5 (H100, 0.6b): the lagged placement as built into the balanced strategy
# (scheduler.graph.lagged, make_plan's R_GU 8) against the previous commit unpacked in _main/
# (git archive HEAD), one process each, alternating twice, every kernel backend (superkernel and
# cuda-graph run the new plan's 8-row gate/up tiles too); then the GPU tests and the recorded run.
#   bash bench/rounds/s24r5.sh "$OUT/s24r5"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
here=$(pwd)
for r in 1 2; do
  for tree in new main; do
    d=$here; [ $tree = main ] && d=$here/_main
    echo "== $tree" | tee -a "$out/ab.txt"
    (cd "$d" && timeout 200 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
      --backends "per-op,megakernel:spl=64,superkernel,cuda-graph,megakernel:spl=64" 2>&1) \
      | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
  done
done
bash bench/recorded_run.sh "$out"

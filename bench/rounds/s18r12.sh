#!/usr/bin/env bash
# Session 18, GPU round 12: R_DOWN halved at batch 1 only where a down row takes more than two
# chunks (0.6b and 1.7b now keep the whole budget: s18r11), against the previous commit (_main/),
# alternating processes: 0.6b three times (with cuda-graph, which runs the same plan), 1.7b twice;
# then the GPU tests and the recorded 0.6b run.
#   bash bench/rounds/s18r12.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|Error|error" | sed "s/^/$1 /"; }
for m in 0.6b:3:cuda-graph, 1.7b:2:; do
  IFS=: read model reps cg <<< "$m"
  for rep in $(seq $reps); do
    po=; [ "$rep" = 1 ] && po=per-op,
    (cd _main && timeout 200 python3 bench/gpu_smoke.py --model $model --steps 256 --max-seq-len 392 \
      --backends $po${cg}megakernel:spl=64 2>&1 | pick "$model-main-$rep")
    timeout 200 python3 bench/gpu_smoke.py --model $model --steps 256 --max-seq-len 392 \
      --backends $po${cg}megakernel:spl=64 2>&1 | pick "$model-down4-$rep"
  done
done | tee "$out/ab.txt"
bash bench/recorded_run.sh "$out"

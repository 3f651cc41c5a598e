#!/usr/bin/env bash
# Session 18, GPU round 8: per-op's GEMV tiles with a CTA barrier after their weight loads (ptxas had
# sunk them to their uses once bf16 inputs needed no layout change through shared memory; s18r7:
# cuda-graph 0.909-0.911 against 0.868-0.871): cuda-graph and the megakernel, the previous commit
# (_main/) against this tree, alternating processes, three times; per-op's profile; then the GPU
# tests and the recorded 0.6b run.
#   bash bench/rounds/s18r8.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|Error|error" | sed "s/^/$1 /"; }
for rep in 1 2 3; do
  (cd _main && timeout 120 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends cuda-graph,megakernel:spl=64 2>&1 | pick "main-$rep")
  timeout 120 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends cuda-graph,megakernel:spl=64 2>&1 | pick "bf16-$rep"
done | tee "$out/ab.txt"
timeout 120 python3 bench/perop_profile.py 2>&1 | grep "us a step" > "$out/perop-bf16.txt"
head -5 "$out/perop-bf16.txt"
bash bench/recorded_run.sh "$out"

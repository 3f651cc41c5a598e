#!/usr/bin/env bash
# Session 18, GPU round 7: cuda-graph ran 0.908 ms/token in s18r4's recorded run against 0.863-0.870
# in session 17's: is the baseline slower with bf16 activations? cuda-graph alone, the previous
# commit (_main/) against this tree, alternating processes, three times; then the per-op profile
# (per-kernel GPU time) of each.
#   bash bench/rounds/s18r7.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|Error|error" | sed "s/^/$1 /"; }
for rep in 1 2 3; do
  (cd _main && timeout 120 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends cuda-graph 2>&1 | pick "main-$rep")
  timeout 120 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends cuda-graph 2>&1 | pick "bf16-$rep"
done | tee "$out/ab.txt"
(cd _main && timeout 120 python3 bench/perop_profile.py) > "$out/perop-main.txt" 2>&1
timeout 120 python3 bench/perop_profile.py > "$out/perop-bf16.txt" 2>&1
tail -15 "$out/perop-main.txt" "$out/perop-bf16.txt"

#!/usr/bin/env bash
# Session 14, GPU round 5: no worker runs two pieces of a stage where the segments allow
# (scheduler/graph.split_stage; 8b's and 4b's QKV busiest worker 10 -> 7 tiles at 264 workers) in
# the repository root, against main unpacked in _main/. 8b and 4b megakernel, one process each,
# interleaved, twice; cuda-graph (no tape) once per size. 0.6b's tape is unchanged.
#   bash bench/rounds/s14r5.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs" | sed "s/^/$1 /"; }
run() { timeout 200 python3 bench/gpu_smoke.py --model $1 --steps 128 --max-seq-len 392 --backends $2 2>&1; }
for size in 8b 4b; do
  for rep in 1 2; do
    run $size per-op,megakernel:spl=64 | pick "new $size"
    (cd _main && run $size per-op,megakernel:spl=64 | pick "main $size")
  done
  run $size cuda-graph | pick "cg $size"
done | tee "$out/ab.txt"

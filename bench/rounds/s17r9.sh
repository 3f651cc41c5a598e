#!/usr/bin/env bash
# Session 17, GPU round 9: x and the counters laid out for the L2's halves (backends.hot_buffers)
# against main's allocation, alternating processes: 0.6b three times, 1.7b twice; tokens compared
# with per-op in the first of each.
#   bash bench/rounds/s17r9.sh "$OUT"    (main's tree unpacked in _main/)
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
for m in 0.6b:3 1.7b:2; do
  model=${m%%:*}
  for rep in $(seq ${m##*:}); do
    po=; [ "$rep" = 1 ] && po=per-op,
    (cd _main && timeout 200 python3 bench/gpu_smoke.py --model $model --steps 256 --max-seq-len 392 --backends $po$mk 2>&1 \
      | pick "$model-main-$rep")
    timeout 200 python3 bench/gpu_smoke.py --model $model --steps 256 --max-seq-len 392 --backends $po$mk 2>&1 \
      | pick "$model-hot-$rep"
  done
done | tee "$out/ab.txt"

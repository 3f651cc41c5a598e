#!/usr/bin/env bash
# Session 17, GPU round 12: attn laid out with x and the counters in one half of the L2 (s17r11:
# 0.7560 there against 0.7590-0.7599 elsewhere), against the previous commit (x and the counters
# only), alternating processes: 0.6b three times, 1.7b twice; tokens compared with per-op in the
# first of each.
#   bash bench/rounds/s17r12.sh "$OUT"    (the previous commit's tree unpacked in _main/)
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

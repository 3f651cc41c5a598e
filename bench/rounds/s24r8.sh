#!/usr/bin/env bash
# Session 24, GPU round 8 (H100): attention's walk after a split's first block not compiled where
# no split can be longer than one block (instructions/attention.py, STAGES 0; compile_check on
# Triton 3.6: 0.6b stack 96 -> 64 B, 1.7b 128 -> 144, 8b 160 -> 152) against the previous commit
# unpacked in _main/, one process each, alternating twice, at 0.6b and 1.7b (max_seq_len 392).
#   bash bench/rounds/s24r8.sh "$OUT/s24r8"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
here=$(pwd)
for m in 0.6b 1.7b; do
  n=256; [ $m = 1.7b ] && n=128
  for r in 1 2; do
    for tree in new main; do
      d=$here; [ $tree = main ] && d=$here/_main
      echo "== $m $tree" | tee -a "$out/ab.txt"
      (cd "$d" && timeout 150 python3 bench/gpu_smoke.py --model $m --steps $n --max-seq-len 392 \
        --backends "per-op,megakernel:spl=64,megakernel:spl=64" 2>&1) \
        | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
    done
  done
done

#!/usr/bin/env bash
# Session 24, GPU round 14 (H200, 0.6b): which workers share an SM on the H200 (bench/sm_map.py on
# a light trace), and attention's splits in two halves (NOTES 65, measured on the H100) against
# the commit before it (HEAD~1 unpacked in _main/), one process each, alternating twice.
#   bash bench/rounds/s24r14.sh "$OUT/s24r14"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
here=$(pwd)
P=megakernel:spl=64
timeout 120 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends $P:trace=2 --trace-dir "$out/tr" \
  2>&1 | grep -E "median|rror" | tee -a "$out/ab.txt"
for f in "$out"/tr/*.json; do python3 bench/sm_map.py "$f"; done 2>&1 | tee "$out/sm_map.txt"
rm -rf "$out/tr"
for r in 1 2; do
  for tree in new before; do
    d=$here; [ $tree = before ] && d=$here/_main
    echo "== $tree" | tee -a "$out/ab.txt"
    (cd "$d" && timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
      --backends "per-op,$P,$P" 2>&1) | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
  done
done

#!/usr/bin/env bash
# (MEGAKERNEL_PAIRS needs bench/results/s24r12/pairs-experiment.diff on the commit before NOTES 65;
# main has the layout in scheduler.graph.build_tape.)
# Session 24, GPU round 12 (H100, 0.6b): which workers share an SM (bench/sm_map.py on a light
# trace), and MEGAKERNEL_PAIRS=1 (scheduler/graph.py, experiment): worker w < 132 holds split s <
# 16 of a group, worker w + 132 split s + 16, so the O workers (the late splits') are w + 132 for
# w < 128: one per SM if the driver pairs w with w + 132. One process per setting, alternating.
#   bash bench/rounds/s24r12.sh "$OUT/s24r12"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
P=megakernel:spl=64
timeout 120 python3 bench/gpu_smoke.py --steps 64 --max-seq-len 392 --backends $P:trace=2 --trace-dir "$out/tr" \
  2>&1 | grep -E "median|rror" | tee -a "$out/ab.txt"
for f in "$out"/tr/*.json; do python3 bench/sm_map.py "$f"; done 2>&1 | tee "$out/sm_map.txt"
rm -rf "$out/tr"
for r in 1 2; do
  for e in 0 1; do
    echo "== PAIRS=$e" | tee -a "$out/ab.txt"
    MEGAKERNEL_PAIRS=$e timeout 150 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 \
      --backends "per-op,$P,$P" 2>&1 | grep -E "median|regs|equal|rror|Traceback" | tee -a "$out/ab.txt"
  done
done

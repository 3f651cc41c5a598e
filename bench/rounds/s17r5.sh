#!/usr/bin/env bash
# Session 17, GPU round 5: s17r4 saw x (the residual stream) cost 1.5% more at most fresh
# addresses than at its own, and the counters 0.5%. Here each buffer is swept over offsets from a
# 4 MB-aligned base in one arena (addresses printed mod 2 MB), the kernel unchanged.
#   bash bench/rounds/s17r5.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
timeout 280 python3 bench/placement.py --arena --step 512 --offsets 32768 --buffers x,counters 2>&1 \
  | grep -v Warning | tee "$out/arena-x-counters.txt"
timeout 200 python3 bench/placement.py --arena --step 1024 --offsets 32768 --buffers tickets,qkv,act 2>&1 \
  | grep -v Warning | tee "$out/arena-others.txt"

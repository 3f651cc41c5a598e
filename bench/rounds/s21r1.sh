#!/usr/bin/env bash
# Session 21, GPU round 1 (H100, 0.6b): four plan variants never measured on today's code, in one
# process with the plan first and last, then again in reverse order:
#   NSPLIT 8 with 64-position blocks (one block per split at max_seq_len 392, loaded before the wait;
#   half the splits to combine), two-warp workers four to an SM (528), a gate/up pool of 150 tiles,
#   half-height down tiles with a pool of 100 (down's tail is the layer's largest GEMV tail, 1.9 us).
#   bash bench/rounds/s21r1.sh "$OUT/s21r1"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
A=megakernel:spl=64:NSPLIT=8:BLOCK_S=64
B=megakernel:spl=64:nw=2:wps=4
C=megakernel:spl=64:POOL_GU=150
D=megakernel:spl=64:R_DOWN=2:POOL_DOWN=100
P=megakernel:spl=64
timeout 290 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 --backends \
  per-op,$P,$A,$B,$C,$D,$P 2>&1 | grep -E "median|equal|regs|rror|Error" | tee "$out/ab1.txt"
timeout 290 python3 bench/gpu_smoke.py --model 0.6b --steps 256 --max-seq-len 392 --backends \
  per-op,$P,$D,$C,$B,$A,$P 2>&1 | grep -E "median|equal|regs|rror|Error" | tee "$out/ab2.txt"

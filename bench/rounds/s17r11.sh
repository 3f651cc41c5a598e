#!/usr/bin/env bash
# Session 17, GPU round 11: (1) two megakernels in one process with x and the counters laid out by
# hot_buffers (s17r2's second one was 1.7% slower: x across the L2's halves?); (2) attn (8 KB, the
# O projection's input) in one half (chunks 1-2 or 3-4 of the arena) or across both (0-1, 2-3),
# interleaved, three times.
#   bash bench/rounds/s17r11.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
timeout 200 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends megakernel:spl=64,megakernel:spl=64,megakernel:spl=64 2>&1 \
  | grep -E "median|tokens equal|Error|error" | tee "$out/three-in-one.txt"
timeout 200 python3 bench/placement.py --layouts "orig;attn@0x1000;attn@0x3000;attn@0x0;attn@0x2000;qkv@0x1000;qkv@0x3000" 2>&1 \
  | grep -v Warning | tee "$out/layouts.txt"

#!/usr/bin/env bash
# Session 17, GPU round 7: s17r6 found the L2's two halves alternating as bit 12 XOR bit 13 of the
# address (4 KB chunks). Layouts of x and the counters by half (+: chunk 0 and 3, -: 1 and 2),
# x straddling, and every hot buffer in one arena; interleaved, three times; one process.
#   bash bench/rounds/s17r7.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
L="orig;x@0x0,counters@0x3000;x@0x0,counters@0x2000;x@0x1000,counters@0x3000;x@0x1000,counters@0x2000"
L="$L;x@0x800,counters@0x3000;x@0x0,counters@0x3000,tickets@0x3800,qkv@0x4000,attn@0x8000,act@0xc000,ml@0x18000,opart@0x20000"
L="$L;x@0x0,counters@0x3000,tickets@0x3800,qkv@0x4000,attn@0x8000,act@0xd000,ml@0x19000,opart@0x20000"
timeout 280 python3 bench/placement.py --layouts "$L" --repeats ${REPS:-3} 2>&1 | grep -v Warning | tee "$out/layouts.txt"

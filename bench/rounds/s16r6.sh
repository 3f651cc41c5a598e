#!/usr/bin/env bash
# Session 16, GPU round 6 (H100): cuda-graph runs the megakernel's plan (so the two agree bit for
# bit); at 14b and 32b a plan of its own made it 7-8% faster (s16r5, NOTES 52). Does it at 0.6b,
# the size issue #6 compares at? cuda-graph with the plan, with tiles of twice the rows, of half,
# and of four times, in one process, twice (reversed the second time), beside the megakernel.
#   bash bench/rounds/s16r6.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|Error|error" | sed "s/^/$1 /"; }
cg=cuda-graph
v="$cg,$cg:R_QKV=32:R_O=8:R_GU=8:R_DOWN=4:R_LM=32,$cg:R_QKV=8:R_O=2:R_GU=2:R_DOWN=1:R_LM=8,$cg:R_QKV=64:R_O=16:R_GU=16:R_DOWN=8:R_LM=64"
r="$cg:R_QKV=64:R_O=16:R_GU=16:R_DOWN=8:R_LM=64,$cg:R_QKV=8:R_O=2:R_GU=2:R_DOWN=1:R_LM=8,$cg:R_QKV=32:R_O=8:R_GU=8:R_DOWN=4:R_LM=32,$cg"
{
timeout 250 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends per-op,megakernel:spl=64,$v 2>&1 | pick fwd
timeout 250 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends per-op,$r 2>&1 | pick rev
} | tee "$out/ab.txt"

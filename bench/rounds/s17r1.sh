#!/usr/bin/env bash
# Session 17, GPU round 1: every tile kind a function of its own (noinline) in the megakernel
# (MEGAKERNEL_NOINLINE=1), so each kind gets its own register allocation, against the same tree
# inlined (the default: main's kernel). Alternating processes, three rounds; tokens compared with
# per-op in the first of each.
#   bash bench/rounds/s17r1.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs|Error|error" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
for rep in $(seq ${REPS:-3}); do
  po=; [ "$rep" = 1 ] && po=per-op,
  timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $po$mk 2>&1 | pick "inline-$rep"
  MEGAKERNEL_NOINLINE=1 timeout 150 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends $po$mk 2>&1 \
    | pick "noinline-$rep"
done | tee "$out/ab.txt"

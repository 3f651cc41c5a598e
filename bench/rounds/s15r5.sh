#!/usr/bin/env bash
# Session 15, GPU round 5 (H200): the down projection's long rows through Triton's pipeliner
# (shared memory, MEGAKERNEL_DEEP_CHUNKS=3: rows longer than three chunks, i.e. 14b and 32b's down;
# MEGAKERNEL_DEEP_STAGES = num_stages) against the register one-ahead of NOTES 45 (off). s15r4 found
# that stream bound by the bytes in flight (R_DOWN 1: +13% at 32b). One process per variant.
#   bash bench/rounds/s15r5.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/gpu.txt"
pick() { grep -E "median|tokens equal|regs|workers|Error|error" | sed -E "s/plan Plan.*//" | sed "s/^/$1 /"; }
mk=megakernel:spl=64
run() {  # label, model, chunks, stages, extra backends
  MEGAKERNEL_DEEP_CHUNKS=$3 MEGAKERNEL_DEEP_STAGES=$4 timeout 200 python3 bench/gpu_smoke.py --model $2 --steps 64 \
    --max-seq-len 392 --backends per-op,$mk$5 2>&1 | pick "$2 $1"
}
{
run off 32b 1000 3 ""
run s3 32b 3 3 ",$mk:BK_I=2048:R_DOWN=4"
run s4 32b 3 4 ""
run off 14b 1000 3 ""
run s3 14b 3 3 ""
run s2 32b 3 2 ""
} | tee "$out/ab.txt"

#!/usr/bin/env bash
# Session 12, GPU round 3: one program of 8 warps per SM (132 workers on the H100) whose tiles hold
# twice the rows (make_plan's register budget scaled with the warps), against two programs of 4
# warps (264). sync_floor: a stage's chain costs 0.3-0.5 us less with 132 programs than with 264
# (s12r1/s12r2). 0.6b batch 1, max_seq_len 392, 256 steps, 64 steps per launch, one process,
# interleaved.
#   bash bench/rounds/s12r3.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
timeout 400 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends \
per-op,megakernel:spl=64,megakernel:spl=64:nw=8:wps=1,megakernel:spl=64,megakernel:spl=64:nw=8:wps=1,per-op:nw=8:wps=1,megakernel:spl=64:nw=4:wps=1 2>&1 \
  | tee "$out/smoke.log"

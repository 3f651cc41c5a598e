#!/usr/bin/env bash
# Session 5, GPU round 2: why staging (s5r1) is slower. The buffer alone (pad=1, nothing staged),
# one staged kind at a time (sk bitmask: 1 QKV, 2 O, 4 GU, 8 DOWN, 16 LM head), and less of
# Triton's own shared memory (KV_STAGES=2).   bash bench/rounds/s5r2.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 400 python3 bench/gpu_smoke.py --steps 128 --backends \
megakernel:sw=0,megakernel:sw=0:pad=1,megakernel,megakernel:sk=1,megakernel:sk=2,megakernel:sk=4,megakernel:sk=8,megakernel:sk=16,megakernel:sw=0:KV_STAGES=2,megakernel:KV_STAGES=2,megakernel:sw=0:pad=1:KV_STAGES=2 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"
tar czf "$out/results.tgz" -C "$out" r

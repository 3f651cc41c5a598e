#!/usr/bin/env bash
# Session 8, GPU round 5: s8r4 found R_QKV 8 and R_DOWN 2 (half the bytes each worker loads before
# its wait) 1.2% faster each. Both together, and with R_LM 8 (what TILE_ELEMS 8192 would give
# 0.6b), against main, interleaved; a trace of both together; 8b with TILE_ELEMS 8192's tiles
# (R_QKV 2, R_O 2, R_GU 1, R_DOWN 2, R_LM 2) and with only QKV and down halved, against main.
# Batch 1, max_seq_len 392.   bash bench/rounds/s8r5.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
A=megakernel:R_QKV=8:R_DOWN=2; B=megakernel:R_QKV=8:R_DOWN=2:R_LM=8
timeout 300 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --trace-dir "$out/r/trace" --backends \
megakernel,$A,$B,megakernel,$A,$B,$A:trace=1 2>&1 | tee "$out/r/smoke.log" | grep -v "^  workers"
for f in "$out"/r/trace/*.json; do python3 bench/phase_stats.py "$f"; done 2>&1 | tee "$out/r/phases.txt"
rm -rf "$out/r/trace"
timeout 250 python3 bench/gpu_smoke.py --model 8b --steps 128 --max-seq-len 392 --backends \
megakernel,megakernel:R_QKV=2:R_DOWN=2,megakernel:R_QKV=2:R_O=2:R_GU=1:R_DOWN=2:R_LM=2,megakernel 2>&1 \
  | tee "$out/r/smoke8b.log" | grep -v "^  workers"

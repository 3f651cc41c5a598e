#!/usr/bin/env bash
# Session 8, GPU round 6: half-size down tiles (R_DOWN 2 at 0.6b, where s8r4 measured -1.2%) and,
# at 8b (where R_QKV 2 + R_DOWN 2 measured -2% in s8r5), each of the two alone, interleaved
# three/two times against main in one process. Batch 1, max_seq_len 392.
#   bash bench/rounds/s8r6.sh "$OUT"
set -u
out=${1:?out}; mkdir -p "$out/r"; export PYTHONUNBUFFERED=1
timeout 250 python3 bench/gpu_smoke.py --steps 256 --max-seq-len 392 --backends \
megakernel,megakernel:R_DOWN=2,megakernel,megakernel:R_DOWN=2,megakernel,megakernel:R_DOWN=2 2>&1 \
  | tee "$out/r/smoke.log" | grep -v "^  workers"
timeout 300 python3 bench/gpu_smoke.py --model 8b --steps 128 --max-seq-len 392 --backends \
megakernel,megakernel:R_DOWN=2,megakernel:R_QKV=2,megakernel,megakernel:R_DOWN=2,megakernel:R_QKV=2 2>&1 \
  | tee "$out/r/smoke8b.log" | grep -v "^  workers"
